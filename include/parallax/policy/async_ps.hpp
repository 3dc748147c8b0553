#pragma once
/// @file
/// The AsyncPS policy tag: an asynchronous parameter server with bounded
/// staleness. Its machinery is in policy/async_ps/: the ranks' step clocks
/// and the staleness bound (clock.hpp), and the shards and the synchronizer
/// a trainer runs (synchronizer.hpp). arch::AsyncPS (async.hpp) routes every
/// variable to it. AsyncStats, what the staleness bound did, is in
/// asynchronous.hpp, with the interface a trainer detects.

#include <parallax/policy/async_ps/options.hpp>
#include <parallax/policy/asynchronous.hpp>
#include <parallax/policy/sharded_ps/options.hpp>

#include <tuple>

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
  static constexpr bool stores_half = true;  // shards of Var::storage_type rows, updated in float
  /// Its synchronizer's own settings (TrainerOptions::async), and ShardedPS's
  /// default partition count (TrainerOptions::sharded), which it shards by.
  using options = std::tuple<policy::async::Options, policy::sharded::Options>;
  template <class Engine, class Optimizer>
  using synchronizer = policy::AsyncSynchronizer<Engine, Optimizer>;
};


}  // namespace parallax
