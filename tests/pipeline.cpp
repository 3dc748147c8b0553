// pipeline.hpp: a model split into S stages x R replicas trains to the
// parameters of one process on the same global batch (GPipe and 1F1B),
// bit for bit the same run after run; each rank stores only its stage; bad
// grids and stage definitions are named on every rank before the first
// pass; a stage rank that does not send is named within the deadline.
#include "support.hpp"

#include <parallax/pipeline.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace pp = px::pipeline;

// The model: a chain of tanh layers (widths kWidths[i] -> kWidths[i + 1]),
// the last one linear, and half the squared error against a target.
const std::vector<std::size_t> kWidths = {4, 8, 8, 8, 8, 8, 1};
constexpr std::size_t kLayers = 6, kBatch = 24, kSteps = 3;
constexpr float kLr = 0.2f;

float input(std::size_t step, std::size_t e, std::size_t j) { return std::sin(0.37f * (e + 3 * step) + 0.9f * j); }
float target(std::size_t step, std::size_t e) { return std::cos(0.21f * (e + 5 * step)); }

std::string w_name(std::size_t l) { return "l" + std::to_string(l) + "_w"; }
std::string b_name(std::size_t l) { return "l" + std::to_string(l) + "_b"; }
px::Init w_init(std::size_t l) { return px::init::Glorot{11 + l}; }
px::Init b_init(std::size_t l) { return px::init::Uniform{-0.1f, 0.1f, 31 + l}; }

std::size_t layer_parameters(std::size_t l) { return (kWidths[l] + 1) * kWidths[l + 1]; }

/// The placement every test uses: layers balanced by parameter count.
pp::Placement placement(int stages) {
  std::vector<double> cost;
  std::vector<std::size_t> bytes;
  for (std::size_t l = 0; l < kLayers; ++l) {
    cost.push_back(static_cast<double>(layer_parameters(l)));
    bytes.push_back(layer_parameters(l) * sizeof(float));
  }
  return pp::place_layers(cost, bytes, pp::Schedule::gpipe(stages, 1));
}

/// Single-process reference in double precision: kSteps steps of SGD on
/// the whole global batch at once. Returns every layer's (W, b).
std::vector<std::pair<std::vector<double>, std::vector<double>>> reference(const px::Context& ctx) {
  std::vector<std::pair<std::vector<double>, std::vector<double>>> p(kLayers);
  for (std::size_t l = 0; l < kLayers; ++l) {
    px::Variable<px::Dense, float> w(ctx, w_name(l), {kWidths[l], kWidths[l + 1]}, w_init(l));
    px::Variable<px::Dense, float> b(ctx, b_name(l), {1, kWidths[l + 1]}, b_init(l));
    const auto wv = w.value().to_host(), bv = b.value().to_host();
    p[l].first.assign(wv.begin(), wv.end());
    p[l].second.assign(bv.begin(), bv.end());
  }
  for (std::size_t s = 0; s < kSteps; ++s) {
    std::vector<std::vector<double>> act(kLayers + 1);
    act[0].resize(kBatch * kWidths[0]);
    for (std::size_t e = 0; e < kBatch; ++e)
      for (std::size_t j = 0; j < kWidths[0]; ++j) act[0][e * kWidths[0] + j] = input(s, e, j);
    for (std::size_t l = 0; l < kLayers; ++l) {
      const std::size_t in = kWidths[l], out = kWidths[l + 1];
      act[l + 1].assign(kBatch * out, 0.0);
      for (std::size_t e = 0; e < kBatch; ++e)
        for (std::size_t o = 0; o < out; ++o) {
          double z = p[l].second[o];
          for (std::size_t i = 0; i < in; ++i) z += act[l][e * in + i] * p[l].first[i * out + o];
          act[l + 1][e * out + o] = l + 1 < kLayers ? std::tanh(z) : z;
        }
    }
    std::vector<double> dy(kBatch);
    for (std::size_t e = 0; e < kBatch; ++e) dy[e] = (act[kLayers][e] - target(s, e)) / kBatch;
    for (std::size_t l = kLayers; l-- > 0;) {
      const std::size_t in = kWidths[l], out = kWidths[l + 1];
      std::vector<double> dz = dy;
      if (l + 1 < kLayers)
        for (std::size_t k = 0; k < dz.size(); ++k) dz[k] *= 1 - act[l + 1][k] * act[l + 1][k];
      std::vector<double> dx(kBatch * in, 0.0), dw(in * out, 0.0), db(out, 0.0);
      for (std::size_t e = 0; e < kBatch; ++e)
        for (std::size_t o = 0; o < out; ++o) {
          db[o] += dz[e * out + o];
          for (std::size_t i = 0; i < in; ++i) {
            dw[i * out + o] += act[l][e * in + i] * dz[e * out + o];
            dx[e * in + i] += dz[e * out + o] * p[l].first[i * out + o];
          }
        }
      for (std::size_t k = 0; k < dw.size(); ++k) p[l].first[k] -= static_cast<double>(kLr) * dw[k];
      for (std::size_t k = 0; k < db.size(); ++k) p[l].second[k] -= static_cast<double>(kLr) * db[k];
      dy = std::move(dx);
    }
  }
  return p;
}

