# CTest space_prefetch_codegen: disassembles the object compiled from
# prefetch_probe.cpp (the build's compiler and flags) and fails unless every
# probe_* function holds a prefetch instruction. A loop whose only effect is
# __builtin_prefetch may be deleted whole by the optimiser (C++ lets it assume
# such a loop ends; GCC's -ffinite-loops) when its trip count is not a
# constant: the row kernels would then run without their prefetch, and
# nothing else would fail.
#
#   cmake -DOBJDUMP=objdump -DOBJECT=probe.o -P prefetch.cmake
execute_process(COMMAND "${OBJDUMP}" -d --no-show-raw-insn "${OBJECT}"
                OUTPUT_VARIABLE _asm RESULT_VARIABLE _rc ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${OBJDUMP} -d ${OBJECT} failed:\n${_err}")
endif()
# objdump prints each function as "<name>:" followed by its instructions up
# to a blank line.
string(REGEX MATCHALL "<probe_[a-z_]+>:" _labels "${_asm}")
list(LENGTH _labels _n)
if(NOT _n EQUAL 3)
  message(FATAL_ERROR "expected the 3 probe functions in ${OBJECT}, found ${_n}: ${_labels}")
endif()
set(_failed "")
foreach(_label IN LISTS _labels)
  string(FIND "${_asm}" "${_label}" _at)
  string(SUBSTRING "${_asm}" ${_at} -1 _rest)
  string(FIND "${_rest}" "\n\n" _end)
  string(SUBSTRING "${_rest}" 0 ${_end} _body)
  # x86: prefetcht0/t1/t2/nta/w; AArch64: prfm.
  if(NOT _body MATCHES "prefetch|prfm")
    string(APPEND _failed " ${_label}")
  endif()
endforeach()
if(_failed)
  message(FATAL_ERROR "no prefetch instruction left in:${_failed}")
endif()
message(STATUS "a prefetch in each of the ${_n} probes")
