#pragma once
/// @file
/// The examples' matrix products: parallax::nn::gemm (<parallax/nn/gemm.hpp>:
/// a CBLAS sgemm on the host, cuBLAS on a CUDA Exec's stream), each call
/// charged to Part::gemm of the current StepProfile (profile.hpp):
///
///     gemm(ex, Op::none, Op::transpose, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
///
/// is C = alpha op(A) op(B) + beta C on row-major matrices. What is not a
/// matrix product (gathers, softmax, activations) stays a px::for_each
/// functor. nn/gemm.hpp states what the products promise (threads, bits).

#include "profile.hpp"

#include <parallax/nn/gemm.hpp>
#include <parallax/parallax.hpp>

#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>

namespace examples {

namespace px = parallax;

using px::nn::Op;

/// On rank 0, nn::host_blas_warning() to stderr where there is one: a run
/// whose matrix products use generic kernels is no measure of anything.
inline void warn_about_blas(const px::Context& ctx) {
  if (!ctx.is_root()) return;
  if (const std::string w = px::nn::host_blas_warning(); !w.empty()) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

/// nn::gemm's call, timed as Part::gemm: the type DenseLayer (layers.hpp)
/// runs its products with. On a device the stream is synchronised around
/// the call when a profile is current (profile.hpp).
struct TimedGemm {
  template <class Space>
  void operator()(const px::Exec<Space>& ex, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k,
                  float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                  std::size_t ldc) const {
    const auto call = [&] { px::nn::gemm(ex, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); };
    if constexpr (std::is_same_v<Space, px::HostSpace>)
      timed(Part::gemm, call);
    else
      timed(ex, Part::gemm, call);
  }
};

/// C = alpha op(A) op(B) + beta C (row-major) in ex's space, timed.
template <class Space>
void gemm(const px::Exec<Space>& ex, Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
          const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  TimedGemm{}(ex, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// What runs gemm() in Space, in a few words, for the examples' banners.
template <class Space>
std::string gemm_description() {
  return px::nn::gemm_description<Space>();
}

}  // namespace examples
