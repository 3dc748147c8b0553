#pragma once
/// @file
/// ShardedSynchronizer's lookups of bags (declared in steps.hpp;
/// docs/design.md, "Bags"): the choice, per request, of pooling here or at
/// the owners (choose_pooling), lookup_bags() and the gradient of its
/// pooled rows (bag_gradients).

#include <parallax/bags.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/bag_pool.hpp>
#include <parallax/policy/sharded_ps/group_routes.hpp>
#include <parallax/policy/sharded_ps/lookups.hpp>
#include <parallax/policy/sharded_ps/members.hpp>
#include <parallax/policy/sharded_ps/steps.hpp>
#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace parallax::policy::sharded {

/// The shape of a bag route that carries its batch's check
/// (CallShape::problems_first).
inline CallShape checked(CallShape shape) {
  shape.problems_first = true;
  return shape;
}

}  // namespace parallax::policy::sharded

namespace parallax::policy {

/// A lookup_bags() batch, kept until clear() for its gradient.
template <class Engine, class Optimizer>
class ShardedSynchronizer<Engine, Optimizer>::BagBatchBase {
 public:
  virtual ~BagBatchBase() = default;
  bool given = false;  // its gradient was given
};
template <class Engine, class Optimizer>
template <class S>
class ShardedSynchronizer<Engine, Optimizer>::BagBatch final : public BagBatchBase {
 public:
  using T = compute_t<S>;
  std::vector<Group<S>*> groups;  // in the order the batch first names them
  std::vector<sharded::BagPool<T, Engine, S>*> pools;  // per group
  std::vector<bool> local;        // per request: pooled here (LocalBags), not at the owners
  std::size_t local_first = 0;    // the LocalBags index of the first request pooled here
  std::vector<const void*> vars;  // per request: its variable's state
  std::vector<const std::string*> names;
  // Per request: its group, its place there (pooled here: among those pooled here), its bags.
  std::vector<std::size_t> request_group, request_at, bags;
  std::vector<Rows<T, space>> rows;  // per request: the pooled rows
  std::vector<std::pair<const std::string*, std::uint64_t>> parts;  // per request pooled at the owners: its share of the bytes
  std::uint64_t word = 0;  // the route's shape: each request's (group, table), in order
  bool ahead = false;      // routed ahead (start_lookup): its groups' ahead_bag_pool(), the ahead bag route
  std::string describe(bool detailed, const char* what) const {
    std::string out = what;
    bool first = true;
    for (std::size_t i = 0; i < request_group.size(); ++i) {
      if (local[i]) continue;
      const auto& q = pools[request_group[i]]->request(request_at[i]);
      out += (first ? "" : ", ") + groups[request_group[i]]->tables.label(q.table, detailed) + " (" +
             to_string(q.combiner) + ")";
      first = false;
    }
    return out;
  }
};

/// Per request of a bag batch: whether it is pooled locally. Requests of
/// Pooling::automatic weigh the bytes both ways would move (this rank's
/// sends: ids and pairs, or unique ids, each way), added over the ranks,
/// so every rank picks alike; the ranks check first that no batch has a
/// `problem` (else they throw its words) and that they look up the same
/// tables with the same pooling (else they throw, on every rank).
template <class Engine, class Optimizer>
template <class V>
std::vector<bool> ShardedSynchronizer<Engine, Optimizer>::choose_pooling(
    const Bags<V>* batch, std::size_t count, const std::vector<std::vector<index_t>>& offsets,
    const std::optional<std::string>& problem) {
  using T = typename V::value_type;
  std::vector<bool> local(count, false);
  std::vector<std::int64_t> cost;
  std::vector<std::size_t> automatic;
  detail::Fingerprint word;
  word.add("pooling").add(count);
  for (std::size_t i = 0; i < count; ++i) {
    const Bags<V>& q = batch[i];
    TableOf<V>& t = table_of(*q.var);
    word.add(t.name()).add(static_cast<std::uint64_t>(q.pooling)).add(static_cast<std::uint64_t>(q.combiner));
    if (q.pooling != Pooling::automatic) {
      local[i] = q.pooling == Pooling::local;
      continue;
    }
    automatic.push_back(i);
    if (problem) continue;  // its offsets may not hold: the ranks throw before weighing
    const auto& tables = static_cast<Group<storage_type_t<V>>&>(t.group()).tables;
    const PartitionMap& map = tables.map(t.index());
    std::vector<index_t> ids(q.n);
    if (q.n) space_traits<space>::copy_to_host(ids.data(), q.ids, q.n * sizeof(index_t));
    const int me = engine_->rank();
    // On the wire: rows of T, or of 2 bytes a value compressed, with ids of
    // 8 bytes or 4 (narrowed); rows read in place as the table stores them.
    const bool half = tables.compression() != Compression::none;
    const std::int64_t id = tables.narrows_ids() ? 4 : 8;
    const std::int64_t count_bytes =
        sharded::BagPool<T, Engine, storage_type_t<V>>::narrow_counts || tables.narrows_ids() ? 4 : 8;
    const std::int64_t row = static_cast<std::int64_t>(tables.cols() * (half ? 2 : sizeof(T)));
    const std::int64_t read = static_cast<std::int64_t>(tables.cols() * sizeof(storage_type_t<V>));
    const std::int64_t per_id = id + (q.combiner == Combiner::weighted_sum ? static_cast<std::int64_t>(sizeof(T)) : 0);
    std::int64_t remote = 0, pairs = 0;
    std::vector<std::size_t> seen(static_cast<std::size_t>(engine_->size()), 0);  // the bag + 1 an owner was last seen in
    std::vector<index_t> remote_ids;
    for (std::size_t bag = 0; bag + 1 < offsets[i].size(); ++bag)
      for (auto j = static_cast<std::size_t>(offsets[i][bag]); j < static_cast<std::size_t>(offsets[i][bag + 1]); ++j) {
        const int o = map.owner(ids[j]);
        if (o == me) continue;
        ++remote;
        remote_ids.push_back(ids[j]);
        if (seen[static_cast<std::size_t>(o)] != bag + 1) {
          seen[static_cast<std::size_t>(o)] = bag + 1;
          ++pairs;
        }
      }
    std::sort(remote_ids.begin(), remote_ids.end());
    const auto unique = static_cast<std::int64_t>(std::unique(remote_ids.begin(), remote_ids.end()) - remote_ids.begin());
    // At the owners: the ids, a count and a row back per pair; a row per
    // pair pushed. Here: a key and a row back per unique id (rows
    // read in place: a row per id, repeats too), and each pushed.
    cost.push_back(per_id * remote + pairs * (count_bytes + 2 * row));
    cost.push_back((tables.reads_directly() ? remote * read : unique * (id + row)) + unique * (id + row));
  }
  if (automatic.empty()) return local;
  // The shape word, and the lowest rank whose batch has a problem (the
  // check's agreement rides this all-reduce: its words follow only then).
  const int n = engine_->size();
  std::int64_t agree[3] = {static_cast<std::int64_t>(word.value()), -static_cast<std::int64_t>(word.value()),
                           problem ? engine_->rank() : n};
  {
    auto scope = engine_->stats().scope("", "control");
    engine_->allreduce(agree, agree, 3, DataType::i64, ReduceOp::min);
  }
  if (agree[2] < n) detail::agree(*engine_, problem);  // throws, on every rank
  if (agree[0] != -agree[1])
    throw error("parallax: ranks make different batched lookups of bags: every rank must look up the same sparse variables, "
                "with the same combiners and pooling, in the same order, in each batch (the ids may differ, and may "
                "be none)");
  {
    auto scope = engine_->stats().scope("", "control");
    engine_->allreduce(cost.data(), cost.data(), cost.size(), DataType::i64, ReduceOp::sum);
  }
  for (std::size_t k = 0; k < automatic.size(); ++k) local[automatic[k]] = cost[2 * k + 1] < cost[2 * k];
  return local;
}

/// A lookup of bags started ahead (start_lookup with bags): copies of
/// its requests (offsets, ids, weights), its check, its routed state.
template <class Engine, class Optimizer>
template <class V>
class ShardedSynchronizer<Engine, Optimizer>::BagsAhead final : public BatchBase {
 public:
  using T = typename V::value_type;
  using S = storage_type_t<V>;
  std::size_t plain_count = 0;       // the plain lookups, whose rows come first
  std::vector<Lookup<V>> lookups;    // the plain lookups, and the bags, on copies of their arrays
  std::vector<Bags<V>> bags;
  std::vector<Buffer<index_t, space>> ids, offsets;  // ids: the lookups', then the bags'
  std::vector<Buffer<T, space>> weights;
  std::vector<std::vector<index_t>> host_offsets;  // the bags' offsets on the host (batch_problem)
  std::optional<std::string> problem;              // this rank's bags' problem, found when started
  std::unique_ptr<BagBatch<S>> record = std::make_unique<BagBatch<S>>();
  Batch<S> plain;                  // the plain lookups and the bags pooled here
  std::vector<Bags<V>> here;       // the bags pooled here
  void cancel() noexcept override { plain.cancel(); }
};

template <class Engine, class Optimizer>
template <class V, class S>
void ShardedSynchronizer<Engine, Optimizer>::route_bags(BagBatch<S>& b, Batch<S>& plain, bool ahead,
                                                        const Lookup<V>* lookups, std::size_t n, const Bags<V>* batch,
                                                        std::size_t count, std::vector<std::vector<index_t>>& offsets,
                                                        const std::optional<std::string>& problem,
                                                        std::vector<Bags<V>>& here) {
  using T = typename V::value_type;
  sharded::RouteBuffers<space>& buffers = ahead ? ahead_bag_route_ : bag_route_;
  // A batch pooled at the owners alone is checked by its route (a problem
  // travels in its headers, and only then do the ranks agree on its words),
  // one with automatic requests by the all-reduce that compares the ranks'
  // batches (choose_pooling): no call of its own. Others are checked first,
  // as they look up rows here before any route.
  const bool checked_by_route =
      std::all_of(batch, batch + count, [](const Bags<V>& q) { return q.pooling == Pooling::owner; });
  const bool checked_by_choice =
      std::any_of(batch, batch + count, [](const Bags<V>& q) { return q.pooling == Pooling::automatic; });
  if (!checked_by_route && !checked_by_choice) detail::agree(*engine_, problem);
  if (checked_by_route && problem) {
    auto scope = engine_->stats().scope("", "control");
    sharded::route_lanes(*engine_, nullptr, 0, buffers, sharded::checked(sharded::lookup_shape(0)),
                        [](bool) { return std::string(); }, index_t{0});
    detail::agree(*engine_, problem);  // throws, on every rank
  }
  b.ahead = ahead;
  b.local = choose_pooling(batch, count, offsets, problem);
  b.rows.resize(count);
  b.request_group.assign(count, 0);
  b.request_at.assign(count, 0);
  for (std::size_t i = 0; i < count; ++i) {
    TableOf<V>& t = table_of(*batch[i].var);
    b.vars.push_back(&batch[i].var->state());
    b.names.push_back(&t.name());
    b.bags.push_back(offsets[i].size() - 1);
  }
  // Pooled at the owners: planned and routed now, served with the plain
  // lookup (their rows' buffers given then: set_out()).
  std::vector<std::vector<typename sharded::BagPool<T, Engine, S>::Request>> requests;
  detail::Fingerprint word;
  word.add("bags");
  for (std::size_t i = 0; i < count; ++i) {
    if (b.local[i]) continue;
    TableOf<V>& t = table_of(*batch[i].var);
    Group<S>& g = static_cast<Group<S>&>(t.group());
    auto at = std::find(b.groups.begin(), b.groups.end(), &g);
    if (at == b.groups.end()) {
      b.groups.push_back(&g);
      requests.emplace_back();
      at = b.groups.end() - 1;
    }
    const auto gi = static_cast<std::size_t>(at - b.groups.begin());
    const Bags<V>& q = batch[i];
    b.request_group[i] = gi;
    b.request_at[i] = requests[gi].size();
    requests[gi].push_back({t.index(), std::move(offsets[i]), q.ids, q.n, q.weights, q.combiner, nullptr});
    b.parts.emplace_back(&t.name(), g.weight(q.n));
    word.add(g.tables.identity()).add(t.index()).add(static_cast<std::uint64_t>(q.combiner));
  }
  b.word = word.value();
  if (!b.groups.empty()) {
    std::vector<sharded::RouteLane*> lanes;
    {
      const detail::Span span(ahead ? "prefetch bags: plan" : "bags: plan");
      for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
        sharded::BagPool<T, Engine, S>& pool = ahead ? b.groups[gi]->ahead_bag_pool() : b.groups[gi]->next_bag_pool();
        pool.plan(b.groups[gi]->tables, std::move(requests[gi]));
        b.pools.push_back(&pool);
        lanes.push_back(&pool.entry_lane());
        lanes.push_back(&pool.segment_lane());
      }
    }
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
    const detail::Span span(ahead ? "prefetch bags: route" : "bags: route");
    if (sharded::route_lanes(*engine_, lanes.data(), lanes.size(), buffers, sharded::checked(sharded::lookup_shape(b.word)),
                            [&](bool detailed) { return b.describe(detailed, ahead ? "prefetch of bags of " : "bags of "); }))
      detail::agree(*engine_, std::optional<std::string>());  // another rank's problem: throws, on every rank
  }
  // Pooled here: one plain lookup of their ids (after the plain lookups
  // given with them), routed now, served with the bags. It follows the
  // owners' route, which carries the bags' check: a rank whose bags have a
  // problem routes nothing else.
  std::vector<Lookup<V>> looked_up(lookups, lookups + n);
  for (std::size_t i = 0; i < count; ++i)
    if (b.local[i]) {
      b.request_at[i] = here.size();
      here.push_back(batch[i]);
      looked_up.emplace_back(*batch[i].var, batch[i].ids, batch[i].n);
    }
  if (!looked_up.empty()) {
    gather(plain, looked_up.data(), looked_up.size(), ahead, /*ids_copied=*/true);  // ahead: start_lookup's copies
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (const auto& [name, weight] : plain.parts) shared.part(*name, weight);
    route(plain);
    if (ahead && options_.sharded.early_rows) serve_part(plain, true);
  }
}

