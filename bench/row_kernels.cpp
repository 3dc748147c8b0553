// Host row kernels: the local work parallax does every step besides its
// messages (the lookup's gather, coalescing sparse gradients, the lazy
// optimizer update, the ring's reduction), each against a memcpy of the
// same bytes at the same memory level, and the hooks and flags that made
// them faster against their baselines.
//
//   build/host/bench/bench_row_kernels --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// One process, no MPI, on the process's OpenMP team (OMP_NUM_THREADS). The
// workloads (row_kernels.hpp): 8,192 distinct rows of 128 floats a step, a
// new set of rows each iteration, from a rank's shard of word_lm's softmax
// table at the demo's shape (argument 0: 100 MB) or from a 1 GB table
// (argument 1: DRAM everywhere). Benchmarks:
//   AdagradRows/library      optim::apply_rows(Adagrad), as the trainer runs it
//   AdagradRows/no_prefetch  the same kernel with its prefetch(r) hidden
//   AdagradRows/math_errno   the same kernel compiled with -fmath-errno
//   AdagradRows/baseline_isa the same kernel built for the baseline x86-64 only
//                            (PARALLAX_NO_ISA_CLONES), not for the CPU's vector level
//   AdagradRows/contiguous   the same kernel on as many contiguous rows: the
//                            update without the scatter, beside Memcpy/rows
//   TouchRows/floor          the table's and the accumulator's rows of a set read
//                            and written with no arithmetic, prefetched: the floor
//                            of any one-slot update of scattered rows in place
//   AdamRows/library         optim::apply_rows(Adam) (two state rows)
//   AdamRows/contiguous      the same kernel on as many contiguous rows
//   AdamRows/floor           Adam's rows (gradient, table, both moments) read and
//                            written with no arithmetic, prefetched: its floor
//   GatherRows/library       detail::GatherRows (a lookup's gather)
//   GatherRows/no_prefetch   the same kernel with its prefetch(r) hidden
//   GatherAt/library         sharded::GatherAt (the gather from shared shards)
//   Memcpy/rows              the baseline of the row kernels: as many rows of the
//                            same table, contiguous, copied by the same team
//   Coalesce/library         detail::coalesce_rows (SparseGrad::coalesce of rows not
//                            yet sorted): 16,384 rows of 128 floats with repeated
//                            ids, word_lm's embedding gradient at 8,192 words
//   Coalesce/thrust          the same with Thrust's stable sort of the ids (what
//                            other spaces run), the baseline of the radix grouping
//   Coalesce/sorted_sums     the radix grouping, then the sums gathering rows in
//                            sorted order (SumSegmentRows, a segment per task on the team)
//   Coalesce/group           the radix grouping alone (detail::radix_group)
//   Memcpy/coalesce          its baseline: the 16,384 rows copied
//   AddInto/ring             RingAllReducer's reduction (ContiguousView::add): a
//                            received 128 KiB segment added into each segment of
//                            a 64 MiB gradient in turn
//   Memcpy/ring              its baseline: the segment copied into each in turn
//   NonFinite/library        detail::find_non_finite over the step's gradient
//                            rows, all finite (TrainerOptions::check_finite)
//   NonFinite/find_if        the same scan as a sequential thrust::find_if
//                            of NotFinite (the device path's kernel)
// Counter `bytes_per_second`: the bytes read and written (a memcpy of n
// bytes: 2n), so every kernel is quoted as a fraction of memcpy's rate.
#include "row_kernels.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>
#include <thrust/find.h>
#include <thrust/system/cpp/execution_policy.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;

