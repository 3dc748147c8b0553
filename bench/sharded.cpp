// Benchmarks of issue 3: a sharded sparse variable against the all-reduce
// architecture, and the partition count.
//
//   mpiexec -n 4 build/host/bench/bench_sharded --benchmark_format=json
//   bench/run_sharded.py          # 2 and 4 ranks, tables for docs/benchmarks.md
//
// Step/<arch>[_sorted]: one training step (lookup, gradient rows, step()) of a
// 1,000,000 x 64 float embedding where every rank touches 20,000 distinct
// rows (2%) drawn uniformly, plus a 256 x 256 dense layer. The ranks share
// one machine, so the hybrid's lookups read the owners' shards in shared
// memory; Step/hybrid_messages turns that off (ShardedOptions::shared_memory)
// and asks the owners for the rows. Counters per step and rank, from the
// trainer's CommStats (exact, the busiest rank):
//   sparse_sent      bytes the embedding's policy sent
//   formula          docs/design.md, "Byte accounting", for that policy with
//                    this step's k_i
//   sparse_vs_formula  sparse_sent / formula
//   inter_host_sent  bytes sent to other hosts (hosts emulated with
//                    ranks_per_host = 2 in Step/hybrid_2hosts)
// The learning rate is zero, so after the timed loop every looked-up row can
// be checked against its initial value (`wrong`); every kernel still runs.
// _sorted: the same ids in ascending order (the in-order lookup and a
// gradient coalesced as added; docs/design.md); _sorted_8pr: with 8
// partitions per rank, whose owners interleave.
//
// Partitions/P:<p>: the same step with Zipf-distributed ids (s = 1.1, the
// shape of word frequencies) and P partitions. `imbalance` is the busiest
// owner's share of the lookups over the mean (plan_partitions' cost model);
// `chosen` is 1 for the P plan_partitions picks. run_sharded.py fits
// t(P) = b/P + a(P-1) + c to the measured times (Parallax's method) as well.
#include "common/harness.hpp"

#include <parallax/parallax.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;

namespace {

constexpr std::size_t kRows = 1000000, kCols = 64, kTouched = kRows / 50, kDense = 256;

/// k distinct rows, uniformly (the bar's workload), or Zipf(s) ranks.
std::vector<px::index_t> draw_ids(std::mt19937_64& rng, double zipf_s) {
  std::vector<px::index_t> ids;
  ids.reserve(kTouched);
  std::unordered_set<px::index_t> seen;
  if (zipf_s <= 0) {
    std::uniform_int_distribution<px::index_t> u(0, kRows - 1);
    while (ids.size() < kTouched)
      if (const auto id = u(rng); seen.insert(id).second) ids.push_back(id);
    return ids;
  }
  // Zipf by inverse transform on the continuous approximation of the CDF;
  // duplicates are kept (a batch repeats frequent words), as in a real batch.
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double a = 1.0 - zipf_s, hi = std::pow(double(kRows) + 1, a) - 1;
  for (std::size_t i = 0; i < kTouched; ++i) {
    const double x = std::pow(1 + u(rng) * hi, 1 / a) - 1;
    ids.push_back(std::min<px::index_t>(static_cast<px::index_t>(x), kRows - 1));
  }
  return ids;
}

std::size_t distinct(std::vector<px::index_t> v) {
  std::sort(v.begin(), v.end());
  return static_cast<std::size_t>(std::unique(v.begin(), v.end()) - v.begin());
}

/// docs/design.md, "Byte accounting": bytes a rank sends per step for the
/// sparse variable, k_mine distinct ids of n_ids looked up. Shared shards: no ids go out for
/// a lookup, and every id read (repeats too) is a row from its owner.
double formula(const std::string& policy, bool shared, int n, std::size_t n_ids, std::size_t k_mine,
               std::size_t k_all) {
  const double b = 4, idx = 8, frac = double(n - 1) / n;
  if (policy == "ShardedPS" && shared) return frac * double(n_ids) * kCols * b + frac * k_mine * (kCols * b + idx);
  if (policy == "ShardedPS") return 2 * frac * k_mine * kCols * b + 2 * frac * k_mine * idx;
  return frac * double(k_all) * (kCols * b + idx);  // AllGatherv
}

double max_over_ranks(double v, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, comm);
  return v;
}

