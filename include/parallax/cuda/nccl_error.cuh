#pragma once
/// @file
/// PARALLAX_NCCL_CHECK: turns a failed NCCL call into a parallax::nccl_error
/// carrying NCCL's error string, its last-error text, the call text, file and
/// line. nvcc only, CUDA configurations with NCCL (PARALLAX_HAS_NCCL).

#include <parallax/config.hpp>

#if !PARALLAX_HAS_NCCL
#error "parallax/cuda/nccl_error.cuh needs nvcc and a PARALLAX_ENABLE_CUDA build (NCCL)"
#endif

#include <parallax/error.hpp>

#include <nccl.h>

#include <string>

namespace parallax::detail {

/// Throws nccl_error for `status`. `comm` may be null; NCCL's last-error text
/// (ncclGetLastError, NCCL >= 2.13) is appended when it has one, since it
/// usually says which peer or transport failed.
[[noreturn]] inline void throw_nccl_error(ncclResult_t status, ncclComm_t comm, const char* call, const char* file,
                                          int line) {
  std::string description = ncclGetErrorString(status);
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') {
    description += "; ";
    description += last;
  }
#else
  (void)comm;
#endif
  throw nccl_error("NCCL", static_cast<int>(status), description, call, file, line);
}

/// True for the results that are not failures: ncclSuccess, and ncclInProgress
/// from a non-blocking communicator (its outcome is polled with
/// ncclCommGetAsyncError).
constexpr bool nccl_ok(ncclResult_t status) noexcept { return status == ncclSuccess || status == ncclInProgress; }

}  // namespace parallax::detail

/// Calls an NCCL function and throws parallax::nccl_error when it fails.
#define PARALLAX_NCCL_CHECK(call)                                                                  \
  do {                                                                                             \
    const ncclResult_t parallax_nccl_status_ = (call);                                             \
    if (!::parallax::detail::nccl_ok(parallax_nccl_status_))                                       \
      ::parallax::detail::throw_nccl_error(parallax_nccl_status_, nullptr, #call, __FILE__, __LINE__); \
  } while (0)
