#pragma once
/// @file
/// ShardedSynchronizer's batched lookups (declared in steps.hpp): a
/// batch's requests sorted into their groups (gather), every group's keys
/// in one route (route), the owners' replies put in each caller's order
/// (serve); lookup() runs the three at once, start_lookup() and
/// finish_lookup() split them around the step (Trainer::prefetch).

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/members.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/policy/sharded_ps/steps.hpp>
#include <parallax/policy/sharded_ps/table_group.hpp>
#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace parallax::policy {

// ---------------------------------------------------------------- batched lookups

template <class Engine, class Optimizer>
class ShardedSynchronizer<Engine, Optimizer>::BatchBase {
 public:
  virtual ~BatchBase() = default;
  virtual void cancel() noexcept {}  // forgets its groups' early parts
  /// Throws, at rows(), what a lookup ahead's route threw, or that it never ran.
  void check_routed() const {
    if (failure) std::rethrow_exception(failure);
    PARALLAX_EXPECTS(routed, "the prefetch's route never ran: the communication thread failed before it (see the "
                             "error the trainer threw then); prefetch the batch again");
  }
  std::exception_ptr failure;  // what a lookup ahead's route threw
  bool routed = false;         // a lookup ahead's route ran
};
/// A batched lookup of tables of storage type S, from gather() to serve().
template <class Engine, class Optimizer>
template <class S>
class ShardedSynchronizer<Engine, Optimizer>::Batch final : public BatchBase {
 public:
  using Request = typename sharded::TableGroup<compute_t<S>, Engine, S>::Request;
  using Pull = typename sharded::TableGroup<compute_t<S>, Engine, S>::Pull;

  bool ahead = false;  // a lookup ahead (start_lookup): its groups' ahead_pull(), the ahead route
  std::vector<Group<S>*> groups;  // in the order the batch first names them
  std::vector<std::vector<Request>> requests;  // per group
  std::vector<std::size_t> request_group, request_at;  // per request of the batch: its group, its place there
  std::vector<std::pair<const std::string*, std::uint64_t>> parts;  // per request: its table's name, share of the bytes
  std::vector<sharded::RouteLane*> lanes;
  std::uint64_t word = 0;  // the route's shape: each request's (group, table), in order
  Buffer<index_t, space> ids;  // a lookup ahead's copy of the ids
  bool early = false;          // its groups that serves_early() sent their early parts

  Pull& pull(Group<S>& g) noexcept { return ahead ? g.tables.ahead_pull() : g.tables.plain_pull(); }
  /// Whether group gi's rows go in two parts (those of a lookup ahead that went early).
  bool in_parts(std::size_t gi) const noexcept { return early && groups[gi]->tables.serves_early(); }
  void cancel() noexcept override {
    for (auto* g : groups) g->tables.cancel_early(g->tables.ahead_pull());
  }
  /// What the batch carries, for a message about ranks that differ.
  std::string describe(bool detailed) const {
    std::string out = ahead ? "prefetch of " : "";
    for (std::size_t i = 0; i < request_group.size(); ++i)
      out += (i ? ", " : "") +
             groups[request_group[i]]->tables.label(requests[request_group[i]][request_at[i]].table, detailed);
    if (detailed) {
      out += "; groups ";
      for (std::size_t gi = 0; gi < groups.size(); ++gi) out += (gi ? ", " : "") + groups[gi]->tables.describe(true);
    }
    return out;
  }
};

/// Sorts a batch's requests into their groups (and, ahead, copies the ids
/// into b.ids, sized for them, unless `ids_copied`: the caller's copies already).
template <class Engine, class Optimizer>
template <class V, class T>
void ShardedSynchronizer<Engine, Optimizer>::gather(Batch<T>& b, const Lookup<V>* batch, std::size_t count,
                                                    bool ahead, bool ids_copied) {
  // T: the storage type of V's tables.
  b.ahead = ahead;
  b.request_group.resize(count);
  b.request_at.resize(count);
  std::size_t copied = 0;
  for (std::size_t i = 0; i < count; ++i) {
    TableOf<V>& t = table_of(*batch[i].var);
    Group<T>& g = static_cast<Group<T>&>(t.group());
    auto at = std::find(b.groups.begin(), b.groups.end(), &g);
    if (at == b.groups.end()) {
      b.groups.push_back(&g);
      b.requests.emplace_back();
      at = b.groups.end() - 1;
    }
    const auto gi = static_cast<std::size_t>(at - b.groups.begin());
    const index_t* ids = batch[i].ids;
    if (ahead && !ids_copied && batch[i].n) {
      space_traits<space>::copy(b.ids.data() + copied, ids, batch[i].n * sizeof(index_t));
      ids = b.ids.data() + copied;
      copied += batch[i].n;
    }
    b.request_group[i] = gi;
    b.request_at[i] = b.requests[gi].size();
    b.requests[gi].push_back(typename Batch<T>::Request{t.index(), ids, batch[i].n, nullptr});
    b.parts.emplace_back(&t.name(), g.weight(batch[i].n));
  }
  detail::Fingerprint word;
  word.add(ahead ? "prefetch" : "lookup");
  for (std::size_t i = 0; i < count; ++i)
    word.add(b.groups[b.request_group[i]]->tables.identity()).add(b.requests[b.request_group[i]][b.request_at[i]].table);
  b.word = word.value();
}

