#pragma once
/// @file
/// Bags pooled at the owner (docs/design.md, "Bags"): ShardedPS's
/// placement of a sparse variable's pooling next to the shard that holds its
/// rows. One BagPool carries one batched bag lookup of a table group, from
/// its route to the gradient its owners expand.
///
/// * forward: the asker splits each bag by owner into segments (one per
///   (bag, owner) pair, owners ascending) and sends each owner two lanes of
///   one route: the segment's ids as group keys (with a weight each when some
///   request of the batch is weighted), and a row per segment holding its
///   number of ids. The owner sums its rows of each segment (times the
///   weights) and replies with one row per segment; the asker adds a bag's
///   partial sums, owners ascending, and divides by the bag's ids for mean.
/// * backward: the asker sends each owner one row per segment, the bag's
///   gradient (divided by its ids for mean), in the order of the forward's
///   segments; the owner, which kept what the forward brought it, gives each
///   id of the segment that row (times its weight) as a gradient row of its
///   shard (TableGroup::add_owned_rows), summed at the step's push with the
///   rows the push brings.
///
/// Bytes per rank and peer: 8 per id sent (12, weighted, padded to 8 per
/// block), 4 per segment (its count; 8 where T has 8 bytes) and cols x
/// sizeof(T) per segment replied; the backward cols x sizeof(T) per segment
/// (padded to 8 per block). A plain lookup sends 8 per unique id and replies a row per
/// unique id, and pushes one per unique id. With compression
/// (TableGroup::compression()) the replies and gradient rows travel in 16
/// bits and the ids in 4 bytes (TableGroup::narrows_ids()).
///
/// The group's shard may hold S (bf16, fp16): an owner widens its rows to T
/// as it pools them, and the expanded gradients are T rows like any pushed.

#include <parallax/bags.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/sharded_ps/half_wire.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/policy/sharded_ps/table_group.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace parallax::policy::sharded {


/// at[j] = where the shard row of key keys[j] starts (elements): (key -
/// base) x cols, base being this rank x span.
struct ShardOffsetOfKey {
  const index_t* keys;
  index_t base;
  std::size_t cols;
  index_t* at;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    at[j] = static_cast<index_t>(static_cast<std::size_t>(keys[j] - base) * cols);
  }
};

/// at[order[j]] = j x cols: where the reply row of segment order[j] lies.
struct ReplyOffsetOfSegment {
  const index_t* order;
  std::size_t cols;
  index_t* at;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    at[order[j]] = static_cast<index_t>(j * cols);
  }
};

/// out[j] = the first value of row j (a received weight).
template <class T>
struct FirstOfRow {
  detail::RowsAt<T> rows;
  T* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { out[j] = rows.row(j, 1)[0]; }
};


template <class T, class Engine, class S = T>
class BagPool {
 public:
  using space = engine::space_of_t<Engine>;

  /// One request of the batch for a table of the group, checked already
  /// (detail::bag_problem): `offsets` on the host, the ids and weights in
  /// space (read by plan() only), rows to `out` (bags x cols, in space;
  /// set_out()).
  struct Request {
    std::size_t table = 0;
    std::vector<index_t> offsets;
    const index_t* ids = nullptr;
    std::size_t n = 0;
    const T* weights = nullptr;
    Combiner combiner = Combiner::sum;
    T* out = nullptr;
    std::size_t bags() const noexcept { return offsets.size() - 1; }
  };

  /// Whether counts travel in 4 bytes: with values of at most 4 bytes (the
  /// alignment a 4-byte id leaves them), as RowExchange::narrow_ids needs.
  static constexpr bool narrow_counts = sizeof(T) <= sizeof(std::uint32_t);

  explicit BagPool(Engine& engine)
      : engine_(&engine), entries_(engine), segments_(engine), gradients_(engine), half_gradients_(engine) {}
  BagPool(const BagPool&) = delete;
  BagPool& operator=(const BagPool&) = delete;

