#pragma once
/// @file
/// The AsyncPS policy tag: an asynchronous parameter server with bounded
/// staleness. Its machinery is in policy/async_ps/: the ranks' step clocks
/// and the staleness bound (clock.hpp), and the shards and the synchronizer
/// a trainer runs (synchronizer.hpp). arch::AsyncPS (async.hpp) routes every
/// variable to it.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax {

namespace policy {
template <class Engine, class Optimizer>
class AsyncSynchronizer;
}  // namespace policy

/// Rows are cut into partitions owned by the ranks, as ShardedPS, but no
/// step waits for the other ranks' gradients: a push is applied to its rows
/// when it is made, exactly once, and a lookup returns the rows as they are
/// then. A rank runs at most TrainerOptions::async.staleness steps ahead of
/// the slowest (stale synchronous parallel). On one machine every shard
/// lives in shared memory that every rank reads and writes under per-row
/// locks, so an owner need not take part in its rows' pulls and pushes;
/// across hosts the shards live in MPI one-sided windows, reached under
/// each owner's passive-target lock (AsyncOptions::route). Dense variables are sharded the same way and each rank's
/// replica (`value()`) is refreshed from the shards after each step.
struct AsyncPS {
  static constexpr const char* name = "AsyncPS";
  template <class Engine, class Optimizer>
  using synchronizer = policy::AsyncSynchronizer<Engine, Optimizer>;
};

/// What the staleness bound did on this rank (Trainer::async_stats()).
struct AsyncStats {
  std::int64_t clock = 0;      ///< steps this rank completed
  int staleness = 0;           ///< the bound s (-1: unbounded)
  std::int64_t max_lag = 0;    ///< most steps this rank was ahead of the slowest rank after its waits (<= s)
  std::int64_t max_lead_seen = 0;  ///< most steps it was ahead before waiting (what the bound held back)
  std::uint64_t waits = 0;     ///< steps at which it waited for slower ranks
  double wait_seconds = 0;     ///< time spent in those waits
  /// Per rank: this rank's clock minus that rank's at the end of this
  /// rank's last step (its lag behind this rank; negative: it is ahead).
  std::vector<std::int64_t> lag;
  /// Per rank: seconds this rank waited with that rank the slowest (the
  /// wait it caused here).
  std::vector<double> wait_caused;
};

}  // namespace parallax