/// This rank's stage of the model: layers [first, last) of the placement,
/// their variables, and the forward and backward functions over them.
struct StagePart {
  using Var = px::Variable<px::Dense, float>;
  std::size_t first = 0, last = 0, step = 0;
  std::size_t offset = 0;  // the replica's first example in the global batch
  std::vector<Var> vars;  // w, b of each layer

  StagePart(const px::Context& ctx, const pp::Placement& p, int stage) {
    first = p.first_layer[static_cast<std::size_t>(stage)];
    last = p.first_layer[static_cast<std::size_t>(stage) + 1];
    for (std::size_t l = first; l < last; ++l) {
      vars.emplace_back(ctx, w_name(l), px::Shape{kWidths[l], kWidths[l + 1]}, w_init(l));
      vars.emplace_back(ctx, b_name(l), px::Shape{1, kWidths[l + 1]}, b_init(l));
    }
  }
  std::size_t parameters() const {
    std::size_t n = 0;
    for (const Var& v : vars) n += v.shape().elements();
    return n;
  }
  /// Rows x width activations of every layer of the stage (the stage's
  /// input first): what backward needs, kept in `saved`.
  pp::Stage<float> stage(bool first_stage, bool last_stage) {
    pp::Stage<float> st;
    st.name = "layers " + std::to_string(first) + ".." + std::to_string(last - 1);
    st.in_width = first_stage ? 0 : kWidths[first];
    st.out_width = last_stage ? 0 : kWidths[last];
    st.parameters = parameters();
    st.forward = [this, last_stage](const pp::MicroBatch& mb, const float* in, float* out, std::vector<float>& saved) {
      const std::size_t rows = mb.rows;
      saved.clear();
      if (in) saved.insert(saved.end(), in, in + rows * kWidths[first]);
      else
        for (std::size_t e = 0; e < rows; ++e)
          for (std::size_t j = 0; j < kWidths[0]; ++j) saved.push_back(input(step, offset + mb.first + e, j));
      std::size_t at = 0;  // where layer l's input starts in saved
      for (std::size_t l = first; l < last; ++l) {
        const std::size_t i_w = kWidths[l], o_w = kWidths[l + 1];
        const auto W = vars[2 * (l - first)].value().to_host(), B = vars[2 * (l - first) + 1].value().to_host();
        const std::size_t next = saved.size();
        saved.resize(next + rows * o_w);
        for (std::size_t e = 0; e < rows; ++e)
          for (std::size_t o = 0; o < o_w; ++o) {
            float z = B[o];
            for (std::size_t i = 0; i < i_w; ++i) z += saved[at + e * i_w + i] * W[i * o_w + o];
            saved[next + e * o_w + o] = l + 1 < kLayers ? std::tanh(z) : z;
          }
        at = next;
      }
      const std::size_t o_w = kWidths[last];
      if (out) std::copy(saved.begin() + static_cast<std::ptrdiff_t>(at), saved.end(), out);
      double loss = 0;
      if (last_stage)
        for (std::size_t e = 0; e < rows; ++e) {
          const double d = saved[at + e * o_w] - target(step, offset + mb.first + e);
          loss += 0.5 * d * d;
        }
      return loss;
    };
    st.backward = [this](const pp::MicroBatch& mb, const float*, const float* out_grad, float* in_grad,
                         std::vector<float>& saved) {
      const std::size_t rows = mb.rows;
      std::vector<std::size_t> at(last - first + 1, 0);  // where each layer's input (and the output) starts
      for (std::size_t l = first; l < last; ++l) at[l - first + 1] = at[l - first] + rows * kWidths[l];
      std::vector<float> dy(rows * kWidths[last]);
      if (out_grad) std::copy(out_grad, out_grad + dy.size(), dy.begin());
      else
        for (std::size_t e = 0; e < rows; ++e)
          dy[e] = (saved[at.back() + e] - target(step, offset + mb.first + e)) / static_cast<float>(mb.batch_rows);
      for (std::size_t l = last; l-- > first;) {
        const std::size_t i_w = kWidths[l], o_w = kWidths[l + 1];
        Var& w = vars[2 * (l - first)];
        Var& b = vars[2 * (l - first) + 1];
        const auto W = w.value().to_host();
        float* dw = w.grad().data();
        float* db = b.grad().data();
        const float* x = saved.data() + at[l - first];
        const float* y = saved.data() + at[l - first + 1];
        if (l + 1 < kLayers)
          for (std::size_t k = 0; k < dy.size(); ++k) dy[k] *= 1 - y[k] * y[k];
        std::vector<float> dx(rows * i_w, 0.f);
        for (std::size_t e = 0; e < rows; ++e)
          for (std::size_t o = 0; o < o_w; ++o) {
            db[o] += dy[e * o_w + o];
            for (std::size_t i = 0; i < i_w; ++i) {
              dw[i * o_w + o] += x[e * i_w + i] * dy[e * o_w + o];
              dx[e * i_w + i] += dy[e * o_w + o] * W[i * o_w + o];
            }
          }
        dy = std::move(dx);
      }
      if (in_grad) std::copy(dy.begin(), dy.end(), in_grad);
    };
    return st;
  }
};

