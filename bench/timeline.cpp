// The timeline's cost per phase (detail/timeline.hpp): a Span built and
// destroyed with the timeline off (what every phase of every step pays when
// nobody asked for a timeline), a named Span off (its name is not built),
// and both with the timeline on (what a recorded phase costs). One process;
// bench/run_overlap.sh runs it.
//
//   mpiexec -n 1 build/host/bench/bench_timeline

#include <parallax/detail/timeline.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstdio>
#include <string>

namespace pd = parallax::detail;

namespace {

void span_off(benchmark::State& st) {
  for (auto _ : st) {
    const pd::Span span("start exchange");
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(span_off);

void named_span_off(benchmark::State& st) {
  const char* policy = "ring_allreduce";
  for (auto _ : st) {
    const auto span = pd::Span::named("parallax", "start exchange: ", policy);
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(named_span_off);

/// The timeline on while a benchmark runs; its spans are then written to
/// /dev/null. A fixed iteration count bounds the spans kept in memory.
class On {
 public:
  On() { pd::Timeline::get().start(MPI_COMM_SELF, "/dev/null"); }
  ~On() { pd::Timeline::get().finish(); }
};

void span_on(benchmark::State& st) {
  const On on;
  for (auto _ : st) {
    const pd::Span span("start exchange");
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(span_on)->Iterations(1 << 18);

void named_span_on(benchmark::State& st) {
  const On on;
  const char* policy = "ring_allreduce";
  for (auto _ : st) {
    const auto span = pd::Span::named("parallax", "start exchange: ", policy);
    benchmark::DoNotOptimize(&span);
  }
}
BENCHMARK(named_span_on)->Iterations(1 << 18);

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
