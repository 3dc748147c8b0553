#pragma once
// RowExchange: sends rows (id + values) to ranks chosen per row, and replies
// back. ShardedPS's pull and push are built from it.
//
// A route sends each rank pair a header (the call's shape word, the bytes
// of the rest of the message or a problem flag, a row count per lane, and
// a bad id when the sender has one) and the rows packed per destination,
// each lane's as [ids][values]: one engine call where the engine has
// alltoallv_unsized (the header leads each message, engine::Mpi), else an
// alltoall of the headers' first two words and an alltoallv of the rest.
// Every rank reads every other rank's shape word, so ranks whose calls
// carry different things (a lookup of other variables, tables grouped
// otherwise) all see it and throw the same error naming them, and a bad
// input on any rank is known to every rank from the headers; either way
// no rows are taken.
//
// A route may carry several lanes at once (route_lanes): each RowExchange
// is a lane that plans its rows, packs them into the blocks the route lays
// out and unpacks what it got. ShardedPS routes every table group's
// gradient rows of a step together: one route a step, whatever the number
// of groups. A lane's count word in the header is -(1 + t) when the
// sender's problem concerns table t of that lane (its groups name tables).

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/alltoallv_any.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/binary_search.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

namespace parallax::policy::sharded {

inline constexpr index_t no_problem = std::numeric_limits<index_t>::min();

/// A bad row id reported by some rank during an exchange, the lane (of a
/// route carrying several) it was meant for, and which of the lane's tables.
struct RemoteProblem {
  int rank;
  index_t id;
  std::size_t lane = 0;
  std::size_t table = 0;
};

template <class T>
struct PackIds {
  const index_t* ids;
  const index_t* order;    // row sent j-th is input row order[j]
  const std::int32_t* dest;  // sorted destinations
  const index_t* meta;     // [first row per dest (N+1)][byte offset per dest (N)]
  int ranks;
  std::byte* out;
  bool narrow = false;  // as 32-bit offsets from dest x span (RowExchange::narrow_ids)
  std::size_t span = 0;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const int p = dest[j];
    const index_t t = static_cast<index_t>(j) - meta[p];
    std::byte* block = out + meta[ranks + 1 + p];
    if (narrow)
      detail::RowBlock<T>::narrow_ids(block)[t] =
          static_cast<std::uint32_t>(ids[order[j]] - static_cast<index_t>(static_cast<std::size_t>(p) * span));
    else
      detail::RowBlock<T>::ids(block)[t] = ids[order[j]];
  }
};

template <class T>
struct PackValues {
  detail::RowsAt<T> values;
  const index_t* order;
  const std::int32_t* dest;
  const index_t* meta;
  int ranks;
  std::size_t cols;
  std::byte* out;
  std::size_t id_bytes = sizeof(index_t);
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    const int p = dest[j];
    const index_t t = static_cast<index_t>(j) - meta[p];
    const auto count = static_cast<std::size_t>(meta[p + 1] - meta[p]);
    T* block = detail::RowBlock<T>::values(out + meta[ranks + 1 + p], count, id_bytes);
    block[static_cast<std::size_t>(t) * cols + c] = values.row(static_cast<std::size_t>(order[j]), cols)[c];
  }
  void prefetch(std::size_t j) const { prefetch_bytes(values.row(static_cast<std::size_t>(order[j]), cols), cols * sizeof(T)); }
};

/// One table's part of a route (type-erased, so tables of different element
/// types share one route). RowExchange implements it.
class RouteLane {
 public:
  virtual ~RouteLane() = default;
  /// Rows this rank sends to rank p (after the lane's plan()).
  virtual std::size_t rows_to(int p) const = 0;
  /// Bytes k of this lane's rows take in a message (a RowBlock).
  virtual std::size_t bytes_of(std::size_t k) const = 0;
  /// Writes the rows for every rank p at send + offsets[p] (bytes); may run
  /// asynchronously on the lane's stream.
  virtual void pack(std::byte* send, const std::vector<std::size_t>& offsets) = 0;
  /// Takes rows[p] rows from every rank p at recv + offsets[p].
  virtual void unpack(const std::byte* recv, const std::vector<std::size_t>& offsets,
                      const std::vector<std::size_t>& rows) = 0;
};

