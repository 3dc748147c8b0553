#pragma once
/// @file
/// Matrix products for the examples, written once for every memory space:
///
///     gemm(ex, Op::none, Op::transpose, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
///
/// is C = alpha op(A) op(B) + beta C on row-major matrices (op(A) m x k,
/// op(B) k x n, C m x n, each with its leading dimension), run by a CBLAS
/// sgemm on the host (OpenBLAS, examples/CMakeLists.txt) and by cuBLAS on a
/// CUDA Exec's stream (nvcc builds), in order with the trainer's own work
/// on that stream. What is not a matrix product (gathers, softmax,
/// activations) stays a px::for_each functor. Each call is charged to
/// Part::gemm of the current StepProfile (profile.hpp).
///
/// This is the examples' code, not parallax's: parallax moves and updates
/// gradients, and the model's math is the user's, in whatever BLAS or
/// framework they already use. A library function would make every user of
/// parallax link a BLAS they may not want.
///
/// Threads (host): the product runs on omp_get_max_threads() threads, the
/// count parallax::Context sets from ContextOptions::threads (the examples'
/// --threads). With OpenBLAS's OpenMP build those are the very threads of
/// parallax's for_each; with its pthreads build, a pool of their size.
///
/// Determinism: a product's bits depend on its shape, the BLAS build and the
/// CPU it picks kernels for, and, on the host, on the thread count (OpenBLAS
/// splits a long inner dimension differently on one thread and on several).
/// Runs with the same shapes and thread counts give the same bits, run
/// after run; changing --threads or the rank count changes the rounding
/// (float tolerance), as the batch split over the ranks already does.

#include "profile.hpp"

#include <parallax/parallax.hpp>

#include <cblas.h>
#include <omp.h>

#if PARALLAX_HAS_CUDA
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

namespace examples {

namespace px = parallax;

/// op(X) of a gemm operand: X itself or its transpose.
enum class Op { none, transpose };

namespace detail {

inline CBLAS_TRANSPOSE cblas_op(Op op) { return op == Op::none ? CblasNoTrans : CblasTrans; }

/// A leading dimension BLAS accepts: at least 1 even for an empty matrix.
inline int blas_ld(std::size_t ld) { return static_cast<int>(std::max<std::size_t>(ld, 1)); }

/// Sizes the BLAS's threads like the calling thread's OpenMP team.
inline void follow_openmp_threads() {
#if PARALLAX_EXAMPLES_OPENBLAS
  const int threads = omp_get_max_threads();
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
#endif
}

}  // namespace detail

/// C = alpha op(A) op(B) + beta C (row-major), on the host. k == 0 sets C to
/// beta C.
inline void gemm(const px::Exec<px::HostSpace>&, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  detail::follow_openmp_threads();
  timed(Part::gemm, [&] {
    cblas_sgemm(CblasRowMajor, detail::cblas_op(op_a), detail::cblas_op(op_b), static_cast<int>(m),
                static_cast<int>(n), static_cast<int>(k), alpha, a, detail::blas_ld(lda), b, detail::blas_ld(ldb), beta,
                c, detail::blas_ld(ldc));
  });
}

#if PARALLAX_HAS_CUDA
namespace detail {

/// Throws parallax's runtime_call_error for a failed cuBLAS call.
inline void cublas_check(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw px::runtime_call_error("cuBLAS", static_cast<int>(status), cublasGetStatusString(status), call, __FILE__, line);
}

/// This thread's cuBLAS handle for the current device, made at first use.
/// Handles are never destroyed: a handle freed at exit may outlive the CUDA
/// runtime it belongs to (PyTorch keeps its handles for the same reason).
inline cublasHandle_t cublas_handle() {
  thread_local std::vector<cublasHandle_t> handles;
  int device = 0;
  PARALLAX_CUDA_CHECK(cudaGetDevice(&device));
  const auto d = static_cast<std::size_t>(device);
  if (handles.size() <= d) handles.resize(d + 1, nullptr);
  if (!handles[d]) cublas_check(cublasCreate(&handles[d]), "cublasCreate", __LINE__);
  return handles[d];
}

inline cublasOperation_t cublas_op(Op op) { return op == Op::none ? CUBLAS_OP_N : CUBLAS_OP_T; }

}  // namespace detail

/// C = alpha op(A) op(B) + beta C (row-major), on ex's stream: cuBLAS's
/// column-major C^T = op(B)^T op(A)^T. FP32 arithmetic (cuBLAS's default
/// math mode: no TF32), so results match the host's to float tolerance.
inline void gemm(const px::Exec<px::CudaSpace>& ex, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const cublasHandle_t handle = detail::cublas_handle();
  detail::cublas_check(cublasSetStream(handle, ex.stream()), "cublasSetStream", __LINE__);
  timed(ex, Part::gemm, [&] {
    detail::cublas_check(cublasSgemm(handle, detail::cublas_op(op_b), detail::cublas_op(op_a), static_cast<int>(n),
                                     static_cast<int>(m), static_cast<int>(k), &alpha, b, detail::blas_ld(ldb), a,
                                     detail::blas_ld(lda), &beta, c, detail::blas_ld(ldc)),
                         "cublasSgemm", __LINE__);
  });
}
#endif

/// What runs gemm() in Space, in a few words, for the examples' banners:
/// the host BLAS's build, kernels and threads now, or cuBLAS.
template <class Space>
std::string gemm_description() {
  if constexpr (!std::is_same_v<Space, px::HostSpace>) {
    return "cuBLAS";
  } else {
#if PARALLAX_EXAMPLES_OPENBLAS
    detail::follow_openmp_threads();
    const int parallel = openblas_get_parallel(), threads = openblas_get_num_threads();
    char text[200];
    std::snprintf(text, sizeof text, "OpenBLAS (%s build, %s kernels) on %d thread%s",
                  parallel == 2 ? "OpenMP" : parallel == 1 ? "pthreads" : "single-threaded", openblas_get_corename(),
                  threads, threads == 1 ? "" : "s");
    return text;
#else
    return "CBLAS";
#endif
  }
}

}  // namespace examples
