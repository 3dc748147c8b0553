#pragma once
/// @file
/// ShardedPS machinery: a variable's rows sharded over the ranks, which act
/// as parameter servers for them.

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/detail/row_exchange.hpp>
#include <parallax/detail/shared_window.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/binary_search.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax {

namespace detail {

struct OwnerOf {
  PartitionMap map;
  const index_t* ids;
  std::int32_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { out[j] = map.owner(ids[j]); }
};

/// out[j] = route[owner(ids[j])]: the first hop of a row (its owner, or this
/// host's aggregator for that owner).
struct HopOf {
  PartitionMap map;
  const index_t* ids;
  const std::int32_t* route;
  std::int32_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { out[j] = route[map.owner(ids[j])]; }
};

/// A row's lookup key: owner * rows + its index in the owner's shard. Keys
/// sort by owner, and an owner finds a row from its key without the
/// partition arithmetic (divisions) per element.
struct KeyOf {
  PartitionMap map;
  const index_t* ids;
  index_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    out[j] = static_cast<index_t>(static_cast<std::size_t>(map.owner(ids[j])) * map.rows + map.local_row(ids[j]));
  }
};

struct OwnerOfKey {
  std::size_t rows;
  const index_t* keys;
  std::int32_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    out[j] = static_cast<std::int32_t>(static_cast<std::size_t>(keys[j]) / rows);
  }
};

/// out[j] = the shard row of key keys[j] (all owned here: key - base).
template <class T>
struct GatherKeyedRows {
  const T* shard;
  const index_t* keys;
  index_t base;  // this rank * rows
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    out[j * cols + c] = shard[static_cast<std::size_t>(keys[j] - base) * cols + c];
  }
  void prefetch(std::size_t j) const {
    prefetch_bytes(shard + static_cast<std::size_t>(keys[j] - base) * cols, cols * sizeof(T));
  }
};

/// out[j] = row j, read where it lies (a row of an owner's shard in shared memory).
template <class T>
struct GatherAt {
  const T* const* rows;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const { out[j * cols + c] = rows[j][c]; }
  void prefetch(std::size_t j) const { prefetch_bytes(rows[j], cols * sizeof(T)); }
};

/// An engine whose ranks can share host memory (an MPI communicator over
/// host buffers): a ShardedTable may keep its shard where peers read it.
template <class Engine, class = void>
struct shares_host_memory : std::false_type {};
template <class Engine>
struct shares_host_memory<Engine, std::void_t<decltype(std::declval<Engine&>().comm())>>
    : std::bool_constant<std::is_same_v<engine::space_of_t<Engine>, HostSpace> &&
                         std::is_same_v<decltype(std::declval<Engine&>().comm()), MPI_Comm>> {};

/// The lane of a lookup that reads its rows from the owners' shards in
/// shared memory: its route carries only the headers (how many rows this
/// rank will read of each owner, and its status), which are the
/// synchronisation the reads need. The reads are booked as the messages
/// they replace: the row bytes from the owner to the reader.
class SharedReads final : public RouteLane {
 public:
  SharedReads(CommStats& stats, const Topology& topology, std::size_t row_bytes)
      : stats_(&stats), topology_(&topology), row_bytes_(row_bytes) {}
  /// Rows this rank reads from each rank's shard.
  std::vector<std::size_t>& counts() noexcept { return counts_; }

  std::size_t rows_to(int p) const override { return p == topology_->rank() ? 0 : counts_[static_cast<std::size_t>(p)]; }
  std::size_t bytes_of(std::size_t) const override { return 0; }
  void pack(std::byte*, const std::vector<std::size_t>&) override {}
  void unpack(const std::byte*, const std::vector<std::size_t>&, const std::vector<std::size_t>& rows) override {
    for (int p = 0; p < topology_->size(); ++p) {
      if (p == topology_->rank()) continue;
      const auto up = static_cast<std::size_t>(p);
      stats_->add_sent(rows[up] * row_bytes_, topology_->same_host(p));
      stats_->add_received(counts_[up] * row_bytes_, topology_->same_host(p));
    }
  }

 private:
  CommStats* stats_;
  const Topology* topology_;
  std::size_t row_bytes_;
  std::vector<std::size_t> counts_;
};

struct ToLocalRow {
  PartitionMap map;
  const index_t* ids;
  index_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { out[j] = static_cast<index_t>(map.local_row(ids[j])); }
};

