# Runs a fault drill under mpiexec and checks what a failure must look like.
#   cmake -D MPIEXEC=... -D NP=4 -D DRILL=<binary> -D "ARGS=--mode;stop;..."
#         -D BOUND=<seconds> -D "EXPECT=<regex>;..." -D EXPECT_VICTIM_EXIT=ON|OFF
#         [-D EXPECT_ZERO=ON] -P run_drill.cmake
# Fails unless the job ends within BOUND seconds, with a non-zero status
# (or zero with EXPECT_ZERO), and its output matches every EXPECT regex.
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${MPIEXEC} -print-all-exitcodes -n ${NP} ${DRILL} ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 280)
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
set(all "${out}\n${err}")
message("exit status ${rc} after ${elapsed} s\n---- output ----\n${all}\n----------------")
if(EXPECT_ZERO)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected success, got exit status ${rc}")
  endif()
elseif(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although a rank failed")
endif()
if(elapsed GREATER BOUND)
  # What was still running when the job overran (its launcher killed by the
  # timeout above): the drill's processes and launcher proxies, with their
  # state (T: stopped) and the kernel function they wait in.
  get_filename_component(drill_name "${DRILL}" NAME)
  execute_process(COMMAND ps -eo pid,ppid,pgid,stat,wchan:32,etimes,args OUTPUT_VARIABLE table ERROR_QUIET)
  string(REPLACE "\n" ";" rows "${table}")
  set(left "")
  foreach(row IN LISTS rows)
    if(row MATCHES "PID|${drill_name}|hydra_pmi_proxy")
      string(APPEND left "${row}\n")
    endif()
  endforeach()
  message(FATAL_ERROR "the job took ${elapsed} s; the bound is ${BOUND} s. Processes of the drill left:\n${left}")
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
