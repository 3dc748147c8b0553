// optim/groups.hpp: an optimizer per group of variables. Adagrad on the
// tables and AdamW on the dense layers trains at N ranks as one process
// does, under every synchronous architecture; a group of one optimizer is
// that optimizer, bit for bit; lr scales, decay exclusions and the trainer's
// learning rate change one step as computed by hand; checkpoints restore
// onto other rank counts and refuse another optimizer per variable, naming
// the variable; a variable in no group or in two is an error naming it.
#include "support.hpp"

#include <parallax/optim/groups.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

namespace fs = std::filesystem;
namespace opt = px::optim;

namespace {

constexpr std::size_t kRowsA = 40, kRowsB = 30, kDim = 4, kClasses = 3, kBatch = 12;

using Table = px::Variable<px::Sparse, float>;
using Layer = px::Variable<px::Dense, float>;

/// The usual recipe: Adagrad on the tables, AdamW on the dense layers, no
/// decay on the bias, half the rate on table "b".
auto recipe() {
  // example-begin groups_recipe
  namespace opt = px::optim;
  auto groups = opt::Groups(opt::group(opt::select::sparse(), opt::Adagrad{}.with_lr(0.1f)),
                            opt::group(opt::select::dense(), opt::AdamW{}.with_lr(0.02f).with_weight_decay(0.1f)))
                    .no_weight_decay(opt::select::named({"bias"}))  // no decay on the bias
                    .scale_lr(opt::select::named({"b"}), 0.5f);     // table "b" at half the rate
  // example-end
  return groups;
}

struct Model {
  std::vector<float> a, b, w, bias;
  std::vector<float> all() const {
    std::vector<float> out(a);
    for (const auto* v : {&b, &w, &bias}) out.insert(out.end(), v->begin(), v->end());
    return out;
  }
};

px::index_t id_a(std::size_t s, std::size_t e) { return static_cast<px::index_t>((e * 7 + s * 3) % 29); }
px::index_t id_b(std::size_t s, std::size_t e) { return static_cast<px::index_t>((e * 5 + s * 11) % 23); }
float target(std::size_t s, std::size_t e, std::size_t c) { return std::sin(0.3f * (e + 2 * s + 5 * c)); }

/// Two tables of one width (ShardedPS would group them, were their
/// optimizers' bindings the same), a layer and its bias, and a trainer.
template <class Arch, class Opt>
struct Job {
  Table a, b;
  Layer w, bias;
  px::Trainer<Arch, Opt> trainer;

  Job(px::Context& ctx, const Opt& o)
      : a(ctx, "a", {kRowsA, kDim}, px::init::Uniform{-0.5f, 0.5f, 7}),
        b(ctx, "b", {kRowsB, kDim}, px::init::Uniform{-0.5f, 0.5f, 8}),
        w(ctx, "w", {kDim, kClasses}, px::init::Glorot{3}),
        bias(ctx, "bias", {kClasses}, px::init::Constant{0.1}),
        trainer(ctx, o, a, b, w, bias) {}