template <class T>
struct SumBlocks {
  const T* blocks;  // `ranks` blocks of `size` elements, by rank
  T* out;
  std::size_t size;
  int ranks;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    T acc = blocks[j];
    for (int r = 1; r < ranks; ++r) acc += blocks[static_cast<std::size_t>(r) * size + j];
    out[j] = acc;
  }
};

}  // namespace detail

/// Settings of ShardedPS.
struct ShardedOptions {
  /// Partitions per sharded variable; 0 means one per rank.
  int partitions = 0;
  /// Sum the sparse gradients of the ranks on one host before they cross to
  /// another host (needs more than one host with several ranks; see Context).
  bool local_aggregation = true;
  /// When every rank runs on one machine (host-memory engine), keep each
  /// shard in an MPI shared-memory window and let a lookup read its rows
  /// straight from their owners' shards: no owner gathers them, no reply
  /// carries them, and they land in the caller's order. The environment
  /// variable PARALLAX_SHARED_SHARDS=0 turns it off (for comparisons).
  bool shared_memory = true;
};

/// One sparse variable sharded over the ranks of an engine.
///
/// * lookup (pull): the ids are de-duplicated, each unique id is requested
///   from its owner, and the rows come back aligned to the caller's ids.
///   Bytes per rank: 8 per remote unique id out, cols*sizeof(T) per remote
///   row back, plus the same for the rows this rank serves. With shared
///   shards (ShardedOptions::shared_memory, every rank on one machine) the
///   rows are read from the owners' shards instead, after a route of the
///   headers alone: cols*sizeof(T) per remote id read (repeats too), booked
///   as received from its owner and sent by it.
/// * push: the caller's coalesced rows go to their owners; an owner sums the
///   contributions by row, then by rank, and gets (local row, sum) pairs to
///   apply its optimizer to. With local aggregation the rows first go to an
///   aggregator on the sender's host (the owner itself when it is on the same
///   host), which sums them, so each row crosses between hosts once per host.
///
/// Errors in ids (outside [0, rows)) are reported on every rank at once.
template <class T, class Engine>
class ShardedTable {
 public:
  using space = engine::space_of_t<Engine>;

  /// @param engine  the ranks that share the variable
  /// @param map     partitioning of the rows
  /// @param cols    row width
  /// @param name    the variable's name, for errors
  /// @param aggregate sum per host before crossing hosts, where hosts exist
  /// @param shared  keep the shard in shared memory where every rank can read it
  ///                (ShardedOptions::shared_memory); collective
  ShardedTable(Engine& engine, PartitionMap map, std::size_t cols, std::string name, bool aggregate = true,
               bool shared = true)
      : engine_(&engine), map_(map), cols_(cols), name_(std::move(name)), exchange_(engine), aggregate_exchange_(engine),
        reads_(engine.stats(), engine.topology(), cols * sizeof(T)) {
    PARALLAX_EXPECTS(map.ranks == engine.size(), "ShardedTable '", name_, "': partition map is for ", map.ranks,
                     " ranks but the engine has ", engine.size());
    const std::size_t elements = map_.shard_rows(engine.rank()) * cols_;
    if constexpr (detail::shares_host_memory<Engine>::value) {
      if (const char* env = std::getenv("PARALLAX_SHARED_SHARDS")) shared = shared && std::atoi(env) != 0;
      // Every rank on one host: the hosts of the topology (real or emulated
      // for tests) and the machine's own say so (SharedWindow checks).
      if (shared && engine.size() > 1 && engine.topology().num_hosts() == 1) {
        window_ = detail::SharedWindow<T>::create(engine.comm(), elements);
        if (window_) shard_ = Buffer<T, space>::borrow(window_.local(), elements);
      }
    }
    if (!window_) shard_.resize_discard(elements);
    const Topology& topo = engine.topology();
    // Aggregation pays off only with several hosts of which some have several ranks.
    aggregate_ = aggregate && topo.num_hosts() > 1 && topo.num_hosts() < topo.size();
    if (aggregate_) {
      const auto mates = topo.ranks_of_host(topo.host());
      std::vector<std::int32_t> route(static_cast<std::size_t>(topo.size()));
      for (int o = 0; o < topo.size(); ++o)
        route[static_cast<std::size_t>(o)] = topo.same_host(o) ? o : mates[static_cast<std::size_t>(o) % mates.size()];
      first_hop_ = Buffer<std::int32_t, space>::from_host(route);
    }
  }