struct Result {
  std::vector<std::vector<float>> values;  // this rank's variables, in StagePart order
  std::size_t first = 0, last = 0;
  pp::RunStats stats;
  std::size_t parameters = 0;
};

Result train(int stages, pp::ScheduleKind kind, int micro_batches) {
  pp::Grid grid(test::world(), stages);
  const pp::Placement p = placement(stages);
  StagePart part(grid.replica_context(), p, grid.stage());
  px::TrainerOptions options;
  options.overlap = false;
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(grid.replica_context(), options, px::optim::Sgd{kLr},
                                                         part.vars);
  pp::Pipeline<float> pipe(grid, part.stage(grid.first_stage(), grid.last_stage()),
                           pp::Schedule::make(kind, stages, micro_batches));
  const px::BatchShare share = px::share_of(kBatch, grid.replica(), grid.replicas());
  part.offset = share.first;
  Result r;
  for (std::size_t s = 0; s < kSteps; ++s) {
    part.step = s;
    r.stats = pipe.run(share.count);
    trainer.step();
  }
  for (const auto& v : part.vars) r.values.push_back(trainer.fetch(v));
  r.first = part.first;
  r.last = part.last;
  r.parameters = part.parameters();
  return r;
}


/// The stage counts a world of n ranks can split into (S divides n, S <= layers).
std::vector<int> stage_counts(int n) {
  std::vector<int> out;
  for (int s = 1; s <= n && s <= static_cast<int>(kLayers); ++s)
    if (n % s == 0) out.push_back(s);
  return out;
}

bool close(const std::vector<float>& got, const std::vector<double>& want, double tolerance, std::string& why) {
  double scale = 0, err = 0;
  for (std::size_t k = 0; k < want.size(); ++k) {
    scale = std::max(scale, std::fabs(want[k]));
    err = std::max(err, std::fabs(static_cast<double>(got[k]) - want[k]));
  }
  if (got.size() == want.size() && err <= tolerance * scale) return true;
  char text[120];
  std::snprintf(text, sizeof text, "largest difference %.3g against largest value %.3g", err, scale);
  why = text;
  return false;
}

std::string bits_of(const Result& r) {
  std::string s;
  for (const auto& v : r.values) s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return s;
}

}  // namespace

