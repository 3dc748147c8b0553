// Host row kernels on scattered rows: the sparse optimizer update and the
// row gather that a sharded PS runs on its shard every step.
//
//   build/host/bench/bench_row_kernels --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
//
// One process, no MPI. The workloads (row_kernels.hpp): 8,192 distinct rows
// of 128 floats a step, a new set of rows each iteration, from a rank's
// shard of word_lm's softmax table at the demo's shape (argument 0: 100 MB,
// L3-resident here) or from a 1 GB table (argument 1: DRAM), on the
// process's OpenMP team. Benchmarks:
//   AdagradRows/library      optim::apply_rows(Adagrad), as the trainer runs it
//   AdagradRows/prefetch     the same kernel given a prefetch(r) of its table and
//                            accumulator rows (RowUpdate has none: this is why)
//   AdagradRows/math_errno   the same kernel compiled with -fmath-errno
//   GatherRows/library       detail::GatherRows (a lookup's gather)
//   GatherRows/no_prefetch   the same kernel with its prefetch(r) hidden
//   NonFinite/library        detail::find_non_finite over the step's gradient
//                            rows, all finite (TrainerOptions::check_finite)
//   NonFinite/find_if        the same scan as a sequential thrust::find_if
//                            of NotFinite (the device path's kernel)
// Counter `bytes_per_second`: the rows' bytes read and written.
#include "row_kernels.hpp"

#include <benchmark/benchmark.h>
#include <thrust/find.h>
#include <thrust/system/cpp/execution_policy.h>

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
/// The sparse update with a prefetch(r) of the rows it updates.
struct PrefetchingUpdate : px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float> {
  void prefetch(std::size_t j) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols;
    px::prefetch_bytes(w + at, cols * sizeof(float));
    px::prefetch_bytes(s0 + at, cols * sizeof(float));
  }
};
void adagrad_rows_prefetch(pb::RowWorkload& w, std::size_t s) {
  px::for_each_rows(host, pb::RowWorkload::touched, pb::RowWorkload::cols,
                    pb::adagrad_update<PrefetchingUpdate>(w, s));
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
void AdagradRows_prefetch(benchmark::State& state) { run_rows(state, adagrad_rows_prefetch, kAdagradBytes); }
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
BENCHMARK(AdagradRows_prefetch)->Name("AdagradRows/prefetch")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(AdagradRows_math_errno)->Name("AdagradRows/math_errno")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(GatherRows_library)->Name("GatherRows/library")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(GatherRows_no_prefetch)->Name("GatherRows/no_prefetch")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(NonFinite_library)->Name("NonFinite/library")->Arg(0)->Unit(benchmark::kMicrosecond);
BENCHMARK(NonFinite_find_if)->Name("NonFinite/find_if")->Arg(0)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
