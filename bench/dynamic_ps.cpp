// A training step (lookup, gradient, step) of a DynamicVariable through
// DynamicPS against the same step of a fixed sparse Variable through
// ShardedPS (arch::Hybrid, Sgd), on the same ids: K keys, skewed (a cube of
// a uniform draw), n per rank a step; the dynamic key is the fixed id
// scrambled by splitmix64, and each rank's capacity holds its share of the
// K keys with room to spare, so nothing is evicted and both hold the same
// live rows. The two alternate in rounds (the first variant alternates
// too); each round reports the slowest rank's median step, and the program
// prints the median over rounds and the ratio:
//
//   mpiexec -n 2 build/host/bench/bench_dynamic_ps [keys cols ids steps rounds]
#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace px = parallax;

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double slowest(double mine) {
  double out = 0;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

struct Shape {
  std::size_t keys, cols, n;
  int steps;
};

std::vector<std::vector<px::index_t>> batches(const px::Context& ctx, const Shape& s) {
  std::mt19937_64 gen(17 + static_cast<std::uint64_t>(ctx.rank()));
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::vector<px::index_t>> out(static_cast<std::size_t>(s.steps));
  for (auto& ids : out) {
    ids.resize(s.n);
    for (auto& id : ids) id = static_cast<px::index_t>(static_cast<double>(s.keys - 1) * u(gen) * u(gen) * u(gen));
  }
  return out;
}

// The slowest rank's median step, in microseconds.
double fixed_step(const px::Context& ctx, const Shape& s, const std::vector<std::vector<px::index_t>>& ids) {
  px::Variable<px::Sparse, float> emb(ctx, "emb", {s.keys, s.cols}, px::init::Uniform{-0.1f, 0.1f, 1});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.01f}, emb);
  const std::vector<float> grad(s.n * s.cols, 1e-3f);
  std::vector<double> times;
  for (const auto& batch : ids) {
    const auto t = Clock::now();
    (void)trainer.lookup(emb, batch);
    emb.grad().add(batch, grad);
    trainer.step();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  return slowest(median(times));
}

double dynamic_step(const px::Context& ctx, const Shape& s, const std::vector<std::vector<px::index_t>>& ids) {
  px::dynamic::Options o;
  o.capacity = s.keys / static_cast<std::size_t>(ctx.size()) * 3 / 2 + 1024;
  o.cols = s.cols;
  o.init = px::init::Uniform{-0.1f, 0.1f, 1};
  px::DynamicVariable<float> emb(ctx, "emb", o);
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.01f}, emb);
  const std::vector<float> grad(s.n * s.cols, 1e-3f);
  std::vector<std::uint64_t> keys(s.n);
  std::vector<double> times;
  for (const auto& batch : ids) {
    const auto t = Clock::now();
    for (std::size_t i = 0; i < s.n; ++i) keys[i] = px::detail::splitmix64(static_cast<std::uint64_t>(batch[i]));
    (void)trainer.lookup(emb, keys);
    emb.grad().add(keys, grad);
    trainer.step();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  return slowest(median(times));
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  Shape s{argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16,
          argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 8192, argc > 4 ? std::atoi(argv[4]) : 20};
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 5;
  const auto ids = batches(ctx, s);
  std::vector<double> fixed, dynamic;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) {
      fixed.push_back(fixed_step(ctx, s, ids));
      dynamic.push_back(dynamic_step(ctx, s, ids));
    } else {
      dynamic.push_back(dynamic_step(ctx, s, ids));
      fixed.push_back(fixed_step(ctx, s, ids));
    }
  }
  if (ctx.rank() == 0) {
    std::printf("%d ranks, %zu keys x %zu floats, %zu ids per rank a step, %d steps, %d rounds\n", ctx.size(), s.keys,
                s.cols, s.n, s.steps, rounds);
    std::printf("round  fixed (ShardedPS) us  dynamic (DynamicPS) us\n");
    for (int r = 0; r < rounds; ++r) std::printf("%5d  %20.0f  %22.0f\n", r, fixed[r], dynamic[r]);
    const double f = median(fixed), d = median(dynamic);
    std::printf("median step: fixed %.0f us, dynamic %.0f us; dynamic samples/s / fixed samples/s = %.2f\n", f, d,
                f / d);
  }
  return 0;
}