  /// Steps [first, last) of the global batch sequence, this rank's share:
  /// h = a[id_a] + b[id_b]; out = h W + bias; squared error.
  void train(px::Context& ctx, std::size_t first_step, std::size_t last_step) {
    const std::size_t n = static_cast<std::size_t>(ctx.size()), r = static_cast<std::size_t>(ctx.rank());
    const std::size_t local = kBatch / n, first = r * local;
    for (std::size_t s = first_step; s < last_step; ++s) {
      std::vector<px::index_t> ia(local), ib(local);
      for (std::size_t i = 0; i < local; ++i) {
        ia[i] = id_a(s, first + i);
        ib[i] = id_b(s, first + i);
      }
      const auto ra = test::to_host(trainer.lookup(a, ia));
      const auto rb = test::to_host(trainer.lookup(b, ib));
      const auto W = w.value().to_host();
      const auto B = bias.value().to_host();
      auto dW = w.grad().to_host();
      auto dB = bias.grad().to_host();
      std::vector<float> dh(local * kDim, 0.f);
      for (std::size_t i = 0; i < local; ++i) {
        float h[kDim];
        for (std::size_t d = 0; d < kDim; ++d) h[d] = ra[i * kDim + d] + rb[i * kDim + d];
        for (std::size_t c = 0; c < kClasses; ++c) {
          float out = B[c];
          for (std::size_t d = 0; d < kDim; ++d) out += h[d] * W[d * kClasses + c];
          const float g = (out - target(s, first + i, c)) / static_cast<float>(local);
          dB[c] += g;
          for (std::size_t d = 0; d < kDim; ++d) {
            dW[d * kClasses + c] += h[d] * g;
            dh[i * kDim + d] += W[d * kClasses + c] * g;
          }
        }
      }
      w.grad().assign_from_host(dW.data(), dW.size());
      bias.grad().assign_from_host(dB.data(), dB.size());
      a.grad().add(ia, dh);
      b.grad().add(ib, dh);
      trainer.step();
    }
  }
  Model model() { return Model{trainer.fetch(a), trainer.fetch(b), trainer.fetch(w), trainer.fetch(bias)}; }
};

template <class Arch, class Opt>
Model train(px::Context& ctx, const Opt& o, std::size_t steps) {
  Job<Arch, Opt> job(ctx, o);
  job.train(ctx, 0, steps);
  return job.model();
}

/// Equal but for the order of float operations.
bool near(float got, float want) { return std::abs(got - want) <= 1e-6f * std::max(1.f, std::abs(want)); }
bool near(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return false;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!near(got[i], want[i])) return false;
  return true;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = got.size() == want.size() ? 0 : 1e9;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
  return worst;
}

double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = got.size() == want.size() ? 0 : 1e9;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]));
  return worst;
}

/// A job on the first `ranks` ranks of the world (MPI_COMM_NULL elsewhere).
struct SubJob {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit SubJob(int ranks) {
    const int me = test::world().rank();
    MPI_Comm_split(MPI_COMM_WORLD, me < ranks ? 0 : MPI_UNDEFINED, me, &comm);
  }
  ~SubJob() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  bool member() const { return comm != MPI_COMM_NULL; }
};

template <class Arch>
void check_equivalence() {
  const auto groups = recipe();
  px::Context single(MPI_COMM_SELF);
  const Model want = train<Arch>(single, groups, 4);
  const Model got = train<Arch>(test::world(), groups, 4);
  const double err = max_relative_error(got.all(), want.all());
  INFO("architecture " << Arch::name << ", " << test::world().size() << " ranks, max relative error " << err);
  CHECK(err <= 1e-5);
  const Model initial = train<Arch>(single, groups, 0);
  CHECK(max_relative_error(got.a, initial.a) > 1e-3);  // the model moved
  CHECK(max_relative_error(got.b, initial.b) > 1e-3);
  CHECK(max_relative_error(got.w, initial.w) > 1e-3);
  CHECK(max_relative_error(got.bias, initial.bias) > 1e-3);
}

}  // namespace

TEST_CASE("Adagrad tables and AdamW layers train at N ranks as one process does", "[optim][groups]") {
  check_equivalence<px::arch::Hybrid>();
  check_equivalence<px::arch::AllReduce>();
  check_equivalence<px::arch::PS>();
}

TEST_CASE("groups of one optimizer train as that optimizer, bit for bit", "[optim][groups]") {
  auto& world = test::world();
  const opt::Adam adam = opt::AdamW{}.with_lr(0.02f).with_weight_decay(0.1f);
  const auto one = opt::Groups(opt::group(opt::select::all(), adam));
  const auto two = opt::Groups(opt::group(opt::select::sparse(), adam), opt::group(opt::select::dense(), adam));
  for (int arch = 0; arch < 2; ++arch) {
    const Model plain = arch ? train<px::arch::PS>(world, adam, 3) : train<px::arch::Hybrid>(world, adam, 3);
    const Model g1 = arch ? train<px::arch::PS>(world, one, 3) : train<px::arch::Hybrid>(world, one, 3);
    const Model g2 = arch ? train<px::arch::PS>(world, two, 3) : train<px::arch::Hybrid>(world, two, 3);
    CHECK(g1.all() == plain.all());
    CHECK(g2.all() == plain.all());
  }
  // The recipe is not Adam on everything: the groups' optimizers are used.
  CHECK(max_relative_error(train<px::arch::Hybrid>(world, recipe(), 3).all(),
                           train<px::arch::Hybrid>(world, adam, 3).all()) > 1e-3);
}