/// Plans every group's lookups and routes their keys, all groups in one
/// route. A bad id throws on every rank, naming its variable. Reads no row.
template <class Engine, class Optimizer>
template <class T>
void ShardedSynchronizer<Engine, Optimizer>::route(Batch<T>& b) {
  b.lanes.clear();
  index_t bad = sharded::no_problem;
  std::size_t bad_lane = 0, bad_table = 0;
  detail::Span plan(b.ahead ? "prefetch: plan" : "lookup: plan");
  for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
    auto& p = b.pull(*b.groups[gi]);
    b.lanes.push_back(&b.groups[gi]->tables.plan_lookup(b.requests[gi].data(), b.requests[gi].size(), p));
    if (bad == sharded::no_problem && p.problem() != sharded::no_problem) {
      bad = p.problem();
      bad_lane = gi;
      bad_table = p.problem_table();
    }
  }
  plan.end();
  // A plain lookup's route shares the push's buffers (its ids are copied
  // out as they arrive, and pushes route only inside a step); a lookup
  // ahead has its own, since a step's push comes between.
  const detail::Span span(b.ahead ? "prefetch: route" : "lookup: route");
  if (auto problem = sharded::route_lanes(*engine_, b.lanes.data(), b.lanes.size(), b.ahead ? ahead_route_ : route_,
                                         b.ahead ? sharded::prefetch_shape(b.word) : sharded::lookup_shape(b.word),
                                         [&](bool detailed) { return b.describe(detailed); }, bad, bad_lane,
                                         bad_table))
    b.groups[problem->lane]->tables.fail(*problem, "lookup id");
}

/// The owners serve a routed batch's rows as their shards hold them now;
/// each group's rows land in one buffer, request after request, valid
/// until the step's clear().
template <class Engine, class Optimizer>
template <class T>
auto ShardedSynchronizer<Engine, Optimizer>::serve(Batch<T>& b) -> std::vector<Rows<compute_t<T>, space>> {
  // T: the storage type; the rows come as compute_t<T>.
  for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
    Group<T>& g = *b.groups[gi];
    std::size_t total = 0;
    for (const auto& r : b.requests[gi]) total += r.n;
    compute_t<T>* out = g.outputs.next(total * g.tables.cols()).data();
    for (std::size_t r = 0; r < b.requests[gi].size(); ++r) {
      b.requests[gi][r].out = out;
      g.tables.place(b.pull(g), r, out);
      out += b.requests[gi][r].n * g.tables.cols();
    }
  }
  if (b.early) serve_part(b, false);
  {
    const detail::Span span("lookup: serve and reply");
    for (std::size_t gi = 0; gi < b.groups.size(); ++gi)
      if (!b.in_parts(gi)) b.groups[gi]->tables.start_reply(b.pull(*b.groups[gi]));
    if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
  }
  const detail::Span span("lookup: rows in order");
  for (auto* g : b.groups) g->tables.finish_lookup(b.pull(*g));

  std::vector<Rows<compute_t<T>, space>> rows;
  rows.reserve(b.request_group.size());
  for (std::size_t i = 0; i < b.request_group.size(); ++i) {
    const auto& r = b.requests[b.request_group[i]][b.request_at[i]];
    rows.push_back(Rows<compute_t<T>, space>{r.out, r.n, b.groups[b.request_group[i]]->tables.cols()});
  }
  return rows;
}

