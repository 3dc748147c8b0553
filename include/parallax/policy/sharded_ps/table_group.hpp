#pragma once
/// @file
/// ShardedPS's sparse tables, stored and exchanged as groups: the tables of
/// one element type and width share one shard buffer per rank, one key
/// space and one lane of every route (the idea of TorchRec's table-batched
/// embeddings). A batch's lookups of a group's tables then take one route,
/// one serve and one reply; a step's pushes one route, one sum and one
/// optimizer update per group, whatever the number of tables. Each table
/// keeps its own partitioning: a row lives on the owner its table's
/// PartitionMap names, so bytes and placement are what the table would have
/// alone.
///
/// Layout: see table_layout.hpp (TableLayout, the group's storage, which
/// TableGroup extends with the exchange).

#include <parallax/comm_stats.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/half.hpp>
#include <parallax/options.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/sharded_ps/early_rows.hpp>
#include <parallax/policy/sharded_ps/group_routes.hpp>
#include <parallax/policy/sharded_ps/half_wire.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/policy/sharded_ps/table_layout.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/binary_search.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy::sharded {

/// Sparse tables of element type T and one width, sharded over the ranks of
/// an engine and exchanged together (see the file comment).
///
/// * lookup (pull): each request's ids become keys, de-duplicated per
///   request, and every unique key is asked of its owner; the rows come back
///   aligned to the caller's ids. Bytes per rank: 8 per remote unique id
///   out, cols*sizeof(T) per remote row back, plus the same for the rows this
///   rank serves. With shared shards (every rank on one machine), or one
///   rank, the rows are read from the owners' shards instead, after a route
///   of the headers alone: cols*sizeof(T) per remote id read (repeats too), booked as
///   received from its owner and sent by it.
/// * push: the tables' coalesced rows go to their owners; an owner sums the
///   contributions by row, then by rank, and gets (group shard row, sum)
///   pairs to apply its optimizer to. With local aggregation the rows first
///   go to an aggregator on the sender's host (the owner itself when it is
///   on the same host), which sums them, so each row crosses between hosts
///   once per host.
///
/// Errors in ids (outside a table's [0, rows)) are reported on every rank at
/// once, naming the table.
///
/// Rows are looked up, pushed and summed as T; the shards may store them as
/// S (bf16 or fp16 for T = float): an owner widens the rows it serves (or a
/// reader those it reads in place), and the optimizer rounds its updates.
template <class T, class Engine, class S = T>
class TableGroup : public TableLayout<T, Engine, S> {
 public:
  using space = engine::space_of_t<Engine>;

  /// One table's lookup in a batch: `n` ids (in space), rows to `out` (room
  /// for n x cols, in space). Both must stay valid until finish_lookup().
  struct Request {
    std::size_t table = 0;
    const index_t* ids = nullptr;
    std::size_t n = 0;
    T* out = nullptr;
  };
  /// One table's gradient in a push: `k` rows, ids strictly ascending (a
  /// coalesced SparseGrad), values contiguous, both in space.
  struct Push {
    std::size_t table = 0;
    const index_t* ids = nullptr;
    const T* values = nullptr;
    std::size_t k = 0;
  };

  /// @param aggregate sum per host before crossing hosts, where hosts exist
  /// @param shared    keep the shard in shared memory where every rank can
  ///                  read it (ShardedOptions::shared_memory)
  /// @param compress  float rows travel in 16 bits (bf16, fp16): pushed
  ///                  rows (not with local aggregation, whose hops stay in
  ///                  T) and lookup replies, rounded where they leave, and
  ///                  the ids with them as 32-bit offsets (narrows_ids())
  TableGroup(Engine& engine, std::size_t cols, bool aggregate = true, bool shared = true,
             Compression compress = Compression::none)
      : TableLayout<T, Engine, S>(engine, cols, shared), want_aggregate_(aggregate), plain_(engine, cols * sizeof(S)),
        ahead_(engine, cols * sizeof(S)), exchange_(engine), aggregate_exchange_(engine),
        compress_(std::is_same_v<T, float> ? compress : Compression::none), half_push_(engine) {}
  TableGroup(const TableGroup&) = delete;
  TableGroup& operator=(const TableGroup&) = delete;

