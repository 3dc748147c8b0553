#pragma once
/// @file
/// Communicator policies: how one variable's gradient is synchronised. Each
/// is a small tag type; the machinery lives beside it (ring_allreduce.hpp,
/// allgatherv.hpp, sharded_ps.hpp) and the Trainer picks it at compile time.

namespace parallax {

/// Dense gradients are summed over the ranks with a bandwidth-optimal ring
/// (reduce-scatter, then all-gather), or the engine's own all-reduce where
/// that is faster. Every rank keeps a full replica and applies the same update.
/// For a sparse variable, the gradient is first scattered into a dense buffer
/// (the "sparse sent as dense" baseline of docs/design.md).
struct RingAllReduce {
  static constexpr const char* name = "RingAllReduce";
};

/// Sparse gradients (indices + rows) are gathered from every rank, then
/// coalesced; every rank keeps a full replica. Horovod's way; its bytes grow
/// with the number of ranks.
struct AllGatherv {
  static constexpr const char* name = "AllGatherv";
};

/// Rows are cut into partitions owned by the ranks, which act as parameter
/// servers: a rank pulls the rows it needs and pushes the rows it touched;
/// the owner sums and applies the optimizer. Dense variables can be sharded
/// too (then push = reduce-scatter, pull = all-gather).
struct ShardedPS {
  static constexpr const char* name = "ShardedPS";
};

}  // namespace parallax
