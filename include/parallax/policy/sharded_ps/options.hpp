#pragma once
/// @file
/// ShardedPS's settings, policy::sharded::Options (ShardedOptions), which a
/// TrainerOptions carries as `sharded` and the sharded synchronizers
/// (ShardedPS, and AsyncPS for its partition count) receive beside the
/// common ones (policy::Common).

namespace parallax::policy::sharded {

/// Settings of ShardedPS.
struct Options {
  /// Partitions per sharded variable; 0 means one per rank.
  int partitions = 0;
  /// Sum the sparse gradients of the ranks on one host before they cross to
  /// another host (needs more than one host with several ranks; see Context).
  bool local_aggregation = true;
  /// When every rank runs on one machine (host-memory engine), keep each
  /// shard in an MPI shared-memory window and let a lookup read its rows
  /// straight from their owners' shards: no owner gathers them, no reply
  /// carries them, and they land in the caller's order. The environment
  /// variable PARALLAX_SHARED_SHARDS=0 turns it off (for comparisons; read by
  /// TrainerOptions::resolve()).
  bool shared_memory = true;
  /// Store and exchange the sparse variables of one element type and width
  /// as one group (one shard buffer, one key space): a batched lookup then
  /// makes one sort pass, route and reply per group, and a step one push
  /// and one optimizer update per group, whatever the number of tables.
  /// Rows, errors, bytes and checkpoints stay per variable, and so does
  /// each variable's partitioning.
  bool group_tables = true;
  /// Trainer::ready(): push every group's gradient rows in one route once
  /// the last group is ready, instead of a route per group as each one is:
  /// a round trip a step per group fewer (what costs over TCP between
  /// hosts), but an early group's rows no longer travel while the layers
  /// below compute. Turn it off for a model whose backward pass computes
  /// long between its groups' ready() calls.
  bool push_together = true;
  /// Trainer::prefetch: once the prefetch's keys have reached their
  /// owners (on the communication thread, while the model computes), each
  /// owner replies at once with the asked rows it did not serve since its
  /// last update, and at rows() with the rest and with any early row an
  /// update wrote after all: the same rows, bit for bit, with fewer of
  /// their bytes left for rows(). For rows asked of owners in host memory
  /// and not compressed (elsewhere rows() serves them all). The environment
  /// variable PARALLAX_EARLY_ROWS=0 turns it off (for comparisons; read by
  /// TrainerOptions::resolve()).
  bool early_rows = true;
};

}  // namespace parallax::policy::sharded

namespace parallax {
using ShardedOptions = policy::sharded::Options;  ///< TrainerOptions::sharded's type, as the tutorial names it
}  // namespace parallax
