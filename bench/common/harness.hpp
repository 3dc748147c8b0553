#pragma once
/// @file
/// The harness every parallax benchmark binary shares: MPI around Google
/// Benchmark, the same fixed iteration count on every rank, the slowest rank's
/// time per iteration, output from rank 0 only, and the nccl-tests counters
/// (algbw, busbw, #wrong) so every figure can be quoted as a ratio to a
/// baseline measured in the same run.
///
/// A benchmark binary is
///
///     int main(int argc, char** argv) {
///       parallax::bench::Session session(argc, argv);
///       session.add("MPI_Allreduce/4096", 4096, [&](benchmark::State& st) { ... });
///       return session.run();
///     }
///
/// and a benchmark body is
///
///     parallax::bench::timed_loop(st, comm, session.warmup(bytes), reset, step);
///     parallax::bench::set_bandwidth(st, bytes, parallax::bench::bus_factor::allreduce(n), n);
///     parallax::bench::set_wrong(st, wrong_on_this_rank, comm);
///
/// Harness flags (removed before Google Benchmark sees the command line):
///   --iterations_scale=<x>  multiplies every iteration count (default 1; at
///                           least min_iterations stay), for quick or long runs.
///   --rotate=<k>            asks a program that registers variants of one
///                           workload (architectures) side by side to start
///                           at the k-th (Session::rotation()): runs repeated
///                           with k = 0, 1, 2, ... put each variant first in
///                           turn, so none always runs first, on a cold cache.
/// Every --benchmark_* flag works (--benchmark_out is written by rank 0 only)
/// except --benchmark_enable_random_interleaving, which each rank would
/// shuffle differently: repeat whole runs instead.

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace parallax::bench {

/// nccl-tests bus-bandwidth factors (src/*.cu, `getBw`): busbw = algbw * factor.
/// They turn the algorithm bandwidth into the bandwidth a link would need,
/// comparable across rank counts and with the hardware's peak.
namespace bus_factor {
/// All-reduce: every rank sends and receives 2(N-1)/N of the buffer.
inline double allreduce(int n) { return n > 1 ? 2.0 * (n - 1) / n : 0.0; }
/// All-gather(v): every rank receives (N-1)/N of the gathered buffer.
inline double allgather(int n) { return n > 1 ? static_cast<double>(n - 1) / n : 0.0; }
}  // namespace bus_factor

/// A display reporter that prints nothing: what ranks other than 0 get, so
/// one job writes one report.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }  // true: run the benchmarks
  void ReportRuns(const std::vector<Run>&) override {}
};

/// How many iterations a benchmark of `bytes` gets: about `budget_bytes` of
/// payload per run, clamped to [min_iterations, max_iterations]. Chosen from
/// the size (and the job's shape, the same everywhere), so it is the same on
/// every rank.
struct IterationPolicy {
  double budget_bytes = 512.0 * (1 << 20);
  std::int64_t min_iterations = 5;
  std::int64_t max_iterations = 200;
  double scale = 1.0;  ///< --iterations_scale

  /// With more ranks on a host than it has cores, a call costs scheduler
  /// time slices (milliseconds) rather than bytes: fewer iterations keep a
  /// run short. Decided on rank 0 and broadcast, so all ranks agree.
  void adapt_to_oversubscription() {
    budget_bytes = 128.0 * (1 << 20);
    max_iterations = 20;
  }

  std::int64_t iterations(std::size_t bytes) const {
    const double raw = budget_bytes / static_cast<double>(std::max<std::size_t>(bytes, 1));
    const auto clamped = std::clamp<double>(raw, static_cast<double>(min_iterations),
                                            static_cast<double>(max_iterations));
    return std::max<std::int64_t>(min_iterations, std::llround(clamped * scale));
  }
  /// Untimed iterations before the timed loop: page faults, MPI's
  /// registration caches and connection set-up stay out of the figures.
  int warmup(std::size_t bytes) const {
    return static_cast<int>(std::clamp<std::int64_t>(iterations(bytes) / 10, 2, 10));
  }
};

