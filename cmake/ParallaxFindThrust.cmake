# Thrust for a host build: the imported target parallax::thrust. Host code
# uses Thrust's C++ and OpenMP backends through explicit execution policies
# (Exec<HostSpace>::thrust_policy, with_thrust), which need its headers only:
# no CUDA toolkit, no nvcc, no CUB. They come from the system: Debian/Ubuntu's
# libthrust-dev (scripts/setup.sh installs it), or a Thrust (1.17 or later)
# install named by Thrust_ROOT / PARALLAX_THRUST_INCLUDE_DIR / CMAKE_PREFIX_PATH.
#
# The CUDA toolkit's own copy is deliberately not searched (PATH is left out,
# where the toolkit's bin directory would lead to it): a host build, and the package
# it installs, must work on a machine that has no toolkit. The CUDA
# configuration uses ParallaxFindCCCL.cmake instead.
#
# Used twice: by parallax's own CMakeLists.txt (PARALLAX_FIND_AS_DEPENDENCY
# unset: a missing Thrust is a configure error) and by the installed
# parallax-config.cmake of a host build (set: find_package(parallax) fails
# politely with the reason). Nothing found here is written into the installed
# package: the consumer's machine is searched afresh.
if(NOT TARGET parallax::thrust)
  find_path(PARALLAX_THRUST_INCLUDE_DIR thrust/version.h
    HINTS ENV Thrust_ROOT "${Thrust_ROOT}"
    PATH_SUFFIXES include
    NO_SYSTEM_ENVIRONMENT_PATH
    DOC "Directory holding thrust/version.h for parallax's host build (libthrust-dev: /usr/include)")
  set(_parallax_thrust_version "")
  if(PARALLAX_THRUST_INCLUDE_DIR)
    file(STRINGS "${PARALLAX_THRUST_INCLUDE_DIR}/thrust/version.h" _parallax_thrust_line
         REGEX "^#define[ \t]+THRUST_VERSION[ \t]+[0-9]+")
    if(_parallax_thrust_line MATCHES "([0-9]+)$")
      math(EXPR _major "${CMAKE_MATCH_1} / 100000")
      math(EXPR _minor "${CMAKE_MATCH_1} / 100 % 1000")
      set(_parallax_thrust_version "${_major}.${_minor}")
    endif()
  endif()
  set(_parallax_thrust_problem "")
  if(NOT PARALLAX_THRUST_INCLUDE_DIR)
    set(_parallax_thrust_problem "Thrust was not found (install libthrust-dev, or set Thrust_ROOT to a Thrust install)")
  elseif(_parallax_thrust_version VERSION_LESS 1.17)
    set(_parallax_thrust_problem
        "Thrust ${_parallax_thrust_version} at ${PARALLAX_THRUST_INCLUDE_DIR} is older than 1.17, the oldest parallax is tested with")
  endif()
  if(_parallax_thrust_problem)
    if(PARALLAX_FIND_AS_DEPENDENCY)
      set(parallax_FOUND FALSE)
      set(parallax_NOT_FOUND_MESSAGE "${_parallax_thrust_problem}")
      return()
    endif()
    message(FATAL_ERROR "parallax: ${_parallax_thrust_problem}")
  endif()
  add_library(parallax::thrust INTERFACE IMPORTED GLOBAL)
  # A directory the compiler searches anyway (/usr/include) is dropped from
  # the command line by CMake. Thrust's device system defaults to CUDA, whose
  # headers then include <cuda_runtime_api.h> even under g++; parallax names
  # its policies explicitly (omp::par, cpp::par), so the device system only
  # decides what Thrust includes: the OpenMP one, which parallax links anyway.
  set_target_properties(parallax::thrust PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${PARALLAX_THRUST_INCLUDE_DIR}"
    INTERFACE_COMPILE_DEFINITIONS "THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP")
  if(NOT PARALLAX_FIND_AS_DEPENDENCY)
    message(STATUS "parallax: Thrust ${_parallax_thrust_version} from ${PARALLAX_THRUST_INCLUDE_DIR} (host build)")
  endif()
  unset(_parallax_thrust_line)
  unset(_parallax_thrust_problem)
endif()
