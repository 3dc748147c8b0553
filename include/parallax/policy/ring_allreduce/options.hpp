#pragma once
/// @file
/// RingAllReduce's settings, policy::ring::Options (RingOptions), which a
/// TrainerOptions carries as `ring` and the ring synchronizer receives
/// beside the common ones (policy::Common).

#include <parallax/engine/engine.hpp>

#include <cstddef>

namespace parallax::policy::ring {

/// Settings of RingAllReduce. The defaults follow docs/benchmarks.md,
/// "Collectives".
struct Options {
  /// ring, native (the engine's all-reduce), hierarchical, or automatic:
  /// native with one rank, below `native_below_bytes`, on an oversubscribed
  /// host (see `adapt_to_oversubscription`) and for engines over device
  /// memory (NCCL, MpiStaged); otherwise hierarchical where there is more
  /// than one host and every host runs the same number (> 1) of ranks, the
  /// flat ring elsewhere. hierarchical (Horovod's
  /// HOROVOD_HIERARCHICAL_ALLREDUCE): a reduce-scatter inside each host, a
  /// ring all-reduce of each local rank's 1/L share between the hosts, an
  /// all-gather inside each host (docs/design.md, "Hierarchical
  /// all-reduce"); forced, it runs wherever every host has the same number
  /// of ranks and falls back to the flat ring where they differ. ring forces
  /// the flat ring (hierarchical off); RingAllReducer::hierarchical() says
  /// which ring runs.
  engine::Algorithm algorithm = engine::Algorithm::automatic;
  /// Buffers smaller than this go to the engine's all-reduce under automatic:
  /// 4 KiB is the smallest size the ring has been benchmarked at
  /// (docs/benchmarks.md, "Collectives"), and nothing below it speaks for it.
  std::size_t native_below_bytes = std::size_t{4} << 10;
  /// The ring moves each chunk in segments of at most this many bytes, two
  /// in flight, so a segment is reduced while the next one travels and
  /// landing and packing buffers stay in cache. Ignored on an oversubscribed
  /// host (see `adapt_to_oversubscription`).
  std::size_t segment_bytes = std::size_t{128} << 10;
  /// Tensor fusion: consecutive gradients are packed into buckets of at most
  /// this many bytes (a larger gradient is reduced in place, alone).
  std::size_t bucket_bytes = std::size_t{32} << 20;
  /// When a host runs more ranks than it has hardware threads, waiting ranks
  /// take turns on the cores and every wait for a descheduled neighbour costs
  /// a scheduler time slice. Then automatic picks the engine's all-reduce
  /// (fewer dependent steps than the ring's 2(N-1)), and the ring, if forced,
  /// sends each chunk whole instead of in segments. False: behave as on a
  /// host with a core per rank (tests use it to exercise segments).
  bool adapt_to_oversubscription = true;
};

}  // namespace parallax::policy::ring

namespace parallax {
using RingOptions = policy::ring::Options;  ///< TrainerOptions::ring's type, as the tutorial names it
}  // namespace parallax
