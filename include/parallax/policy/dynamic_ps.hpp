#pragma once
/// @file
/// The DynamicPS policy tag. Its synchronizer is in
/// policy/dynamic_ps/synchronizer.hpp.

namespace parallax {

namespace policy {
template <class Engine, class Optimizer>
class DynamicSynchronizer;
}  // namespace policy

/// Dynamic variables (DynamicVariable) as a parameter server: each rank owns
/// the keys that dynamic::owner hashes to it, in a dynamic::Table of the
/// variable's capacity; a lookup routes keys to their owners, which create
/// rows on first sight; a step routes the gradient rows to the owners, which
/// sum them in rank order and apply the optimizer. The synchronous
/// architectures route dynamic variables here, but for arch::AllReduce,
/// which replicates them (AllGatherv); the asynchronous ones refuse them at
/// compile time.
struct DynamicPS {
  static constexpr const char* name = "DynamicPS";
  template <class Engine, class Optimizer>
  using synchronizer = policy::DynamicSynchronizer<Engine, Optimizer>;
};

}  // namespace parallax