TEST_CASE("an lr scale, a decay exclusion and the trainer's rate change one step as computed by hand",
          "[optim][groups]") {
  auto& ctx = test::world();
  // SGD with decay: w <- w - lr g - lr wd w (rows a step touches, for a table).
  const float lr = 0.1f, wd = 0.2f, scale = 0.5f, rate = 0.25f;
  const auto groups = opt::Groups(opt::group(opt::select::sparse(), opt::Sgd{lr, wd}),
                                  opt::group(opt::select::dense(), opt::Sgd{}.with_lr(lr).with_weight_decay(wd)))
                          .scale_lr(opt::select::named({"t"}), scale)
                          .no_weight_decay(opt::select::name_ends_with("bias"));
  Table t(ctx, "t", {6, 2}, px::init::Constant{1.0});
  Layer w(ctx, "w", {2, 2}, px::init::Constant{2.0});
  Layer bias(ctx, "out_bias", {2}, px::init::Constant{3.0});
  px::Trainer<px::arch::Hybrid, std::decay_t<decltype(groups)>> trainer(ctx, groups, t, w, bias);
  // Every rank gives the same gradients: their mean is each rank's.
  auto give = [&] {
    t.grad().add(std::vector<px::index_t>{1, 4}, std::vector<float>{1, 2, 3, 4});
    w.grad().assign_from_host(std::vector<float>{1, 1, 1, 1}.data(), 4);
    bias.grad().assign_from_host(std::vector<float>{1, -1}.data(), 2);
  };
  give();
  REQUIRE(trainer.step());
  const float lt = lr * scale;
  const float row1[] = {1 - lt * 1 - lt * wd, 1 - lt * 2 - lt * wd};
  const float row4[] = {1 - lt * 3 - lt * wd, 1 - lt * 4 - lt * wd};
  const auto tv = trainer.fetch(t);
  CHECK(near(tv[2], row1[0]));
  CHECK(near(tv[3], row1[1]));
  CHECK(near(tv[8], row4[0]));
  CHECK(near(tv[9], row4[1]));
  CHECK(tv[0] == 1.f);  // untouched rows stay (lazy decay)
  const float w1 = 2 - lr * 1 - lr * wd * 2;
  CHECK(near(trainer.fetch(w), std::vector<float>(4, w1)));
  CHECK(near(trainer.fetch(bias), {3 - lr * 1, 3 + lr * 1}));  // no decay
  // Without the scale and the exclusion, the step would differ by more than that.
  CHECK(!near(tv[2], 1 - lr * 1 - lr * wd));
  CHECK(!near(trainer.fetch(bias)[0], 3 - lr * 1 - lr * wd * 3));

  // The trainer's rate (Groups::lr) scales every group.
  CHECK(trainer.learning_rate() == 1.0);
  trainer.set_learning_rate(rate);
  give();
  REQUIRE(trainer.step());
  const float w2 = w1 - rate * lr * 1 - rate * lr * wd * w1;
  CHECK(near(trainer.fetch(w), std::vector<float>(4, w2)));
  CHECK(near(trainer.fetch(bias), {3 - lr - rate * lr, 3 + lr + rate * lr}));
  CHECK(near(trainer.fetch(t)[2], row1[0] - rate * lt * 1 - rate * lt * wd * row1[0]));
}