namespace {

/// A row kernel without its prefetch(r): the baseline of the hook.
template <class F>
struct NoPrefetch {
  F f;
  void operator()(std::size_t r, std::size_t c) const { f(r, c); }
};

const px::Exec<px::HostSpace> host;
constexpr std::size_t kRowBytes = pb::RowWorkload::cols * sizeof(float);

void adagrad_rows(pb::RowWorkload& w, std::size_t s) {
  const px::optim::Adagrad opt{0.5f};
  px::optim::apply_rows(host, opt, 1, w.table.data(), w.ids[s].data(), w.grad.data(), pb::RowWorkload::touched,
                        pb::RowWorkload::cols, w.state, 1.0f);
}
/// The library's sparse update with its prefetch(r) hidden: the baseline of the hook.
void adagrad_rows_no_prefetch(pb::RowWorkload& w, std::size_t s) {
  using Update = px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float, px::optim::Adagrad::slots>;
  px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols,
                    NoPrefetch<Update>{Update{px::optim::Adagrad{0.5f}.rule<float>(1), w.table.data(), w.state.slot(0),
                                              nullptr, w.ids[s].data(), w.grad.data(), pb::RowWorkload::cols, 1.0f}});
}

template <class Run>
void run_rows(benchmark::State& state, Run run, std::size_t bytes_per_row) {
  auto& w = pb::RowWorkload::of(state.range(0));
  std::size_t s = 0;
  for (auto _ : state) {
    run(w, s);
    s = (s + 1) % w.sets;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * pb::RowWorkload::touched * bytes_per_row));
}

// Adagrad reads and writes a row of the table and of the accumulator, and reads a gradient row.
constexpr std::size_t kAdagradBytes = 5 * kRowBytes;

void AdagradRows_library(benchmark::State& state) { run_rows(state, adagrad_rows, kAdagradBytes); }
void AdagradRows_no_prefetch(benchmark::State& state) { run_rows(state, adagrad_rows_no_prefetch, kAdagradBytes); }
void AdagradRows_baseline_isa(benchmark::State& state) {
  run_rows(state, pb::adagrad_rows_baseline_isa, kAdagradBytes);
}
void AdagradRows_math_errno(benchmark::State& state) {
  run_rows(state, pb::adagrad_rows_math_errno, kAdagradBytes);
}

template <bool Prefetch>
void gather_rows(pb::RowWorkload& w, std::size_t s) {
  const px::detail::GatherRows<float> f{w.table.data(), w.ids[s].data(), w.out.data(), pb::RowWorkload::cols};
  if constexpr (Prefetch)
    px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols, f);
  else
    px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols, NoPrefetch<decltype(f)>{f});
}
void GatherRows_library(benchmark::State& state) { run_rows(state, gather_rows<true>, 2 * kRowBytes); }
void GatherRows_no_prefetch(benchmark::State& state) { run_rows(state, gather_rows<false>, 2 * kRowBytes); }

// ---------------------------------------------------------------- against memcpy

/// Copies `bytes` from src to dst on the OpenMP team, a block a thread, from
/// the size at which for_each takes the team for floats: the baseline each
/// kernel is quoted against.
void team_memcpy(void* dst, const void* src, std::size_t bytes) {
  const int threads = omp_get_max_threads();
  [[maybe_unused]] const bool team = bytes / sizeof(float) >= px::detail::host_parallel_threshold;
#pragma omp parallel for schedule(static) if (team)
  for (int t = 0; t < threads; ++t) {
    const std::size_t b0 = bytes * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
    const std::size_t b1 = bytes * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
    std::memcpy(static_cast<char*>(dst) + b0, static_cast<const char*>(src) + b0, b1 - b0);
  }
}

/// Set s's baseline: as many rows as a set, contiguous, from the same table.
void memcpy_rows(pb::RowWorkload& w, std::size_t s) {
  team_memcpy(w.out.data(), w.table.data() + s * pb::RowWorkload::touched * pb::RowWorkload::cols,
              pb::RowWorkload::touched * kRowBytes);
}
void Memcpy_rows(benchmark::State& state) { run_rows(state, memcpy_rows, 2 * kRowBytes); }

void gather_at(pb::RowWorkload& w, std::size_t s) {
  px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols,
                    px::policy::sharded::GatherAt<float>{w.row_pointers(s), w.out.data(), pb::RowWorkload::cols});
}
void GatherAt_library(benchmark::State& state) {
  pb::RowWorkload::of(state.range(0)).row_pointers(0);  // made before the timed loop
  run_rows(state, gather_at, 2 * kRowBytes);
}

