// optim/: each optimizer's dense and lazy (row) update against the formula,
// written out in double precision, in host and device memory.
#include "support.hpp"

#include <cmath>
#include <cstring>
#include <omp.h>
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

namespace {

/// A table of `rows` x `cols` stored as H, its float optimizer state, and
/// the float reference of both, updated by the rule element by element.
template <class H, class Opt>
struct HalfTable {
  std::size_t rows, cols;
  std::vector<H> w;
  px::optim::State<Opt, float, px::HostSpace> state;
  std::vector<float> s0, s1;  // the reference's state
  HalfTable(const Opt& opt, std::size_t r, std::size_t c)
      : rows(r), cols(c), w(r * c), state(opt, r * c), s0(r * c, opt.template slot_initial<float>(0)),
        s1(r * c, opt.template slot_initial<float>(1)) {
    for (std::size_t i = 0; i < w.size(); ++i)
      w[i] = H(std::sin(0.3f * static_cast<float>(i)) * (i % 7 == 0 ? 300.f : 1.f));
  }
};

/// The 16-bit value next to h, upwards or downwards.
template <class H>
H step_toward(H h, bool up) {
  if ((h.bits & 0x7FFF) == 0) return H::from_bits(up ? 0x0001 : 0x8001);
  const bool negative = h.bits & 0x8000;
  return H::from_bits(static_cast<std::uint16_t>(up != negative ? h.bits + 1 : h.bits - 1));
}

template <class T>
bool same_bits(const std::vector<T>& a, const T* b) {
  return std::memcmp(a.data(), b, a.size() * sizeof(T)) == 0;
}

std::vector<float> gradient(std::size_t k, std::size_t cols, int step) {
  std::vector<float> g(k * cols);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::cos(0.7f * static_cast<float>(i) + static_cast<float>(step));
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("rows stored in 16 bits update in float and round to nearest even", "[optim][half]", px::bf16,
                   px::fp16) {
  using H = TestType;
  auto run = [](auto opt) {
    using Opt = decltype(opt);
    HalfTable<H, Opt> t(opt, 6, 37);
    std::vector<H> want = t.w;
    const std::vector<px::index_t> rows{4, 0, 2}, ids{104, 100, 102};
    const px::Exec<px::HostSpace> ex;
    for (int step = 1; step <= 3; ++step) {
      const auto g = gradient(rows.size(), t.cols, step);
      const auto rule = opt.template rule<float>(static_cast<std::uint64_t>(step));
      for (std::size_t j = 0; j < rows.size(); ++j)
        for (std::size_t c = 0; c < t.cols; ++c) {
          const std::size_t at = static_cast<std::size_t>(rows[j]) * t.cols + c;
          float value = want[at];
          rule(value, g[j * t.cols + c] * 0.5f, t.s0[at], t.s1[at]);
          want[at] = H(value);
        }
      px::optim::apply_rows(ex, opt, static_cast<std::uint64_t>(step), t.w.data(), rows.data(), ids.data(), g.data(),
                            rows.size(), t.cols, t.state, 0.5f);
    }
    INFO(Opt::name);
    CHECK(same_bits(want, t.w.data()));
    if (Opt::slots > 0) CHECK(same_bits(t.s0, t.state.slot(0)));
    if (Opt::slots > 1) CHECK(same_bits(t.s1, t.state.slot(1)));
  };
  run(px::optim::Sgd{0.1f});
  run(px::optim::Sgd{0.1f, 0.25f});
  run(px::optim::Momentum{0.1f, 0.8f, true});
  run(px::optim::Adagrad{0.1f, 0.1f, 1e-7f});
  run(px::optim::Adam{0.1f, 0.9f, 0.999f, 1e-8f, 0.25f});
}

TEMPLATE_TEST_CASE("stochastic rounding of updated rows: the seeded draws, on any thread or rank count",
                   "[optim][half]", px::bf16, px::fp16) {
  using H = TestType;
  const px::optim::Adam opt{0.01f};
  const px::optim::Rounding rounding{px::optim::Rounding::stochastic, 2026};
  // 512 rows of 64: enough elements for the host's OpenMP team.
  constexpr std::size_t rows = 512, cols = 64;
  std::vector<px::index_t> local(rows), ids(rows);
  for (std::size_t j = 0; j < rows; ++j) {
    local[j] = static_cast<px::index_t>((j * 37) % rows);  // unique, scattered
    ids[j] = local[j] * 3 + 1;                            // global ids of a sharded table
  }
  const auto g = gradient(rows, cols, 1);
  const px::Exec<px::HostSpace> ex;
  auto update = [&](HalfTable<H, px::optim::Adam>& t, std::size_t first, std::size_t count, px::optim::Rounding r) {
    px::optim::apply_rows(ex, opt, 5, t.w.data(), local.data() + first, ids.data() + first, g.data() + first * cols,
                          count, cols, t.state, 1.f, r);
  };

  // The stored bits are the rule's float result rounded with the draw of
  // (seed, step, id, column): one of its two neighbours.
  HalfTable<H, px::optim::Adam> one(opt, rows, cols);
  std::vector<H> want = one.w;
  const auto rule = opt.template rule<float>(5);
  std::size_t neighbours = 0, moved_up = 0;
  for (std::size_t j = 0; j < rows; ++j)
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t at = static_cast<std::size_t>(local[j]) * cols + c;
      float value = want[at];
      rule(value, g[j * cols + c], one.s0[at], one.s1[at]);
      want[at] = H::round_stochastic(value, px::optim::rounding_bits(2026, 5, static_cast<std::uint64_t>(ids[j]), c));
      // The two neighbours of the float result: nearest rounding gives one.
      const H near(value);
      const bool near_is_below = static_cast<float>(near) <= value;
      const H other = step_toward<H>(near, near_is_below);
      neighbours += want[at].bits == near.bits || want[at].bits == other.bits;
      moved_up += static_cast<float>(want[at]) > value;
    }
  update(one, 0, rows, rounding);
  CHECK(same_bits(want, one.w.data()));
  CHECK(neighbours == rows * cols);
  CHECK(moved_up > rows * cols / 4);  // not always the same way
  CHECK(moved_up < rows * cols * 3 / 4);

  // One thread or the team: the same bits.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  HalfTable<H, px::optim::Adam> serial(opt, rows, cols);
  update(serial, 0, rows, rounding);
  omp_set_num_threads(saved);
  CHECK(same_bits(one.w, serial.w.data()));

  // Rows updated in two calls (two shards) with their global ids: the same bits.
  HalfTable<H, px::optim::Adam> split(opt, rows, cols);
  update(split, 0, 200, rounding);
  update(split, 200, rows - 200, rounding);
  CHECK(same_bits(one.w, split.w.data()));

  // Another seed draws otherwise.
  HalfTable<H, px::optim::Adam> other(opt, rows, cols);
  update(other, 0, rows, {px::optim::Rounding::stochastic, 2027});
  CHECK_FALSE(same_bits(one.w, other.w.data()));
}

TEMPLATE_TEST_CASE("stochastic rounding keeps updates below half a unit that nearest rounding loses", "[optim][half]",
                   px::bf16, px::fp16) {
  using H = TestType;
  // SGD steps of 2^-14 from 1: a sixteenth of the unit just below 1 for
  // fp16 (2^-11 there), far less for bf16 (2^-8). Nearest rounding stays at
  // 1 for ever; stochastic rounding follows the float run on average.
  const px::optim::Sgd opt{std::ldexp(1.f, -14)};
  constexpr std::size_t rows = 64, cols = 64, steps = 512;
  std::vector<px::index_t> ids(rows);
  for (std::size_t j = 0; j < rows; ++j) ids[j] = static_cast<px::index_t>(j);
  const std::vector<float> g(rows * cols, 1.f);
  const px::Exec<px::HostSpace> ex;
  std::vector<H> nearest(rows * cols, H(1.f)), stochastic = nearest;
  px::optim::State<px::optim::Sgd, float, px::HostSpace> none(opt, 0);
  for (std::size_t s = 1; s <= steps; ++s) {
    px::optim::apply_rows(ex, opt, s, nearest.data(), ids.data(), ids.data(), g.data(), rows, cols, none, 1.f);
    px::optim::apply_rows(ex, opt, s, stochastic.data(), ids.data(), ids.data(), g.data(), rows, cols, none, 1.f,
                          {px::optim::Rounding::stochastic, 9});
  }
  const double exact = 1.0 - steps * std::ldexp(1.0, -14);  // 0.96875
  double mean = 0;
  for (const H& h : stochastic) mean += static_cast<float>(h);
  mean /= static_cast<double>(stochastic.size());
  CHECK(static_cast<float>(nearest[0]) == 1.f);
  CHECK(static_cast<float>(nearest.back()) == 1.f);
  // Each element's error is a sum of unbiased roundings of at most one
  // unit (2^-8) each: over 4096 elements the mean is within a few 1e-4.
  CHECK(std::fabs(mean - exact) < 2e-3);
}

TEMPLATE_TEST_CASE("row-wise Adagrad keeps one float per row", "[optim][half]", float, px::bf16) {
  using W = TestType;
  const px::optim::Adagrad opt{0.1f, 0.25f, 1e-7f};
  constexpr std::size_t rows = 9, cols = 13;
  std::vector<W> w(rows * cols);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = W(std::sin(0.3f * static_cast<float>(i)));
  std::vector<W> want = w;
  std::vector<float> acc(rows, opt.initial_accumulator), want_acc = acc;
  const std::vector<px::index_t> local{7, 2, 5}, ids{7, 2, 5};
  const px::Exec<px::HostSpace> ex;
  for (int step = 1; step <= 3; ++step) {
    const auto g = gradient(local.size(), cols, step);
    for (std::size_t j = 0; j < local.size(); ++j) {
      const auto r = static_cast<std::size_t>(local[j]);
      float squares = 0;
      for (std::size_t c = 0; c < cols; ++c) squares += (g[j * cols + c] * 2.f) * (g[j * cols + c] * 2.f);
      want_acc[r] += squares / static_cast<float>(cols);
      const float rate = opt.lr / (std::sqrt(want_acc[r]) + opt.eps);
      for (std::size_t c = 0; c < cols; ++c)
        want[r * cols + c] = W(static_cast<float>(want[r * cols + c]) - rate * (g[j * cols + c] * 2.f));
    }
    px::optim::apply_rows_rowwise_adagrad(ex, opt, static_cast<std::uint64_t>(step), w.data(), local.data(),
                                          ids.data(), g.data(), local.size(), cols, acc.data(), 2.f);
  }
  CHECK(same_bits(want, w.data()));
  CHECK(same_bits(want_acc, acc.data()));
  CHECK(acc[0] == opt.initial_accumulator);  // untouched rows keep theirs
  CHECK(w[0] == want[0]);
}