template <class Arch>
void run_step(benchmark::State& state, int ranks_per_host, double zipf_s, int partitions,
              bool planned, bool sorted = false, bool shared = true) {
  px::Context ctx(MPI_COMM_WORLD, px::ContextOptions{ranks_per_host});
  const MPI_Comm comm = ctx.comm();
  const int n = ctx.size();
  px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kCols}, px::init::Uniform{-0.1f, 0.1f, 5});
  px::Variable<px::Dense, float> w(ctx, "w", {kDense, kDense}, px::init::Glorot{6});
  px::TrainerOptions options;
  if (partitions > 0) options.partitions["emb"] = partitions;
  options.sharded.shared_memory = shared;
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, options, px::optim::Sgd{0.0f}, emb, w);
  const std::string policy = trainer.policy_of(emb);
  const bool in_shared_memory = trainer.in_shared_memory(emb);

  std::mt19937_64 rng(1000 + static_cast<unsigned>(ctx.rank()));
  std::vector<px::index_t> ids;
  std::vector<float> grad(kTouched * kCols, 1e-3f);
  px::Rows<float> rows;
  auto before = [&] {
    ids = draw_ids(rng, zipf_s);
    if (sorted) std::sort(ids.begin(), ids.end());
  };
  auto step = [&] {
    rows = trainer.lookup(emb, ids);
    emb.grad().add(ids, grad);
    for (auto& g : w.grad()) g = 1e-3f;
    trainer.step();
  };
  const int warmup = 2;
  std::uint64_t sparse_sent = 0, inter = 0, steps = 0;
  double want = 0;
  for (int i = 0; i < warmup; ++i) {
    before();
    step();
  }
  MPI_Barrier(comm);
  for (auto _ : state) {
    before();
    std::uint64_t k_mine = distinct(ids), k_all = k_mine;
    MPI_Allreduce(MPI_IN_PLACE, &k_all, 1, MPI_UINT64_T, MPI_SUM, comm);
    const px::Traffic t0 = trainer.stats().variable("emb");
    const std::uint64_t inter0 = trainer.stats().total().sent_inter;
    MPI_Barrier(comm);
    const double start = MPI_Wtime();
    step();
    double elapsed = MPI_Wtime() - start;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm);
    state.SetIterationTime(elapsed);
    sparse_sent += (trainer.stats().variable("emb") - t0).sent();
    inter += trainer.stats().total().sent_inter - inter0;
    want += formula(policy, in_shared_memory, n, ids.size(), k_mine, k_all);
    ++steps;
  }

  // The looked-up rows of the last step are the initial values (lr = 0).
  std::vector<float> expected(ids.size() * kCols);
  const auto rule = emb.rule();
  px::for_each(px::Exec<px::HostSpace>{}, expected.size(),
               px::detail::FillInit<float>{rule, expected.data(), kCols, 0, ids.data()});
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) wrong += rows.data[i] != expected[i];
  pb::set_wrong(state, wrong, comm);

  using C = benchmark::Counter;
  const double sent = max_over_ranks(double(sparse_sent) / double(steps), comm);
  const double form = max_over_ranks(want / double(steps), comm);
  state.counters["sparse_sent"] = C(sent, C::kDefaults, C::OneK::kIs1024);
  state.counters["formula"] = C(form, C::kDefaults, C::OneK::kIs1024);
  state.counters["sparse_vs_formula"] = C(form > 0 ? sent / form : 0);
  state.counters["inter_host_sent"] = C(max_over_ranks(double(inter) / double(steps), comm), C::kDefaults,
                                        C::OneK::kIs1024);
  state.counters["samples_per_s"] = C(double(kTouched) * n, C::kIsIterationInvariantRate);
  state.counters["ranks"] = C(n);
  state.counters["shared"] = C(in_shared_memory ? 1 : 0);
  if (partitions > 0) {
    // The cost model's view of this P, from the last step's ids.
    const px::PartitionPlan plan = px::plan_partitions(trainer.engine(), kRows, ids, {partitions});
    state.counters["imbalance"] = C(plan.candidates.front().imbalance);
    state.counters["partitions"] = C(partitions);
    state.counters["chosen"] = C(planned ? 1 : 0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  pb::IterationPolicy policy;
  policy.budget_bytes = 0;  // whole training steps: the minimum iteration count
  policy.min_iterations = 8;
  pb::Session session(argc, argv, policy);
  const int n = session.size();
  const std::size_t iters = 0;  // whole steps: the policy's minimum count

  session.add("Step/hybrid", iters, [&](benchmark::State& s) { run_step<px::arch::Hybrid>(s, 0, 0, 0, false); });
  session.add("Step/hybrid_messages", iters,
              [&](benchmark::State& s) { run_step<px::arch::Hybrid>(s, 0, 0, 0, false, false, false); });
  session.add("Step/allreduce", iters,
              [&](benchmark::State& s) { run_step<px::arch::AllReduce>(s, 0, 0, 0, false); });
  session.add("Step/ps", iters, [&](benchmark::State& s) { run_step<px::arch::PS>(s, 0, 0, 0, false); });
  // The same ids, ascending: with one partition per rank the lookup needs no
  // sort and receives its rows in place, and the gradient is coalesced as added.
  session.add("Step/hybrid_sorted", iters,
              [&](benchmark::State& s) { run_step<px::arch::Hybrid>(s, 0, 0, 0, false, true); });
  session.add("Step/allreduce_sorted", iters,
              [&](benchmark::State& s) { run_step<px::arch::AllReduce>(s, 0, 0, 0, false, true); });
  // Ascending ids over 8 partitions per rank: owners interleave, so the keys
  // ascend within each owner only (grouped by a counting sort on the host).
  session.add("Step/hybrid_sorted_8pr", iters,
              [&](benchmark::State& s) { run_step<px::arch::Hybrid>(s, 0, 0, 8 * n, false, true); });
  if (n >= 4)
    session.add("Step/hybrid_2hosts", iters,
                [&](benchmark::State& s) { run_step<px::arch::Hybrid>(s, 2, 0, 0, false); });

  // The partition count: the plan on a sample of Zipf ids, then each candidate.
  const double zipf = 1.1;
  int chosen = n;
  {
    px::engine::Mpi mpi(session.context());
    std::mt19937_64 rng(77 + static_cast<unsigned>(session.rank()));
    std::vector<px::index_t> sample;
    for (int b = 0; b < 3; ++b) {
      const auto ids = draw_ids(rng, zipf);
      sample.insert(sample.end(), ids.begin(), ids.end());
    }
    chosen = px::plan_partitions(mpi, kRows, sample).partitions;
  }
  std::vector<int> candidates{n, 4 * n, 16 * n, 64 * n, 256 * n};
  if (std::find(candidates.begin(), candidates.end(), chosen) == candidates.end()) candidates.push_back(chosen);
  std::sort(candidates.begin(), candidates.end());
  for (int p : candidates) {
    session.add("Partitions/P:" + std::to_string(p), iters, [&, p](benchmark::State& s) {
      run_step<px::arch::Hybrid>(s, 0, zipf, p, p == chosen);
    });
  }
  return session.run();
}
