#pragma once
/// @file
/// parallax::nn (optional, needs a CBLAS; target parallax::nn): matrix
/// products written once for every memory space,
///
///     nn::gemm(ex, nn::Op::none, nn::Op::transpose, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
///
/// is C = alpha op(A) op(B) + beta C on row-major float matrices (op(A)
/// m x k, op(B) k x n, C m x n, each with its leading dimension), run by a
/// CBLAS sgemm on the host and by cuBLAS on a CUDA Exec's stream (nvcc
/// builds), in order with the trainer's own work on that stream.
///
/// parallax itself needs no BLAS: this header set is the model's math for
/// users who have none of their own (the examples use it); include it, and
/// link parallax::nn (`find_package(parallax COMPONENTS nn)`), which brings a
/// CBLAS (OpenBLAS's OpenMP build preferred) and, in CUDA configurations,
/// cuBLAS.
///
/// Threads (host): the product runs on omp_get_max_threads() threads, the
/// count parallax::Context sets from ContextOptions::threads. With OpenBLAS's
/// OpenMP build those are the very threads of parallax's for_each; with its
/// pthreads build, a pool of their size.
///
/// Determinism: a product's bits depend on its shape, the BLAS build and the
/// CPU it picks kernels for, and, on the host, on the thread count (OpenBLAS
/// splits a long inner dimension differently on one thread and on several).
/// Runs with the same shapes and thread counts give the same bits, run after
/// run; another thread or rank count changes the rounding (float tolerance).

#include <parallax/config.hpp>
#include <parallax/space.hpp>

#include <cblas.h>
#include <omp.h>

#if PARALLAX_HAS_CUDA
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/space.cuh>

#include <cublas_v2.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

/// 1 where the CBLAS is OpenBLAS (its cblas.h defines OPENBLAS_VERSION):
/// gemm then sizes OpenBLAS's threads like the caller's OpenMP team.
#if defined(OPENBLAS_VERSION)
#define PARALLAX_NN_OPENBLAS 1
#else
#define PARALLAX_NN_OPENBLAS 0
#endif

namespace parallax::nn {

/// op(X) of a gemm operand: X itself or its transpose.
enum class Op { none, transpose };

/// The kernels the host CBLAS picked for this CPU, as it names them
/// (OpenBLAS: openblas_get_corename(), e.g. "SkylakeX", "Haswell", "Zen"),
/// or "" where the CBLAS does not say.
inline std::string host_blas_core() {
#if PARALLAX_NN_OPENBLAS
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string();
#else
  return {};
#endif
}

/// A warning where the host CBLAS runs generic SSE3 kernels on a CPU with
/// AVX2 or AVX-512, naming the fix; "" otherwise. OpenBLAS's runtime CPU
/// detection before 0.3.25 (OpenBLAS issue 4267) takes Intel models it does
/// not know, Emerald Rapids among them (Debian 12's 0.3.21), for Prescott,
/// whose sgemm ran 02_ctr's products at about half the speed of its AVX-512
/// kernels there (docs/benchmarks.md, "BLAS kernels"). The variable it names
/// must be set before the program starts: OpenBLAS picks its kernels when
/// it is loaded.
inline std::string host_blas_warning() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  std::string core = host_blas_core();
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (core != "prescott") return {};
  const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
  if (!avx512 && !avx2) return {};
  return std::string("the BLAS (OpenBLAS) runs its generic Prescott (SSE3) kernels on this CPU, which has ") +
         (avx512 ? "AVX-512" : "AVX2") +
         ": matrix products run at a fraction of their speed. OpenBLAS before 0.3.25 does not know this CPU model; "
         "run with OPENBLAS_CORETYPE=" + (avx512 ? "SkylakeX" : "Haswell") + " in the environment";
#else
  return {};
#endif
}

namespace detail {

inline CBLAS_TRANSPOSE cblas_op(Op op) { return op == Op::none ? CblasNoTrans : CblasTrans; }

/// A leading dimension BLAS accepts: at least 1 even for an empty matrix.
inline int blas_ld(std::size_t ld) { return static_cast<int>(std::max<std::size_t>(ld, 1)); }

/// Sizes the BLAS's threads like the calling thread's OpenMP team.
inline void follow_openmp_threads() {
#if PARALLAX_NN_OPENBLAS
  const int threads = omp_get_max_threads();
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
#endif
}

}  // namespace detail

/// C = alpha op(A) op(B) + beta C (row-major), on the host. k == 0 sets C to
/// beta C.
inline void gemm(const Exec<HostSpace>&, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  detail::follow_openmp_threads();
  cblas_sgemm(CblasRowMajor, detail::cblas_op(op_a), detail::cblas_op(op_b), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, detail::blas_ld(lda), b, detail::blas_ld(ldb), beta, c,
              detail::blas_ld(ldc));
}

#if PARALLAX_HAS_CUDA
namespace detail {

/// Throws parallax's runtime_call_error for a failed cuBLAS call.
inline void cublas_check(cublasStatus_t status, const char* call, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw runtime_call_error("cuBLAS", static_cast<int>(status), cublasGetStatusString(status), call, __FILE__, line);
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
inline void gemm(const Exec<CudaSpace>& ex, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const cublasHandle_t handle = detail::cublas_handle();
  detail::cublas_check(cublasSetStream(handle, ex.stream()), "cublasSetStream", __LINE__);
  detail::cublas_check(cublasSgemm(handle, detail::cublas_op(op_b), detail::cublas_op(op_a), static_cast<int>(n),
                                   static_cast<int>(m), static_cast<int>(k), &alpha, b, detail::blas_ld(ldb), a,
                                   detail::blas_ld(lda), &beta, c, detail::blas_ld(ldc)),
                       "cublasSgemm", __LINE__);
}
#endif

/// The default product of nn::DenseLayer: nn::gemm. A layer takes another type
/// with the same call operator to time, count or replace its products.
struct Gemm {
  template <class Space>
  void operator()(const Exec<Space>& ex, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                  const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                  std::size_t ldc) const {
    gemm(ex, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

/// What runs gemm() in Space, in a few words (for a program's banner): the
/// host BLAS's build, kernels and threads now, or cuBLAS.
template <class Space>
std::string gemm_description() {
  if constexpr (!std::is_same_v<Space, HostSpace>) {
    return "cuBLAS";
  } else {
#if PARALLAX_NN_OPENBLAS
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

}  // namespace parallax::nn
