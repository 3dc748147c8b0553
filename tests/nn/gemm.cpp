// Tests of include/parallax/nn/gemm.hpp: nn::gemm against a plain triple
// loop in double, for every pair of transposes, odd shapes, padded leading
// dimensions, alpha and beta, and an empty inner dimension; the same bits run
// to run; another thread count within float tolerance.
#include "support.hpp"

#include <parallax/nn/gemm.hpp>

#include "common/synthetic.hpp"  // examples::uniform_floats: the examples' data, as they multiply it

#include <omp.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using parallax::nn::Op;
using examples::uniform_floats;

const px::Exec<px::HostSpace> host;

// A gemm problem with operands stored row-major with padded leading
// dimensions (cols + pad).
struct Problem {
  Op op_a, op_b;
  std::size_t m, n, k, pad;
  float alpha, beta;
  std::size_t lda() const { return (op_a == Op::none ? k : m) + pad; }
  std::size_t ldb() const { return (op_b == Op::none ? n : k) + pad; }
  std::size_t ldc() const { return n + pad; }
  // op(A)[i, l] and op(B)[l, j]
  float a_at(const std::vector<float>& a, std::size_t i, std::size_t l) const {
    return op_a == Op::none ? a[i * lda() + l] : a[l * lda() + i];
  }
  float b_at(const std::vector<float>& b, std::size_t l, std::size_t j) const {
    return op_b == Op::none ? b[l * ldb() + j] : b[j * ldb() + l];
  }
};

std::vector<float> run(const Problem& p, const std::vector<float>& a, const std::vector<float>& b, std::vector<float> c) {
  px::nn::gemm(host, p.op_a, p.op_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), b.data(), p.ldb(), p.beta, c.data(),
                 p.ldc());
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("gemm: C = alpha op(A) op(B) + beta C, row-major, as a triple loop gives it", "[nn][gemm]") {
  const auto op_a = GENERATE(Op::none, Op::transpose);
  const auto op_b = GENERATE(Op::none, Op::transpose);
  const auto shape = GENERATE(std::vector<std::size_t>{1, 1, 1}, std::vector<std::size_t>{7, 5, 3},
                              std::vector<std::size_t>{33, 17, 65}, std::vector<std::size_t>{64, 129, 1000},
                              std::vector<std::size_t>{5, 3, 0});
  const auto pad = GENERATE(std::size_t{0}, std::size_t{3});
  const auto scale = GENERATE(std::vector<float>{1.0f, 0.0f}, std::vector<float>{0.5f, 2.0f});
  const Problem p{op_a, op_b, shape[0], shape[1], shape[2], pad, scale[0], scale[1]};
  INFO("op_a " << int(op_a) << ", op_b " << int(op_b) << ", m n k " << p.m << " " << p.n << " " << p.k << ", pad " << pad
               << ", alpha " << p.alpha << ", beta " << p.beta);
  const std::size_t a_rows = op_a == Op::none ? p.m : p.k, b_rows = op_b == Op::none ? p.k : p.n;
  const std::vector<float> a = uniform_floats(a_rows * p.lda(), 1), b = uniform_floats(b_rows * p.ldb(), 2);
  const std::vector<float> c0 = uniform_floats(p.m * p.ldc(), 3);
  const std::vector<float> c = run(p, a, b, c0);
  for (std::size_t i = 0; i < p.m; ++i) {
    for (std::size_t j = 0; j < p.ldc(); ++j) {
      const std::size_t e = i * p.ldc() + j;
      if (j >= p.n) {  // the padding is left alone
        CHECK(c[e] == c0[e]);
        continue;
      }
      double s = 0;
      for (std::size_t l = 0; l < p.k; ++l) s += static_cast<double>(p.a_at(a, i, l)) * p.b_at(b, l, j);
      CHECK(c[e] == Approx(p.alpha * s + p.beta * static_cast<double>(c0[e])).epsilon(1e-5).margin(1e-4));
    }
  }
  CHECK(same_bits(c, run(p, a, b, c0)));  // run to run
}

// CTest runs it alone (nn_gemm_needs_blas_threads_np1): it skips where the
// BLAS will not take two threads.
TEST_CASE("gemm: another thread count rounds the sums differently, within float tolerance",
          "[nn][gemm][needs-blas-threads]") {
  // The promise is the same bits for the same thread count (nn/gemm.hpp); a long
  // inner dimension is where OpenBLAS's split changes with the threads.
  const Problem p{Op::none, Op::none, 256, 128, 8700, 0, 1.0f, 0.0f};
  const std::vector<float> a = uniform_floats(p.m * p.k, 4), b = uniform_floats(p.k * p.n, 5), c0(p.m * p.n);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run(p, a, b, c0);
  omp_set_num_threads(2);
  const std::vector<float> two = run(p, a, b, c0);
#if PARALLAX_NN_OPENBLAS
  const int blas_threads = openblas_get_num_threads();
#else
  const int blas_threads = 0;  // a CBLAS without a thread count to read
#endif
  omp_set_num_threads(threads);
  if (test::skip_unless(blas_threads >= 2, "the BLAS ran on " + std::to_string(blas_threads) +
                                              " threads where two were asked for: nothing to compare"))
    return;
  for (std::size_t i = 0; i < one.size(); ++i) CHECK(one[i] == Approx(two[i]).epsilon(1e-5).margin(1e-4));
}

// OpenBLAS picks its kernels when it is loaded, from OPENBLAS_CORETYPE where
// set: CTest runs this case alone with OPENBLAS_CORETYPE=Prescott
// (nn_gemm_needs_blas_prescott_np1), the generic kernels OpenBLAS before
// 0.3.25 falls back to on Intel models it does not know.
TEST_CASE("host_blas_warning: generic kernels on a CPU with AVX2 or AVX-512 name the kernels to ask for",
          "[nn][gemm][needs-blas-prescott]") {
#if !PARALLAX_NN_OPENBLAS || !defined(__x86_64__)
  test::skip_unless(false, "the CBLAS is not OpenBLAS on x86-64: it names no kernels");
#else
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (test::skip_unless(forced && std::string(forced) == "Prescott", "run it with OPENBLAS_CORETYPE=Prescott")) return;
  CHECK(parallax::nn::host_blas_core() == "Prescott");
  const std::string warning = parallax::nn::host_blas_warning();
  INFO(warning);
  if (__builtin_cpu_supports("avx512f")) {
    CHECK(warning.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
    CHECK(warning.find("AVX-512") != std::string::npos);
  } else if (__builtin_cpu_supports("avx2")) {
    CHECK(warning.find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
  } else {
    CHECK(warning.empty());  // nothing wider to run
  }
#endif
}

// Run alone with OPENBLAS_CORETYPE=Haswell (nn_gemm_needs_blas_haswell_np1):
// kernels for the CPU's AVX2, nothing to warn about.
TEST_CASE("host_blas_warning: kernels for the CPU's vector units give no warning", "[nn][gemm][needs-blas-haswell]") {
#if !PARALLAX_NN_OPENBLAS || !defined(__x86_64__)
  test::skip_unless(false, "the CBLAS is not OpenBLAS on x86-64: it names no kernels");
#else
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (test::skip_unless(forced && std::string(forced) == "Haswell", "run it with OPENBLAS_CORETYPE=Haswell")) return;
  if (test::skip_unless(__builtin_cpu_supports("avx2"), "this CPU has no AVX2 for Haswell's kernels")) return;
  CHECK(parallax::nn::host_blas_core() == "Haswell");
  CHECK(parallax::nn::host_blas_warning().empty());
#endif
}
