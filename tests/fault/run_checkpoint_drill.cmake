# The kill-during-save drill: ROUNDS rounds of checkpoint_drill under
# mpiexec on one fresh directory, each killed by a SIGKILL at an instant of
# a save or a prune (checkpoint_drill.cpp), then one round that only checks.
#   cmake -D MPIEXEC=... -D NP=4 -D DRILL=<binary> -D DIR=<scratch dir>
#         -D ROUNDS=20 -D SEED=1 -D BOUND=<seconds> -P run_checkpoint_drill.cmake
# Fails if any round's check finds a listed checkpoint that does not
# restore, or anything in the directory that a save left and does not list,
# if fewer than ROUNDS rounds ended in a kill, if a process of a round's job
# outlived its mpiexec (leftovers.sh), or if the whole took longer than
# BOUND seconds.
include(${CMAKE_CURRENT_LIST_DIR}/leftovers.cmake)
string(TIMESTAMP t0 "%s")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(kills 0)
set(unrestorable 0)
set(leftovers 0)
set(checks 0)
set(found 0)
math(EXPR last "${ROUNDS}")
foreach(round RANGE 0 ${last})
  set(extra "")
  if(round EQUAL ROUNDS)
    set(extra --check-only)
  endif()
  drill_tag_job(tag)
  execute_process(COMMAND ${MPIEXEC} -n ${NP} ${DRILL} --dir ${DIR} --round ${round} --seed ${SEED} ${extra}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  drill_check_leftovers(${tag} "round ${round}")
  set(all "${out}\n${err}")
  string(REGEX MATCH
    "drill-check: round ${round}: listed ([0-9]+), unrestorable ([0-9]+), unlisted before the save ([0-9]+), leftovers ([0-9]+)"
    line "${all}")
  if(NOT line)
    message(FATAL_ERROR "round ${round}: no check line (exit status ${rc})\n${all}")
  endif()
  math(EXPR checks "${checks} + 1")
  math(EXPR unrestorable "${unrestorable} + ${CMAKE_MATCH_2}")
  math(EXPR found "${found} + ${CMAKE_MATCH_3}")
  math(EXPR leftovers "${leftovers} + ${CMAKE_MATCH_4}")
  string(REGEX MATCHALL "drill-check: [^\n]*(does not restore|leftover after)[^\n]*" problems "${all}")
  string(REGEX MATCH "drill-kill: [^\n]*" kill "${all}")
  message("round ${round}: ${line}; ${kill} (exit status ${rc})")
  foreach(p IN LISTS problems)
    message("  ${p}")
  endforeach()
  if(kill AND NOT rc EQUAL 0)
    math(EXPR kills "${kills} + 1")
  elseif(round LESS ROUNDS)
    message("  no kill in this round:\n${all}")
  endif()
endforeach()
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message("${kills} kills in ${ROUNDS} rounds, ${checks} checks: ${unrestorable} listed checkpoints did not restore; "
        "${found} unlisted entries found before a save, ${leftovers} after it; ${elapsed} s")
file(REMOVE_RECURSE "${DIR}")
if(unrestorable GREATER 0 OR leftovers GREATER 0)
  message(FATAL_ERROR "a kill left a listed checkpoint that does not restore, or a leftover that a save kept")
endif()
if(kills LESS ROUNDS)
  message(FATAL_ERROR "only ${kills} of ${ROUNDS} rounds ended in a kill")
endif()
if(elapsed GREATER BOUND)
  message(FATAL_ERROR "the drill took ${elapsed} s; the bound is ${BOUND} s")
endif()