/// The library's Adagrad update on set s's count of contiguous rows: the
/// kernel without the scatter, beside the memcpy of the same rows.
void adagrad_contiguous(pb::RowWorkload& w, std::size_t s) {
  px::optim::apply_rows(host, px::optim::Adagrad{0.5f}, 1, w.table.data(), w.contiguous_ids(s), w.grad.data(),
                        pb::RowWorkload::touched, pb::RowWorkload::cols, w.state, 1.0f);
}
void AdagradRows_contiguous(benchmark::State& state) {
  pb::RowWorkload::of(state.range(0)).contiguous_ids(0);  // made before the timed loop
  run_rows(state, adagrad_contiguous, kAdagradBytes);
}

/// The floor of any update of scattered rows in place with one state row:
/// the table's and the accumulator's rows of set s read and written (each
/// element plus one), no arithmetic to speak of, prefetched as the library's
/// update is. An update's fraction of this is how close it is to what the
/// scattered accesses allow; its fraction of Memcpy/rows, to streaming.
struct TouchRows {
  float* w;
  float* s0;
  const px::index_t* rows;
  std::size_t cols;
  void operator()(std::size_t j, std::size_t c) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols + c;
    w[at] += 1.0f;
    s0[at] += 1.0f;
  }
  void prefetch(std::size_t j) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols;
    px::prefetch_bytes(w + at, cols * sizeof(float));
    px::prefetch_bytes(s0 + at, cols * sizeof(float));
  }
};
void touch_rows(pb::RowWorkload& w, std::size_t s) {
  px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols,
                    TouchRows{w.table.data(), w.state.slot(0), w.ids[s].data(), pb::RowWorkload::cols});
}
// Reads and writes a row of the table and of the accumulator.
void TouchRows_floor(benchmark::State& state) { run_rows(state, touch_rows, 4 * kRowBytes); }

void adam_rows(pb::RowWorkload& w, std::size_t s) {
  px::optim::apply_rows(host, px::optim::Adam{1e-3f}, 1, w.table.data(), w.ids[s].data(), w.grad.data(),
                        pb::RowWorkload::touched, pb::RowWorkload::cols, w.adam(), 1.0f);
}
// Adam reads and writes a row of the table and of both moments, and reads a gradient row.
void AdamRows_library(benchmark::State& state) {
  pb::RowWorkload::of(state.range(0)).adam();  // made before the timed loop
  run_rows(state, adam_rows, 7 * kRowBytes);
}
void adam_contiguous(pb::RowWorkload& w, std::size_t s) {
  px::optim::apply_rows(host, px::optim::Adam{1e-3f}, 1, w.table.data(), w.contiguous_ids(s), w.grad.data(),
                        pb::RowWorkload::touched, pb::RowWorkload::cols, w.adam(), 1.0f);
}
void AdamRows_contiguous(benchmark::State& state) {
  auto& w = pb::RowWorkload::of(state.range(0));
  w.adam();  // made before the timed loop
  w.contiguous_ids(0);
  run_rows(state, adam_contiguous, 7 * kRowBytes);
}

/// Adam's accesses without its arithmetic: a gradient row read, and the
/// table's and both moments' rows of set s read and written (the table's
/// plus the gradient, each moment plus one), prefetched as the library's
/// update is. What the scattered accesses of a two-slot update allow: the
/// floor AdamRows/library is quoted against beside Memcpy/rows.
struct TouchAdamRows {
  float* w;
  float* s0;
  float* s1;
  const px::index_t* rows;
  const float* g;
  std::size_t cols;
  void operator()(std::size_t j, std::size_t c) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols + c;
    w[at] += g[j * cols + c];
    s0[at] += 1.0f;
    s1[at] += 1.0f;
  }
  void prefetch(std::size_t j) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols;
    px::prefetch_bytes(w + at, cols * sizeof(float));
    px::prefetch_bytes(s0 + at, cols * sizeof(float));
    px::prefetch_bytes(s1 + at, cols * sizeof(float));
  }
};
void touch_adam_rows(pb::RowWorkload& w, std::size_t s) {
  px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols,
                    TouchAdamRows{w.table.data(), w.adam().slot(0), w.adam().slot(1), w.ids[s].data(), w.grad.data(),
                                  pb::RowWorkload::cols});
}
void AdamRows_floor(benchmark::State& state) {
  pb::RowWorkload::of(state.range(0)).adam();  // made before the timed loop
  run_rows(state, touch_adam_rows, 7 * kRowBytes);
}

