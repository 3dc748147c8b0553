#pragma once
/// @file
/// The RingAllReduce policy tag. Its machinery is in policy/ring_allreduce/:
/// the ring (reducer.hpp), tensor fusion (fusion.hpp), and the synchronizer
/// a trainer runs (synchronizer.hpp).

#include <parallax/policy/ring_allreduce/options.hpp>

#include <tuple>

namespace parallax {

namespace policy {
template <class Engine, class Optimizer>
class RingSynchronizer;
}  // namespace policy

/// Dense gradients are summed over the ranks with a bandwidth-optimal ring
/// (reduce-scatter, then all-gather), or the engine's own all-reduce where
/// that is faster, many small ones fused into buckets. Every rank keeps a
/// full replica and applies the same update. For a sparse variable, the
/// gradient is first scattered into a dense buffer (the "sparse sent as
/// dense" baseline of docs/design.md).
struct RingAllReduce {
  static constexpr const char* name = "RingAllReduce";
  using options = std::tuple<policy::ring::Options>;  // its synchronizer's own settings (TrainerOptions::ring)
  template <class Engine, class Optimizer>
  using synchronizer = policy::RingSynchronizer<Engine, Optimizer>;
};

}  // namespace parallax