  // ---------------------------------------------------------------- forward
  //
  // plan() (local), then route_lanes() over lanes() (with other
  // groups' lanes), then serve() (the owners pool and reply: one collective),
  // the engine's wait_started() where it has one, and finish().

  /// Splits the requests' bags into segments by owner and plans the lanes.
  void plan(TableGroup<T, Engine, S>& tables, std::vector<Request> requests) {
    requests_ = std::move(requests);
    cols_ = tables.cols();
    const std::size_t span = tables.span();
    compress_ = tables.compression();
    // Keys as offsets in their owner's shard where the group narrows them;
    // counts in 4 bytes as they are (span 0) wherever the rows' values allow
    // 4-byte ids. The gradient rows carry no ids: the owner knows each from
    // the order of the segments the forward brought it.
    if (tables.narrows_ids()) entries_.narrow_ids(span);
    else entries_.wide_ids();
    if (narrow_counts || tables.narrows_ids()) segments_.narrow_ids(0);
    else segments_.wide_ids();
    gradients_.omit_ids();
    half_gradients_.omit_ids();
    weighted_ = false;
    std::size_t total_ids = 0, total_bags = 0;
    for (const Request& q : requests_) {
      // The lane's width must be every rank's: the combiner says (the ids of
      // a weighted request may be none here).
      weighted_ = weighted_ || q.combiner == Combiner::weighted_sum;
      total_ids += q.n;
      total_bags += q.bags();
    }
    PARALLAX_EXPECTS(!narrow_counts || total_ids <= 0xffffffffu, "BagPool: ", total_ids,
                     " ids in one batch of bags; counts travel in 32 bits");
    Plan& h = plan_;  // host arrays, kept across steps so plan() allocates nothing once warm
    h.clear();
    h.keys.reserve(total_ids);
    h.entry_dest.reserve(total_ids);
    if (weighted_) h.weights.reserve(total_ids);
    h.bag_first.reserve(total_bags + 1);
    h.per_owner.assign(static_cast<std::size_t>(engine_->size()), 0);
    bag_first_of_.assign(requests_.size() + 1, 0);
    std::size_t global_bag = 0;
    for (std::size_t r = 0; r < requests_.size(); ++r) {
      const Request& q = requests_[r];
      bag_first_of_[r] = global_bag;
      h.ids.resize(q.n);
      if (q.n) space_traits<space>::copy_to_host(h.ids.data(), q.ids, q.n * sizeof(index_t));
      h.w.assign(q.weights ? q.n : 0, T(1));
      if (q.weights && q.n) space_traits<space>::copy_to_host(h.w.data(), q.weights, q.n * sizeof(T));
      for (std::size_t b = 0; b < q.bags(); ++b, ++global_bag) {
        h.bag_first.push_back(static_cast<index_t>(h.counts.size()));
        const auto begin = static_cast<std::size_t>(q.offsets[b]), end = static_cast<std::size_t>(q.offsets[b + 1]);
        split_bag(tables, q, begin, end, span, static_cast<index_t>(global_bag));
      }
    }
    h.bag_first.push_back(static_cast<index_t>(h.counts.size()));
    bag_first_of_[requests_.size()] = global_bag;
    keys_.assign_from_host(h.keys.data(), h.keys.size());
    entry_dest_.assign_from_host(h.entry_dest.data(), h.entry_dest.size());
    weights_.assign_from_host(h.weights.data(), h.weights.size());
    counts_.assign_from_host(h.counts.data(), h.counts.size());
    segment_dest_.assign_from_host(h.segment_dest.data(), h.segment_dest.size());
    bag_first_.assign_from_host(h.bag_first.data(), h.bag_first.size());
    offsets_.resize(requests_.size());
    for (std::size_t r = 0; r < requests_.size(); ++r)
      offsets_[r].assign_from_host(requests_[r].offsets.data(), requests_[r].offsets.size());
    entries_.plan(keys_.data(), detail::RowsAt<T>(weighted_ ? weights_.data() : nullptr), entry_dest_.data(),
                  h.keys.size(), weighted_ ? 1 : 0);
    segments_.plan(counts_.data(), detail::RowsAt<T>(), segment_dest_.data(), h.counts.size(), 0);
  }