/// Rows of a sparse gradient before it is coalesced: 16,384 rows (word_lm's
/// context words at 8,192 words a step) with ids drawn log-uniformly from
/// 200,000, as word frequencies fall, so the frequent ones repeat; 8 sets.
struct UncoalescedRows {
  static constexpr std::size_t n = 16384, cols = 128, sets = 8;
  std::vector<std::vector<px::index_t>> ids;
  std::vector<float> values = std::vector<float>(n * cols, 1e-3f);
  px::Buffer<px::index_t> out_ids;
  px::Buffer<float> out_values;
  px::detail::CoalesceScratch<px::HostSpace> scratch;
  UncoalescedRows() {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (std::size_t k = 0; k < sets; ++k) {
      ids.emplace_back(n);
      for (auto& id : ids.back()) id = static_cast<px::index_t>(std::exp(u(rng) * std::log(200000.0))) - 1;
    }
  }
  static UncoalescedRows& get() {
    static UncoalescedRows r;
    return r;
  }
};

template <class Coalesce>
void run_coalesce(benchmark::State& state, Coalesce coalesce) {
  auto& r = UncoalescedRows::get();
  std::size_t s = 0, bytes = 0;
  for (auto _ : state) {
    const std::size_t m = coalesce(r, s);
    bytes += (r.n + m) * (r.cols * sizeof(float) + sizeof(px::index_t));  // rows and ids read, sums and ids written
    s = (s + 1) % r.sets;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}
void Coalesce_library(benchmark::State& state) {
  run_coalesce(state, [](UncoalescedRows& r, std::size_t s) {
    return px::detail::coalesce_rows(host, r.ids[s].data(), r.values.data(), r.n, r.cols, r.out_ids, r.out_values,
                                     r.scratch);
  });
}
void Coalesce_thrust(benchmark::State& state) {
  run_coalesce(state, [](UncoalescedRows& r, std::size_t s) {
    return px::detail::coalesce_rows_thrust(host, r.ids[s].data(), r.values.data(), r.n, r.cols, r.out_ids,
                                            r.out_values, r.scratch);
  });
}
/// The radix grouping, then the segment sums gathering rows in sorted order,
/// a segment per task on the team: the baseline of the sums in input order.
void Coalesce_sorted_sums(benchmark::State& state) {
  run_coalesce(state, [](UncoalescedRows& r, std::size_t s) {
    const std::size_t m = *px::detail::radix_group(r.ids[s].data(), r.n, r.scratch, r.out_ids);
    return px::detail::sum_coalesced(host, r.values.data(), r.n, m, r.cols, r.out_ids, r.out_values, r.scratch);
  });
}
/// The grouping alone (bytes counted as for the whole coalesce, so its
/// rate says how much of Coalesce/library's time it is).
void Coalesce_group(benchmark::State& state) {
  run_coalesce(state, [](UncoalescedRows& r, std::size_t s) {
    return *px::detail::radix_group(r.ids[s].data(), r.n, r.scratch, r.out_ids);
  });
}
void Memcpy_coalesce(benchmark::State& state) {
  auto& r = UncoalescedRows::get();
  r.out_values.resize_discard(r.n * r.cols);
  for (auto _ : state) {
    team_memcpy(r.out_values.data(), r.values.data(), r.n * r.cols * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * 2 * r.n * r.cols * sizeof(float)));
}

/// A 64 MiB gradient the ring reduces in 128 KiB segments (RingOptions'
/// default), one received segment added into each in turn.
struct RingSegments {
  static constexpr std::size_t segment = (std::size_t{128} << 10) / sizeof(float), count = 512;
  std::vector<float> grad = std::vector<float>(segment * count, 1.0f);
  std::vector<float> received = std::vector<float>(segment, 1e-3f);
  static RingSegments& get() {
    static RingSegments r;
    return r;
  }
};

template <class Step>
void run_segments(benchmark::State& state, Step step, std::size_t bytes_per_element) {
  auto& r = RingSegments::get();
  std::size_t g = 0;
  for (auto _ : state) {
    step(r.grad.data() + g * r.segment, r.received.data(), r.segment);
    g = (g + 1) % r.count;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * r.segment * bytes_per_element));
}
// The ring's add reads the gradient and the segment and writes the gradient.
void AddInto_ring(benchmark::State& state) {
  run_segments(state, [](float* dst, const float* src, std::size_t n) { px::policy::ring::ContiguousView<float>(dst).add(host, 0, src, n); },
               3 * sizeof(float));
}
void Memcpy_ring(benchmark::State& state) {
  run_segments(state, [](float* dst, const float* src, std::size_t n) { team_memcpy(dst, src, n * sizeof(float)); },
               2 * sizeof(float));
}
void non_finite_library(pb::RowWorkload& w, std::size_t) {
  benchmark::DoNotOptimize(px::detail::find_non_finite(host, w.grad.data(), w.grad.size()));
}
void non_finite_find_if(pb::RowWorkload& w, std::size_t) {
  const float* g = w.grad.data();
  benchmark::DoNotOptimize(thrust::find_if(thrust::cpp::par, g, g + w.grad.size(), px::detail::NotFinite<float>{}));
}
void NonFinite_library(benchmark::State& state) { run_rows(state, non_finite_library, kRowBytes); }
void NonFinite_find_if(benchmark::State& state) { run_rows(state, non_finite_find_if, kRowBytes); }

}  // namespace