TEST_CASE("a checkpoint of groups restores onto other rank counts and refuses other optimizers",
          "[optim][groups][checkpoint]") {
  auto& world = test::world();
  const int n = world.size();
  const auto groups = recipe();
  using Opt = std::decay_t<decltype(groups)>;
  const int from = std::min(2, n);
  test::TempDir dir("parallax-groups");
  std::vector<float> saved;
  {
    SubJob job(from);
    if (job.member()) {
      px::Context ctx(job.comm);
      Job<px::arch::PS, Opt> a(ctx, groups);
      a.train(ctx, 0, 3);
      a.trainer.save(dir.path);
      saved = a.model().all();
    }
  }
  std::size_t count = saved.size();  // rank 0 is in every sub-job
  MPI_Bcast(&count, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  saved.resize(count);
  MPI_Bcast(saved.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);

  for (int to : {1, std::min(3, n)}) {
    SubJob job(to);
    if (job.member()) {
      px::Context ctx(job.comm);
      INFO("saved at " << from << " ranks, restored at " << to);
      Job<px::arch::Hybrid, Opt> b(ctx, groups);  // another architecture: another layout
      REQUIRE(b.trainer.restore_latest(dir.path));
      CHECK(b.trainer.steps() == 3);
      CHECK(b.model().all() == saved);
      b.train(ctx, 3, 5);
      Job<px::arch::PS, Opt> straight(ctx, groups);
      straight.train(ctx, 0, 5);
      // A continuation on another rank count differs from a straight run by float reassociation only.
      CHECK(max_abs_diff(b.model().all(), straight.model().all()) <= 1e-5);

    }
    MPI_Barrier(MPI_COMM_WORLD);
  }

  // Adam on the tables too: their state is not Adagrad's.
  const auto other =
      opt::Groups(opt::group(opt::select::sparse(), opt::Adam{}), opt::group(opt::select::dense(), opt::AdamW{}));
  Job<px::arch::Hybrid, std::decay_t<decltype(other)>> c(world, other);
  const std::string msg = test::error_of([&] { c.trainer.restore_latest(dir.path); });
  CHECK(msg.find("variable 'a' was saved with adagrad, here it uses adam") != std::string::npos);
  CHECK(test::same_on_every_rank(msg));
  // One optimizer for everything is not the groups either.
  Job<px::arch::Hybrid, opt::Adam> d(world, opt::Adam{});
  CHECK(test::error_of([&] { d.trainer.restore_latest(dir.path); }).find("saved with optimizer groups:adagrad") !=
        std::string::npos);
}

TEST_CASE("a variable in no group or in two is an error naming it, on every rank", "[optim][groups][errors]") {
  auto& ctx = test::world();
  Table t(ctx, "t", {6, 2}, px::init::Constant{1.0});
  Layer w(ctx, "w", {2, 2}, px::init::Constant{2.0});
  const auto none = opt::Groups(opt::group(opt::select::sparse(), opt::Adagrad{}));
  std::string msg = test::error_of([&] { px::Trainer<px::arch::Hybrid, std::decay_t<decltype(none)>> tr(ctx, none, t, w); });
  CHECK(msg == "optim::Groups: variable 'w' (dense) is in no group; every variable needs exactly one");
  CHECK(test::same_on_every_rank(msg));
  const auto two = opt::Groups(opt::group(opt::select::all(), opt::Adagrad{}),
                               opt::group(opt::select::named({"t"}), opt::Adam{}));
  msg = test::error_of([&] { px::Trainer<px::arch::PS, std::decay_t<decltype(two)>> tr(ctx, two, t, w); });
  CHECK(msg == "optim::Groups: variable 't' is in 2 groups: 0 (adagrad), 1 (adam); every variable needs exactly one");
  CHECK(test::same_on_every_rank(msg));
  // The variables stay free for another trainer.
  const auto fine = opt::Groups(opt::group(opt::select::sparse(), opt::Adagrad{}),
                                opt::group(opt::select::dense(), opt::Adam{}));
  px::Trainer<px::arch::Hybrid, std::decay_t<decltype(fine)>> tr(ctx, fine, t, w);
  CHECK(tr.steps() == 0);
}

TEST_CASE("optimizers take their hyper-parameters by name", "[optim]") {
  const auto a = opt::AdamW{}.with_lr(1e-3f).with_weight_decay(0.01f).with_beta2(0.99f);
  CHECK(a.lr == 1e-3f);
  CHECK(a.weight_decay == 0.01f);
  CHECK(a.beta2 == 0.99f);
  CHECK(a.beta1 == opt::Adam{}.beta1);  // the others keep their defaults
  const auto m = opt::Momentum{}.with_nesterov(true).with_momentum(0.5f);
  CHECK((m.nesterov && m.momentum == 0.5f && m.lr == opt::Momentum{}.lr));
  CHECK(opt::Adagrad{}.with_initial_accumulator(0.5f).initial_accumulator == 0.5f);
  CHECK(opt::Sgd{}.with_weight_decay(0.5f).weight_decay == 0.5f);
  STATIC_REQUIRE(px::optim::is_optimizer_v<decltype(recipe())>);
  STATIC_REQUIRE(decltype(recipe())::slots == 2);
}