  /// Lays the tables out and allocates this rank's group shard (in a shared
  /// window when every rank is on one machine). Collective.
  void build() {
    this->lay_out();
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    const Topology& topo = engine_->topology();
    // Aggregation pays off only with several hosts of which some have several ranks.
    aggregate_ = want_aggregate_ && topo.num_hosts() > 1 && topo.num_hosts() < topo.size();
    if (aggregate_) {
      const auto mates = topo.ranks_of_host(topo.host());
      std::vector<std::int32_t> route(un);
      for (int o = 0; o < n; ++o)
        route[static_cast<std::size_t>(o)] = topo.same_host(o) ? o : mates[static_cast<std::size_t>(o) % mates.size()];
      first_hop_ = Buffer<std::int32_t, space>::from_host(route);
    }
    // Compressed exchanges send each key as its offset in its owner's group
    // shard: 32 bits hold it while a shard has fewer than 2^32 rows.
    narrow_ids_ = compress_ != Compression::none && span_ <= (std::size_t{1} << 32);
    for (Pull* p : {&plain_, &ahead_})
      if (narrow_ids_) p->exchange_.narrow_ids(span_);
    half_push_.narrow_ids(narrow_ids_, span_);
    detail::Fingerprint id;
    id.add(static_cast<std::uint64_t>(data_type_of_v<T>)).add(static_cast<std::uint64_t>(data_type_of_v<S>)).add(cols_).add(this->reads_directly() ? 1 : 0);
    id.add(aggregate_ ? 1 : 0).add(static_cast<std::uint64_t>(compress_)).add(serves_early() ? 1 : 0);
    for (const Table& t : tables_) id.add(t.name).add(t.map.rows).add(static_cast<std::uint64_t>(t.map.parts));
    identity_ = id.value();
  }

  bool aggregates() const noexcept { return aggregate_; }
  /// TrainerOptions::compress, for float rows (none for other T).
  Compression compression() const noexcept { return compress_; }
  /// Whether compressed exchanges send keys as 32-bit offsets from their
  /// owner's first key (RowExchange::narrow_ids with span()). Set by build().
  bool narrows_ids() const noexcept { return narrow_ids_; }
  /// What every rank's group must share for the routes it takes part in to
  /// match (the word their shapes are made of): the element type, the
  /// width, how lookups read, and each table's name, rows and partitions.
  /// Set by build().
  std::uint64_t identity() const noexcept { return identity_; }

  // ---------------------------------------------------------------- lookup
  //
  // plan_lookup() (local), then route_lanes() over the returned lane
  // and any others, passing the problem() and problem_table() of the first
  // Pull that has one (fail() when the route reports a problem), then
  // place() of any request planned without an output, start_reply() (serves
  // and starts the reply, one collective), the engine's wait_started() where
  // it has one, and finish_lookup(). The route reads no row, so it may run
  // long before start_reply() (Trainer::prefetch), with other routes in
  // between; start_reply() reads the shards as they are then.

  /// One lookup's state from plan_lookup() to finish_lookup(): its
  /// requests, keys, lane and reply. A group keeps two, so that a lookup
  /// ahead (Trainer::prefetch) whose ids were routed survives plain lookups
  /// and pushes until its rows are taken: plain_pull() and ahead_pull().
  class Pull {
   public:
    Pull(Engine& engine, std::size_t row_bytes)
        : reads_(engine.stats(), engine.topology(), row_bytes), exchange_(engine), early_(engine) {}
    Pull(const Pull&) = delete;
    Pull& operator=(const Pull&) = delete;
    /// The id outside its table's [0, rows) that the last plan_lookup()
    /// found on this rank (no_problem if none), and the table.
    index_t problem() const noexcept { return problem_; }
    std::size_t problem_table() const noexcept { return problem_table_; }
    /// True when the last plan_lookup() was one request whose keys were
    /// strictly ascending, so its rows land in place (no sort, no reordering).
    bool in_order() const noexcept { return single_in_order_; }

