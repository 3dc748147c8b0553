// optim/: each optimizer's dense and lazy (row) update against the formula,
// written out in double precision, in host and device memory.
#include "support.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

// Three steps of one element with gradients g_t, by the textbook formula.
// Weight decay is decoupled: the weight shrinks by lr * decay of its value
// before the step, apart from the gradient (SGDW, AdamW).
double reference(const px::optim::Sgd& o, double w, const double* g, int steps) {
  for (int t = 0; t < steps; ++t) w -= o.lr * g[t] + o.lr * o.weight_decay * w;
  return w;
}
double reference(const px::optim::Momentum& o, double w, const double* g, int steps) {
  double v = 0;
  for (int t = 0; t < steps; ++t) {
    const double before = w;
    v = o.momentum * v + g[t];
    w -= o.nesterov ? o.lr * (g[t] + o.momentum * v) : o.lr * v;
    w -= o.lr * o.weight_decay * before;
  }
  return w;
}
double reference(const px::optim::Adagrad& o, double w, const double* g, int steps) {
  double a = o.initial_accumulator;
  for (int t = 0; t < steps; ++t) {
    a += g[t] * g[t];
    w -= o.lr * g[t] / (std::sqrt(a) + o.eps);
  }
  return w;
}
double reference(const px::optim::Adam& o, double w, const double* g, int steps) {
  double m = 0, v = 0;
  for (int t = 1; t <= steps; ++t) {
    m = o.beta1 * m + (1 - o.beta1) * g[t - 1];
    v = o.beta2 * v + (1 - o.beta2) * g[t - 1] * g[t - 1];
    // TensorFlow's form: the bias corrections folded into the step size.
    const double lr_t = o.lr * std::sqrt(1 - std::pow(double(o.beta2), t)) / (1 - std::pow(double(o.beta1), t));
    const double before = w;
    w -= lr_t * m / (std::sqrt(v) + o.eps);
    w -= o.lr * o.weight_decay * before;
  }
  return w;
}