TEST_CASE("pipeline: S stages x R replicas train to the single-process parameters, bit for bit again",
          "[pipeline]") {
  const auto& world = test::world();
  const auto ref = reference(world);
  for (int stages : stage_counts(world.size()))
    for (auto kind : {pp::ScheduleKind::gpipe, pp::ScheduleKind::one_f_one_b})
      for (int micro : {1, 3, 4}) {
        INFO("stages " << stages << " x replicas " << world.size() / stages << ", " << pp::to_string(kind) << ", "
                       << micro << " micro-batches");
        const Result a = train(stages, kind, micro);
        bool ok = true;
        std::string why;
        for (std::size_t l = a.first; l < a.last && ok; ++l) {
          ok = close(a.values[2 * (l - a.first)], ref[l].first, 1e-5, why) &&
               close(a.values[2 * (l - a.first) + 1], ref[l].second, 1e-5, why);
          if (!ok) why = "layer " + std::to_string(l) + ": " + why;
        }
        INFO(why);
        CHECK(test::all_ranks(ok));
        // Activations held at once: 1F1B at most S (min(S - stage, M)), GPipe all M.
        const pp::Grid grid(world, stages);
        const int want = kind == pp::ScheduleKind::gpipe ? micro : std::min(stages - grid.stage(), micro);
        CHECK(test::all_ranks(a.stats.peak_in_flight == want));
        // The same configuration again: the same bits.
        const Result b = train(stages, kind, micro);
        CHECK(test::all_ranks(bits_of(a) == bits_of(b)));
      }
}

TEST_CASE("pipeline: a rank stores at most 1/S of the parameters plus the largest layer", "[pipeline]") {
  const auto& world = test::world();
  std::size_t total = 0, largest = 0;
  for (std::size_t l = 0; l < kLayers; ++l) {
    total += layer_parameters(l);
    largest = std::max(largest, layer_parameters(l));
  }
  for (int stages : stage_counts(world.size())) {
    INFO("stages " << stages);
    const Result r = train(stages, pp::ScheduleKind::one_f_one_b, 2);
    std::size_t stored = 0;
    for (const auto& v : r.values) stored += v.size();
    CHECK(test::all_ranks(stored == r.parameters));
    CHECK(test::all_ranks(static_cast<double>(stored) <= static_cast<double>(total) / stages + largest));
    // And every layer lives on exactly one stage of each replica.
    const std::size_t sum = static_cast<std::size_t>(world.sum(static_cast<std::int64_t>(stored)));
    CHECK(sum == total * static_cast<std::size_t>(world.size() / stages));
  }
}

namespace {

/// A trivial stage of widths in -> out, for the error cases.
pp::Stage<float> plain_stage(std::string name, std::size_t in, std::size_t out, std::size_t parameters = 0) {
  pp::Stage<float> st;
  st.name = std::move(name);
  st.in_width = in;
  st.out_width = out;
  st.parameters = parameters;
  st.forward = [](const pp::MicroBatch&, const float*, float*, std::vector<float>&) { return 0.0; };
  st.backward = [](const pp::MicroBatch&, const float*, const float*, float*, std::vector<float>&) {};
  return st;
}

/// The chain of `stages` plain stages of width 8; stage `odd` gets
/// `odd_in` inputs instead.
pp::Stage<float> chain_stage(const pp::Grid& g, int odd = -1, std::size_t odd_in = 0) {
  const std::size_t in = g.first_stage() ? 0 : (g.stage() == odd ? odd_in : 8);
  return plain_stage("stage" + std::to_string(g.stage()), in, g.last_stage() ? 0 : 8);
}

/// The error each rank throws, checked to contain `part` and to be the same
/// on every rank.
template <class F>
void expect_everywhere(F&& f, const std::string& part) {
  const std::string e = test::error_of(std::forward<F>(f));
  INFO(e);
  CHECK(test::all_ranks(e.find(part) != std::string::npos));
  CHECK(test::same_on_every_rank(e));
}

}  // namespace

TEST_CASE("pipeline: a world size the stage count does not divide is named on every rank", "[pipeline]") {
  const int n = test::world().size();
  expect_everywhere([&] { pp::Grid g(test::world(), n + 1); },
                    std::to_string(n) + " ranks cannot hold " + std::to_string(n + 1) + " stages");
  expect_everywhere([&] { pp::Grid g(test::world(), 0); }, "at least 1");
}

TEST_CASE("pipeline: ranks that ask for different stage counts are named", "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  expect_everywhere([&] { pp::Grid g(w, w.rank() == 1 ? w.size() : 1); },
                    "different stage counts: rank 0 for 1, rank 1 for " + std::to_string(w.size()));
}

