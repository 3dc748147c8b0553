#pragma once
/// @file
/// One sparse table sharded over the ranks, on its own: a TableGroup of one
/// table with the whole protocol of a lookup and of a push in one call each.
/// For programs that use ShardedPS's machinery without a Trainer (tests,
/// benchmarks); a Trainer groups its tables (ShardedSynchronizer).

#include <parallax/detail/agreement.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/policy/sharded_ps/table_group.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace parallax {

template <class T, class Engine>
class ShardedTable {
 public:
  using space = engine::space_of_t<Engine>;

  /// @param engine    the ranks that share the variable
  /// @param map       partitioning of the rows
  /// @param cols      row width
  /// @param name      the variable's name, for errors
  /// @param aggregate sum per host before crossing hosts, where hosts exist
  /// @param shared    keep the shard in shared memory where every rank can
  ///                  read it (ShardedOptions::shared_memory); collective
  ShardedTable(Engine& engine, PartitionMap map, std::size_t cols, std::string name, bool aggregate = true,
               bool shared = true)
      : engine_(&engine), group_(engine, cols, aggregate, shared) {
    group_.add(std::move(name), map);
    group_.build();
  }

  const PartitionMap& map() const noexcept { return group_.map(0); }
  std::size_t cols() const noexcept { return group_.cols(); }
  /// Rows stored on this rank.
  std::size_t shard_rows() const noexcept { return group_.shard_rows(0); }
  Buffer<T, space>& shard() noexcept { return group_.shard(); }
  bool aggregates() const noexcept { return group_.aggregates(); }
  bool shared() const noexcept { return group_.shared(); }
  /// Whether lookups read every row where it lies (shared shards, or one rank).
  bool reads_directly() const noexcept { return group_.reads_directly(); }
  /// True when the last lookup's keys were strictly ascending, so its rows
  /// landed in place (no sort, no reordering).
  bool lookup_in_order() const noexcept { return group_.lookup_in_order(); }

  /// Fills this rank's shard with initial values: fill(global rows, k, out).
  template <class Fill>
  void initialize(Fill&& fill) {
    group_.initialize(0, std::forward<Fill>(fill));
  }

  /// out[i*cols ...] = row ids[i] of the variable, for i < n. Collective.
  void lookup(const index_t* ids, std::size_t n, T* out) {
    const typename TableGroup<T, Engine>::Request request{0, ids, n, out};
    detail::RouteLane* lane = &group_.plan_lookup(&request, 1);
    const auto shape = detail::lookup_shape(detail::Fingerprint().add("lookup").add(group_.identity()).add(0).value());
    if (auto p = detail::route_lanes(*engine_, &lane, 1, buffers_, shape, [&](bool d) { return group_.label(0, d); },
                                     group_.lookup_problem()))
      group_.fail(*p, "lookup id");
    group_.start_reply();
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
    group_.finish_lookup();
  }

  /// Sends this rank's k coalesced rows (ids strictly ascending) to their
  /// owners. Returns m and fills local_rows / sums with the m rows of this
  /// rank's shard that received contributions and their sums, by row then by
  /// rank. Collective.
  std::size_t push(const index_t* ids, const T* values, std::size_t k, Buffer<index_t, space>& local_rows,
                   Buffer<T, space>& sums) {
    const typename TableGroup<T, Engine>::Push push{0, ids, values, k};
    detail::RouteLane* lane = &group_.plan_push(&push, 1);
    const auto shape = detail::push_shape(detail::Fingerprint().add("push").add(group_.identity()).value());
    detail::route_lanes(*engine_, &lane, 1, buffers_, shape, [&](bool d) { return "groups " + group_.describe(d); });
    const std::size_t m = group_.finish_push(local_rows, sums);
    const auto local = local_rows.to_host();
    std::vector<index_t> global(m);
    for (std::size_t i = 0; i < m; ++i) global[i] = map().global_row(engine_->rank(), static_cast<std::size_t>(local[i]));
    pushed_ = Buffer<index_t, space>::from_host(global);
    return m;
  }

  /// The global ids of the rows the last push() summed on this rank.
  const Buffer<index_t, space>& pushed_ids() const noexcept { return pushed_; }

 private:
  Engine* engine_;
  TableGroup<T, Engine> group_;
  detail::RouteBuffers<space> buffers_;
  Buffer<index_t, space> pushed_;
};

}  // namespace parallax