/// What a route carries, as its ranks compare it: a shape word that every
/// rank computes alike from the call (its kind and lanes: for a lookup the
/// variables, in order; for a push the table groups and their layouts), and
/// the words that name a disagreement (detail::throw_different_calls).
struct CallShape {
  std::uint64_t word = 0;
  const char* what = "routes of rows";  ///< "ranks make different <what>"
  const char* rule = "Every rank must make the same call.";
  /// A rank's report of a problem is heard before the shapes are compared:
  /// if any rank reports one, route_lanes() returns at once (the lowest such
  /// rank, its id and lanes unread), whatever the shapes. For a caller
  /// whose problem is a sentence it then agrees on (detail::agree), so its
  /// check costs no call of its own; a rank with a problem may then route
  /// no lanes at all.
  bool problems_first = false;
};

/// Words at the front of every route message: the shape word, then the
/// bytes of the rest of the message, or -1 when the sender reports a bad
/// id (then the id follows the lane counts).
inline constexpr std::size_t route_prefix = 2;
inline constexpr std::int64_t reports_problem = -1;

/// A route's messages and bookkeeping, kept across steps.
template <class Space>
struct RouteBuffers {
  std::vector<std::int64_t> send_header, recv_header;  // per rank: prefix, a count per lane[, bad id]
  std::vector<std::uint64_t> shapes;                   // per rank: its shape word
  std::vector<std::size_t> send_bytes, send_displs, recv_bytes, recv_displs;
  std::vector<std::vector<std::size_t>> send_at, recv_at, recv_rows;  // per lane, per rank
  Buffer<std::byte, Space> send, recv;
};