TEST_CASE("pipeline: a stage whose output width is not the next one's input is named before any pass",
          "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, w.size());
  const int odd = w.size() - 1;
  expect_everywhere([&] { pp::Pipeline<float> p(g, chain_stage(g, odd, 7), pp::Schedule::gpipe(w.size(), 2)); },
                    "stage " + std::to_string(odd - 1) + " 'stage" + std::to_string(odd - 1) +
                        "' (" + (odd == 1 ? "0" : "8") + " -> 8 values per example, 0 parameters) sends 8 values "
                        "per example but stage " + std::to_string(odd));
  // A first stage that expects input, a last stage that sends some.
  const int n = w.size();
  expect_everywhere([&] {
    pp::Pipeline<float> p(g, plain_stage("x", g.first_stage() ? 3 : 8, g.last_stage() ? 0 : 8),
                          pp::Schedule::gpipe(n, 2));
  }, "its in_width must be 0");
  expect_everywhere([&] {
    pp::Pipeline<float> p(g, plain_stage("x", g.first_stage() ? 0 : 8, 8), pp::Schedule::gpipe(n, 2));
  }, "its out_width must be 0");
}

TEST_CASE("pipeline: replicas that define their stage differently are named", "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, 1);  // one stage, every rank a replica
  expect_everywhere([&] {
    pp::Pipeline<float> p(g, plain_stage("dense", 0, 0, w.rank() == 1 ? 96 : 64), pp::Schedule::gpipe(1, 2));
  }, "stage 0 is defined differently on its replicas: rank 0 (stage 0, replica 0) defines 'dense' (0 -> 0 values per "
     "example, 64 parameters), rank 1 (stage 0, replica 1) defines 'dense' (0 -> 0 values per example, 96 parameters)");
}

TEST_CASE("pipeline: ranks that run different schedules are named", "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, w.size());
  const auto kind = w.rank() == 1 ? pp::ScheduleKind::one_f_one_b : pp::ScheduleKind::gpipe;
  expect_everywhere([&] { pp::Pipeline<float> p(g, chain_stage(g), pp::Schedule::make(kind, w.size(), 3)); },
                    "the ranks run different schedules: rank 0 (stage 0, replica 0) runs gpipe with 3 micro-batches, "
                    "rank 1 (stage 1, replica 0) 1f1b with 3");
  expect_everywhere([&] { pp::Pipeline<float> p(g, chain_stage(g), pp::Schedule::gpipe(w.size(), w.rank() == 1 ? 4 : 3)); },
                    "rank 1 (stage 1, replica 0) gpipe with 4");
}

TEST_CASE("pipeline: a stage rank that does not send is named within the deadline", "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, w.size());
  pp::PipelineOptions o;
  o.engine.timeout = std::chrono::milliseconds(300);
  std::string e;
  {
    pp::Pipeline<float> p(g, chain_stage(g), pp::Schedule::gpipe(w.size(), 2), o);
    // Stage 0 stays away; every later stage waits for its predecessor's
    // activations, which never come.
    if (!g.first_stage()) e = test::error_of([&] { p.run(4); });
  }
  const bool failed = px::detail::job_failed();
  px::detail::job_failed() = false;  // the drill is over: let the job end normally
  INFO(e);
  // Stage 1 names stage 0; a later stage names its predecessor, which
  // answered that it is waiting too, and stage 0, which did not answer.
  const std::string want =
      "waiting for the activations of micro-batch 0 from " + g.describe_rank(w.rank() - 1) +
      (w.rank() == 1 ? std::string(": it did not send them")
                     : ", which is waiting too: " + g.describe_rank(0) + " did not answer");
  CHECK(test::all_ranks(g.first_stage() || (failed && e.find(want) != std::string::npos &&
                                            e.find("gave up after 300 ms") != std::string::npos)));
  MPI_Barrier(MPI_COMM_WORLD);
}