/// MPI (through parallax::Context) and Google Benchmark for one binary.
/// Construct first in main; run() runs the registered benchmarks and returns
/// the exit code. MPI is finalised when the session is destroyed.
class Session {
 public:
  Session(int& argc, char**& argv, IterationPolicy policy = {}) : policy_(policy) {
    init_mpi(argc, argv);
    ctx_ = std::make_unique<Context>(MPI_COMM_WORLD);
    int oversubscribed = ctx_->topology().oversubscribed();
    MPI_Bcast(&oversubscribed, 1, MPI_INT, 0, MPI_COMM_WORLD);
    oversubscribed_ = oversubscribed != 0;
    if (oversubscribed_) policy_.adapt_to_oversubscription();
    args_ = filter_args(argc, argv);
    int bargc = static_cast<int>(args_.size());
    for (auto& a : args_) argv_.push_back(a.data());
    argv_.push_back(nullptr);
    benchmark::Initialize(&bargc, argv_.data());
    if (rank() == 0 && benchmark::ReportUnrecognizedArguments(bargc, argv_.data())) bad_args_ = true;
    int bad = bad_args_ ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    bad_args_ = bad != 0;

    benchmark::AddCustomContext("mpi_ranks", std::to_string(size()));
    benchmark::AddCustomContext("mpi_library", mpi_library());
    benchmark::AddCustomContext("omp_threads_per_rank", std::to_string(ctx_->threads()));
    benchmark::AddCustomContext("oversubscribed", oversubscribed_ ? "true" : "false");
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  ~Session() {
    benchmark::Shutdown();
    ctx_.reset();
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  Context& context() noexcept { return *ctx_; }
  int rank() const noexcept { return ctx_->rank(); }
  int size() const noexcept { return ctx_->size(); }
  /// More ranks on this host than it has cores (rank 0's view).
  bool oversubscribed() const noexcept { return oversubscribed_; }
  const IterationPolicy& policy() const noexcept { return policy_; }
  /// --rotate=<k>: where a set of side-by-side variants starts (0 if not given).
  int rotation() const noexcept { return rotation_; }
  std::int64_t iterations(std::size_t bytes) const { return policy_.iterations(bytes); }
  int warmup(std::size_t bytes) const { return policy_.warmup(bytes); }

  /// Registers `body` as benchmark `name`, timed manually, with the fixed
  /// iteration count for `bytes` (the payload that sets the cost).
  template <class Body>
  benchmark::internal::Benchmark* add(const std::string& name, std::size_t bytes, Body body) {
    return benchmark::RegisterBenchmark(name.c_str(), std::move(body))
        ->UseManualTime()
        ->Iterations(iterations(bytes))
        ->Unit(benchmark::kMicrosecond);
  }

  /// Runs the benchmarks the flags select; rank 0 reports, the others stay
  /// silent. Returns main's exit code.
  int run() {
    if (bad_args_) return 1;
    if (rank() == 0) {
      std::unique_ptr<benchmark::BenchmarkReporter> display(benchmark::CreateDefaultDisplayReporter());
      benchmark::RunSpecifiedBenchmarks(display.get());  // --benchmark_out: Google Benchmark's file reporter
    } else {
      SilentReporter silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    return 0;
  }

 private:
  void init_mpi(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
      owns_mpi_ = true;
    }
  }

  /// Takes the harness's own flags out of argv. Ranks other than 0 also drop
  /// --benchmark_out* and get an empty --benchmark_out (overriding the
  /// BENCHMARK_OUT environment variable), so only rank 0 opens the file.
  std::vector<std::string> filter_args(int argc, char** argv) {
    std::vector<std::string> out;
    const int me = rank();
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i];
      constexpr const char* scale_flag = "--iterations_scale=";
      if (a.rfind(scale_flag, 0) == 0) {
        policy_.scale = std::atof(a.c_str() + std::strlen(scale_flag));
        if (!(policy_.scale > 0)) policy_.scale = 1.0;
        continue;
      }
      constexpr const char* rotate_flag = "--rotate=";
      if (a.rfind(rotate_flag, 0) == 0) {
        rotation_ = std::max(0, std::atoi(a.c_str() + std::strlen(rotate_flag)));
        continue;
      }
      if (a.rfind("--benchmark_enable_random_interleaving", 0) == 0 &&
          a.find("=false") == std::string::npos && a.find("=0") == std::string::npos) {
        // Each rank would shuffle on its own and run a different benchmark.
        if (me == 0)
          std::fprintf(stderr, "%s: --benchmark_enable_random_interleaving is not supported: the ranks would "
                               "run the benchmarks in different orders; repeat whole runs instead\n", argv[0]);
        bad_args_ = true;
        continue;
      }
      if (me != 0 && a.rfind("--benchmark_out", 0) == 0) continue;
      out.push_back(std::move(a));
    }
    if (me != 0) out.emplace_back("--benchmark_out=");
    return out;
  }