/// Routes the planned rows of `count` lanes. Collective; every rank passes
/// the same `shape` word (what the call carries): if ranks differ, none
/// takes any rows and every rank throws the same parallax::error naming
/// the ranks and what each carried (`describe(detailed)` names this rank's
/// call; see detail::throw_different_calls). `bad_id` is this rank's
/// problem to share (no_problem if none), found in table `bad_table` of lane
/// `bad_lane`: if any rank has one, no rows are taken and every rank gets the
/// lowest such rank's report.
///
/// Each rank pair's message starts with a header: the shape word, the bytes
/// of the rest of the message (or reports_problem), the rows of each lane
/// (with a problem: -(1 + table) for the lane it concerns, 0 for the
/// others), and the bad id when there is one. On an engine with
/// alltoallv_unsized (engine::Mpi) the header travels in front of the rows
/// and the route is one engine call; elsewhere the first two words go in an
/// alltoall (a fixed width, so ranks that disagree still read each other's
/// shape) and the rest with the rows in an alltoallv. The bytes are the same
/// either way: 8 (lanes + 2) per rank pair, and the rows.
template <class Engine, class Describe>
std::optional<RemoteProblem> route_lanes(Engine& engine, RouteLane* const* lanes, std::size_t count,
                                         RouteBuffers<engine::space_of_t<Engine>>& b, const CallShape& shape,
                                         Describe&& describe, index_t bad_id = no_problem, std::size_t bad_lane = 0,
                                         std::size_t bad_table = 0) {
  using space = engine::space_of_t<Engine>;
  constexpr bool unsized = engine::supports_v<Engine, engine::op_alltoallv_unsized>;
  const int n = engine.size();
  const auto un = static_cast<std::size_t>(n);
  constexpr std::size_t word = sizeof(std::int64_t);
  const bool reporting = bad_id != no_problem;
  // Header words per rank pair, and those of them that travel with the rows
  // (all on an unsized route; after the prefix otherwise).
  const std::size_t width = route_prefix + count + 1;  // room for a bad id
  auto head_words = [&](bool with_problem) { return route_prefix + count + (with_problem ? 1 : 0); };
  const std::size_t skip = unsized ? 0 : route_prefix;  // header words not in the rows message

  // Header: (shape, rest, rows for you of each lane[, my bad id]) to every
  // rank. With a problem no rows move, so the counts say which lane and
  // table it concerns instead: -(1 + table) for that lane, 0 for the others.
  b.send_header.assign(width * un, 0);
  b.recv_header.assign(width * un, 0);
  for (std::size_t p = 0; p < un; ++p) {
    std::int64_t* h = b.send_header.data() + width * p;
    h[0] = static_cast<std::int64_t>(shape.word);
    for (std::size_t l = 0; l < count; ++l)
      h[route_prefix + l] = reporting ? (l == bad_lane ? -1 - static_cast<std::int64_t>(bad_table) : 0)
                                      : static_cast<std::int64_t>(lanes[l]->rows_to(static_cast<int>(p)));
    if (reporting) h[route_prefix + count] = bad_id;
  }

  // Layout: the message for rank p holds its header (from word `skip` on)
  // and each lane's rows in turn; rows[p][l] gives the counts.
  b.send_bytes.assign(un, 0);
  b.send_displs.resize(un);
  b.recv_bytes.assign(un, 0);
  b.recv_displs.resize(un);
  b.send_at.resize(count);
  b.recv_at.resize(count);
  b.recv_rows.resize(count);
  for (std::size_t l = 0; l < count; ++l) {
    b.send_at[l].resize(un);
    b.recv_at[l].resize(un);
    b.recv_rows[l].resize(un);
  }
  auto lay_out = [&](const std::vector<std::int64_t>& header, std::vector<std::vector<std::size_t>>& at,
                     std::vector<std::size_t>& displs, std::vector<std::size_t>& bytes, bool sizes_known) {
    std::size_t t = 0;
    for (std::size_t p = 0; p < un; ++p) {
      const std::int64_t* h = header.data() + width * p;
      if (sizes_known) displs[p] = t;
      else t = displs[p];
      t += (head_words(h[1] == reports_problem) - skip) * word;
      for (std::size_t l = 0; l < count; ++l) {
        at[l][p] = t;
        t += lanes[l]->bytes_of(static_cast<std::size_t>(std::max<std::int64_t>(h[route_prefix + l], 0)));
      }
      if (sizes_known) bytes[p] = t - displs[p];
    }
    return t;
  };
  for (std::size_t p = 0; p < un; ++p) b.send_header[width * p + 1] = reporting ? reports_problem : 0;
  const std::size_t st = lay_out(b.send_header, b.send_at, b.send_displs, b.send_bytes, true);
  if (!reporting)
    for (std::size_t p = 0; p < un; ++p)
      b.send_header[width * p + 1] = static_cast<std::int64_t>(b.send_bytes[p] + skip * word) -
                                     static_cast<std::int64_t>(route_prefix * word);
  b.send.resize_discard(st);
  if (!reporting)
    for (std::size_t l = 0; l < count; ++l) lanes[l]->pack(b.send.data(), b.send_at[l]);
  for (std::size_t p = 0; p < un; ++p)
    space_traits<space>::copy_from_host(b.send.data() + b.send_displs[p], b.send_header.data() + width * p + skip,
                                        (head_words(reporting) - skip) * word);
  auto& ex = engine.exec();
  ex.synchronize();

  // Every rank's shape and rest; ranks that disagree take nothing.
  b.shapes.resize(un);
  auto first_report = [&]() -> std::optional<RemoteProblem> {
    if (shape.problems_first)
      for (std::size_t p = 0; p < un; ++p)
        if (b.recv_header[width * p + 1] == reports_problem) return RemoteProblem{static_cast<int>(p), bad_id};
    return std::nullopt;
  };
  auto check_shapes = [&] {
    bool agree = true;
    for (std::size_t p = 0; p < un; ++p) {
      b.shapes[p] = static_cast<std::uint64_t>(b.recv_header[width * p]);
      agree = agree && b.shapes[p] == shape.word;
    }
    if (!agree) detail::throw_different_calls(engine, b.shapes, shape.what, shape.rule, describe);
  };
  // The prefixes go ahead (at a width every rank shares) where the engine
  // cannot send unsized messages; a report or other shapes then stop the
  // route before the rest moves.
  std::vector<std::int64_t> prefix, got;
  if constexpr (!unsized) {
    prefix.resize(route_prefix * un);
    got.resize(route_prefix * un);
    for (std::size_t p = 0; p < un; ++p)
      std::copy_n(b.send_header.data() + width * p, route_prefix, prefix.data() + route_prefix * p);
  }
  std::optional<RemoteProblem> report;
  const bool moved = engine::alltoallv_any(
      engine, b.send.data(), b.send_bytes.data(), b.send_displs.data(), b.recv_bytes.data(), b.recv_displs.data(),
      [&](std::size_t total) {
        b.recv.resize_discard(total);
        return b.recv.data();
      },
      route_prefix, prefix.data(), got.data(), [&](const std::int64_t* words, std::size_t* rbytes) {
        for (std::size_t p = 0; p < un; ++p)
          std::copy_n(words + route_prefix * p, route_prefix, b.recv_header.data() + width * p);
        if ((report = first_report())) return false;
        check_shapes();
        for (std::size_t p = 0; p < un; ++p) {
          const std::int64_t rest = b.recv_header[width * p + 1];
          rbytes[p] = rest == reports_problem ? (count + 1) * word : static_cast<std::size_t>(rest);
        }
        return true;
      });
  if (!moved) return report;
  if constexpr (unsized) {
    for (std::size_t p = 0; p < un; ++p)
      space_traits<space>::copy_to_host(b.recv_header.data() + width * p, b.recv.data() + b.recv_displs[p],
                                        std::min(b.recv_bytes[p], route_prefix * word));
    if (auto first = first_report()) return first;
    check_shapes();
  }
  for (std::size_t p = 0; p < un; ++p) {
    const std::size_t words = head_words(b.recv_header[width * p + 1] == reports_problem) - route_prefix;
    space_traits<space>::copy_to_host(b.recv_header.data() + width * p + route_prefix,
                                      b.recv.data() + b.recv_displs[p] + (route_prefix - skip) * word, words * word);
  }
  // The first problem, lowest rank first.
  for (std::size_t p = 0; p < un; ++p) {
    const std::int64_t* h = b.recv_header.data() + width * p;
    if (h[1] != reports_problem) continue;
    std::size_t lane = 0;
    while (lane + 1 < count && h[route_prefix + lane] >= 0) ++lane;
    const std::size_t table = count && h[route_prefix + lane] < 0 ? static_cast<std::size_t>(-h[route_prefix + lane] - 1) : 0;
    return RemoteProblem{static_cast<int>(p), h[route_prefix + count], lane, table};
  }
  lay_out(b.recv_header, b.recv_at, b.recv_displs, b.recv_bytes, false);
  for (std::size_t l = 0; l < count; ++l) {
    for (std::size_t p = 0; p < un; ++p)
      b.recv_rows[l][p] = static_cast<std::size_t>(b.recv_header[width * p + route_prefix + l]);
    lanes[l]->unpack(b.recv.data(), b.recv_at[l], b.recv_rows[l]);
  }
  ex.synchronize();
  return std::nullopt;
}