  const PartitionMap& map() const noexcept { return map_; }
  std::size_t cols() const noexcept { return cols_; }
  /// Rows stored on this rank.
  std::size_t shard_rows() const noexcept { return map_.shard_rows(engine_->rank()); }
  Buffer<T, space>& shard() noexcept { return shard_; }
  const Buffer<T, space>& shard() const noexcept { return shard_; }
  bool aggregates() const noexcept { return aggregate_; }
  /// Whether the shard lives in shared memory, so lookups read the owners'
  /// shards directly (ShardedOptions::shared_memory).
  bool shared() const noexcept { return static_cast<bool>(window_); }

  /// Fills this rank's shard with initial values: init(global_rows, out).
  template <class Fill>
  void initialize(Fill&& fill) {
    const std::size_t k = shard_rows();
    std::vector<index_t> rows(k);
    for (std::size_t i = 0; i < k; ++i) rows[i] = map_.global_row(engine_->rank(), i);
    auto dev = Buffer<index_t, space>::from_host(rows);
    fill(dev.data(), k, shard_.data());
  }

  /// out[i*cols ...] = row ids[i] of the variable, for i < n. Collective:
  /// plan_lookup(), a route of its lane alone, finish_lookup().
  void lookup(const index_t* ids, std::size_t n, T* out) {
    detail::RouteLane* lane = &plan_lookup(ids, n);
    check(detail::route_lanes(*engine_, &lane, 1, route_buffers_, lookup_problem_), "lookup id");
    finish_lookup(n, out);
  }

  /// lookup() in three parts, so that a trainer can route several tables'
  /// ids in one route: plan_lookup() (local), then detail::route_lanes()
  /// over the returned lane and any others, passing lookup_problem() of the
  /// first table that has one, then finish_lookup() with the same n (one
  /// collective reply per table). `ids` must stay valid until the route.
  detail::RouteLane& plan_lookup(const index_t* ids, std::size_t n) {
    auto& ex = engine_->exec();
    lookup_problem_ = detail::no_problem;
    if (auto at = detail::find_out_of_range(ex, ids, n, map_.rows))
      lookup_problem_ = detail::read_one<index_t, space>(ids + *at);
    if constexpr (detail::shares_host_memory<Engine>::value)
      if (window_) return plan_shared_reads(ids, n);

    // Each id as a key (owner, row in the owner's shard). Sorted unique keys
    // are grouped by owner, so they go out in their own order and the
    // replies come back aligned to them; an owner reads its rows straight
    // from the keys. Keys already strictly ascending (ascending unique ids
    // over one partition per rank, say) are their own sorted unique set:
    // no sort, and the replies land in the caller's rows. Ascending unique
    // ids over more partitions than ranks are sorted by a counting sort on
    // the host (group_ascending_ids); anything else by a sort.
    std::size_t k = 0;
    keys_.resize_discard(n);
    const index_t* unique = keys_.data();
    in_order_ = false;
    if (lookup_problem_ == detail::no_problem && n) {
      for_each(ex, n, detail::KeyOf{map_, ids, keys_.data()});
      in_order_ = detail::strictly_ascending(ex, keys_.data(), n);
      k = n;
      if (!in_order_) {
        unique_.resize_discard(n);
        inverse_.resize_discard(n);
        unique = unique_.data();
        if (!group_ascending_ids(ids, n)) {
          ex.copy(unique_.data(), keys_.data(), n * sizeof(index_t));
          with_thrust(ex, n, [&](auto policy) {
            thrust::sort(policy, unique_.data(), unique_.data() + n);
            k = static_cast<std::size_t>(thrust::unique(policy, unique_.data(), unique_.data() + n) - unique_.data());
            thrust::lower_bound(policy, unique_.data(), unique_.data() + k, keys_.data(), keys_.data() + n,
                                inverse_.data());
          });
        }
      }
    }
    dest_.resize_discard(k);
    if (k) for_each(ex, k, detail::OwnerOfKey{map_.rows, unique, dest_.data()});
    ex.synchronize();
    exchange_.plan(unique, nullptr, dest_.data(), k, 0);
    return exchange_;
  }

  /// True when the last plan_lookup() found its keys strictly ascending, so
  /// finish_lookup() receives the rows in place (no sort, no reordering).
  bool lookup_in_order() const noexcept { return in_order_; }