// Run with --benchmark_enable_random_interleaving=true (docs/benchmarks.md), so
// drift on a shared machine falls on every variant alike.
BENCHMARK(AdagradRows_library)->Name("AdagradRows/library")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdagradRows_no_prefetch)->Name("AdagradRows/no_prefetch")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdagradRows_baseline_isa)->Name("AdagradRows/baseline_isa")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdagradRows_math_errno)->Name("AdagradRows/math_errno")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(GatherRows_library)->Name("GatherRows/library")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(GatherRows_no_prefetch)->Name("GatherRows/no_prefetch")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdagradRows_contiguous)->Name("AdagradRows/contiguous")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(GatherAt_library)->Name("GatherAt/library")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(TouchRows_floor)->Name("TouchRows/floor")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdamRows_library)->Name("AdamRows/library")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdamRows_contiguous)->Name("AdamRows/contiguous")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdamRows_floor)->Name("AdamRows/floor")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(Memcpy_rows)->Name("Memcpy/rows")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(Coalesce_library)->Name("Coalesce/library")->Unit(benchmark::kMicrosecond);
BENCHMARK(Coalesce_thrust)->Name("Coalesce/thrust")->Unit(benchmark::kMicrosecond);
BENCHMARK(Coalesce_sorted_sums)->Name("Coalesce/sorted_sums")->Unit(benchmark::kMicrosecond);
BENCHMARK(Coalesce_group)->Name("Coalesce/group")->Unit(benchmark::kMicrosecond);
BENCHMARK(Memcpy_coalesce)->Name("Memcpy/coalesce")->Unit(benchmark::kMicrosecond);
BENCHMARK(AddInto_ring)->Name("AddInto/ring")->Unit(benchmark::kMicrosecond);
BENCHMARK(Memcpy_ring)->Name("Memcpy/ring")->Unit(benchmark::kMicrosecond);
BENCHMARK(NonFinite_library)->Name("NonFinite/library")->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(NonFinite_find_if)->Name("NonFinite/find_if")->Arg(0)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