template <class T, class Engine>
class RowExchange final : public RouteLane {
 public:
  using space = engine::space_of_t<Engine>;
  using value_type = T;

  explicit RowExchange(Engine& engine) : engine_(&engine) {}

  /// Ids on the wire from now on as 32-bit offsets from their
  /// destination's first id, dest x span (4 bytes instead of 8): for ids
  /// that lie in [dest x span, dest x span + 2^32), as a group's keys lie at
  /// their owner when its shards have fewer than 2^32 rows (span: the
  /// group's), or counts (span 0). The receiver adds its own rank x span
  /// back. Every rank's exchange must narrow alike (their shape words say).
  void narrow_ids(std::size_t span) {
    PARALLAX_EXPECTS(sizeof(T) <= sizeof(std::uint32_t), "RowExchange: narrowed ids need row values of at most 4 bytes");
    narrow_ = true;
    omit_ = false;
    span_ = span;
  }
  /// Ids at their full 8 bytes again (the default).
  void wide_ids() noexcept { narrow_ = omit_ = false; }
  /// No ids on the wire from now on, the rows' values alone: for a receiver
  /// that knows each row from the order they come in (BagPool's gradient
  /// rows, in the order of the segments its forward route brought).
  /// received_ids() then holds no values. Every rank's exchange must omit
  /// alike (their shape words say).
  void omit_ids() noexcept { omit_ = true; }
  std::size_t id_bytes() const noexcept {
    return omit_ ? 0 : narrow_ ? sizeof(std::uint32_t) : sizeof(index_t);
  }

  /// Sends row i (ids[i] and, if cols > 0, values.row(i)) to rank dest[i]. Collective. `bad_id` is this rank's problem to share
  /// (no_problem if none); if any rank has one, no rows move and every rank
  /// gets the lowest such rank's report.
  std::optional<RemoteProblem> route(const index_t* ids, detail::RowsAt<T> values, const std::int32_t* dest, std::size_t k,
                                     std::size_t cols, index_t bad_id = no_problem) {
    const CallShape shape{detail::Fingerprint().add("rows").add(static_cast<std::uint64_t>(data_type_of_v<T>)).add(cols).value()};
    return route(ids, values, dest, k, cols, shape,
                 [&](bool) { return detail::concat("rows of ", cols, " x ", to_string(data_type_of_v<T>)); }, bad_id);
  }
  /// route() of a call with its own shape (see route_lanes()).
  template <class Describe>
  std::optional<RemoteProblem> route(const index_t* ids, detail::RowsAt<T> values, const std::int32_t* dest, std::size_t k,
                                     std::size_t cols, const CallShape& shape, Describe&& describe,
                                     index_t bad_id = no_problem) {
    plan(ids, values, dest, bad_id != no_problem ? 0 : k, cols);
    RouteLane* self = this;
    return route_lanes(*engine_, &self, 1, buffers_, shape, describe, bad_id);
  }