  /// The id outside [0, rows) that the last plan_lookup() found on this
  /// rank, or detail::no_problem.
  index_t lookup_problem() const noexcept { return lookup_problem_; }

  /// Serves the keys the route brought this rank, then gathers the answers
  /// (one per unique key, in key order) into the caller's order, or has
  /// them land there when the keys were in order. Collective.
  void finish_lookup(std::size_t n, T* out) {
    start_reply(out);
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
    gather_reply(n, out);
  }

  /// finish_lookup() in three parts, so that a trainer can wait for several
  /// tables' replies at once: start_reply() serves the keys and starts the
  /// reply, the engine's wait_started() (where it has one) completes every
  /// started reply, gather_reply() puts the rows in the caller's order.
  void start_reply(T* out) {
    auto& ex = engine_->exec();
    if constexpr (detail::shares_host_memory<Engine>::value) {
      if (window_) {
        // The route's headers came from every rank after its last update
        // of its shard: the rows are final. Read them where they lie.
        window_.sync();
        for_each_rows(ex, reads_at_.size(), cols_, detail::GatherAt<T>{reads_at_.data(), out, cols_});
        ex.synchronize();
        window_.sync();
        return;
      }
    }
    const std::size_t asked = exchange_.received();
    served_.resize_discard(asked * cols_);
    const auto base = static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * map_.rows);
    for_each_rows(ex, asked, cols_,
                  detail::GatherKeyedRows<T>{shard_.data(), exchange_.received_ids(), base, served_.data(), cols_});
    ex.synchronize();
    by_unique_ = exchange_.start_reply(served_.data(), cols_, in_order_ ? out : nullptr);
  }
  void gather_reply(std::size_t n, T* out) {
    if (in_order_ || window_) return;
    auto& ex = engine_->exec();
    for_each_rows(ex, n, cols_, detail::GatherRows<T>{by_unique_, inverse_.data(), out, cols_});
    ex.synchronize();
  }

  /// Throws the error of a problem a route reported (`what`: "lookup id", ...).
  [[noreturn]] void fail(const detail::RemoteProblem& p, const char* what) const {
    throw error(detail::concat("variable '", name_, "': ", what, " ", p.id, " is outside [0, ", map_.rows,
                               ") on rank ", p.rank));
  }
  void check(const std::optional<detail::RemoteProblem>& p, const char* what) const {
    if (p) fail(*p, what);
  }

  /// Sends this rank's k coalesced rows (ids strictly ascending) to their
  /// owners. Returns m and fills local_rows / sums with the m rows of this
  /// rank's shard that received contributions and their sums. Collective.
  std::size_t push(const index_t* ids, const T* values, std::size_t k, Buffer<index_t, space>& local_rows,
                   Buffer<T, space>& sums) {
    plan_push(ids, values, k);
    route_planned();
    return finish_push(local_rows, sums);
  }

  /// Routes what plan_push() planned, alone (no other table's rows).
  void route_planned() {
    detail::RouteLane* lane = &exchange_;
    detail::route_lanes(*engine_, &lane, 1, route_buffers_);
  }

  /// push() in three parts, so that a trainer can send several tables' rows
  /// in one route: plan_push() (collective only with local aggregation,
  /// whose first hop it takes), then detail::route_lanes() over the returned
  /// lane and any others, then finish_push(). The inputs must stay valid
  /// until the route.
  detail::RouteLane& plan_push(const index_t* ids, const T* values, std::size_t k) {
    auto& ex = engine_->exec();
    const index_t* hop_ids = ids;
    const T* hop_values = values;
    std::size_t hop_k = k;
    if (aggregate_) {
      // Hop 1, inside the host: to the owner, or to this host's aggregator for it.
      dest_.resize_discard(k);
      if (k) for_each(ex, k, detail::HopOf{map_, ids, first_hop_.data(), dest_.data()});
      ex.synchronize();
      check(aggregate_exchange_.route(ids, values, dest_.data(), k, cols_), "gradient row");
      hop_k = detail::coalesce_rows(ex, aggregate_exchange_.received_ids(), aggregate_exchange_.received_values(),
                                    aggregate_exchange_.received(), cols_, hop_ids_, hop_values_, scratch_);
      hop_ids = hop_ids_.data();
      hop_values = hop_values_.data();
    }
    // To the owners (across hosts when aggregating; rows already at their owner stay).
    dest_.resize_discard(hop_k);
    if (hop_k) for_each(ex, hop_k, detail::OwnerOf{map_, hop_ids, dest_.data()});
    ex.synchronize();
    exchange_.plan(hop_ids, hop_values, dest_.data(), hop_k, cols_);
    return exchange_;
  }

  /// Sums the rows the route brought this rank, by row and then by source
  /// rank; see push().
  std::size_t finish_push(Buffer<index_t, space>& local_rows, Buffer<T, space>& sums) {
    auto& ex = engine_->exec();
    const std::size_t m = detail::coalesce_rows(ex, exchange_.received_ids(), exchange_.received_values(),
                                                exchange_.received(), cols_, owned_ids_, sums, scratch_);
    local_rows.resize_discard(m);
    if (m) for_each(ex, m, detail::ToLocalRow{map_, owned_ids_.data(), local_rows.data()});
    ex.synchronize();
    return m;
  }

  /// The global ids of the rows the last push() summed on this rank.
  const Buffer<index_t, space>& pushed_ids() const noexcept { return owned_ids_; }

 private:
  /// plan_lookup() with shared shards: where each row lies, and how many
  /// rows of each owner this rank will read (the route's headers).
  detail::RouteLane& plan_shared_reads(const index_t* ids, std::size_t n) {
    // Our last writes to our shard before the headers that tell peers
    // they may read it.
    window_.sync();
    // A bad id reads nothing: the route reports it on every rank.
    reads_at_.resize(lookup_problem_ == detail::no_problem ? n : 0);
    auto& counts = reads_.counts();
    counts.assign(static_cast<std::size_t>(engine_->size()), 0);
    const T* const* bases = window_.bases();
    for (std::size_t j = 0; j < reads_at_.size(); ++j) {
      const int o = map_.owner(ids[j]);
      reads_at_[j] = bases[o] + map_.local_row(ids[j]) * cols_;
      ++counts[static_cast<std::size_t>(o)];
    }
    in_order_ = false;
    return reads_;
  }

  /// Host memory, ids strictly ascending but owners interleaved (more
  /// partitions than ranks): the keys ascend within each owner (an owner's
  /// shard is its partitions in increasing order), so grouping them by owner
  /// (a counting sort) sorts them, and they are already unique. Fills
  /// unique_ and inverse_ as the sort would; false (nothing done) otherwise.
  bool group_ascending_ids(const index_t* ids, std::size_t n) {
    if constexpr (std::is_same_v<space, HostSpace>) {
      if (!detail::strictly_ascending(engine_->exec(), ids, n)) return false;
      const index_t* keys = keys_.data();
      index_t* unique = unique_.data();
      index_t* inverse = inverse_.data();
      const std::size_t rows = map_.rows;
      group_first_.resize(static_cast<std::size_t>(engine_->size()) + 1);
      detail::group_stably(
          n, static_cast<std::size_t>(engine_->size()),
          [&](std::size_t i) { return static_cast<std::size_t>(keys[i]) / rows; }, group_first_.data(),
          [&](std::size_t i, index_t at) {
            unique[at] = keys[i];
            inverse[i] = at;
          });
      return true;
    } else {
      (void)ids;
      (void)n;
      return false;
    }
  }

  Engine* engine_;
  PartitionMap map_;
  std::size_t cols_;
  std::string name_;
  bool aggregate_ = false;
  index_t lookup_problem_ = detail::no_problem;
  bool in_order_ = false;  // the last plan_lookup()'s keys were strictly ascending
  std::vector<index_t> group_first_;  // group_ascending_ids(): where each owner's keys start
  const T* by_unique_ = nullptr;  // where the last start_reply()'s rows land
  detail::SharedWindow<T> window_;  // the shard's memory, when shared
  std::vector<const T*> reads_at_;  // where each looked-up row lies, when shared
  Buffer<T, space> shard_;
  detail::RowExchange<T, Engine> exchange_, aggregate_exchange_;
  detail::SharedReads reads_;  // the lookup's lane, when shared
  detail::RouteBuffers<space> route_buffers_;
  Buffer<std::int32_t, space> first_hop_, dest_;
  Buffer<index_t, space> keys_, unique_, inverse_, hop_ids_, owned_ids_;
  Buffer<T, space> served_, hop_values_;
  detail::CoalesceScratch<space> scratch_;
};