namespace {

// A stage with a sharded embedding: ids -> the sum of two rows of `emb`
// (ShardedPS under the hybrid, its rows looked up per micro-batch over the
// stage's replicas) -> tanh layer A (4 -> 8) | layer B (8 -> 1) -> squared
// error. With one stage everything is on every rank; with two, the
// embedding and A are stage 0's and B is stage 1's.
constexpr std::size_t kVocab = 20, kDim = 4, kHidden = 8, kEmbBatch = 12;

px::index_t emb_id(std::size_t step, std::size_t e, std::size_t k) {
  return static_cast<px::index_t>((e * 7 + step * 3 + k * 11) % kVocab);
}

struct EmbeddingModel {
  using Dense = px::Variable<px::Dense, float>;
  using Sparse = px::Variable<px::Sparse, float>;
  std::optional<Sparse> emb;
  std::optional<Dense> a_w, a_b, b_w, b_b;
  std::function<std::vector<float>(const std::vector<px::index_t>&)> lookup;  // the trainer's, set later
  std::size_t step = 0, offset = 0;

  EmbeddingModel(const px::Context& ctx, bool front, bool back) {
    if (front) {
      emb.emplace(ctx, "emb", px::Shape{kVocab, kDim}, px::init::Uniform{-0.5f, 0.5f, 7});
      a_w.emplace(ctx, "a_w", px::Shape{kDim, kHidden}, px::init::Glorot{3});
      a_b.emplace(ctx, "a_b", px::Shape{1, kHidden}, px::init::Uniform{-0.1f, 0.1f, 4});
    }
    if (back) {
      b_w.emplace(ctx, "b_w", px::Shape{kHidden, 1}, px::init::Glorot{5});
      b_b.emplace(ctx, "b_b", px::Shape{1, 1}, px::init::Uniform{-0.1f, 0.1f, 6});
    }
  }

  std::vector<px::index_t> ids_of(const pp::MicroBatch& mb) const {
    std::vector<px::index_t> ids;
    for (std::size_t e = 0; e < mb.rows; ++e)
      for (std::size_t k = 0; k < 2; ++k) ids.push_back(emb_id(step, offset + mb.first + e, k));
    return ids;
  }