template <class Engine, class Optimizer>
template <class V, class S>
auto ShardedSynchronizer<Engine, Optimizer>::serve_bags(std::unique_ptr<BagBatch<S>> record, Batch<S>* plain,
                                                        std::size_t n, const std::vector<Bags<V>>& here)
    -> std::vector<Rows<typename V::value_type, space>> {
  using T = typename V::value_type;
  BagBatch<S>& b = *record;
  std::vector<Rows<T, space>> out;  // the plain lookups' rows, then the bags'
  if (plain) {
    const auto looked_up = plain->ahead ? finish_ahead(*plain) : serve(*plain);
    out.assign(looked_up.begin(), looked_up.begin() + static_cast<std::ptrdiff_t>(n));
    if (!here.empty()) {
      LocalBags<T, space>& local = local_bags_.template of<T>();
      b.local_first = local.pooled();
      const std::vector<Rows<T, space>> mine(looked_up.begin() + static_cast<std::ptrdiff_t>(n), looked_up.end());
      const detail::Span span("bags: pooled locally");
      const auto pooled = local.pool(engine_->exec(), here.data(), here.size(), mine);
      for (std::size_t i = 0; i < b.local.size(); ++i)
        if (b.local[i]) b.rows[i] = pooled[b.request_at[i]];
    }
  }
  if (!b.groups.empty()) {
    for (std::size_t i = 0; i < b.local.size(); ++i) {
      if (b.local[i]) continue;
      Group<S>& g = *b.groups[b.request_group[i]];
      T* rows = g.outputs.next(b.bags[i] * g.tables.cols()).data();
      b.pools[b.request_group[i]]->set_out(b.request_at[i], rows);
      b.rows[i] = Rows<T, space>{rows, b.bags[i], g.tables.cols()};
    }
    if (b.ahead)
      for (auto* g : b.groups) g->adopt_ahead_bag_pool();
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
    {
      const detail::Span span("bags: owners pool and reply");
      for (std::size_t gi = 0; gi < b.groups.size(); ++gi) b.pools[gi]->serve(b.groups[gi]->tables);
      if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
    }
    const detail::Span span("bags: partial sums added");
    for (auto* pool : b.pools) pool->finish();
  }
  out.insert(out.end(), b.rows.begin(), b.rows.end());
  bag_batches_.push_back(std::move(record));
  return out;
}