/// A dense variable sharded over the ranks (arch::PS): each rank sends every
/// owner its rows of the gradient, the owner sums them by rank and updates
/// its shard, and every rank gathers the updated shards. Bytes per rank equal
/// a ring all-reduce's, 2(N-1)/N of the variable, in two collectives.
template <class T, class Engine>
class DenseShards {
 public:
  using space = engine::space_of_t<Engine>;

  DenseShards(Engine& engine, PartitionMap map, std::size_t cols) : engine_(&engine), map_(map), cols_(cols) {
    const int n = engine.size();
    const auto un = static_cast<std::size_t>(n);
    // In the owner-major layout each owner's partitions are adjacent. With
    // P <= N that is the variable's own row order, and no copies are needed.
    identity_ = map.parts <= n;
    counts_.resize(un);
    displs_.resize(un);
    std::size_t at = 0;
    for (int r = 0; r < n; ++r) {
      counts_[r] = map.shard_rows(r) * cols;
      displs_[r] = at;
      at += counts_[r];
    }
    mine_ = counts_[static_cast<std::size_t>(engine.rank())];
    rcounts_.assign(un, mine_);
    rdispls_.resize(un);
    for (std::size_t r = 0; r < un; ++r) rdispls_[r] = r * mine_;
    shard_.resize_discard(mine_);
  }

