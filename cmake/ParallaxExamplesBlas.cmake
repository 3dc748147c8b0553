# The BLAS of the examples' matrix products, for the examples and the
# benchmarks that run their models: the INTERFACE target
# parallax_examples_blas, which is parallax::nn (<parallax/nn/gemm.hpp>: a
# CBLAS on the host, found by ParallaxFindCBLAS.cmake; cuBLAS in a CUDA
# configuration), and parallax_examples_cublas for the nvcc programs.
include_guard(GLOBAL)

if(NOT TARGET parallax::nn)
  message(FATAL_ERROR "parallax examples: no CBLAS found for parallax::nn (library: ${PARALLAX_CBLAS_LIBRARY}, "
                      "cblas.h: ${PARALLAX_CBLAS_INCLUDE_DIR}); on Debian, scripts/setup.sh installs "
                      "libopenblas-openmp-dev")
endif()
add_library(parallax_examples_blas INTERFACE)
target_link_libraries(parallax_examples_blas INTERFACE parallax::nn)

if(PARALLAX_ENABLE_CUDA)
  add_library(parallax_examples_cublas INTERFACE)
  target_link_libraries(parallax_examples_cublas INTERFACE CUDA::cublas)
endif()