template <class Engine, class Optimizer>
template <class V>
auto ShardedSynchronizer<Engine, Optimizer>::lookup_bags(const Bags<V>* batch, std::size_t count)
    -> std::vector<Rows<typename V::value_type, space>> {
  using S = storage_type_t<V>;
  std::vector<std::vector<index_t>> offsets;
  const std::optional<std::string> problem = detail::batch_problem(engine_->exec(), batch, count, offsets);
  auto record = std::make_unique<BagBatch<S>>();
  Batch<S> plain;
  std::vector<Bags<V>> here;
  route_bags(*record, plain, false, static_cast<const Lookup<V>*>(nullptr), 0, batch, count, offsets, problem, here);
  return serve_bags(std::move(record), plain.groups.empty() ? nullptr : &plain, 0, here);
}

template <class Engine, class Optimizer>
template <class V>
void ShardedSynchronizer<Engine, Optimizer>::start_lookup(const Lookup<V>* batch, std::size_t count,
                                                          const Bags<V>* bags, std::size_t bag_count,
                                                          Background& background) {
  using T = typename V::value_type;
  auto owned = std::make_unique<BagsAhead<V>>();
  BagsAhead<V>& a = *owned;
  // Copies of every array, so the caller may reuse its own at once; the
  // bags' check reads them here, its agreement travels on `background`.
  a.plain_count = count;
  a.ids.resize(count + bag_count);
  a.offsets.resize(bag_count);
  a.weights.resize(bag_count);
  for (std::size_t i = 0; i < count; ++i) {
    a.ids[i].resize_discard(batch[i].n);
    if (batch[i].n) space_traits<space>::copy(a.ids[i].data(), batch[i].ids, batch[i].n * sizeof(index_t));
    a.lookups.emplace_back(*batch[i].var, a.ids[i].data(), batch[i].n);
  }
  for (std::size_t i = 0; i < bag_count; ++i) {
    const Bags<V>& q = bags[i];
    Buffer<index_t, space>& ids = a.ids[count + i];
    ids.resize_discard(q.ids ? q.n : 0);
    if (q.ids && q.n) space_traits<space>::copy(ids.data(), q.ids, q.n * sizeof(index_t));
    a.offsets[i].resize_discard(q.offsets ? q.offsets_count : 0);
    if (q.offsets && q.offsets_count)
      space_traits<space>::copy(a.offsets[i].data(), q.offsets, q.offsets_count * sizeof(index_t));
    a.weights[i].resize_discard(q.weights ? q.n : 0);
    if (q.weights && q.n) space_traits<space>::copy(a.weights[i].data(), q.weights, q.n * sizeof(T));
    // An array of nothing keeps the caller's pointer (never read), so the
    // check finds what it would find in the caller's request.
    Bags<V> copy = q;
    if (q.ids && q.n) copy.ids = ids.data();
    if (q.offsets && q.offsets_count) copy.offsets = a.offsets[i].data();
    if (q.weights && q.n) copy.weights = a.weights[i].data();
    a.bags.push_back(copy);
  }
  a.problem = detail::batch_problem(engine_->exec(), a.bags.data(), a.bags.size(), a.host_offsets);
  ahead_ = std::move(owned);
  background.post([this, &a] {
    try {
      route_bags(*a.record, a.plain, true, a.lookups.data(), a.lookups.size(), a.bags.data(), a.bags.size(),
                 a.host_offsets, a.problem, a.here);
    } catch (...) {
      a.failure = std::current_exception();  // rows() throws it, on every rank alike
    }
    a.routed = true;
  });
}