   private:
    friend class TableGroup;
    // Its requests, where each one's ids start among all (first_) and its
    // unique keys among all unique keys (unique_first_).
    std::vector<Request> requests_;
    std::vector<std::size_t> first_, unique_first_;
    std::vector<bool> in_order_;
    bool single_in_order_ = false;
    index_t problem_ = no_problem;
    std::size_t problem_table_ = 0;
    std::vector<index_t> group_first_;  // group_ascending_ids(): where each owner's keys start
    Buffer<index_t, space> keys_, unique_, inverse_, where_;
    Buffer<std::int32_t, space> dest_;
    Buffer<T, space> served_;
    const T* by_unique_ = nullptr;      // where the last start_reply()'s rows land
    // A compressed reply (TrainerOptions::compress): the rows served in 16 bits.
    bool narrowed_ = false;
    HalfReply<T, Engine> half_reply_;
    Buffer<const S*, space> reads_at_;  // where each looked-up row lies, when read directly
    SharedReads reads_;         // the lane, when read directly
    RowExchange<T, Engine> exchange_;  // the lane otherwise
    EarlyRows<T, Engine, S> early_;    // its reply in two parts (plan_early())
  };
  Pull& plain_pull() noexcept { return plain_; }
  Pull& ahead_pull() noexcept { return ahead_; }

  /// Plans a batch's lookups of this group's tables: validates every id,
  /// makes the keys, and de-duplicates them per request. Local. The ids are
  /// read here and not after.
  RouteLane& plan_lookup(const Request* requests, std::size_t count) {
    return plan_lookup(requests, count, plain_);
  }
  RouteLane& plan_lookup(const Request* requests, std::size_t count, Pull& p) {
    auto& ex = engine_->exec();
    p.requests_.assign(requests, requests + count);
    p.problem_ = no_problem;
    p.problem_table_ = 0;
    p.first_.resize(count + 1);
    p.first_[0] = 0;
    for (std::size_t r = 0; r < count; ++r) p.first_[r + 1] = p.first_[r] + p.requests_[r].n;
    for (const Request& q : p.requests_)
      if (auto at = detail::find_out_of_range(ex, q.ids, q.n, tables_[q.table].map.rows)) {
        p.problem_ = detail::read_one<index_t, space>(q.ids + *at);
        p.problem_table_ = q.table;
        break;
      }
    if (this->reads_directly()) return plan_direct_reads(p);

    // Each request's keys are made unique on their own (keys of different
    // tables never meet): keys already strictly ascending are their own
    // unique set (ascending unique ids over one partition per rank); ids
    // strictly ascending over more partitions than ranks have keys that
    // ascend within each owner, so grouping them by owner sorts them (a
    // counting sort on the host); anything else is sorted.
    const std::size_t total = p.first_[count];
    p.keys_.resize_discard(total);
    p.unique_.resize_discard(total);
    p.inverse_.resize_discard(total);
    p.unique_first_.assign(count + 1, 0);
    p.in_order_.assign(count, false);
    std::size_t u = 0;
    if (p.problem_ == no_problem) {
      for (std::size_t r = 0; r < count; ++r) {
        const Request& q = p.requests_[r];
        index_t* keys = p.keys_.data() + p.first_[r];
        index_t* unique = p.unique_.data() + u;
        index_t* inverse = p.inverse_.data() + p.first_[r];
        p.unique_first_[r] = u;
        if (q.n == 0) continue;
        for_each(ex, q.n, GroupKeyOf{tables_[q.table].map, base_of(q.table), span_, q.ids, keys});
        if (detail::strictly_ascending(ex, keys, q.n)) {
          p.in_order_[r] = true;
          if (count > 1) ex.copy(unique, keys, q.n * sizeof(index_t));
          u += q.n;
        } else if (group_ascending_ids(q.ids, keys, q.n, unique, inverse, p.group_first_)) {
          u += q.n;
        } else {
          ex.copy(unique, keys, q.n * sizeof(index_t));
          const std::size_t n = q.n;
          std::size_t k = 0;
          with_thrust(ex, n, [&](auto policy) {
            thrust::sort(policy, unique, unique + n);
            k = static_cast<std::size_t>(thrust::unique(policy, unique, unique + n) - unique);
            thrust::lower_bound(policy, unique, unique + k, keys, keys + n, inverse);
          });
          u += k;
        }
      }
    }
    p.unique_first_[count] = u;
    // One request in order: its keys are the unique set, and the rows can
    // land straight in its output.
    p.single_in_order_ = count == 1 && p.in_order_[0];
    const index_t* unique = p.single_in_order_ ? p.keys_.data() : p.unique_.data();
    p.dest_.resize_discard(u);
    if (u) for_each(ex, u, OwnerOfKey{span_, unique, p.dest_.data()});
    ex.synchronize();
    p.exchange_.plan(unique, nullptr, p.dest_.data(), u, 0);
    return p.exchange_;
  }

