#pragma once
/// @file
/// What a policy whose steps wait for no other rank adds to the protocol
/// (policy.hpp): its synchronizer also derives from policy::Asynchronous,
/// which the trainer detects (trainer::Registry, by dynamic_cast). A
/// trainer whose synchronizers all are asynchronous makes no collective call
/// in a step: it skips the step's agreement, and a problem with a rank's data
/// throws on that rank only. AsyncPS (async_ps.hpp) is one.

#include <cstdint>
#include <vector>

namespace parallax {

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

namespace policy {

/// The hooks of an asynchronous policy's synchronizer, besides those of
/// policy::Synchronizer.
class Asynchronous {
 public:
  /// Returns once every rank got here and every push made before is
  /// applied (before a save, a restore or a fetch). Collective.
  virtual void quiesce() = 0;
  /// What the staleness bound did on this rank.
  virtual const AsyncStats& async_stats() = 0;

 protected:
  ~Asynchronous() = default;
};

}  // namespace policy
}  // namespace parallax
