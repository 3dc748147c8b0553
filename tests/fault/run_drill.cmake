# Runs a fault drill under mpiexec and checks what a failure must look like.
#   cmake -D MPIEXEC=... -D NP=4 -D DRILL=<binary> -D "ARGS=--mode;stop;..."
#         -D BOUND=<seconds> -D "EXPECT=<regex>;..." -D EXPECT_VICTIM_EXIT=ON|OFF
#         [-D EXPECT_ZERO=ON] -P run_drill.cmake
# Fails unless the job ends within BOUND seconds, with a non-zero status
# (or zero with EXPECT_ZERO), its output matches every EXPECT regex, and no
# process of the job is left once mpiexec has returned (leftovers.sh finds
# them by a tag in their environment, lists them and kills them).
include(${CMAKE_CURRENT_LIST_DIR}/leftovers.cmake)
string(TIMESTAMP t0 "%s")
drill_tag_job(tag)
execute_process(COMMAND ${MPIEXEC} -print-all-exitcodes -n ${NP} ${DRILL} ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 280)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}\n${err}")
message("exit status ${rc} after ${elapsed} s\n---- output ----\n${all}\n----------------")
drill_check_leftovers(${tag} "the job ended after ${elapsed} s (bound ${BOUND} s)")
if(EXPECT_ZERO)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected success, got exit status ${rc}")
  endif()
elseif(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although a rank failed")
endif()
if(elapsed GREATER BOUND)
  message(FATAL_ERROR "the job took ${elapsed} s; the bound is ${BOUND} s")
endif()
foreach(re IN LISTS EXPECT)
  if(NOT all MATCHES "${re}")
    message(FATAL_ERROR "output does not match '${re}'")
  endif()
endforeach()
if(EXPECT_VICTIM_EXIT)
  # The launcher's per-rank exit codes: the victim's must be 9 (SIGKILL).
  string(REGEX MATCH "victim rank ([0-9]+)" _ "${all}")
  set(victim "${CMAKE_MATCH_1}")
  string(REGEX MATCH "Exit codes: [^\n]*\] ([0-9,]+)" _ "${all}")
  string(REPLACE "," ";" codes "${CMAKE_MATCH_1}")
  list(LENGTH codes ncodes)
  if(victim STREQUAL "" OR NOT ncodes EQUAL NP)
    message(FATAL_ERROR "no per-rank exit codes for victim '${victim}' in the launcher's report")
  endif()
  list(GET codes ${victim} code)
  if(NOT code EQUAL 9)
    message(FATAL_ERROR "rank ${victim} was killed but its exit code reads ${code}")
  endif()
endif()