  // saved: [h (rows x kDim) | a (rows x kHidden)] in front; [y (rows)] at the back.
  pp::Stage<float> stage() {
    pp::Stage<float> st;
    const bool front = emb.has_value(), back = b_w.has_value();
    st.name = front && back ? "all" : front ? "embedding + A" : "B";
    st.in_width = front ? 0 : kHidden;
    st.out_width = back ? 0 : kHidden;
    st.forward = [this, front, back](const pp::MicroBatch& mb, const float* in, float* out, std::vector<float>& saved) {
      const std::size_t rows = mb.rows;
      saved.clear();
      std::vector<float> a(in ? std::vector<float>(in, in + rows * kHidden) : std::vector<float>());
      if (front) {
        const auto rowsv = lookup(ids_of(mb));
        const auto W = a_w->value().to_host(), B = a_b->value().to_host();
        std::vector<float> h(rows * kDim);
        for (std::size_t e = 0; e < rows; ++e)
          for (std::size_t d = 0; d < kDim; ++d) h[e * kDim + d] = rowsv[(2 * e) * kDim + d] + rowsv[(2 * e + 1) * kDim + d];
        a.assign(rows * kHidden, 0.f);
        for (std::size_t e = 0; e < rows; ++e)
          for (std::size_t o = 0; o < kHidden; ++o) {
            float z = B[o];
            for (std::size_t d = 0; d < kDim; ++d) z += h[e * kDim + d] * W[d * kHidden + o];
            a[e * kHidden + o] = std::tanh(z);
          }
        saved.insert(saved.end(), h.begin(), h.end());
        saved.insert(saved.end(), a.begin(), a.end());
        if (out) std::copy(a.begin(), a.end(), out);
      }
      double loss = 0;
      if (back) {
        const auto W = b_w->value().to_host(), B = b_b->value().to_host();
        for (std::size_t e = 0; e < rows; ++e) {
          float y = B[0];
          for (std::size_t o = 0; o < kHidden; ++o) y += a[e * kHidden + o] * W[o];
          saved.push_back(y);
          const double d = y - target(step, offset + mb.first + e);
          loss += 0.5 * d * d;
        }
      }
      return loss;
    };
    st.backward = [this, front, back](const pp::MicroBatch& mb, const float* in, const float* out_grad, float* in_grad,
                                      std::vector<float>& saved) {
      const std::size_t rows = mb.rows;
      std::vector<float> da(rows * kHidden);
      if (back) {
        const float* a = front ? saved.data() + rows * kDim : in;
        const float* y = saved.data() + (front ? rows * (kDim + kHidden) : 0);
        const auto W = b_w->value().to_host();
        float* dw = b_w->grad().data();
        float* db = b_b->grad().data();
        for (std::size_t e = 0; e < rows; ++e) {
          const float dy = (y[e] - target(step, offset + mb.first + e)) / static_cast<float>(mb.batch_rows);
          db[0] += dy;
          for (std::size_t o = 0; o < kHidden; ++o) {
            dw[o] += a[e * kHidden + o] * dy;
            da[e * kHidden + o] = dy * W[o];
          }
        }
      } else {
        std::copy(out_grad, out_grad + da.size(), da.begin());
      }
      if (in_grad) std::copy(da.begin(), da.end(), in_grad);
      if (!front) return;
      const float* h = saved.data();
      const float* a = saved.data() + rows * kDim;
      const auto W = a_w->value().to_host();
      float* dw = a_w->grad().data();
      float* db = a_b->grad().data();
      std::vector<float> dh(rows * kDim, 0.f);
      for (std::size_t e = 0; e < rows; ++e)
        for (std::size_t o = 0; o < kHidden; ++o) {
          const float dz = da[e * kHidden + o] * (1 - a[e * kHidden + o] * a[e * kHidden + o]);
          db[o] += dz;
          for (std::size_t d = 0; d < kDim; ++d) {
            dw[d * kHidden + o] += h[e * kDim + d] * dz;
            dh[e * kDim + d] += dz * W[d * kHidden + o];
          }
        }
      // Both ids of an example get the gradient of h.
      std::vector<float> rows_grad(2 * rows * kDim);
      for (std::size_t e = 0; e < rows; ++e)
        for (std::size_t k = 0; k < 2; ++k)
          std::copy(dh.begin() + static_cast<std::ptrdiff_t>(e * kDim), dh.begin() + static_cast<std::ptrdiff_t>((e + 1) * kDim),
                    rows_grad.begin() + static_cast<std::ptrdiff_t>((2 * e + k) * kDim));
      const auto ids = ids_of(mb);
      emb->grad().add(ids.data(), rows_grad.data(), ids.size());
    };
    return st;
  }
};

/// Trains the embedding model on `stages` stages; returns every variable
/// this rank holds, by name (the embedding whole, fetched).
std::map<std::string, std::vector<float>> train_embedding(int stages, pp::ScheduleKind kind, int micro) {
  pp::Grid grid(test::world(), stages);
  const bool front = grid.first_stage(), back = grid.last_stage();
  EmbeddingModel m(grid.replica_context(), front, back);
  px::TrainerOptions options;
  options.overlap = false;
  std::map<std::string, std::vector<float>> out;
  auto go = [&](auto& trainer) {
    if (front)
      m.lookup = [&trainer, &m](const std::vector<px::index_t>& ids) {
        const auto r = trainer.lookup(*m.emb, ids);
        return std::vector<float>(r.data, r.data + r.size());
      };
    pp::Pipeline<float> pipe(grid, m.stage(), pp::Schedule::make(kind, stages, micro));
    const px::BatchShare share = px::share_of(kEmbBatch, grid.replica(), grid.replicas());
    m.offset = share.first;
    for (std::size_t s = 0; s < kSteps; ++s) {
      m.step = s;
      pipe.run(share.count);
      trainer.step();
    }
    if (front) {
      out["emb"] = trainer.fetch(*m.emb);
      out["a_w"] = trainer.fetch(*m.a_w);
      out["a_b"] = trainer.fetch(*m.a_b);
    }
    if (back) {
      out["b_w"] = trainer.fetch(*m.b_w);
      out["b_b"] = trainer.fetch(*m.b_b);
    }
  };
  using T = px::Trainer<px::arch::Hybrid, px::optim::Sgd>;
  if (front && back) {
    T t(grid.replica_context(), options, px::optim::Sgd{kLr}, *m.emb, *m.a_w, *m.a_b, *m.b_w, *m.b_b);
    go(t);
  } else if (front) {
    T t(grid.replica_context(), options, px::optim::Sgd{kLr}, *m.emb, *m.a_w, *m.a_b);
    CHECK(t.policy_of(*m.emb) == "ShardedPS");
    if (grid.replicas() > 1) CHECK(t.stored_rows(*m.emb) < kVocab);  // shards over the stage's replicas
    go(t);
  } else {
    T t(grid.replica_context(), options, px::optim::Sgd{kLr}, *m.b_w, *m.b_b);
    go(t);
  }
  return out;
}

}  // namespace

