# The CBLAS of parallax::nn (<parallax/nn/*.hpp>: nn::gemm, nn::DenseLayer),
# as the imported target parallax::cblas. Optional: parallax itself needs no
# BLAS; where none is found the target is missing and so is parallax::nn
# (find_package(parallax COMPONENTS nn) then fails and says why).
#
# OpenBLAS's OpenMP build comes first (Debian: libopenblas-openmp-dev, which
# scripts/setup.sh installs): its threads are the OpenMP team that runs
# parallax's host kernels, so one thread count sizes both and neither team
# spins on a core the other needs. The pthreads build, which libopenblas-dev
# brings by default, keeps a pool of its own beside OpenMP's: two sets of
# threads that wait by spinning, on the same cores (docs/benchmarks.md,
# "Realistic workloads", "Threads"). Debian installs the builds side by side
# and the alternatives system points the plain library name at the pthreads
# one, so the OpenMP build is looked for in its own folder (an executable's
# RUNPATH then keeps it at run time). Any other CBLAS works too, without the
# thread control: set PARALLAX_CBLAS_LIBRARY and PARALLAX_CBLAS_INCLUDE_DIR.
#
# Used by parallax's own CMakeLists.txt and by the installed
# parallax-config.cmake, which searches the consumer's machine afresh.
if(NOT TARGET parallax::cblas)
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
  find_library(PARALLAX_CBLAS_LIBRARY NAMES openblas HINTS ${_px_blas_lib_hints} NO_DEFAULT_PATH)
  find_path(PARALLAX_CBLAS_INCLUDE_DIR cblas.h HINTS ${_px_blas_inc_hints} NO_DEFAULT_PATH)
  # Otherwise any OpenBLAS, then any CBLAS, on the default paths.
  find_library(PARALLAX_CBLAS_LIBRARY NAMES openblas cblas)
  find_path(PARALLAX_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
  unset(_px_blas_lib_hints)
  unset(_px_blas_inc_hints)
  if(PARALLAX_CBLAS_LIBRARY AND PARALLAX_CBLAS_INCLUDE_DIR)
    add_library(parallax::cblas INTERFACE IMPORTED GLOBAL)
    set_target_properties(parallax::cblas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${PARALLAX_CBLAS_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${PARALLAX_CBLAS_INCLUDE_DIR}"
      INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${PARALLAX_CBLAS_INCLUDE_DIR}")
    set(_px_blas_openmp "no")
    if(PARALLAX_CBLAS_LIBRARY MATCHES "openblas-openmp")
      set(_px_blas_openmp "yes")
    endif()
    message(STATUS "parallax::nn: CBLAS ${PARALLAX_CBLAS_LIBRARY} (OpenBLAS's OpenMP build: ${_px_blas_openmp})")
    unset(_px_blas_openmp)
  else()
    message(STATUS "parallax::nn: no CBLAS found (library: ${PARALLAX_CBLAS_LIBRARY}, cblas.h: "
                   "${PARALLAX_CBLAS_INCLUDE_DIR}); on Debian: libopenblas-openmp-dev")
  endif()
endif()
