// Unit tests of the examples' dense math (examples/common/gemm.hpp,
// layers.hpp): gemm against a plain triple loop in double, for every pair of
// transposes, odd shapes, padded leading dimensions, alpha and beta, and an
// empty inner dimension; the same bits run to run; DenseLayer's forward and
// backward against the hand-written functors it replaced
// (tests/reference_layers.hpp) within float tolerance; and the bias
// gradient's tiles against each other, bit for bit. One process: run under
// mpiexec -n 1 (DenseLayer's weights are parallax variables).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/gemm.hpp"
#include "common/layers.hpp"
#include "common/synthetic.hpp"
#include "common/tests/reference_layers.hpp"

#include <omp.h>

#include <cstddef>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace px = parallax;
using examples::Op;

namespace {

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
  examples::gemm(host, p.op_a, p.op_b, p.m, p.n, p.k, p.alpha, a.data(), p.lda(), b.data(), p.ldb(), p.beta, c.data(),
                 p.ldc());
  return c;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

px::Context* job = nullptr;  // main's
px::Context& context() { return *job; }

// The tests' skip convention (docs/testing.md, "Skipped checks"), for this
// one-process program: a case that cannot check here prints why and returns;
// main exits with 77 unless a check failed, which CTest reports as Skipped.
bool skipped = false;
void skip(const std::string& why) {
  skipped = true;
  std::cout << "SKIPPED: " << Catch::getResultCapture().getCurrentTestName() << ": " << why << std::endl;
}

}  // namespace

TEST_CASE("gemm: C = alpha op(A) op(B) + beta C, row-major, as a triple loop gives it", "[examples][gemm]") {
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
  const std::vector<float> a = examples::uniform_floats(a_rows * p.lda(), 1), b = examples::uniform_floats(b_rows * p.ldb(), 2);
  const std::vector<float> c0 = examples::uniform_floats(p.m * p.ldc(), 3);
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

// CTest runs it alone (examples_layers_needs_blas_threads): it skips where the
// BLAS will not take two threads.
TEST_CASE("gemm: another thread count rounds the sums differently, within float tolerance",
          "[examples][gemm][needs-blas-threads]") {
  // The promise is the same bits for the same thread count (gemm.hpp); a long
  // inner dimension is where OpenBLAS's split changes with the threads.
  const Problem p{Op::none, Op::none, 256, 128, 8700, 0, 1.0f, 0.0f};
  const std::vector<float> a = examples::uniform_floats(p.m * p.k, 4), b = examples::uniform_floats(p.k * p.n, 5), c0(p.m * p.n);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = run(p, a, b, c0);
  omp_set_num_threads(2);
  const std::vector<float> two = run(p, a, b, c0);
#if PARALLAX_EXAMPLES_OPENBLAS
  const int blas_threads = openblas_get_num_threads();
#else
  const int blas_threads = 0;  // a CBLAS without a thread count to read
#endif
  omp_set_num_threads(threads);
  if (blas_threads < 2) {
    skip("the BLAS ran on " + std::to_string(blas_threads) + " threads where two were asked for: nothing to compare");
    return;
  }
  for (std::size_t i = 0; i < one.size(); ++i) CHECK(one[i] == Approx(two[i]).epsilon(1e-5).margin(1e-4));
}

TEST_CASE("DenseLayer: forward and backward through gemm match the hand-written functors", "[examples][layers]") {
  using examples::Activation;
  namespace ref = examples::reference;
  const auto act = GENERATE(Activation::none, Activation::relu, Activation::tanh);
  const auto rows = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{33});
  const auto in = GENERATE(std::size_t{3}, std::size_t{13});
  const auto out = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{17}, std::size_t{40});
  INFO("activation " << int(act) << ", rows " << rows << ", in " << in << ", out " << out);
  examples::DenseLayer<px::HostSpace> layer(context(), "dense", in, out, act, 9);
  const std::vector<float> b = examples::uniform_floats(out, 10);
  std::copy(b.begin(), b.end(), layer.b.state().value.data());  // a bias that is not zero
  const std::vector<float> x = examples::uniform_floats(rows * in, 11), dy = examples::uniform_floats(rows * out, 12);

  const float* y = layer.forward(host, x.data(), rows);
  std::vector<float> ref_y(rows * out);
  px::for_each(host, rows, ref::DenseForward<float>{x.data(), layer.w.value().data(), b.data(), ref_y.data(), in, out, act});
  for (std::size_t e = 0; e < rows * out; ++e) CHECK(y[e] == Approx(ref_y[e]).epsilon(1e-5).margin(1e-6));

  std::copy(dy.begin(), dy.end(), layer.output_grad());
  std::vector<float> dx(rows * in, -7.0f);
  layer.w.grad().zero();
  layer.b.grad().zero();
  layer.backward(host, x.data(), rows, dx.data());

  std::vector<float> ref_dy = dy, ref_dw(in * out, -7.0f), ref_db(out, -7.0f), ref_dx(rows * in);
  px::for_each(host, rows * out, examples::ActivationBackward<float>{ref_y.data(), ref_dy.data(), act});
  px::for_each(host, in + 1, ref::DenseBackwardWeight<float>{x.data(), ref_dy.data(), ref_dw.data(), ref_db.data(), rows, in, out});
  px::for_each(host, rows * in, ref::DenseBackwardInput<float>{ref_dy.data(), layer.w.value().data(), ref_dx.data(), in, out});
  const float* dw = layer.w.grad().data();
  const float* db = layer.b.grad().data();
  for (std::size_t e = 0; e < in * out; ++e) CHECK(dw[e] == Approx(ref_dw[e]).epsilon(1e-5).margin(1e-5));
  for (std::size_t o = 0; o < out; ++o) CHECK(db[o] == Approx(ref_db[o]).epsilon(1e-5).margin(1e-5));
  for (std::size_t e = 0; e < rows * in; ++e) CHECK(dx[e] == Approx(ref_dx[e]).epsilon(1e-5).margin(1e-5));
}

TEST_CASE("ColumnSums: every tile adds the same terms in the same order", "[examples][layers]") {
  const std::size_t rows = 37;
  const auto cols = GENERATE(std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{41});
  const std::vector<float> m = examples::uniform_floats(rows * cols, 13);
  auto sums = [&](auto functor) {
    std::vector<float> s(cols, -7.0f);
    functor.m = m.data();
    functor.sums = s.data();
    functor.rows = rows;
    functor.cols = cols;
    px::for_each(host, decltype(functor)::calls(cols), functor);
    return s;
  };
  const std::vector<float> one = sums(examples::ColumnSums<float, 1>{}), sixteen = sums(examples::ColumnSums<float, 16>{}),
                           five = sums(examples::ColumnSums<float, 5>{});
  CHECK(same_bits(one, sixteen));
  CHECK(same_bits(one, five));
  for (std::size_t c = 0; c < cols; ++c) {
    float s = 0;
    for (std::size_t r = 0; r < rows; ++r) s += m[r * cols + c];
    CHECK(one[c] == s);
  }
}

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  job = &ctx;
  const int status = Catch::Session().run(argc, argv);
  return status == 0 && skipped ? 77 : status;
}
