# Drives one packaging test from start to end (cmake -P, run by CTest):
#
#   MODE=find_package      configure parallax alone (host, no tests), install it
#                          into a scratch prefix, then build the consumer with
#                          find_package(parallax) from that prefix; with
#                          INSTALL_TREE, install that (built) tree instead;
#   MODE=add_subdirectory  build the consumer with parallax as a subdirectory.
#
# Either way the consumer then runs under mpiexec. The package_without_cuda
# test runs MODE=find_package through without_cuda.sh, with the CUDA toolkit
# hidden from every step. Prints "consumer OK" only
# when every step succeeded and the run exited 0; on any failure prints the
# step's log and "package test FAILED".
#
# Inputs (-D): MODE SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER BUILD_TYPE
#              MPIEXEC MPIEXEC_NUMPROC_FLAG RANKS TRAINERS (find_package: the
#              install holds parallax::trainers and the consumer links it;
#              default OFF) INSTALL_TREE (find_package: a built host tree)
cmake_minimum_required(VERSION 3.21)

foreach(_var IN ITEMS MODE SOURCE_DIR WORK_DIR GENERATOR MPIEXEC MPIEXEC_NUMPROC_FLAG)
  if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
    message(FATAL_ERROR "package test FAILED: check_package.cmake needs -D${_var}=...")
  endif()
endforeach()
if(NOT RANKS)
  set(RANKS 2)
endif()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
if(NOT DEFINED TRAINERS)
  set(TRAINERS OFF)  # parallax::trainers: about 1.5 minutes of compiling
endif()

# A fresh scratch tree every run, so nothing stale can make it pass.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(_common_args -G "${GENERATOR}" "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
if(CXX_COMPILER)
  list(APPEND _common_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()

if(NOT DEFINED STEP_TIMEOUT)
  set(STEP_TIMEOUT 600)  # seconds for one step
endif()

# Runs one step; on failure shows its log (the last 12000 characters) and stops.
function(step name)
  set(_log "${WORK_DIR}/${name}.log")
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out TIMEOUT ${STEP_TIMEOUT})
  file(WRITE "${_log}" "${_out}")
  if(NOT _rc EQUAL 0)
    string(LENGTH "${_out}" _len)
    set(_tail "${_out}")
    if(_len GREATER 12000)
      math(EXPR _from "${_len} - 12000")
      string(SUBSTRING "${_out}" ${_from} -1 _tail)
      set(_tail "...${_tail}")
    endif()
    message("---- ${name}: ${ARGN}\n${_tail}\n---- (full log: ${_log})")
    message(FATAL_ERROR "package test FAILED at step '${name}' (exit status ${_rc})")
  endif()
  set(step_output "${_out}" PARENT_SCOPE)
  message(STATUS "${name}: ok")
endfunction()

set(_consumer_build "${WORK_DIR}/consumer-build")
if(MODE STREQUAL "find_package")
  set(_prefix "${WORK_DIR}/prefix")
  if(INSTALL_TREE)
    step(parallax_install "${CMAKE_COMMAND}" --install "${INSTALL_TREE}" --prefix "${_prefix}")
  else()
    step(parallax_configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/parallax-build" ${_common_args}
         -DPARALLAX_ENABLE_CUDA=OFF -DPARALLAX_BUILD_TESTS=OFF -DPARALLAX_BUILD_EXAMPLES=OFF -DPARALLAX_BUILD_BENCH=OFF
         "-DPARALLAX_TRAINERS=${TRAINERS}" "-DCMAKE_INSTALL_PREFIX=${_prefix}")
    step(parallax_build "${CMAKE_COMMAND}" --build "${WORK_DIR}/parallax-build" --parallel 2)
    step(parallax_install "${CMAKE_COMMAND}" --install "${WORK_DIR}/parallax-build")
  endif()
  # What a packager would ship: the headers, the generated config.hpp, the
  # package config with its version file and the find modules it uses.
  file(GLOB_RECURSE _config RELATIVE "${_prefix}" "${_prefix}/*/parallax-config.cmake")
  file(GLOB_RECURSE _installed RELATIVE "${_prefix}" "${_prefix}/*")
  if(NOT _config)
    message("installed files:\n${_installed}")
    message(FATAL_ERROR "package test FAILED: the install has no parallax-config.cmake")
  endif()
  get_filename_component(_cfgdir "${_config}" DIRECTORY)
  foreach(_f IN ITEMS include/parallax/parallax.hpp include/parallax/config.hpp include/parallax/space.hpp
                      include/parallax/cuda/space.cuh include/parallax/nn/gemm.hpp include/parallax/nn/dense.hpp
                      ${_cfgdir}/ParallaxFindCBLAS.cmake
                      ${_cfgdir}/parallax-config-version.cmake ${_cfgdir}/parallax-targets.cmake
                      ${_cfgdir}/ParallaxFindThrust.cmake)
    if(NOT EXISTS "${_prefix}/${_f}")
      message("installed files:\n${_installed}")
      message(FATAL_ERROR "package test FAILED: the install has no ${_f}")
    endif()
  endforeach()
  # A host build's package must work where there is no CUDA toolkit: none of
  # its CMake files may name one (a toolkit path, the toolkit's CCCL).
  file(GLOB _cmake_files "${_prefix}/${_cfgdir}/*.cmake")
  foreach(_f IN LISTS _cmake_files)
    file(STRINGS "${_f}" _hits REGEX "/cuda([-/0-9\"]|$)|CCCL::")
    if(_hits)
      list(JOIN _hits "\n  " _hits)
      message(FATAL_ERROR "package test FAILED: the host package's ${_f} names the CUDA toolkit:\n  ${_hits}")
    endif()
  endforeach()
  step(consumer_configure "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${_consumer_build}"
       ${_common_args} -DPARALLAX_CONSUMER_MODE=find_package "-DCMAKE_PREFIX_PATH=${_prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  step(consumer_configure "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/consumer" -B "${_consumer_build}"
       ${_common_args} -DPARALLAX_CONSUMER_MODE=add_subdirectory "-DPARALLAX_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "package test FAILED: unknown MODE '${MODE}'")
endif()

if(TRAINERS AND MODE STREQUAL "find_package" AND NOT step_output MATCHES "consumer: linking parallax::trainers")
  message("${step_output}")
  message(FATAL_ERROR "package test FAILED: the install has no parallax::trainers for the consumer to link")
endif()
step(consumer_build "${CMAKE_COMMAND}" --build "${_consumer_build}" --parallel 2)

if(MODE STREQUAL "add_subdirectory")
  # Belt and braces beside the consumer's own configure-time check: nothing
  # of parallax's tests, examples or benchmarks was generated or built.
  foreach(_dir IN ITEMS tests examples bench)
    if(EXISTS "${_consumer_build}/parallax/${_dir}")
      message(FATAL_ERROR "package test FAILED: parallax/${_dir} was generated in the subproject build")
    endif()
  endforeach()
endif()

set(_exe "${_consumer_build}/consumer")
if(NOT EXISTS "${_exe}")
  message(FATAL_ERROR "package test FAILED: no consumer executable at ${_exe}")
endif()
step(consumer_run "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} ${RANKS} "${_exe}")
if(NOT step_output MATCHES "consumer OK")
  message("${step_output}")
  message(FATAL_ERROR "package test FAILED: the consumer exited 0 without saying it passed")
endif()
string(REGEX MATCH "consumer OK[^\n]*" _verdict "${step_output}")
message("${MODE}: ${_verdict}")
