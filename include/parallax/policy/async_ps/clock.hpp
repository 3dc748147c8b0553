#pragma once
/// @file
/// The step clocks of asynchronous training (stale synchronous parallel):
/// every rank publishes the steps it completed in a shared-memory window,
/// after the pushes of those steps are applied, and before a rank starts a
/// step it waits until it is at most `s` steps ahead of the slowest rank.
/// Across hosts (the RMA route) every rank keeps every rank's clock in its
/// own segment of a one-sided window, and a rank publishes its clock by
/// MPI_Accumulate (MPI_REPLACE) into every segment: the wait then reads
/// only its own memory, so its deadline holds whatever the others do.
/// The row locks the shards share live here too.

#include <parallax/detail/fault.hpp>
#include <parallax/detail/shared_window.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/async_ps.hpp>
#include <parallax/policy/async_ps/rma.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace parallax::policy::async {

/// A row lock in shared memory: 0 free, else the holder's rank + 1 (so a
/// waiter that gives up can name it).
using RowLock = std::uint32_t;

/// Takes `lock` for `rank`; spins, giving the core away after a while (the
/// holder may be descheduled on an oversubscribed host). Past `timeout`
/// (when positive) marks the job failed and throws, naming the holder.
inline void lock_row(RowLock* lock, int rank, std::chrono::milliseconds timeout, const char* what) {
  const RowLock me = static_cast<RowLock>(rank) + 1;
  RowLock free = 0;
  if (__atomic_compare_exchange_n(lock, &free, me, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t spins = 1;; ++spins) {
    free = 0;
    if (__atomic_load_n(lock, __ATOMIC_RELAXED) == 0 &&
        __atomic_compare_exchange_n(lock, &free, me, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
      return;
    if (spins > 64) std::this_thread::yield();
    if ((spins & 1023u) == 0 && timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout) {
      const RowLock holder = __atomic_load_n(lock, __ATOMIC_RELAXED);
      detail::job_failed() = true;
      throw timeout_error(detail::concat("parallax: rank ", rank, " gave up after ", timeout.count(),
                                         " ms waiting for a row lock of ", what, " held by rank ",
                                         static_cast<long>(holder) - 1, " (dead or stalled inside parallax)"));
    }
  }
}
inline void unlock_row(RowLock* lock) { __atomic_store_n(lock, RowLock{0}, __ATOMIC_RELEASE); }

/// The ranks' step clocks and the staleness bound.
class Clock {
 public:
  /// Collective over `comm`. `staleness` < 0: unbounded. `rma`: the route
  /// across hosts; otherwise throws on every rank if the ranks do not share
  /// one machine's memory.
  Clock(MPI_Comm comm, int staleness, std::chrono::milliseconds timeout, bool rma = false)
      : staleness_(staleness), timeout_(timeout), comm_(comm) {
    MPI_Comm_rank(comm, &rank_);
    MPI_Comm_size(comm, &size_);
    if (rma) {
      rma_ = RmaWindow::create(comm, static_cast<std::size_t>(size_) * sizeof(std::int64_t), true);
      std::fill(rma_.local<std::int64_t>(), rma_.local<std::int64_t>() + size_, std::int64_t{0});
      seen_.assign(static_cast<std::size_t>(size_), 0);
      rma_.sync();
    } else {
      window_ = detail::SharedWindow<std::int64_t>::create(comm, 1);
      PARALLAX_EXPECTS(static_cast<bool>(window_), "AsyncPS's shared-memory route keeps the step clocks and every ",
                       "shard in shared memory: every rank must run on one machine (with room in /dev/shm); "
                       "AsyncOptions::Route::rma reaches other hosts");
      *window_.local() = 0;
      window_.sync();
    }
    PARALLAX_MPI_CHECK(MPI_Barrier(comm));
    stats_.staleness = staleness;
    stats_.lag.assign(static_cast<std::size_t>(size_), 0);
    stats_.wait_caused.assign(static_cast<std::size_t>(size_), 0.0);
  }

  int staleness() const noexcept { return staleness_; }
  std::int64_t clock() const noexcept { return mine_; }
  /// Rank r's published clock (RMA route: as of the last slowest()).
  std::int64_t of(int r) const {
    if (rma_) return seen_[static_cast<std::size_t>(r)];
    return __atomic_load_n(const_cast<std::int64_t*>(window_.bases()[r]), __ATOMIC_ACQUIRE);
  }
  /// The slowest rank and its clock.
  std::pair<int, std::int64_t> slowest() {
    if (rma_) load();
    std::pair<int, std::int64_t> low{rank_, mine_};
    for (int r = 0; r < size_; ++r) {
      const std::int64_t c = r == rank_ ? mine_ : of(r);
      if (c < low.second) low = {r, c};
    }
    return low;
  }

  /// Publishes one more completed step (after its pushes were applied:
  /// release order), then waits until this rank is at most `s` steps ahead
  /// of the slowest. Past the deadline without progress of the slowest
  /// rank, marks the job failed and throws on this rank, naming it.
  void tick() {
    ++mine_;
    publish();
    wait();
  }

  /// Sets every rank's clock to `step` (after a restore; collective over
  /// `comm`, which orders it).
  void reset(MPI_Comm comm, std::int64_t step) {
    mine_ = step;
    publish();
    if (rma_) PARALLAX_MPI_CHECK(MPI_Win_flush_all(rma_.win()));
    PARALLAX_MPI_CHECK(MPI_Barrier(comm));
  }

  const AsyncStats& stats() {
    stats_.clock = mine_;
    return stats_;
  }

 private:
  /// Makes mine_ visible to the others, after this rank's pushes (which
  /// completed at their owners before: release order, or MPI_Win_unlock).
  void publish() {
    if (!rma_) {
      __atomic_store_n(window_.local(), mine_, __ATOMIC_RELEASE);
      return;
    }
    sent_ = mine_;
    for (int r = 0; r < size_; ++r)
      PARALLAX_MPI_CHECK(MPI_Accumulate(&sent_, 1, MPI_INT64_T, r, static_cast<MPI_Aint>(rank_) * 8, 1, MPI_INT64_T,
                                        MPI_REPLACE, rma_.win()));
    // Sent, not necessarily arrived: waiting for every owner to serve it
    // would wait for the slowest rank to enter MPI.
    PARALLAX_MPI_CHECK(MPI_Win_flush_local_all(rma_.win()));
  }
  /// The clocks as this rank's segment holds them; polls MPI's progress so
  /// the others' calls into this rank's windows are served while it waits.
  void load() {
    int flag = 0;
    PARALLAX_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE));
    PARALLAX_MPI_CHECK(MPI_Get_accumulate(nullptr, 0, MPI_INT64_T, seen_.data(), size_, MPI_INT64_T, rank_, 0, size_,
                                          MPI_INT64_T, MPI_NO_OP, rma_.win()));
    PARALLAX_MPI_CHECK(MPI_Win_flush(rank_, rma_.win()));
  }

  void wait() {
    auto [slow, low] = slowest();
    const std::int64_t lead = mine_ - low;
    if (lead > stats_.max_lead_seen) stats_.max_lead_seen = lead;
    if (staleness_ >= 0 && lead > staleness_) {
      ++stats_.waits;
      const int cause = slow;  // the slowest rank when the wait began
      const auto start = std::chrono::steady_clock::now();
      auto last_move = start;
      std::int64_t last_low = low;
      for (std::uint32_t spins = 0; mine_ - low > staleness_; ++spins) {
        if (spins > 16) std::this_thread::yield();
        std::tie(slow, low) = slowest();
        if ((spins & 255u) != 0 || timeout_.count() <= 0) continue;
        const auto now = std::chrono::steady_clock::now();
        if (low != last_low) {
          last_low = low;
          last_move = now;
        } else if (now - last_move > timeout_) {
          detail::job_failed() = true;
          const std::string report = detail::concat(
              "parallax: rank ", rank_, " gave up after ", timeout_.count(), " ms waiting at step ", mine_ + 1,
              " for the staleness bound ", staleness_, ": rank ", slow, " has completed ", low,
              " steps and did not complete another (failed, killed, or stuck outside parallax)");
          std::fprintf(stderr, "%s\n", report.c_str());
          std::fflush(stderr);
          throw timeout_error(report);
        }
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      stats_.wait_seconds += waited;
      stats_.wait_caused[static_cast<std::size_t>(cause)] += waited;
    }
    std::int64_t lag_now = 0;
    for (int r = 0; r < size_; ++r) {
      const std::int64_t behind = r == rank_ ? 0 : mine_ - of(r);
      stats_.lag[static_cast<std::size_t>(r)] = behind;
      if (behind > lag_now) lag_now = behind;
    }
    // Ranks only move forward: the lead measured now is at most the one the
    // wait ended with.
    if (lag_now > stats_.max_lag) stats_.max_lag = lag_now;
  }

  detail::SharedWindow<std::int64_t> window_;  // shared-memory route: this rank's clock
  RmaWindow rma_;                   // RMA route: every rank's clock, in every rank's segment
  std::vector<std::int64_t> seen_;  // RMA route: the clocks as last loaded
  std::int64_t sent_ = 0;           // RMA route: what the last publish() sent
  int staleness_;
  std::chrono::milliseconds timeout_;
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::int64_t mine_ = 0;
  AsyncStats stats_;
};

}  // namespace parallax::policy::async
