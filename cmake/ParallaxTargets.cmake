# Helpers for parallax's own tests, examples and benchmarks.
#
# parallax_add_executable(<name> SOURCES <src>... [LIBS <lib>...] [CUDA_TWIN])
#   Builds <name> from the sources as C++. With CUDA_TWIN and a CUDA
#   configuration, also builds <name>_cuda from the same sources compiled by
#   nvcc, so templated code is instantiated for CudaSpace too.

set(PARALLAX_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wno-unknown-pragmas)

function(_parallax_configure_target target)
  target_link_libraries(${target} PRIVATE parallax::parallax)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${PARALLAX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda --expt-relaxed-constexpr -Xcompiler=-Wall>)
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF CUDA_EXTENSIONS OFF)
endfunction()

function(parallax_add_executable name)
  cmake_parse_arguments(ARG "CUDA_TWIN" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  _parallax_configure_target(${name})
  if(ARG_LIBS)
    target_link_libraries(${name} PRIVATE ${ARG_LIBS})
  endif()
  if(ARG_CUDA_TWIN AND PARALLAX_ENABLE_CUDA)
    # Copies of the sources with a .cu name, so nvcc compiles them.
    set(_cu_sources)
    foreach(_src IN LISTS ARG_SOURCES)
      get_filename_component(_abs "${_src}" ABSOLUTE)
      get_filename_component(_stem "${_src}" NAME_WE)
      set(_cu "${CMAKE_CURRENT_BINARY_DIR}/cuda_twin/${name}/${_stem}.cu")
      configure_file("${_abs}" "${_cu}" COPYONLY)
      list(APPEND _cu_sources "${_cu}")
    endforeach()
    add_executable(${name}_cuda ${_cu_sources})
    _parallax_configure_target(${name}_cuda)
    target_include_directories(${name}_cuda PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}")
    if(ARG_LIBS)
      target_link_libraries(${name}_cuda PRIVATE ${ARG_LIBS})
    endif()
  endif()
endfunction()
