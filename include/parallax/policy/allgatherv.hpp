#pragma once
/// @file
/// The AllGatherv policy tag. Its machinery is in policy/allgatherv/: the
/// gather of sparse rows (gatherer.hpp) and the synchronizer a trainer runs
/// (synchronizer.hpp).

namespace parallax {

namespace policy {
template <class Engine, class Optimizer>
class GatherSynchronizer;
}  // namespace policy

/// Sparse gradients (indices + rows) are gathered from every rank, then
/// coalesced; every rank keeps a full replica. Horovod's way; its bytes grow
/// with the number of ranks. Sparse variables only: a dense variable has no
/// rows to gather.
struct AllGatherv {
  static constexpr const char* name = "AllGatherv";
  static constexpr bool stores_half = true;  // a replica of Var::storage_type rows, updated in float
  template <class Engine, class Optimizer>
  using synchronizer = policy::GatherSynchronizer<Engine, Optimizer>;
};

}  // namespace parallax