  /// The problem() and problem_table() of the plain lookups' Pull.
  index_t lookup_problem() const noexcept { return plain_.problem_; }
  std::size_t problem_table() const noexcept { return plain_.problem_table_; }
  /// The in_order() of the plain lookups' Pull.
  bool lookup_in_order() const noexcept { return plain_.single_in_order_; }

  /// Where request r of `p` puts its rows (room for n x cols, in space),
  /// when plan_lookup() was given none: before start_reply().
  void place(Pull& p, std::size_t r, T* out) noexcept { p.requests_[r].out = out; }

  /// Serves the keys the route brought this rank and starts the reply (or,
  /// when reading directly, reads every row from its owner's shard): the
  /// rows as the shards hold them now. When reading directly from peers'
  /// shards, a collective since their last update must come between (the
  /// route does, for a plain lookup). Collective.
  void start_reply() { start_reply(plain_); }
  void start_reply(Pull& p) {
    auto& ex = engine_->exec();
    if (this->reads_directly()) {
      // The last collective came from every rank after its last update of
      // its shard: the rows are final. Read them where they lie.
      this->sync_shard();
      if (p.problem_ == no_problem)
        for (std::size_t r = 0; r < p.requests_.size(); ++r)
          if (p.requests_[r].n)
            for_each_rows(ex, p.requests_[r].n, cols_,
                          GatherAt<T, S>{p.reads_at_.data() + p.first_[r], p.requests_[r].out, cols_});
      ex.synchronize();
      return;
    }
    const std::size_t asked = p.exchange_.received();
    note_looked_up(p);
    p.served_.resize_discard(asked * cols_);
    const auto base = static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * span_);
    if (asked)
      for_each_rows(ex, asked, cols_,
                    GatherKeyedRows<T, S>{shard_.data(), p.exchange_.received_ids(), base, p.served_.data(), cols_});
    ex.synchronize();
    p.narrowed_ = compress_ != Compression::none;
    if (p.narrowed_) {
      p.half_reply_.start(compress_, p.exchange_, asked, cols_, [&](auto* served) {
        using W = std::remove_pointer_t<decltype(served)>;
        if (asked)
          for_each_rows(ex, asked, cols_,
                        GatherKeyedRows<W, S>{shard_.data(), p.exchange_.received_ids(), base, served, cols_});
        ex.synchronize();
      });
      return;
    }
    p.by_unique_ = p.exchange_.start_reply(p.served_.data(), cols_, p.single_in_order_ ? p.requests_[0].out : nullptr);
  }

  /// Puts every request's rows in its caller's order (after the engine's
  /// wait_started(), where it has one).
  void finish_lookup() { finish_lookup(plain_); }
  void finish_lookup(Pull& p) {
    if (this->reads_directly()) return;
    if (p.narrowed_)
      p.by_unique_ = p.half_reply_.finish(p.unique_first_[p.requests_.size()], cols_, engine_->exec(),
                                          p.single_in_order_ ? p.requests_[0].out : nullptr);
    if (p.single_in_order_) return;
    auto& ex = engine_->exec();
    const std::size_t count = p.requests_.size(), u = p.unique_first_[count];
    // One request: its unique keys were sorted, so they went out in their
    // own order. Several: the route grouped them by owner.
    const index_t* where = nullptr;
    if (count > 1 && u) {
      p.where_.resize_discard(u);
      for_each(ex, u, InvertOrder{p.exchange_.sent_order(), p.where_.data()});
      where = p.where_.data();
    }
    for (std::size_t r = 0; r < count; ++r) {
      const Request& q = p.requests_[r];
      if (q.n == 0) continue;
      for_each_rows(ex, q.n, cols_,
                    GatherReply<T>{p.by_unique_, where, p.in_order_[r] ? nullptr : p.inverse_.data() + p.first_[r],
                                           static_cast<index_t>(p.unique_first_[r]), q.out, cols_});
    }
    ex.synchronize();
  }

  /// Throws the error of a problem a route reported (`what`: "lookup id", ...).
  [[noreturn]] void fail(const RemoteProblem& p, const char* what) const {
    const Table& t = tables_[p.table < tables_.size() ? p.table : 0];
    throw error(detail::concat("variable '", t.name, "': ", what, " ", p.id, " is outside [0, ", t.map.rows,
                               ") on rank ", p.rank));
  }

  // ------------------------------------------------- a lookup ahead in two parts (early_rows.hpp)
  // Instead of start_reply(): plan_early(), a route, land(p, true); at rows() plan_late(), a route, land(p, false).
  void serve_early(bool on) noexcept { early_ = on; }  // ShardedOptions::early_rows, before build()
  /// Whether a lookup ahead's rows go in two parts: asked of owners, in host memory, not compressed.
  bool serves_early() const noexcept {
    return early_ && std::is_same_v<space, HostSpace> && compress_ == Compression::none && !this->reads_directly();
  }
  RouteLane& plan_early(Pull& p) { return p.early_.plan_early(p.exchange_, looked_up_.sorted(), shard_.data(), own_base(), cols_); }
  RouteLane& plan_late(Pull& p) { return p.early_.plan_late(p.exchange_, shard_.data(), own_base(), cols_); }
  /// Puts a part's rows in place; after the late one, p's rows are whole.
  void land(Pull& p, bool early) {
    p.early_.land(p.exchange_, cols_, early);
    if (early) return;
    note_looked_up(p);
    p.narrowed_ = false;
    p.by_unique_ = p.early_.landing(p.single_in_order_ ? p.requests_[0].out : nullptr);
  }
  void cancel_early(Pull& p) noexcept { p.early_.cancel(); }

  // ---------------------------------------------------------------- push
  //
  // plan_push() (collective only with local aggregation, whose first hop it
  // takes), then route_lanes() over the returned lane and any
  // others, then finish_push(). The inputs must stay valid until the route.

  RouteLane& plan_push(const Push* pushes, std::size_t count) {
    auto& ex = engine_->exec();
    std::size_t k = 0;
    for (std::size_t i = 0; i < count; ++i) k += pushes[i].k;
    push_keys_.resize_discard(k);
    dest_.resize_discard(k);
    at_.resize_discard(k);
    std::size_t first = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const Push& p = pushes[i];
      if (p.k)
        for_each(ex, p.k,
                 PushRowOf<T>{tables_[p.table].map, base_of(p.table), span_,
                                      aggregate_ ? first_hop_.data() : nullptr, p.ids, p.values, cols_,
                                      push_keys_.data() + first, dest_.data() + first, at_.data() + first});
      first += p.k;
    }
    ex.synchronize();
    const detail::RowsAt<T> rows(at_.data());
    narrowed_ = !aggregate_ && compress_ != Compression::none;
    if (narrowed_) return half_push_.plan(compress_, push_keys_.data(), rows, dest_.data(), k, cols_);
    if (!aggregate_) {
      exchange_.plan(push_keys_.data(), rows, dest_.data(), k, cols_);
      return exchange_;
    }
    // Hop 1, inside the host: to the owner, or to this host's aggregator
    // for it, which sums what its host sends; then on to the owners.
    aggregate_exchange_.route(push_keys_.data(), rows, dest_.data(), k, cols_,
                              push_shape(detail::Fingerprint().add("aggregate").add(identity_).value()),
                              [&](bool detailed) { return "groups " + this->describe(detailed); });
    const std::size_t hop_k =
        detail::coalesce_rows(ex, aggregate_exchange_.received_ids(), aggregate_exchange_.received_values(),
                              aggregate_exchange_.received(), cols_, hop_keys_, hop_values_, scratch_);
    dest_.resize_discard(hop_k);
    if (hop_k) for_each(ex, hop_k, OwnerOfKey{span_, hop_keys_.data(), dest_.data()});
    ex.synchronize();
    exchange_.plan(hop_keys_.data(), hop_values_.data(), dest_.data(), hop_k, cols_);
    return exchange_;
  }

  /// Room for k more gradient rows of rows this rank owns, summed by the
  /// next finish_push() after the rows the route brings: k keys (each of
  /// this rank's shard) and k x cols values, in space, for the caller to
  /// write (an owner expanding pooled gradients, BagPool). Valid until the
  /// next call; forgotten by finish_push() and clear_owned_rows().
  std::pair<index_t*, T*> add_owned_rows(std::size_t k) {
    const std::size_t at = extra_keys_.size();
    extra_keys_.resize(at + k);
    extra_values_.resize((at + k) * cols_);
    return {extra_keys_.data() + at, extra_values_.data() + at * cols_};
  }
  void clear_owned_rows() noexcept {
    extra_keys_.clear();
    extra_values_.clear();
  }

  /// Sums the rows the route brought this rank, by row and then by source
  /// rank, then those add_owned_rows() gave. Returns m and fills local_rows /
  /// sums with the m rows of this rank's group shard that received
  /// contributions (ascending) and their sums.
  std::size_t finish_push(Buffer<index_t, space>& local_rows, Buffer<T, space>& sums) {
    auto& ex = engine_->exec();
    std::size_t received = exchange_.received();
    const std::size_t extra = extra_keys_.size();
    const index_t* ids = exchange_.received_ids();
    detail::RowsAt<T> values = exchange_.received_values();
    if (narrowed_) {
      received = half_push_.received();
      ids = half_push_.received_ids();
      values = half_push_.received_values();
    }
    if (extra) {
      // Both as rows where they lie: the received rows first, then the others.
      merged_keys_.resize_discard(received + extra);
      merged_at_.resize_discard(received + extra);
      if (received) {
        ex.copy(merged_keys_.data(), ids, received * sizeof(index_t));
        for_each(ex, received, RowAddresses<T>{values, cols_, merged_at_.data()});
      }
      ex.copy(merged_keys_.data() + received, extra_keys_.data(), extra * sizeof(index_t));
      for_each(ex, extra, RowAddresses<T>{detail::RowsAt<T>(extra_values_.data()), cols_, merged_at_.data() + received});
      ex.synchronize();
      ids = merged_keys_.data();
      values = detail::RowsAt<T>(merged_at_.data());
    }
    const std::size_t m =
        detail::coalesce_rows(ex, ids, values, received + extra, cols_, owned_keys_, sums, scratch_);
    clear_owned_rows();
    if constexpr (std::is_same_v<space, HostSpace>) ahead_.early_.applied(owned_keys_.data(), m);
    looked_up_.clear();  // the keys served before this push: the update takes them
    local_rows.resize_discard(m);
    const auto base = static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * span_);
    if (m) for_each(ex, m, detail::Subtract{owned_keys_.data(), local_rows.data(), base});
    ex.synchronize();
    return m;
  }

 private:
  using Layout = TableLayout<T, Engine, S>;
  using Table = typename Layout::Table;
  using Layout::engine_;
  using Layout::cols_;
  using Layout::tables_;
  using Layout::span_;
  using Layout::host_base_;
  using Layout::window_;
  using Layout::shard_;
  using Layout::base_of;

  /// plan_lookup() when every row can be read where it lies: where each one
  /// lies, and how many rows of each owner this rank will read (the route's
  /// headers).
  RouteLane& plan_direct_reads(Pull& p) {
    // A bad id reads nothing: the route reports it on every rank.
    const std::size_t total = p.problem_ == no_problem ? p.first_.back() : 0;
    p.reads_at_.resize_discard(total);
    auto& counts = p.reads_.counts();
    counts.assign(static_cast<std::size_t>(engine_->size()), 0);
    p.single_in_order_ = false;
    if (!window_) {
      // One rank: every row is in its own shard.
      auto& ex = engine_->exec();
      for (std::size_t r = 0; r < p.requests_.size() && total; ++r) {
        const Request& q = p.requests_[r];
        if (q.n)
          for_each(ex, q.n, LocalRowAt<S>{tables_[q.table].map, base_of(q.table), shard_.data(), cols_, q.ids,
                                                  p.reads_at_.data() + p.first_[r]});
      }
      ex.synchronize();
      return p.reads_;
    }
    if constexpr (shares_host_memory<Engine>::value) {
      // Our last writes to our shard before the headers that tell peers
      // they may read it.
      window_.sync();
      const S* const* bases = window_.bases();
      const auto un = static_cast<std::size_t>(engine_->size());
      for (std::size_t r = 0; r < p.requests_.size() && total; ++r) {
        const Request& q = p.requests_[r];
        const PartitionMap& map = tables_[q.table].map;
        const index_t* base = host_base_.data() + q.table * un;
        const S** at = p.reads_at_.data() + p.first_[r];
        for (std::size_t j = 0; j < q.n; ++j) {
          const int o = map.owner(q.ids[j]);
          const auto uo = static_cast<std::size_t>(o);
          at[j] = bases[o] + (static_cast<std::size_t>(base[uo]) + map.local_row(q.ids[j])) * cols_;
          ++counts[uo];
        }
      }
    }
    return p.reads_;
  }

  /// Host memory, ids strictly ascending but owners interleaved (more
  /// partitions than ranks): the keys ascend within each owner (an owner's
  /// shard of a table is its partitions in increasing order), so grouping
  /// them by owner (a counting sort) sorts them, and they are unique
  /// already. Writes the sorted keys and each id's place among them as a
  /// sort would; false (nothing done) otherwise.
  bool group_ascending_ids(const index_t* ids, const index_t* keys, std::size_t n, index_t* unique, index_t* inverse,
                           std::vector<index_t>& group_first) {
    if constexpr (std::is_same_v<space, HostSpace>) {
      if (!detail::strictly_ascending(engine_->exec(), ids, n)) return false;
      const std::size_t span = span_;
      group_first.resize(static_cast<std::size_t>(engine_->size()) + 1);
      detail::group_stably(
          n, static_cast<std::size_t>(engine_->size()),
          [&](std::size_t i) { return static_cast<std::size_t>(keys[i]) / span; }, group_first.data(),
          [&](std::size_t i, index_t at) {
            unique[at] = keys[i];
            inverse[i] = at;
          });
      return true;
    } else {
      (void)ids, (void)keys, (void)n, (void)unique, (void)inverse, (void)group_first;
      return false;
    }
  }

  void note_looked_up(Pull& p) { if (serves_early()) looked_up_.note<space>(p.exchange_.received_ids(), p.exchange_.received()); }
  index_t own_base() const noexcept { return static_cast<index_t>(static_cast<std::size_t>(engine_->rank()) * span_); }

  bool want_aggregate_;
  bool aggregate_ = false;
  bool early_ = true;                 // serve_early()
  LookedUp looked_up_;                // keys served since the last push (serves_early())
  std::uint64_t identity_ = 0;          // see identity()
  Buffer<std::int32_t, space> first_hop_, dest_;

  Pull plain_, ahead_;  // plain lookups', and lookups ahead (see Pull)

  // The push.
  Buffer<index_t, space> push_keys_, hop_keys_, owned_keys_;
  Buffer<index_t, space> extra_keys_, merged_keys_;  // add_owned_rows(), and with the received rows
  Buffer<T, space> extra_values_;
  Buffer<const T*, space> merged_at_;
  Buffer<const T*, space> at_;
  Buffer<T, space> hop_values_;
  RowExchange<T, Engine> exchange_, aggregate_exchange_;  // the push's
  detail::CoalesceScratch<space> scratch_;
  // A compressed push (TrainerOptions::compress).
  Compression compress_;
  bool narrow_ids_ = false;  // narrows_ids()
  bool narrowed_ = false;    // the last plan_push() went out compressed
  HalfLane<T, Engine> half_push_;
};

}  // namespace parallax::policy::sharded
