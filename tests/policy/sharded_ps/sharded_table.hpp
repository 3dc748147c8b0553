#pragma once
// One sparse table sharded over the ranks, on its own: a TableGroup of one
// table with the whole protocol of a lookup and of a push in one call each,
// so tests/policy/sharded_ps.cpp checks ShardedPS's routes and shards
// without a Trainer (which groups its tables: ShardedSynchronizer). Test
// code, not the library's: no program of the library uses it.

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

namespace px = parallax;

namespace test {

template <class T, class Engine>
class ShardedTable {
 public:
  using space = px::engine::space_of_t<Engine>;

  /// @param engine    the ranks that share the variable
  /// @param map       partitioning of the rows
  /// @param cols      row width
  /// @param name      the variable's name, for errors
  /// @param aggregate sum per host before crossing hosts, where hosts exist
  /// @param shared    keep the shard in shared memory where every rank can
  ///                  read it (ShardedOptions::shared_memory); collective
  ShardedTable(Engine& engine, px::PartitionMap map, std::size_t cols, std::string name, bool aggregate = true,
               bool shared = true)
      : engine_(&engine), group_(engine, cols, aggregate, shared) {
    group_.add(std::move(name), map);
    group_.build();
  }

  const px::PartitionMap& map() const noexcept { return group_.map(0); }
  std::size_t cols() const noexcept { return group_.cols(); }
  /// Rows stored on this rank.
  std::size_t shard_rows() const noexcept { return group_.shard_rows(0); }
  px::Buffer<T, space>& shard() noexcept { return group_.shard(); }
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
  void lookup(const px::index_t* ids, std::size_t n, T* out) {
    const typename px::policy::sharded::TableGroup<T, Engine>::Request request{0, ids, n, out};
    px::policy::sharded::RouteLane* lane = &group_.plan_lookup(&request, 1);
    const auto shape = px::policy::sharded::lookup_shape(px::detail::Fingerprint().add("lookup").add(group_.identity()).add(0).value());
    if (auto p = px::policy::sharded::route_lanes(*engine_, &lane, 1, buffers_, shape, [&](bool d) { return group_.label(0, d); },
                                     group_.lookup_problem()))
      group_.fail(*p, "lookup id");
    group_.start_reply();
    if constexpr (px::engine::supports_v<Engine, px::engine::op_start_alltoallv>) engine_->wait_started();
    group_.finish_lookup();
  }

  /// Sends this rank's k coalesced rows (ids strictly ascending) to their
  /// owners. Returns m and fills local_rows / sums with the m rows of this
  /// rank's shard that received contributions and their sums, by row then by
  /// rank. Collective.
  std::size_t push(const px::index_t* ids, const T* values, std::size_t k, px::Buffer<px::index_t, space>& local_rows,
                   px::Buffer<T, space>& sums) {
    const typename px::policy::sharded::TableGroup<T, Engine>::Push push{0, ids, values, k};
    px::policy::sharded::RouteLane* lane = &group_.plan_push(&push, 1);
    const auto shape = px::policy::sharded::push_shape(px::detail::Fingerprint().add("push").add(group_.identity()).value());
    px::policy::sharded::route_lanes(*engine_, &lane, 1, buffers_, shape, [&](bool d) { return "groups " + group_.describe(d); });
    const std::size_t m = group_.finish_push(local_rows, sums);
    const auto local = local_rows.to_host();
    std::vector<px::index_t> global(m);
    for (std::size_t i = 0; i < m; ++i) global[i] = map().global_row(engine_->rank(), static_cast<std::size_t>(local[i]));
    pushed_ = px::Buffer<px::index_t, space>::from_host(global);
    return m;
  }

  /// The global ids of the rows the last push() summed on this rank.
  const px::Buffer<px::index_t, space>& pushed_ids() const noexcept { return pushed_; }

 private:
  Engine* engine_;
  px::policy::sharded::TableGroup<T, Engine> group_;
  px::policy::sharded::RouteBuffers<space> buffers_;
  px::Buffer<px::index_t, space> pushed_;
};

}  // namespace test
