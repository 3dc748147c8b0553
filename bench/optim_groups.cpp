// Optimizer groups (issue 37, item 3): the per-step cost of optim::Groups
// against a single optimizer at the same model (two tables, two dense
// layers). Compared:
//
//   adam           optim::Adam on every variable (the baseline)
//   groups(adam)   optim::Groups with Adam on the tables and Adam on the
//                  layers: the same arithmetic, so the difference is what
//                  the groups' binding and dispatch cost
//   adagrad        optim::Adagrad on every variable
//   groups(recipe) Adagrad on the tables, AdamW on the layers, no decay on
//                  the biases, half the rate on one table
//
// Each step: a lookup of `ids` ids per table on every rank, their gradient
// rows, the dense gradients, step(). The configurations run in turn,
// `rounds` times, `steps` timed steps each (after one untimed); each rank's
// median step over everything, and rank 0 prints the slowest rank's.
//
// Then rank 0 times the update alone: apply_dense of Adam through the
// optimizer and through a Groups binding, alternated call by call.
//
//   mpiexec -n 2 bench_optim_groups [rows] [cols] [ids per rank] [hidden] [rounds] [steps]
#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace px = parallax;
namespace opt = px::optim;

namespace {

using Clock = std::chrono::steady_clock;

/// The slowest rank's median of `v`. Collective.
double slowest_median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  double out = 0;
  MPI_Allreduce(&v[v.size() / 2], &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

struct Sizes {
  std::size_t rows = 200000, cols = 32, ids = 4096, hidden = 512;
};

/// One configuration's model and trainer, stepped on demand.
struct Runner {
  virtual ~Runner() = default;
  virtual double step() = 0;  // microseconds
};

template <class Optimizer>
struct RunnerOf final : Runner {
  px::Variable<px::Sparse, float> user, item;
  px::Variable<px::Dense, float> w1, b1, w2, b2;
  px::Trainer<px::arch::Hybrid, Optimizer> trainer;
  Sizes s;
  std::mt19937_64 gen;

  RunnerOf(px::Context& ctx, const Optimizer& o, Sizes sizes)
      : user(ctx, "user", {sizes.rows, sizes.cols}, px::init::Uniform{-0.1f, 0.1f, 1}),
        item(ctx, "item", {sizes.rows, sizes.cols}, px::init::Uniform{-0.1f, 0.1f, 2}),
        w1(ctx, "w1", {2 * sizes.cols, sizes.hidden}, px::init::Glorot{3}),
        b1(ctx, "b1", {sizes.hidden}, px::init::Constant{0.0}),
        w2(ctx, "w2", {sizes.hidden, sizes.hidden}, px::init::Glorot{4}),
        b2(ctx, "b2", {sizes.hidden}, px::init::Constant{0.0}),
        trainer(ctx, o, user, item, w1, b1, w2, b2),
        s(sizes),
        gen(11 + static_cast<std::uint64_t>(ctx.rank())) {}

  double step() override {
    std::uniform_int_distribution<px::index_t> id(0, static_cast<px::index_t>(s.rows - 1));
    std::vector<px::index_t> ids(s.ids);
    for (auto& i : ids) i = id(gen);
    std::vector<float> g(s.ids * s.cols, 1e-3f);
    const auto t = Clock::now();
    trainer.lookup(user, ids);
    trainer.lookup(item, ids);
    user.grad().add(ids, g);
    item.grad().add(ids, g);
    for (auto* v : {&w1, &b1, &w2, &b2}) {
      auto& grad = v->grad();  // host memory (engine::Mpi)
      std::fill_n(grad.data(), grad.size(), 1e-3f);
    }
    trainer.step();
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  }
};

/// The update alone, one process: apply_dense of Adam over `n` elements
/// through the optimizer and through a Groups binding to the same Adam,
/// alternated call by call; the medians, microseconds.
std::pair<double, double> update_alone(std::size_t n, int calls) {
  const opt::Adam adam = opt::AdamW{}.with_lr(1e-3f).with_weight_decay(0.01f);
  const auto groups = opt::Groups(opt::group(opt::select::all(), adam));
  const auto bound = opt::bind(groups, opt::VariableInfo{"w", false});
  const px::Exec<px::HostSpace> ex;
  std::vector<float> w1(n, 0.5f), w2(n, 0.5f), g(n, 1e-3f);
  opt::State<opt::Adam, float, px::HostSpace> s1(adam, n);
  opt::State<std::decay_t<decltype(groups)>, float, px::HostSpace> s2(bound, n);
  std::vector<double> plain, grouped;
  for (int c = 0; c < calls; ++c) {
    auto t = Clock::now();
    opt::apply_dense(ex, adam, static_cast<std::uint64_t>(c + 1), w1.data(), g.data(), n, s1, 1.f);
    plain.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
    t = Clock::now();
    opt::apply_dense(ex, *bound, static_cast<std::uint64_t>(c + 1), w2.data(), g.data(), n, s2, 1.f);
    grouped.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  if (w1 != w2) std::printf("update_alone: the two updates differ\n");
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  return {median(plain), median(grouped)};
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  Sizes s;
  if (argc > 1) s.rows = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) s.cols = std::strtoull(argv[2], nullptr, 10);
  if (argc > 3) s.ids = std::strtoull(argv[3], nullptr, 10);
  if (argc > 4) s.hidden = std::strtoull(argv[4], nullptr, 10);
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 5;
  const int steps = argc > 6 ? std::atoi(argv[6]) : 20;

  const opt::Adam adam = opt::AdamW{}.with_lr(1e-3f).with_weight_decay(0.01f);
  const opt::Adagrad adagrad = opt::Adagrad{}.with_lr(0.05f);
  const auto same = opt::Groups(opt::group(opt::select::sparse(), adam), opt::group(opt::select::dense(), adam));
  const auto recipe = opt::Groups(opt::group(opt::select::sparse(), adagrad), opt::group(opt::select::dense(), adam))
                          .no_weight_decay(opt::select::name_ends_with("b1"))
                          .no_weight_decay(opt::select::name_ends_with("b2"))
                          .scale_lr(opt::select::named({"item"}), 0.5f);

  std::vector<std::string> names = {"adam", "groups(adam)", "adagrad", "groups(recipe)"};
  std::vector<std::unique_ptr<Runner>> runners;
  runners.push_back(std::make_unique<RunnerOf<opt::Adam>>(ctx, adam, s));
  runners.push_back(std::make_unique<RunnerOf<std::decay_t<decltype(same)>>>(ctx, same, s));
  runners.push_back(std::make_unique<RunnerOf<opt::Adagrad>>(ctx, adagrad, s));
  runners.push_back(std::make_unique<RunnerOf<std::decay_t<decltype(recipe)>>>(ctx, recipe, s));

  std::vector<std::vector<double>> times(runners.size());
  for (auto& r : runners) r->step();  // warm
  for (int round = 0; round < rounds; ++round)
    for (std::size_t c = 0; c < runners.size(); ++c)
      for (int i = 0; i < steps; ++i) times[c].push_back(runners[c]->step());

  std::vector<double> med(runners.size());
  for (std::size_t c = 0; c < runners.size(); ++c) med[c] = slowest_median(times[c]);
  if (ctx.rank() == 0) {
    std::printf("ranks=%d rows=%zu cols=%zu ids=%zu hidden=%zu rounds=%d steps=%d\n", ctx.size(), s.rows, s.cols,
                s.ids, s.hidden, rounds, steps);
    for (std::size_t c = 0; c < runners.size(); ++c)
      std::printf("%-16s median step %9.1f us\n", names[c].c_str(), med[c]);
    std::printf("groups(adam) / adam     = %.3f\n", med[1] / med[0]);
    std::printf("groups(recipe) / adagrad = %.3f\n", med[3] / med[2]);
    std::printf("groups(recipe) / adam   = %.3f\n", med[3] / med[0]);
    for (std::size_t n : {std::size_t{1024}, 2 * s.cols * s.hidden + s.hidden * s.hidden}) {
      const auto [plain, grouped] = update_alone(n, 2000);
      std::printf("apply_dense Adam, %zu elements: %.2f us, through Groups %.2f us (%.3f)\n", n, plain, grouped,
                  grouped / plain);
    }
  }
  return 0;
}
