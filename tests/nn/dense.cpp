// Tests of include/parallax/nn/dense.hpp: DenseLayer's forward and backward
// against the hand-written functors the examples ran before their products
// went to a BLAS (examples/common/tests/reference_layers.hpp), within float
// tolerance, for each activation, empty and odd batches; the bias gradient's
// tiles against each other, bit for bit.
#include "support.hpp"

#include <parallax/nn/dense.hpp>

#include "common/synthetic.hpp"               // examples::uniform_floats
#include "common/tests/reference_layers.hpp"  // examples::reference

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace {

using examples::uniform_floats;

const px::Exec<px::HostSpace> host;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("DenseLayer: forward and backward through nn::gemm match the hand-written functors", "[nn][dense]") {
  using px::nn::Activation;
  namespace ref = examples::reference;
  const auto act = GENERATE(Activation::none, Activation::relu, Activation::tanh);
  const auto rows = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{33});
  const auto in = GENERATE(std::size_t{3}, std::size_t{13});
  const auto out = GENERATE(std::size_t{1}, std::size_t{7}, std::size_t{17}, std::size_t{40});
  INFO("activation " << int(act) << ", rows " << rows << ", in " << in << ", out " << out);
  px::nn::DenseLayer<px::HostSpace> layer(test::world(), "dense", in, out, act, 9);
  const std::vector<float> b = uniform_floats(out, 10);
  std::copy(b.begin(), b.end(), layer.b.state().value.data());  // a bias that is not zero
  const std::vector<float> x = uniform_floats(rows * in, 11), dy = uniform_floats(rows * out, 12);

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
  px::for_each(host, rows * out, px::nn::ActivationBackward<float>{ref_y.data(), ref_dy.data(), act});
  px::for_each(host, in + 1, ref::DenseBackwardWeight<float>{x.data(), ref_dy.data(), ref_dw.data(), ref_db.data(), rows, in, out});
  px::for_each(host, rows * in, ref::DenseBackwardInput<float>{ref_dy.data(), layer.w.value().data(), ref_dx.data(), in, out});
  const float* dw = layer.w.grad().data();
  const float* db = layer.b.grad().data();
  for (std::size_t e = 0; e < in * out; ++e) CHECK(dw[e] == Approx(ref_dw[e]).epsilon(1e-5).margin(1e-5));
  for (std::size_t o = 0; o < out; ++o) CHECK(db[o] == Approx(ref_db[o]).epsilon(1e-5).margin(1e-5));
  for (std::size_t e = 0; e < rows * in; ++e) CHECK(dx[e] == Approx(ref_dx[e]).epsilon(1e-5).margin(1e-5));
}

TEST_CASE("ColumnSums: every tile adds the same terms in the same order", "[nn][dense]") {
  const std::size_t rows = 37;
  const auto cols = GENERATE(std::size_t{1}, std::size_t{15}, std::size_t{16}, std::size_t{41});
  const std::vector<float> m = uniform_floats(rows * cols, 13);
  auto sums = [&](auto functor) {
    std::vector<float> s(cols, -7.0f);
    functor.m = m.data();
    functor.sums = s.data();
    functor.rows = rows;
    functor.cols = cols;
    px::for_each(host, decltype(functor)::calls(cols), functor);
    return s;
  };
  const std::vector<float> one = sums(px::nn::ColumnSums<float, 1>{}), sixteen = sums(px::nn::ColumnSums<float, 16>{}),
                           five = sums(px::nn::ColumnSums<float, 5>{});
  CHECK(same_bits(one, sixteen));
  CHECK(same_bits(one, five));
  for (std::size_t c = 0; c < cols; ++c) {
    float s = 0;
    for (std::size_t r = 0; r < rows; ++r) s += m[r * cols + c];
    CHECK(one[c] == s);
  }
}