  /// The local half of route(): groups the rows by destination, to be sent
  /// by route_lanes() with this exchange as one of its lanes. The inputs
  /// must stay valid until then.
  void plan(const index_t* ids, detail::RowsAt<T> values, const std::int32_t* dest, std::size_t k, std::size_t cols) {
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    auto& ex = engine_->exec();
    ids_ = ids;
    values_ = values;
    k_ = k;
    cols_ = cols;

    // Group rows by destination, keeping their order within a destination.
    // On the host a counting sort (the destinations are the ranks); on a
    // device rows already grouped (ascending ids over contiguous partitions)
    // skip the sort and keep their input order, others are sorted.
    keys_.resize_discard(k);
    order_.resize_discard(k);
    meta_.resize_discard(2 * un + 1);
    if constexpr (std::is_same_v<space, HostSpace>) {
      index_t* order = order_.data();
      std::int32_t* keys = keys_.data();
      detail::group_stably(k, un, [&](std::size_t i) { return dest[i]; }, meta_.data(), [&](std::size_t i, index_t at) {
        order[at] = static_cast<index_t>(i);
        keys[at] = dest[i];
      });
    } else {
      with_thrust(ex, k, [&](auto policy) {
        if (k) {
          ex.copy(keys_.data(), dest, k * sizeof(std::int32_t));
          thrust::sequence(policy, order_.data(), order_.data() + k);
          if (!thrust::is_sorted(policy, keys_.data(), keys_.data() + k))
            thrust::stable_sort_by_key(policy, keys_.data(), keys_.data() + k, order_.data());
        }
        thrust::lower_bound(policy, keys_.data(), keys_.data() + k, thrust::counting_iterator<std::int32_t>(0),
                            thrust::counting_iterator<std::int32_t>(n + 1), meta_.data());
      });
    }
    host_meta_.resize(2 * un + 1);
    space_traits<space>::copy_to_host(host_meta_.data(), meta_.data(), (un + 1) * sizeof(index_t));
  }