  const PartitionMap& map() const noexcept { return map_; }
  Buffer<T, space>& shard() noexcept { return shard_; }
  std::size_t shard_elements() const noexcept { return mine_; }

  /// Copies this rank's rows of a full-size buffer into its shard layout.
  void take_shard(const T* full, T* shard_out) {
    auto& ex = engine_->exec();
    const int me = engine_->rank();
    for (std::size_t t = 0; t < map_.partitions_on(me); ++t) {
      const int p = me + static_cast<int>(t) * map_.ranks;
      ex.copy(shard_out + map_.shard_offset(p) * cols_, full + map_.begin(p) * cols_, map_.size(p) * cols_ * sizeof(T));
    }
    ex.synchronize();
  }

  /// sum = the sum over ranks, in rank order, of this rank's rows of `grad`
  /// (a full-size gradient). Collective.
  void reduce(const T* grad, T* sum) {
    auto& ex = engine_->exec();
    const T* send = grad;
    if (!identity_) send = to_owner_major(grad);
    received_.resize_discard(mine_ * static_cast<std::size_t>(engine_->size()));
    engine_->alltoallv(send, counts_.data(), displs_.data(), received_.data(), rcounts_.data(), rdispls_.data(),
                       data_type_of_v<T>);
    if (mine_) for_each(ex, mine_, detail::SumBlocks<T>{received_.data(), sum, mine_, engine_->size()});
    ex.synchronize();
  }

  /// full = every rank's shard, assembled. Collective.
  void gather(const T* shard, T* full) {
    T* out = identity_ ? full : (staging_.resize_discard(map_.rows * cols_), staging_.data());
    engine_->allgatherv(shard, mine_, out, counts_.data(), displs_.data(), data_type_of_v<T>);
    if (!identity_) from_owner_major(out, full);
  }

 private:
  template <class Copy>
  void for_partitions(Copy&& copy) {
    for (int p = 0; p < map_.parts; ++p) {
      const int o = map_.owner_of_partition(p);
      copy(displs_[static_cast<std::size_t>(o)] + map_.shard_offset(p) * cols_, map_.begin(p) * cols_,
           map_.size(p) * cols_);
    }
  }
  const T* to_owner_major(const T* full) {
    staging_.resize_discard(map_.rows * cols_);
    auto& ex = engine_->exec();
    for_partitions([&](std::size_t owner_major, std::size_t row_major, std::size_t n) {
      ex.copy(staging_.data() + owner_major, full + row_major, n * sizeof(T));
    });
    ex.synchronize();
    return staging_.data();
  }
  void from_owner_major(const T* owner_major_buf, T* full) {
    auto& ex = engine_->exec();
    for_partitions([&](std::size_t owner_major, std::size_t row_major, std::size_t n) {
      ex.copy(full + row_major, owner_major_buf + owner_major, n * sizeof(T));
    });
    ex.synchronize();
  }

  Engine* engine_;
  PartitionMap map_;
  std::size_t cols_;
  bool identity_ = true;
  std::size_t mine_ = 0;
  std::vector<std::size_t> counts_, displs_, rcounts_, rdispls_;
  Buffer<T, space> shard_, received_, staging_;
};

}  // namespace parallax
