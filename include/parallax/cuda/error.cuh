#pragma once
/// @file
/// PARALLAX_CUDA_CHECK: turns a failed CUDA runtime call into a
/// parallax::cuda_error carrying the CUDA error string, the call text, file
/// and line. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/cuda/error.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/error.hpp>

#include <cuda_runtime.h>

#include <string>

namespace parallax::detail {

/// Throws cuda_error for `status`. Clears the thread's last CUDA error first,
/// so a later launch check does not report this (non-sticky) failure again.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line,
                                          const std::string& context = {}) {
  (void)cudaGetLastError();
  std::string description = cudaGetErrorName(status);
  description += ": ";
  description += cudaGetErrorString(status);
  if (!context.empty()) description += "; " + context;
  throw cuda_error("CUDA", static_cast<int>(status), description, call, file, line);
}

}  // namespace parallax::detail

/// Calls a CUDA runtime function and throws parallax::cuda_error when it does
/// not return cudaSuccess. Host code only: device code never throws.
#define PARALLAX_CUDA_CHECK(call)                                                                  \
  do {                                                                                             \
    const cudaError_t parallax_cuda_status_ = (call);                                              \
    if (parallax_cuda_status_ != cudaSuccess)                                                      \
      ::parallax::detail::throw_cuda_error(parallax_cuda_status_, #call, __FILE__, __LINE__);      \
  } while (0)