template <class Engine, class Optimizer>
template <class V>
void ShardedSynchronizer<Engine, Optimizer>::bag_gradients(const BagGradient<V>* grads, std::size_t count) {
  using T = typename V::value_type;
  BagBatch<storage_type_t<V>>* b = nullptr;
  for (std::size_t i = bag_batches_.size(); i-- > 0 && !b;)
    if (!bag_batches_[i]->given) b = dynamic_cast<BagBatch<storage_type_t<V>>*>(bag_batches_[i].get());
  std::optional<std::string> problem;
  if (!b) {
    problem = detail::no_bag_lookup(count ? grads[0].var->name() : std::string());
  } else if (count != b->vars.size()) {
    problem = detail::concat("a gradient of bags was given for ", count,
                             " requests; the batch of bags it belongs to had ", b->vars.size());
  } else {
    for (std::size_t i = 0; i < count && !problem; ++i) {
      if (&grads[i].var->state() != b->vars[i])
        problem = detail::concat("a gradient of bags for variable '", grads[i].var->name(),
                                 "' was given where its batch looked up another variable");
      else
        problem = detail::bag_gradient_problem(grads[i].var->name(), b->bags[i], b->rows[i].cols,
                                               grads[i].values.rows, grads[i].values.cols);
    }
  }
  // The check travels in the gradients' route (CallShape::problems_first):
  // every rank routes once, a rank with a problem (or a batch pooled here
  // alone) with no lanes, booked as control; if any rank reports one, the
  // ranks agree on its words and throw them.
  const bool routes_rows = !problem && !b->groups.empty();
  if (problem || !routes_rows) {
    auto scope = engine_->stats().scope("", "control");
    if (sharded::route_lanes(*engine_, nullptr, 0, bag_route_,
                            sharded::checked(sharded::push_shape(detail::Fingerprint().add("bag gradients").value())),
                            [](bool) { return std::string(); }, problem ? index_t{0} : sharded::no_problem))
      detail::agree(*engine_, problem);  // throws, on every rank
  }
  b->given = true;
  bag_gradients_given_ = true;
  for (std::size_t i = 0; i < count; ++i)
    if (b->local[i]) local_bags_.template of<T>().expand(engine_->exec(), b->local_first + b->request_at[i], grads[i]);
  if (!routes_rows) return;
  std::vector<std::vector<const T*>> per_group(b->groups.size());
  for (std::size_t gi = 0; gi < b->groups.size(); ++gi) per_group[gi].resize(b->pools[gi]->requests());
  std::vector<sharded::RouteLane*> lanes;
  auto shared = engine_->stats().shared(ShardedPS::name);
  for (std::size_t i = 0; i < count; ++i) {
    if (b->local[i]) continue;
    per_group[b->request_group[i]][b->request_at[i]] = grads[i].values.data;
    shared.part(*b->names[i], b->bags[i] + 1);
  }
  {
    const detail::Span span("bag gradients: plan");
    for (std::size_t gi = 0; gi < b->groups.size(); ++gi) {
      b->pools[gi]->plan_gradients(per_group[gi]);
      lanes.push_back(&b->pools[gi]->gradient_lane());
    }
  }
  {
    const detail::Span span("bag gradients: route");
    if (sharded::route_lanes(*engine_, lanes.data(), lanes.size(), bag_route_,
                            sharded::checked(sharded::push_shape(
                                detail::Fingerprint().add("bag gradients").add(b->word).value())),
                            [&](bool detailed) { return b->describe(detailed, "gradients of bags of "); }))
      detail::agree(*engine_, std::optional<std::string>());  // another rank's problem: throws, on every rank
  }
  const detail::Span span("bag gradients: owners expand");
  for (std::size_t gi = 0; gi < b->groups.size(); ++gi) b->pools[gi]->expand(b->groups[gi]->tables);
}

}  // namespace parallax::policy
