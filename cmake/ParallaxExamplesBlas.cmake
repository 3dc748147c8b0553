# The BLAS of the examples' matrix products (examples/common/gemm.hpp), for
# the examples and the benchmarks that run their models: the INTERFACE
# target parallax_examples_blas, a CBLAS for the host (and, in a CUDA
# configuration, cuBLAS for the nvcc twins: parallax_examples_cublas).
# parallax itself needs no BLAS: the model's math is the user's.
#
# OpenBLAS's OpenMP build comes first (Debian: libopenblas-openmp-dev, which
# scripts/setup.sh installs): its threads are the OpenMP team that runs
# parallax's host kernels, so --threads sizes both and neither team spins on
# a core the other needs. The pthreads build, which libopenblas-dev brings
# by default, keeps a pool of its own beside OpenMP's: two sets of threads
# that wait by spinning, on the same cores (docs/benchmarks.md, "Realistic
# workloads", "Threads"). Debian
# installs the builds side by side and the alternatives system points the
# plain library name at the pthreads one, so the OpenMP build is looked for
# in its own folder, and the build tree's RUNPATH keeps it at run time. Any
# other CBLAS works too, without the thread control: set
# PARALLAX_EXAMPLES_BLAS_LIBRARY and PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR.
include_guard(GLOBAL)

set(_px_blas_lib_hints)
set(_px_blas_inc_hints)
foreach(_prefix IN ITEMS /usr /usr/local)
  if(CMAKE_LIBRARY_ARCHITECTURE)
    list(APPEND _px_blas_lib_hints "${_prefix}/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
    list(APPEND _px_blas_inc_hints "${_prefix}/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
  endif()
  list(APPEND _px_blas_lib_hints "${_prefix}/lib64/openblas-openmp" "${_prefix}/lib/openblas-openmp")
  list(APPEND _px_blas_inc_hints "${_prefix}/include/openblas-openmp")
endforeach()

find_library(PARALLAX_EXAMPLES_BLAS_LIBRARY NAMES openblas HINTS ${_px_blas_lib_hints} NO_DEFAULT_PATH)
find_path(PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR cblas.h HINTS ${_px_blas_inc_hints} NO_DEFAULT_PATH)
# Otherwise any OpenBLAS, then any CBLAS, on the default paths.
find_library(PARALLAX_EXAMPLES_BLAS_LIBRARY NAMES openblas cblas)
find_path(PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
if(NOT PARALLAX_EXAMPLES_BLAS_LIBRARY OR NOT PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "parallax examples: no CBLAS found (library: ${PARALLAX_EXAMPLES_BLAS_LIBRARY}, cblas.h: "
                      "${PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR}); on Debian, scripts/setup.sh installs "
                      "libopenblas-openmp-dev")
endif()

get_filename_component(_px_blas_name "${PARALLAX_EXAMPLES_BLAS_LIBRARY}" NAME)
set(_px_openblas 0)
if(_px_blas_name MATCHES "openblas")
  set(_px_openblas 1)
endif()
set(_px_blas_openmp "no")
if(PARALLAX_EXAMPLES_BLAS_LIBRARY MATCHES "openblas-openmp")
  set(_px_blas_openmp "yes")
endif()
message(STATUS "parallax examples: BLAS ${PARALLAX_EXAMPLES_BLAS_LIBRARY} (OpenBLAS's OpenMP build: ${_px_blas_openmp})")

add_library(parallax_examples_blas INTERFACE)
target_link_libraries(parallax_examples_blas INTERFACE "${PARALLAX_EXAMPLES_BLAS_LIBRARY}")
target_include_directories(parallax_examples_blas SYSTEM INTERFACE "${PARALLAX_EXAMPLES_CBLAS_INCLUDE_DIR}")
target_compile_definitions(parallax_examples_blas INTERFACE PARALLAX_EXAMPLES_OPENBLAS=${_px_openblas})

if(PARALLAX_ENABLE_CUDA)
  add_library(parallax_examples_cublas INTERFACE)
  target_link_libraries(parallax_examples_cublas INTERFACE CUDA::cublas)
endif()
