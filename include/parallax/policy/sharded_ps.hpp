#pragma once
/// @file
/// The ShardedPS policy tag. Its machinery is in policy/sharded_ps/: the
/// route of rows between ranks (row_exchange.hpp), groups of sharded tables
/// (table_group.hpp; their storage, table_layout.hpp; the kernels of their
/// routes, group_routes.hpp), sharded dense variables (dense_shards.hpp),
/// bags pooled at the owners (bag_pool.hpp), and the synchronizer a trainer
/// runs (synchronizer.hpp, which includes its parts).

#include <parallax/policy/sharded_ps/options.hpp>

#include <tuple>

namespace parallax {

namespace policy {
template <class Engine, class Optimizer>
class ShardedSynchronizer;
}  // namespace policy

/// Rows are cut into partitions owned by the ranks, which act as parameter
/// servers: a rank pulls the rows it needs and pushes the rows it touched;
/// the owner sums and applies the optimizer. Dense variables can be sharded
/// too (then push = reduce-scatter, pull = all-gather).
struct ShardedPS {
  static constexpr const char* name = "ShardedPS";
  static constexpr bool stores_half = true;  // shards of Var::storage_type rows, exchanged and updated in float
  using options = std::tuple<policy::sharded::Options>;  // its synchronizer's own settings (TrainerOptions::sharded)
  template <class Engine, class Optimizer>
  using synchronizer = policy::ShardedSynchronizer<Engine, Optimizer>;
};

}  // namespace parallax