/// A lookup ahead's early part (`early`, after its route, on the
/// communication thread) or the rest (at rows()) of every group that
/// serves_early(): the owners' rows in one route, put in place
/// (sharded::EarlyRows).
template <class Engine, class Optimizer>
template <class T>
void ShardedSynchronizer<Engine, Optimizer>::serve_part(Batch<T>& b, bool early) {
  std::vector<sharded::RouteLane*> lanes;
  std::vector<std::size_t> parted;
  for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
    auto& tables = b.groups[gi]->tables;
    if (!tables.serves_early()) continue;
    parted.push_back(gi);
    lanes.push_back(early ? &tables.plan_early(b.pull(*b.groups[gi])) : &tables.plan_late(b.pull(*b.groups[gi])));
  }
  if (lanes.empty()) return;
  const detail::Span span(early ? "prefetch: early rows" : "prefetch: late rows");
  const auto word = detail::Fingerprint().add(early ? "prefetch early" : "prefetch late").add(b.word).value();
  sharded::route_lanes(*engine_, lanes.data(), lanes.size(), ahead_parts_, sharded::prefetch_shape(word),
                      [&](bool detailed) { return b.describe(detailed); });
  for (std::size_t gi : parted) b.groups[gi]->tables.land(b.pull(*b.groups[gi]), early);
  b.early = true;
}

template <class Engine, class Optimizer>
template <class V>
auto ShardedSynchronizer<Engine, Optimizer>::lookup(const Lookup<V>* batch, std::size_t count)
    -> std::vector<Rows<typename V::value_type, space>> {
  using T = storage_type_t<V>;
  Batch<T> b;
  gather(b, batch, count, false);
  // One booking for the whole lookup: its route and its replies.
  auto shared = engine_->stats().shared(ShardedPS::name);
  for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
  route(b);
  return serve(b);
}

template <class Engine, class Optimizer>
template <class V>
void ShardedSynchronizer<Engine, Optimizer>::start_lookup(const Lookup<V>* batch, std::size_t count,
                                                          Background& background) {
  using T = storage_type_t<V>;
  auto owned = std::make_unique<Batch<T>>();
  Batch<T>& b = *owned;
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) total += batch[i].n;
  b.ids.resize_discard(total);
  gather(b, batch, count, true);
  ahead_ = std::move(owned);
  background.post([this, &b] {
    try {
      auto shared = engine_->stats().shared(ShardedPS::name);
      for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
      route(b);
      if (b.ahead && options_.sharded.early_rows) serve_part(b, true);
    } catch (...) {
      b.failure = std::current_exception();  // rows() throws it, on every rank alike
    }
    b.routed = true;
  });
}

template <class Engine, class Optimizer>
template <class V>
auto ShardedSynchronizer<Engine, Optimizer>::finish_lookup() -> std::vector<Rows<typename V::value_type, space>> {
  using T = storage_type_t<V>;
  std::unique_ptr<BatchBase> taken = std::move(ahead_);
  if (auto* a = dynamic_cast<BagsAhead<V>*>(taken.get())) {
    a->check_routed();
    return serve_bags(std::move(a->record), a->plain.groups.empty() ? nullptr : &a->plain, a->plain_count, a->here);
  }
  auto* b = dynamic_cast<Batch<T>*>(taken.get());
  PARALLAX_EXPECTS(b != nullptr, "ShardedPS: finish_lookup() without a start_lookup() of this element type");
  b->check_routed();
  return finish_ahead(*b);
}

/// The rows of a lookup ahead whose route ran. Rows read in place: the
/// route came before this step's update, so the owners say they are done
/// writing once more (a route of headers alone).
template <class Engine, class Optimizer>
template <class S>
auto ShardedSynchronizer<Engine, Optimizer>::finish_ahead(Batch<S>& b) -> std::vector<Rows<compute_t<S>, space>> {
  auto shared = engine_->stats().shared(ShardedPS::name);
  for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
  bool direct = false;
  for (auto* g : b.groups) direct = direct || g->tables.reads_directly();
  if (direct && engine_->size() > 1) {
    const detail::Span span("prefetch: owners updated");
    for (auto* g : b.groups) g->tables.sync_shard();
    const auto word = detail::Fingerprint().add("prefetch rows").add(b.word).value();
    sharded::route_lanes(*engine_, nullptr, 0, ahead_route_, sharded::prefetch_shape(word),
                        [&](bool detailed) { return b.describe(detailed); });
  }
  return serve(b);
}

}  // namespace parallax::policy