template <class Space, class Opt>
void check_optimizer(const Opt& opt) {
  px::Exec<Space> ex;
  const double g[3] = {0.5, -1.25, 2.0};
  const double scale = 0.5;
  // Dense: 4 elements, element i sees gradient (i+1) * g_t.
  const std::vector<double> w0{1.0, -2.0, 3.0, 0.25};
  auto w_in_space = px::Buffer<double, Space>::from_host(w0);
  px::optim::State<Opt, double, Space> state(opt, w0.size());
  for (int t = 0; t < 3; ++t) {
    std::vector<double> grad(4);
    for (int i = 0; i < 4; ++i) grad[i] = (i + 1) * g[t] / scale;
    const auto grad_in_space = px::Buffer<double, Space>::from_host(grad);
    px::optim::apply_dense(ex, opt, t + 1, w_in_space.data(), grad_in_space.data(), 4, state, scale);
  }
  const auto w = w_in_space.to_host();
  for (int i = 0; i < 4; ++i) {
    const double gi[3] = {(i + 1) * g[0], (i + 1) * g[1], (i + 1) * g[2]};
    CHECK(w[i] == Approx(reference(opt, w0[i], gi, 3)).epsilon(1e-12));
  }

  // Lazy: a 3 x 2 table; only row 1 is touched, rows 0 and 2 keep value and state.
  auto table_in_space = px::Buffer<double, Space>::from_host({1, 2, 3, 4, 5, 6});
  px::optim::State<Opt, double, Space> rows_state(opt, table_in_space.size());
  const auto row = px::Buffer<px::index_t, Space>::from_host({1});
  for (int t = 0; t < 3; ++t) {
    const auto grad = px::Buffer<double, Space>::from_host({g[t], -g[t]});
    px::optim::apply_rows(ex, opt, t + 1, table_in_space.data(), row.data(), grad.data(), 1, 2, rows_state, 1.0);
  }
  const auto table = table_in_space.to_host();
  CHECK(table[0] == 1);
  CHECK(table[1] == 2);
  CHECK(table[4] == 5);
  CHECK(table[5] == 6);
  const double neg[3] = {-g[0], -g[1], -g[2]};
  CHECK(table[2] == Approx(reference(opt, 3, g, 3)).epsilon(1e-12));
  CHECK(table[3] == Approx(reference(opt, 4, neg, 3)).epsilon(1e-12));
  for (int k = 0; k < Opt::slots; ++k) {
    const auto slot = rows_state.buffer(k).to_host();
    CHECK(slot[0] == opt.template slot_initial<double>(k));
    CHECK(slot[5] == opt.template slot_initial<double>(k));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("optimizers follow their formulas, densely and lazily", "[optim]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  SECTION("sgd") { check_optimizer<Space>(px::optim::Sgd{0.1f}); }
  SECTION("momentum") { check_optimizer<Space>(px::optim::Momentum{0.1f, 0.8f}); }
  SECTION("nesterov") { check_optimizer<Space>(px::optim::Momentum{0.1f, 0.8f, true}); }
  SECTION("adagrad") { check_optimizer<Space>(px::optim::Adagrad{0.1f, 0.1f, 1e-7f}); }
  SECTION("adam") { check_optimizer<Space>(px::optim::Adam{0.1f, 0.9f, 0.999f, 1e-8f}); }
  SECTION("sgd with weight decay") { check_optimizer<Space>(px::optim::Sgd{0.1f, 0.25f}); }
  SECTION("momentum with weight decay") { check_optimizer<Space>(px::optim::Momentum{0.1f, 0.8f, false, 0.25f}); }
  SECTION("adamw") { check_optimizer<Space>(px::optim::Adam{0.1f, 0.9f, 0.999f, 1e-8f, 0.25f}); }
}

TEST_CASE("optimizer state starts at the slot's initial value", "[optim]") {
  px::optim::State<px::optim::Adagrad, float, px::HostSpace> s(px::optim::Adagrad{0.1f, 0.25f}, 3);
  CHECK(s.buffer(0).to_host() == std::vector<float>(3, 0.25f));
  CHECK(s.slot(1) == nullptr);
  px::optim::State<px::optim::Sgd, float, px::HostSpace> none(px::optim::Sgd{}, 3);
  CHECK(none.slot(0) == nullptr);
}

TEST_CASE("schedules give the factor of each step", "[optim][schedule]") {
  CHECK(px::schedule::Constant{}(7) == 1.0);
  const px::schedule::LinearWarmup warm{4};
  CHECK(warm(1) == 0.25);
  CHECK(warm(4) == 1.0);
  CHECK(warm(9) == 1.0);
  const px::schedule::StepDecay decay{3, 0.5};
  CHECK(decay(1) == 1.0);
  CHECK(decay(3) == 1.0);
  CHECK(decay(4) == 0.5);
  CHECK(decay(7) == 0.25);
  const px::schedule::Cosine cosine{10, 0.1};
  CHECK(cosine(0) == Approx(1.0));
  CHECK(cosine(5) == Approx(0.55));
  CHECK(cosine(10) == Approx(0.1));
  CHECK(cosine(20) == Approx(0.1));
  const px::schedule::Warmup<px::schedule::Cosine> both{2, {10, 0.0}};
  CHECK(both(1) == 0.5);
  CHECK(both(2) == 1.0);
  CHECK(both(3) == Approx(px::schedule::Cosine{10, 0.0}(1)));
  CHECK(both(12) == Approx(0.0).margin(1e-12));
}

TEMPLATE_TEST_CASE("the row and dense kernels give the rule's bits, with decay or without", "[optim]", px::optim::Sgd,
                   px::optim::Momentum, px::optim::Adam, px::optim::Adagrad) {
  // The kernels pick the rule's update<Decay> once per call (so their loops
  // vectorise); element by element, operator() tests the decay itself. The
  // row kernels run the clone for the CPU's vector level (space.hpp,
  // PARALLAX_HOST_ISA_CLONES), the reference this file's baseline code: the
  // same bits, as no multiply-add is fused.
  for (const float decay : {0.f, 0.01f}) {
    TestType opt{};
    if constexpr (!std::is_same_v<TestType, px::optim::Adagrad>) opt.weight_decay = decay;
    constexpr std::size_t rows = 6, cols = 37;  // odd columns: vector body and remainder
    std::vector<float> w(rows * cols), g(rows * cols);
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] = std::sin(0.3f * static_cast<float>(i)) - (i % 5 == 0 ? 0.f : 0.2f);
      g[i] = std::cos(0.7f * static_cast<float>(i));
    }
    const std::vector<px::index_t> ids{4, 0, 2};
    std::vector<float> row_w = w, dense_w = w, want_rows = w, want_dense = w;
    px::optim::State<TestType, float, px::HostSpace> row_state(opt, rows * cols), dense_state(opt, rows * cols);
    std::vector<float> s0(rows * cols, opt.template slot_initial<float>(0)), s1(rows * cols, opt.template slot_initial<float>(1));
    std::vector<float> d0 = s0, d1 = s1;
    const auto rule = opt.template rule<float>(3);
    for (std::size_t j = 0; j < ids.size(); ++j)
      for (std::size_t c = 0; c < cols; ++c) {
        const std::size_t at = static_cast<std::size_t>(ids[j]) * cols + c;
        rule(want_rows[at], g[j * cols + c], s0[at], s1[at]);
      }
    for (std::size_t i = 0; i < w.size(); ++i) rule(want_dense[i], g[i], d0[i], d1[i]);
    const px::Exec<px::HostSpace> ex;
    px::optim::apply_rows(ex, opt, 3, row_w.data(), ids.data(), g.data(), ids.size(), cols, row_state, 1.f);
    px::optim::apply_dense(ex, opt, 3, dense_w.data(), g.data(), w.size(), dense_state, 1.f);
    INFO(TestType::name << ", decay " << decay);
    CHECK(std::memcmp(row_w.data(), want_rows.data(), w.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(dense_w.data(), want_dense.data(), w.size() * sizeof(float)) == 0);
    if (TestType::slots > 0) {
      std::vector<float> got(rows * cols);
      std::memcpy(got.data(), row_state.slot(0), got.size() * sizeof(float));
      CHECK(std::memcmp(got.data(), s0.data(), got.size() * sizeof(float)) == 0);
    }
  }
}