TEST_CASE("pipeline: a stage with a sharded embedding trains as the data-parallel job does",
          "[pipeline][np2+][needs-even-ranks]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  if (test::skip_unless(w.size() % 2 == 0, "two stages need an even rank count")) return;
  const auto reference = train_embedding(1, pp::ScheduleKind::gpipe, 1);  // every rank a replica
  for (auto kind : {pp::ScheduleKind::gpipe, pp::ScheduleKind::one_f_one_b}) {
    INFO(pp::to_string(kind));
    const auto got = train_embedding(2, kind, 3);
    bool ok = !got.empty();
    std::string why;
    for (const auto& [name, values] : got) {
      const auto& want = reference.at(name);
      const std::vector<double> wd(want.begin(), want.end());
      if (!close(values, wd, 1e-5, why)) {
        ok = false;
        why = name + ": " + why;
      }
    }
    INFO(why);
    CHECK(test::all_ranks(ok));
  }
}

TEST_CASE("pipeline: a message of another size than expected is named by its receiver", "[pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, w.size());
  pp::PipelineOptions o;
  o.engine.timeout = std::chrono::milliseconds(300);
  std::string e;
  {
    pp::Pipeline<float> p(g, chain_stage(g), pp::Schedule::gpipe(w.size(), 4), o);
    // Stage 1 runs a batch of 5 rows (its micro-batch 0 has 2) where stage 0
    // runs 4 (1 row each): 8 values arrive where 16 are expected. The other
    // stages then wait in vain, until the deadline.
    e = test::error_of([&] { p.run(g.stage() == 1 ? 5 : 4); });
  }
  px::detail::job_failed() = false;  // the drill is over
  INFO(e);
  if (g.stage() == 1)
    CHECK(e == "pipeline: rank 1 (stage 1, replica 0) expected 16 elements of activations of micro-batch 0 from rank 0 "
               "(stage 0, replica 0) but got 8 (do the ranks of one replica run the same batch size?)");
  else
    CHECK(e.find("gave up after 300 ms") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("pipeline: a forward reuses the memory a finished micro-batch gave up, and holds no more than 1F1B's",
          "[pipeline]") {
  auto& w = test::world();
  pp::Grid g(w, w.size());  // one stage a rank
  const std::size_t in = g.first_stage() ? 0 : 8, out = g.last_stage() ? 0 : 8;
  pp::Stage<float> st = plain_stage("keep", in, out);
  std::size_t forwards = 0, reused = 0;
  // Each forward keeps 64 values a row; it finds memory waiting where an
  // earlier micro-batch's backward gave it up.
  st.forward = [&](const pp::MicroBatch& mb, const float*, float* o, std::vector<float>& saved) {
    ++forwards;
    if (saved.capacity() >= mb.rows * 64) ++reused;
    CHECK(saved.empty());
    saved.assign(mb.rows * 64, 1.f);
    if (o) std::fill(o, o + mb.rows * 8, 0.5f);
    return 0.0;
  };
  st.backward = [](const pp::MicroBatch& mb, const float*, const float*, float* ig, std::vector<float>& saved) {
    CHECK(saved.size() == mb.rows * 64);
    if (ig) std::fill(ig, ig + mb.rows * 8, 0.25f);
  };
  const int micro = 8;
  pp::Pipeline<float> p(g, std::move(st), pp::Schedule::one_f_one_b(w.size(), micro));
  const pp::RunStats first = p.run(64);
  const pp::RunStats second = p.run(64);
  CHECK(forwards == 2 * static_cast<std::size_t>(micro));
  // 1F1B keeps at most S micro-batches in flight (the stage's own count at
  // its place in the chain): every forward past those of the first run's
  // warm-up, and every forward of the second run, finds memory.
  const auto warm = static_cast<std::size_t>(first.peak_in_flight);
  CHECK(reused == 2 * static_cast<std::size_t>(micro) - warm);
  CHECK(second.peak_kept_bytes == first.peak_kept_bytes);
}
