#pragma once
/// @file
/// What a ShardedPS table group's routes are made of (TableGroup,
/// table_group.hpp): the kernels that make group keys and place rows, the
/// routes' shapes (which name ranks that route otherwise), and the lane of a
/// lookup that reads its rows from shared shards. Keys are as table_layout.hpp
/// lays them out.

#include <parallax/comm_stats.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax::policy::sharded {

/// out[j] = the group key of row ids[j] of a table (see table_layout.hpp).
struct GroupKeyOf {
  PartitionMap map;
  const index_t* base;  // per owner: where the table starts in the owner's group shard
  std::size_t span;
  const index_t* ids;
  index_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const int o = map.owner(ids[j]);
    out[j] = static_cast<index_t>(static_cast<std::size_t>(o) * span + static_cast<std::size_t>(base[o]) +
                                  map.local_row(ids[j]));
  }
};

struct OwnerOfKey {
  std::size_t span;
  const index_t* keys;
  std::int32_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    out[j] = static_cast<std::int32_t>(static_cast<std::size_t>(keys[j]) / span);
  }
};

/// A pushed row of a table: its group key, its first hop (its owner, or
/// this host's aggregator for that owner when `route` is given) and where
/// its values lie.
template <class T>
struct PushRowOf {
  PartitionMap map;
  const index_t* base;
  std::size_t span;
  const std::int32_t* route;
  const index_t* ids;
  const T* values;
  std::size_t cols;
  index_t* key;
  std::int32_t* dest;
  const T** at;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const int o = map.owner(ids[j]);
    key[j] = static_cast<index_t>(static_cast<std::size_t>(o) * span + static_cast<std::size_t>(base[o]) +
                                  map.local_row(ids[j]));
    dest[j] = route ? route[o] : o;
    at[j] = values + j * cols;
  }
};

/// out[j] = the shard row of key keys[j] (all owned here: key - base), as T
/// (a row stored in 16 bits widened exactly).
template <class T, class S = T>
struct GatherKeyedRows {
  const S* shard;
  const index_t* keys;
  index_t base;  // this rank * span
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    out[j * cols + c] = static_cast<T>(shard[static_cast<std::size_t>(keys[j] - base) * cols + c]);
  }
  void prefetch(std::size_t j) const {
    prefetch_bytes(shard + static_cast<std::size_t>(keys[j] - base) * cols, cols * sizeof(S));
  }
};

/// out[j, c] = rows.row(j)[c] as To: rows narrowed to a 16-bit wire, or
/// widened back from it.
template <class To, class From>
struct ConvertRows {
  detail::RowsAt<From> rows;
  To* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    out[j * cols + c] = static_cast<To>(rows.row(j, cols)[c]);
  }
};

/// out[j] = row j, read where it lies (a row of an owner's shard in shared
/// memory), as T.
template <class T, class S = T>
struct GatherAt {
  const S* const* rows;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    out[j * cols + c] = static_cast<T>(rows[j][c]);
  }
  void prefetch(std::size_t j) const { prefetch_bytes(rows[j], cols * sizeof(S)); }
};

/// out[j] = where row ids[j] of a table lies in this rank's group shard (one
/// rank: every row is here).
template <class T>
struct LocalRowAt {
  PartitionMap map;
  const index_t* base;
  const T* shard;
  std::size_t cols;
  const index_t* ids;
  const T** out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    out[j] = shard + (static_cast<std::size_t>(base[0]) + map.local_row(ids[j])) * cols;
  }
};

/// out[i] = the reply row of a request's id i: its unique key is
/// first + inverse[i] (first + i when the request's keys were unique and
/// in order), which was sent where[u]-th (u itself when sent in order).
template <class T>
struct GatherReply {
  const T* reply;
  const index_t* where;
  const index_t* inverse;
  index_t first;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE std::size_t row(std::size_t i) const {
    const index_t u = first + (inverse ? inverse[i] : static_cast<index_t>(i));
    return static_cast<std::size_t>(where ? where[u] : u);
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t i, std::size_t c) const { out[i * cols + c] = reply[row(i) * cols + c]; }
  void prefetch(std::size_t i) const { prefetch_bytes(reply + row(i) * cols, cols * sizeof(T)); }
};

/// out[j] = where row j of `rows` lies.
template <class T>
struct RowAddresses {
  detail::RowsAt<T> rows;
  std::size_t cols;
  const T** out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { out[j] = rows.row(j, cols); }
};

/// where[order[j]] = j: the inverse of a permutation.
struct InvertOrder {
  const index_t* order;
  index_t* where;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { where[order[j]] = static_cast<index_t>(j); }
};


/// The shapes of ShardedPS's routes (see CallShape): a batched lookup's word
/// covers its requests' (group identity, table) in order, a push's every
/// group's identity, so ranks that look up other variables, or hold their
/// tables grouped or partitioned otherwise, are named at the route.
inline CallShape lookup_shape(std::uint64_t word) {
  return {word, "batched lookups",
          "Every rank must look up the same sparse variables, in the same order, in each batched lookup (the ids "
          "may differ, and may be none)."};
}
/// A lookup ahead's routes (Trainer::prefetch, then its rows() when they
/// are read in place): their words are apart from a plain lookup's, so a
/// rank that prefetches while another looks up is named at the route; the
/// rule is the same, so every rank throws the same sentence.
inline CallShape prefetch_shape(std::uint64_t word) { return lookup_shape(word); }
inline CallShape push_shape(std::uint64_t word) {
  return {word, "pushes of sparse gradients",
          "Every rank must hold the same sharded variables, grouped and partitioned alike (give every rank the same "
          "TrainerOptions)."};
}

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

}  // namespace parallax::policy::sharded