  /// The forward route's lanes: the ids (and weights), then the segments.
  RouteLane& entry_lane() noexcept { return entries_; }
  RouteLane& segment_lane() noexcept { return segments_; }
  /// Ids this rank sends (segments: one per (bag, owner) pair).
  std::size_t ids_sent() const noexcept { return keys_.size(); }
  std::size_t segments_sent() const noexcept { return counts_.size(); }

  /// The owner's half: sums its rows of every segment the route brought,
  /// keeps the segments for the backward pass, and starts the reply.
  /// Collective.
  void serve(TableGroup<T, Engine, S>& tables) {
    auto& ex = engine_->exec();
    const std::size_t ids = entries_.received(), segments = segments_.received();
    // Where each segment's ids start among the ids received: both lanes come
    // rank after rank, each rank's segments in the order of its ids.
    std::vector<index_t> first(segments + 1, 0);
    if (segments) space_traits<space>::copy_to_host(first.data() + 1, segments_.received_ids(), segments * sizeof(index_t));
    for (std::size_t s = 0; s < segments; ++s) first[s + 1] += first[s];
    PARALLAX_EXPECTS(static_cast<std::size_t>(first[segments]) == ids, "BagPool: ", ids, " ids arrived for segments of ",
                     first[segments]);
    owner_first_.assign_from_host(first.data(), first.size());
    owner_keys_.resize_discard(ids);
    owner_at_.resize_discard(ids);
    owner_weights_.resize_discard(weighted_ ? ids : 0);
    if (ids) {
      ex.copy(owner_keys_.data(), entries_.received_ids(), ids * sizeof(index_t));
      if (weighted_) for_each(ex, ids, FirstOfRow<T>{entries_.received_values(), owner_weights_.data()});
      const auto base = static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * tables.span());
      for_each(ex, ids, ShardOffsetOfKey{owner_keys_.data(), base, cols_, owner_at_.data()});
    }
    served_.resize_discard(segments * cols_);
    detail::pool_segments(ex,
                          detail::PoolBags<T, S>{detail::RowsAt<S>(tables.shard().data(), owner_at_.data()),
                                                 owner_first_.data(), weighted_ ? owner_weights_.data() : nullptr,
                                                 nullptr, served_.data(), cols_},
                          segments);
    ex.synchronize();
    if (compress_ == Compression::none) {
      replies_ = segments_.start_reply(served_.data(), cols_);
      return;
    }
    half_reply_.start(compress_, segments_, segments, cols_, [&](auto* out) {
      using W = std::remove_pointer_t<decltype(out)>;
      if (segments) for_each(ex, segments * cols_, detail::Convert<W, T>{served_.data(), out});
      ex.synchronize();
    });
  }

  /// The asker's half: each bag's partial sums, owners ascending, into its
  /// request's `out` (divided by its ids for mean; an empty bag: zeros).
  void finish() {
    auto& ex = engine_->exec();
    const std::size_t segments = counts_.size();
    if (compress_ != Compression::none) replies_ = half_reply_.finish(segments, cols_, ex);
    reply_at_.resize_discard(segments);
    if (segments) for_each(ex, segments, ReplyOffsetOfSegment{segments_.sent_order(), cols_, reply_at_.data()});
    for (std::size_t r = 0; r < requests_.size(); ++r) {
      const Request& q = requests_[r];
      detail::pool_segments(ex,
                            detail::PoolBags<T>{detail::RowsAt<T>(replies_, reply_at_.data()),
                                                bag_first_.data() + bag_first_of_[r], nullptr,
                                                q.combiner == Combiner::mean ? offsets_[r].data() : nullptr, q.out,
                                                cols_},
                            q.bags());
    }
    ex.synchronize();
  }

  std::size_t requests() const noexcept { return requests_.size(); }
  const Request& request(std::size_t r) const noexcept { return requests_[r]; }
  /// Where finish() puts request r's rows (bags x cols, in space): given
  /// when they are served, so a batch routed a step ahead writes them
  /// where that step's buffers lie.
  void set_out(std::size_t r, T* out) noexcept { requests_[r].out = out; }

  // ---------------------------------------------------------------- backward
  //
  // plan_gradients() (local), then route_lanes() over gradient_lane()
  // (with other groups' lanes), then expand().

  /// Plans the rows of the bags' gradients: `grads[r]` holds request r's
  /// (bags x cols, in space, checked already), valid until the route.
  void plan_gradients(const std::vector<const T*>& grads) {
    auto& ex = engine_->exec();
    std::vector<const T*> row_of_bag;  // per bag of the batch
    scaled_.resize(requests_.size());
    for (std::size_t r = 0; r < requests_.size(); ++r) {
      const Request& q = requests_[r];
      const T* g = grads[r];
      if (q.combiner == Combiner::mean && q.bags()) {
        scaled_[r].resize_discard(q.bags() * cols_);
        for_each_rows(ex, q.bags(), cols_, detail::DivideByCount<T>{g, offsets_[r].data(), scaled_[r].data(), cols_});
        g = scaled_[r].data();
      }
      for (std::size_t b = 0; b < q.bags(); ++b) row_of_bag.push_back(g + b * cols_);
    }
    ex.synchronize();
    const std::vector<index_t>& segment_bag = plan_.segment_bag;
    std::vector<const T*> rows(segment_bag.size());
    for (std::size_t s = 0; s < rows.size(); ++s) rows[s] = row_of_bag[static_cast<std::size_t>(segment_bag[s])];
    gradient_rows_.assign_from_host(rows.data(), rows.size());
    const detail::RowsAt<T> values(gradient_rows_.data());
    if (compress_ == Compression::none) {
      gradients_.plan(counts_.data(), values, segment_dest_.data(), rows.size(), cols_);
      gradient_lane_ = &gradients_;
    } else {
      gradient_lane_ = &half_gradients_.plan(compress_, counts_.data(), values, segment_dest_.data(), rows.size(), cols_);
    }
  }
  RouteLane& gradient_lane() noexcept { return *gradient_lane_; }

  /// The owner's half: each segment's gradient row given to the segment's
  /// ids (times their weights), as rows of its shard for the step's push.
  void expand(TableGroup<T, Engine, S>& tables) {
    auto& ex = engine_->exec();
    const bool half = compress_ != Compression::none;
    const std::size_t segments = half ? half_gradients_.received() : gradients_.received(), ids = owner_keys_.size();
    PARALLAX_EXPECTS(segments + 1 == owner_first_.size(), "BagPool: ", segments,
                     " gradient rows arrived for the forward's segments of ", owner_first_.size() - 1);
    if (!ids) return;
    auto [keys, values] = tables.add_owned_rows(ids);
    for_each(ex, segments,
             detail::ExpandBags<T>{half ? half_gradients_.received_values() : gradients_.received_values(),
                                   owner_first_.data(),
                                   weighted_ ? owner_weights_.data() : nullptr, false, owner_keys_.data(), keys,
                                   values, cols_},
             Cost{cols_ * 4});
    ex.synchronize();
  }

 private:
  /// plan()'s host arrays: per id sent its key, owner and weight; per
  /// segment its ids, owner and bag; per bag its first segment; and the
  /// scratch of one request (its ids, weights) and of one bag.
  struct Plan {
    std::vector<index_t> keys, counts, segment_bag, bag_first, ids, bag_keys;
    std::vector<std::int32_t> entry_dest, segment_dest, bag_owner;
    std::vector<T> weights, w;
    std::vector<std::size_t> per_owner, owners;  // per rank: ids of the bag there; the owners the bag names
    void clear() {
      for (auto* v : {&keys, &counts, &segment_bag, &bag_first}) v->clear();
      entry_dest.clear();
      segment_dest.clear();
      weights.clear();
    }
  };

  /// Appends bag [begin, end) of request q (bag `bag` of the batch) split
  /// by owner: a segment per owner it names, owners ascending, and its ids
  /// in bag order within each (a counting sort over the owners it names:
  /// no comparison sort, nothing allocated once the arrays have grown).
  void split_bag(TableGroup<T, Engine, S>& tables, const Request& q, std::size_t begin, std::size_t end,
                 std::size_t span, index_t bag) {
    Plan& h = plan_;
    const std::size_t m = end - begin;
    h.bag_keys.resize(m);
    h.bag_owner.resize(m);
    h.owners.clear();
    for (std::size_t j = 0; j < m; ++j) {
      const index_t key = tables.key_of(q.table, h.ids[begin + j]);
      const auto o = static_cast<std::size_t>(key) / span;
      h.bag_keys[j] = key;
      h.bag_owner[j] = static_cast<std::int32_t>(o);
      if (h.per_owner[o]++ == 0) h.owners.push_back(o);
    }
    std::sort(h.owners.begin(), h.owners.end());  // at most min(ids, ranks) of them
    // per_owner[o] becomes where owner o's ids start among the bag's.
    const std::size_t first = h.keys.size();
    std::size_t at = first;
    for (std::size_t o : h.owners) {
      h.counts.push_back(static_cast<index_t>(h.per_owner[o]));
      h.segment_dest.push_back(static_cast<std::int32_t>(o));
      h.segment_bag.push_back(bag);
      const std::size_t c = h.per_owner[o];
      h.per_owner[o] = at;
      at += c;
    }
    h.keys.resize(at);
    h.entry_dest.resize(at);
    if (weighted_) h.weights.resize(at);
    for (std::size_t j = 0; j < m; ++j) {
      const auto o = static_cast<std::size_t>(h.bag_owner[j]);
      const std::size_t k = h.per_owner[o]++;
      h.keys[k] = h.bag_keys[j];
      h.entry_dest[k] = h.bag_owner[j];
      if (weighted_) h.weights[k] = q.weights ? h.w[begin + j] : T(1);
    }
    for (std::size_t o : h.owners) h.per_owner[o] = 0;
  }

  Engine* engine_;
  Plan plan_;
  std::size_t cols_ = 0;
  bool weighted_ = false;  // some request weighted: every id travels with a weight (1 where none)
  Compression compress_ = Compression::none;  // the group's: replies and gradient rows in 16 bits
  std::vector<Request> requests_;
  std::vector<std::size_t> bag_first_of_;  // per request: its first bag among the batch's
  // The asker's: ids as keys, their owners and weights; per segment its ids
  // and owner; per bag its first segment (bags + 1); each request's offsets.
  Buffer<index_t, space> keys_, counts_, bag_first_, reply_at_;
  Buffer<std::int32_t, space> entry_dest_, segment_dest_;
  Buffer<T, space> weights_;
  std::vector<Buffer<index_t, space>> offsets_;
  std::vector<Buffer<T, space>> scaled_;
  Buffer<const T*, space> gradient_rows_;
  const T* replies_ = nullptr;
  // The owner's: what the forward brought (keys, weights, where each
  // segment starts) and the partial sums it replied.
  Buffer<index_t, space> owner_keys_, owner_at_, owner_first_;
  Buffer<T, space> owner_weights_, served_;
  RowExchange<T, Engine> entries_, segments_, gradients_;
  // Compressed: the reply and the gradient rows on a 16-bit wire.
  HalfReply<T, Engine> half_reply_;
  HalfLane<T, Engine> half_gradients_;
  RouteLane* gradient_lane_ = &gradients_;
};

}  // namespace parallax::policy::sharded
