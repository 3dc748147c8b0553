# A drill job's tag, and the check that none of its processes outlives it
# (leftovers.sh), for run_drill.cmake and run_checkpoint_drill.cmake:
#   drill_tag_job(tag)                 a fresh tag, in the environment the job inherits
#   drill_check_leftovers(tag what)    after the job: untags the environment, then fails,
#                                      naming `what`, if a tagged process is still running
#                                      10 s later (leftovers.sh lists and kills them)
macro(drill_tag_job tag_var)
  string(RANDOM LENGTH 16 ${tag_var})
  set(ENV{PARALLAX_DRILL_TAG} "${${tag_var}}")
endmacro()

function(drill_check_leftovers tag what)
  unset(ENV{PARALLAX_DRILL_TAG})
  execute_process(COMMAND sh ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/leftovers.sh ${tag} 10
                  RESULT_VARIABLE left_rc OUTPUT_VARIABLE left)
  if(NOT left_rc EQUAL 0)
    message(FATAL_ERROR "${what}: processes of the job still running 10 s after mpiexec returned (now killed):\n${left}")
  endif()
endfunction()
