#pragma once
/// @file
/// Asynchronous training in the examples: --sync picks the architecture's
/// asynchronous form (host build only: AsyncPS keeps its shards in host
/// shared memory), and --slow-rank / --slow-factor make one rank a
/// straggler by sleeping in its compute. Straggler also measures each
/// rank's own samples/s (from its own clock, before any final collective),
/// which is what asynchronous training changes for the ranks that are not
/// slow.

#include "backend.hpp"
#include "options.hpp"
#include "profile.hpp"

#include <parallax/parallax.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

/// Calls f with the architecture --arch and --sync name (px::with_arch).
template <class F>
decltype(auto) with_arch(const CommonOptions& o, F&& f) {
  if constexpr (std::is_same_v<DefaultSpace, px::HostSpace>) {
    return px::with_arch(o.arch, o.sync, std::forward<F>(f));
  } else {
    if (o.sync != "sync") throw px::error("--sync async needs the host build (AsyncPS shards live in host shared memory)");
    return px::with_arch(o.arch, std::forward<F>(f));
  }
}

/// Runs each training step, makes the --slow-rank sleep (--slow-factor - 1)
/// times the step's compute after it (as if its compute were that much
/// slower), and clocks every rank's own steps after the warm-up.
class Straggler {
 public:
  using clock = std::chrono::steady_clock;

  Straggler(const CommonOptions& o, const px::Context& ctx)
      : slow_(o.slow_rank == ctx.rank() && o.slow_factor > 1), factor_(o.slow_factor), warmup_(o.warmup),
        batch_(o.batch), slow_rank_(o.slow_rank) {
    start_ = end_ = clock::now();
  }

  /// Before a training step.
  void begin() {
    const StepProfile* p = StepProfile::current();
    in_parallax_ = p ? p->seconds(Part::parallax) : 0;
    t0_ = clock::now();
  }
  /// After it: the straggler sleeps, and the step is counted.
  void end() {
    if (slow_) {
      // The user's compute: the step's time outside parallax (lookups,
      // step(), waiting for other ranks), so that the straggler is slowed
      // by the same amount under synchronous and asynchronous training.
      const StepProfile* p = StepProfile::current();
      const double step = std::chrono::duration<double>(clock::now() - t0_).count();
      const double compute = step - (p ? p->seconds(Part::parallax) - in_parallax_ : 0);
      if (compute > 0) std::this_thread::sleep_for(std::chrono::duration<double>(compute * (factor_ - 1)));
    }
    ++steps_;
    end_ = clock::now();
    if (steps_ == warmup_) start_ = end_;
  }

  /// Every rank's own samples/s over its steps after the warm-up, by rank,
  /// and their median over the ranks other than --slow-rank. Collective.
  std::pair<std::vector<double>, double> rates(const px::Context& ctx) const {
    std::vector<double> r(static_cast<std::size_t>(ctx.size()), 0.0);
    const std::uint64_t measured = steps_ > warmup_ ? steps_ - warmup_ : 0;
    const double secs = std::chrono::duration<double>(end_ - start_).count();
    r[static_cast<std::size_t>(ctx.rank())] = secs > 0 ? static_cast<double>(measured * batch_) / secs : 0;
    r = ctx.sum(std::move(r));
    std::vector<double> others;
    for (std::size_t i = 0; i < r.size(); ++i)
      if (static_cast<int>(i) != slow_rank_) others.push_back(r[i]);
    double median = 0;
    if (!others.empty()) {
      std::sort(others.begin(), others.end());
      const std::size_t n = others.size();
      median = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
    }
    return {r, median};
  }

  /// Prints (rank 0) each rank's own samples/s and, for an asynchronous
  /// trainer, what the staleness bound did on each rank. Collective.
  template <class Trainer>
  double report(const px::Context& ctx, Trainer& trainer, const char* unit) const {
    const auto [r, median] = rates(ctx);
    std::vector<double> lag(static_cast<std::size_t>(ctx.size()), 0.0), wait(lag);
    bool async = false;
    try {
      const px::AsyncStats& st = trainer.async_stats();
      lag[static_cast<std::size_t>(ctx.rank())] = static_cast<double>(st.max_lag);
      wait[static_cast<std::size_t>(ctx.rank())] = st.wait_seconds;
      async = true;
    } catch (const px::error&) {
      // a synchronous trainer: no staleness bound to report
    }
    lag = ctx.sum(std::move(lag));
    wait = ctx.sum(std::move(wait));
    if (ctx.is_root()) {
      std::printf("  own %s/s per rank (each rank's clock, steps after the warm-up):", unit);
      for (double x : r) std::printf(" %.1f", x);
      std::printf("; median of the ranks other than --slow-rank %d: %.1f\n", slow_rank_, median);
      if (async) {
        std::printf("  staleness bound %d: most steps ahead of the slowest per rank:", trainer.options().async.staleness);
        for (double x : lag) std::printf(" %.0f", x);
        std::printf("; seconds waiting for it per rank:");
        for (double x : wait) std::printf(" %.2f", x);
        std::printf("\n");
      }
      std::fflush(stdout);
    }
    return median;
  }

 private:
  bool slow_;
  double factor_;
  std::uint64_t warmup_, batch_;
  int slow_rank_;
  std::uint64_t steps_ = 0;
  double in_parallax_ = 0;  // the profile's parallax seconds when the step began
  clock::time_point start_, end_, t0_;
};

}  // namespace examples
