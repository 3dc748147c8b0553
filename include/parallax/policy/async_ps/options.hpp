#pragma once
/// @file
/// AsyncPS's settings, policy::async::Options (AsyncOptions), which a
/// TrainerOptions carries as `async` and the asynchronous synchronizer
/// receives beside the common ones (policy::Common).

namespace parallax::policy::async {

/// Settings of asynchronous training (the AsyncPS policy, arch::Async and
/// arch::AsyncHybrid; see async.hpp). Synchronous policies ignore them.
struct Options {
  /// Stale synchronous parallel: a rank starts a step only while it has
  /// completed at most this many steps more than the slowest rank. 0: every
  /// rank waits for every other at every step; -1: unbounded.
  int staleness = 4;
  /// How ranks reach the shards and clocks (docs/async.md, "Two routes").
  enum class Route {
    automatic,      ///< shared memory where every rank maps it (one machine), else rma
    shared_memory,  ///< loads and stores in an MPI-3 shared-memory window (one machine only)
    rma,            ///< MPI one-sided calls: works across hosts; PARALLAX_ASYNC_ROUTE=rma forces it
  };
  Route route = Route::automatic;
};

}  // namespace parallax::policy::async

namespace parallax {
using AsyncOptions = policy::async::Options;  ///< TrainerOptions::async's type, as the tutorial names it
}  // namespace parallax