  static std::string mpi_library() {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(std::max(len, 0)));
    const auto eol = v.find('\n');
    if (eol != std::string::npos) v.resize(eol);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.pop_back();
    return v;
  }

  IterationPolicy policy_;
  bool owns_mpi_ = false;
  bool bad_args_ = false;
  bool oversubscribed_ = false;
  int rotation_ = 0;
  std::unique_ptr<Context> ctx_;
  std::vector<std::string> args_;  // the command line Google Benchmark sees
  std::vector<char*> argv_;
};

/// The timed loop: `warmup` untimed calls, then one `step` per iteration.
/// `before` runs untimed ahead of every call (restore an input, say); the
/// ranks then meet at a barrier, each times its own `step`, and the
/// iteration's time is the slowest rank's (MPI_Allreduce MAX), because a
/// collective is done when its last rank is.
template <class Before, class Step>
void timed_loop(benchmark::State& state, MPI_Comm comm, int warmup, Before&& before, Step&& step) {
  for (int i = 0; i < warmup; ++i) {
    before();
    step();
  }
  MPI_Barrier(comm);
  for (auto _ : state) {
    before();
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    step();
    double elapsed = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm);
    state.SetIterationTime(elapsed);
  }
}

/// Sets `algbw` (bytes / time, the nccl-tests algorithm bandwidth), `busbw`
/// (algbw * factor), both in bytes/s with decimal prefixes, and `ranks`.
/// `bytes` is the size nccl-tests would name: the buffer for all-reduce, the
/// gathered output for all-gather.
inline void set_bandwidth(benchmark::State& state, double bytes, double factor, int ranks) {
  using C = benchmark::Counter;
  state.counters["algbw"] = C(bytes, C::kIsIterationInvariantRate, C::OneK::kIs1000);
  state.counters["busbw"] = C(bytes * factor, C::kIsIterationInvariantRate, C::OneK::kIs1000);
  state.counters["ranks"] = C(static_cast<double>(ranks));
}

/// Sets `wrong`: elements that differ from the expected result, summed over
/// the ranks (nccl-tests #wrong). Collective. A non-zero count also marks the
/// run as an error, so it cannot be mistaken for a figure.
inline void set_wrong(benchmark::State& state, std::uint64_t wrong_here, MPI_Comm comm) {
  std::uint64_t wrong = wrong_here;
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_UINT64_T, MPI_SUM, comm);
  state.counters["wrong"] = benchmark::Counter(static_cast<double>(wrong));
  if (wrong != 0) state.SkipWithError("result check failed: wrong != 0");
}

/// Sets `bytes_sent`: the bytes one rank sends per call, from parallax's
/// CommStats (`sent_during` = bytes booked over `calls` calls), the largest
/// over the ranks. Collective.
inline void set_bytes_sent(benchmark::State& state, std::uint64_t sent_during, std::uint64_t calls, MPI_Comm comm) {
  double per_call = calls ? static_cast<double>(sent_during) / static_cast<double>(calls) : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &per_call, 1, MPI_DOUBLE, MPI_MAX, comm);
  state.counters["bytes_sent"] = benchmark::Counter(per_call, benchmark::Counter::kDefaults,
                                                    benchmark::Counter::OneK::kIs1024);
}

}  // namespace parallax::bench
