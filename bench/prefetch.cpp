// Lookups ahead (issue 22, item 2): how long a rank waits for the next
// batch's rows after step() when it prefetched them (Trainer::prefetch
// before its compute, Trainer::rows after step()) against a plain lookup()
// at the same point. Also the time prefetch() itself takes.
//
// Each step: [prefetch the next batch], compute (a sleep: the host idle,
// as while a GPU computes), add a gradient, step(), then rows() or
// lookup() of the next batch, timed. Every rank reports its median over the
// timed steps; rank 0 prints the slowest rank's median of each.
//
//   mpiexec -n 2 bench_prefetch [rows] [cols] [ids per rank] [compute ms] [steps]
//
// Sharded under the hybrid, with rows read in place (shared memory, one
// host) and asked of their owners (shared_memory off, as between hosts),
// with and without the communication thread (TrainerOptions::overlap).
#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

namespace px = parallax;

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double slowest(double mine) {
  double out = 0;
  MPI_Allreduce(&mine, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

struct Figures {
  double wait_lookup = 0, wait_rows = 0, prefetch_call = 0;
};

Figures measure(px::Context& ctx, std::size_t rows, std::size_t cols, std::size_t n, int compute_ms, int steps,
                bool shared, bool overlap) {
  px::Variable<px::Sparse, float> emb(ctx, "emb", {rows, cols}, px::init::Uniform{-1.f, 1.f, 1});
  px::TrainerOptions o;
  o.sharded.shared_memory = shared;
  o.overlap = overlap;
  o.overlap_needs_spare_core = false;  // the thread itself, on any host
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.01f}, emb);
  // Skewed ids (many repeats), fresh per step and rank.
  std::mt19937_64 gen(17 + static_cast<std::uint64_t>(ctx.rank()));
  std::uniform_real_distribution<double> u(0, 1);
  auto batch = [&] {
    std::vector<px::index_t> ids(n);
    for (auto& id : ids) id = static_cast<px::index_t>(static_cast<double>(rows - 1) * u(gen) * u(gen) * u(gen));
    return ids;
  };
  std::vector<float> grad(n * cols, 1e-3f);
  Figures f;
  for (bool ahead : {false, true}) {
    std::vector<double> waits, calls;
    auto ids = batch();
    auto got = trainer.lookup({px::Lookup{emb, ids}});
    for (int s = 0; s < steps; ++s) {
      auto next_ids = batch();
      px::Prefetched<decltype(emb)> next;
      if (ahead) {
        const auto t = Clock::now();
        next = trainer.prefetch({px::Lookup{emb, next_ids}});
        calls.push_back(us_since(t));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(compute_ms));
      emb.grad().add(ids, grad);
      trainer.step();
      const auto t = Clock::now();
      got = ahead ? trainer.rows(next) : trainer.lookup({px::Lookup{emb, next_ids}});
      waits.push_back(us_since(t));
      ids = next_ids;
    }
    waits.erase(waits.begin(), waits.begin() + std::min<std::size_t>(2, waits.size() / 2));  // warm-up
    (ahead ? f.wait_rows : f.wait_lookup) = slowest(median(waits));
    if (ahead) f.prefetch_call = slowest(median(calls));
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  const std::size_t rows = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000;
  const std::size_t cols = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64;
  const std::size_t n = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 16384;
  const int compute_ms = argc > 4 ? std::atoi(argv[4]) : 5;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 30;
  if (ctx.rank() == 0)
    std::printf("%d ranks, table %zu x %zu floats, %zu ids per rank, compute %d ms, %d steps (median, slowest rank)\n",
                ctx.size(), rows, cols, n, compute_ms, steps);
  if (ctx.rank() == 0)
    std::printf("%-28s %-8s %16s %16s %16s\n", "rows", "overlap", "lookup() us", "rows() us", "prefetch() us");
  for (bool shared : {true, false})
    for (bool overlap : {true, false}) {
      const Figures f = measure(ctx, rows, cols, n, compute_ms, steps, shared, overlap);
      if (ctx.rank() == 0)
        std::printf("%-28s %-8s %16.0f %16.0f %16.0f\n", shared ? "read in place (shared)" : "asked of owners",
                    overlap ? "on" : "off", f.wait_lookup, f.wait_rows, f.prefetch_call);
    }
  return 0;
}