  // RouteLane
  std::size_t rows_to(int p) const override {
    return static_cast<std::size_t>(host_meta_[static_cast<std::size_t>(p) + 1] - host_meta_[static_cast<std::size_t>(p)]);
  }
  std::size_t bytes_of(std::size_t k) const override { return detail::RowBlock<T>::bytes(k, cols_, id_bytes()); }
  void pack(std::byte* send, const std::vector<std::size_t>& offsets) override {
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    auto& ex = engine_->exec();
    for (std::size_t p = 0; p < un; ++p) host_meta_[un + 1 + p] = static_cast<index_t>(offsets[p]);
    space_traits<space>::copy_from_host(meta_.data() + un + 1, host_meta_.data() + un + 1, un * sizeof(index_t));
    if (k_) {
      if (!omit_) for_each(ex, k_, PackIds<T>{ids_, order_.data(), keys_.data(), meta_.data(), n, send, narrow_, span_});
      for_each_rows(ex, k_, cols_,
                    PackValues<T>{values_, order_.data(), keys_.data(), meta_.data(), n, cols_, send, id_bytes()});
    }
  }
  void unpack(const std::byte* recv, const std::vector<std::size_t>& offsets,
              const std::vector<std::size_t>& rows) override {
    const auto un = static_cast<std::size_t>(engine_->size());
    recv_rows_ = rows;
    recv_first_.resize(un + 1);
    std::size_t rows_in = 0;
    for (std::size_t p = 0; p < un; ++p) {
      recv_first_[p] = rows_in;
      rows_in += rows[p];
    }
    recv_first_[un] = rows_in;
    received_.unpack(engine_->exec(), recv, offsets.data(), rows.data(), un, cols_, id_bytes(),
                     static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * (narrow_ ? span_ : 0)));
  }

  /// Rows received by the last route(), concatenated by source rank: their
  /// ids, and their values where they lie (valid until the next route on the
  /// same buffers; see ReceivedRows).
  std::size_t received() const noexcept { return received_.size(); }
  const index_t* received_ids() const noexcept { return received_.ids(); }
  detail::RowsAt<T> received_values() const noexcept { return received_.values(); }
  std::size_t received_from(int rank) const noexcept { return recv_rows_[static_cast<std::size_t>(rank)]; }
  /// The order the last plan() sends its rows in: the row sent j-th (rows
  /// grouped by destination, in input order within one) is input row
  /// sent_order()[j]. Replies come back in this order.
  const index_t* sent_order() const noexcept { return order_.data(); }

  /// Sends `cols` values per row received by the last route() back to its
  /// sender. Returns the replies in the order the rows were sent (grouped by
  /// destination, in input order within one): at `into` if given (room for
  /// every row this rank sent), else in a buffer valid until the next reply.
  const T* reply(const T* values, std::size_t cols, T* into = nullptr) {
    T* out = plan_reply(cols, into);
    engine_->alltoallv(values, reply_scounts_.data(), reply_sdispls_.data(), out, reply_rcounts_.data(),
                       reply_rdispls_.data(), data_type_of_v<T>);
    return out;
  }

  /// start_reply() of rows in another element type U (a 16-bit wire): they
  /// land in `landing` (bytes, resized), in the order the rows were sent.
  template <class U>
  const U* start_reply_in(const U* values, std::size_t cols, Buffer<std::byte, space>& landing) {
    const std::size_t total = plan_reply_counts(cols);
    landing.resize_discard(total * sizeof(U));
    U* out = reinterpret_cast<U*>(landing.data());
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>)
      engine_->start_alltoallv(values, reply_scounts_.data(), reply_sdispls_.data(), out, reply_rcounts_.data(),
                               reply_rdispls_.data(), data_type_of_v<U>);
    else
      engine_->alltoallv(values, reply_scounts_.data(), reply_sdispls_.data(), out, reply_rcounts_.data(),
                         reply_rdispls_.data(), data_type_of_v<U>);
    return out;
  }

  /// reply() left in flight where the engine can (start_alltoallv): the
  /// replies are there after the engine's wait_started(), and `values` must
  /// stay untouched until then. Elsewhere it is reply() itself.
  const T* start_reply(const T* values, std::size_t cols, T* into = nullptr) {
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) {
      T* out = plan_reply(cols, into);
      engine_->start_alltoallv(values, reply_scounts_.data(), reply_sdispls_.data(), out, reply_rcounts_.data(),
                               reply_rdispls_.data(), data_type_of_v<T>);
      return out;
    } else {
      return reply(values, cols, into);
    }
  }

 private:
  /// The counts and displacements of a reply; returns where it lands.
  T* plan_reply(std::size_t cols, T* into) {
    const std::size_t rt = plan_reply_counts(cols);
    if (into) return into;
    replies_.resize_discard(rt);
    return replies_.data();
  }
  /// The counts and displacements of a reply; returns its elements.
  std::size_t plan_reply_counts(std::size_t cols) {
    const auto un = static_cast<std::size_t>(engine_->size());
    reply_scounts_.resize(un);
    reply_sdispls_.resize(un);
    reply_rcounts_.resize(un);
    reply_rdispls_.resize(un);
    std::size_t rt = 0;
    for (std::size_t p = 0; p < un; ++p) {
      reply_scounts_[p] = recv_rows_[p] * cols;
      reply_sdispls_[p] = recv_first_[p] * cols;
      reply_rcounts_[p] = static_cast<std::size_t>(host_meta_[p + 1] - host_meta_[p]) * cols;
      reply_rdispls_[p] = rt;
      rt += reply_rcounts_[p];
    }
    return rt;
  }

  Engine* engine_;
  const index_t* ids_ = nullptr;
  detail::RowsAt<T> values_;
  std::size_t k_ = 0, cols_ = 0;
  bool narrow_ = false;  // narrow_ids()
  bool omit_ = false;    // omit_ids()
  std::size_t span_ = 0;
  Buffer<std::int32_t, space> keys_;
  Buffer<index_t, space> order_;
  Buffer<index_t, space> meta_;
  std::vector<index_t> host_meta_;
  std::vector<std::size_t> recv_rows_, recv_first_;
  std::vector<std::size_t> reply_scounts_, reply_sdispls_, reply_rcounts_, reply_rdispls_;
  RouteBuffers<space> buffers_;
  detail::ReceivedRows<T, space> received_;
  Buffer<T, space> replies_;
};

}  // namespace parallax::policy::sharded
