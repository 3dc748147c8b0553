#pragma once
/// @file
/// ShardedPS's synchronizer (see synchronizer.hpp, which includes all of
/// it): its registration of variables and the phases of a step. Its parts
/// are declared here and defined beside: the per-variable members and their
/// table groups (members.hpp), batched lookups (lookups.hpp) and lookups of
/// bags (bag_lookups.hpp).

#include <parallax/bags.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/members.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/bag_pool.hpp>
#include <parallax/policy/sharded_ps/group_routes.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace parallax::policy {

/// The partition count of a sharded variable: its own (TrainerOptions::
/// partitions), the configured default, or one per rank (but no more than
/// the variable has rows).
inline int partitions_for(const Common& common, const sharded::Options& sharded, const std::string& name,
                          std::size_t rows, int ranks) {
  if (auto it = common.partitions.find(name); it != common.partitions.end()) return it->second;
  if (sharded.partitions > 0) return sharded.partitions;
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(ranks), std::max<std::size_t>(rows, 1)));
}

template <class Engine, class Optimizer>
class ShardedSynchronizer final : public Synchronizer<Engine> {
 public:
  using space = engine::space_of_t<Engine>;

  ShardedSynchronizer(Engine& engine, const Optimizer& opt, const Common& common, const sharded::Options& sharded)
      : engine_(&engine), opt_(&opt), options_{common, sharded} {}
  ShardedSynchronizer(const ShardedSynchronizer&) = delete;
  ShardedSynchronizer& operator=(const ShardedSynchronizer&) = delete;

  template <class Var>
  Member& add(Var var) {
    const PartitionMap map(var.rows(), partitions_for(options_, options_.sharded, var.name(), var.rows(), engine_->size()),
                           engine_->size());
    if constexpr (Var::is_sparse()) {
      using S = storage_type_t<Var>;
      Group<S>& g = group_for<S>(var.cols(), bind_variable(*opt_, var), var.state().rounding);
      const std::size_t index = g.tables.add(var.name(), map);
      TableOf<Var>& m = tables_.template add<TableOf<Var>>(std::move(var), *engine_, g, index);
      g.members.push_back(&m);
      return m;
    } else {
      return dense_.template add<DenseOf<Var>>(std::move(var), *engine_, *opt_, map);
    }
  }

  /// Lays every group out (shared windows: collective) and places its
  /// tables' initial values and optimizer state.
  void prepare() override {
    for (auto& g : groups_) g->build();
  }

  /// A group's push starts, on the communication thread, once all its
  /// tables are ready: its own route, so its rows travel while the user
  /// computes the other gradients; or, with ShardedOptions::push_together,
  /// once every group is ready, all in one route. A table whose gradient
  /// has a problem sends no rows; the step's agreement reports the problem.
  void ready(const Member& variable, const StepInfo&, Background& background) override {
    const std::size_t i = tables_.find(variable);
    if (i == tables_.size()) return;
    GroupBase& g = tables_[i]->group();
    if (g.pushed || !g.mark_ready(tables_[i]->index())) return;
    std::vector<GroupBase*> groups{&g};
    if (options_.sharded.push_together) {
      groups.clear();
      for (auto& h : groups_) {
        if (h->pushed) continue;
        if (!h->all_ready()) return;
        groups.push_back(h.get());
      }
    }
    for (GroupBase* h : groups) h->pushed = true;
    // A group is in one push a step: the first one's buffers carry it.
    background.post([this, groups] { push(groups, /*early=*/true, groups.front()->early_route); });
  }

  std::optional<std::string> problem() override {
    for (Table* t : tables_)
      if (auto p = t->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    if (bag_gradients_given_) return true;
    for (const Table* t : tables_)
      if (t->has_gradient()) return true;
    for (const Dense* d : dense_)
      if (d->has_gradient()) return true;
    return false;
  }
  /// Every group's gradient rows in one route (one engine call on MPI, two
  /// elsewhere), booked to the tables in proportion to the rows each sends;
  /// the dense variables' gradients to their owners.
  void start_exchange(const StepInfo&) override {
    std::vector<GroupBase*> groups;
    for (auto& g : groups_)
      if (!g->pushed) groups.push_back(g.get());
    push(groups, /*early=*/false, route_);
  }
  void finish_exchange(const StepInfo&) override {
    {
      const detail::Span span("push: owners sum");
      for (auto& g : groups_) g->finish_push();
    }
    const detail::Span span("dense shards: reduce");
    for (Dense* d : dense_) d->reduce();
  }
  /// Each owner counts the sums of the rows it owns.
  std::optional<double> gradient_square_sum() override {
    double sum = 0;
    for (auto& g : groups_) sum += g->square_sum();
    for (Dense* d : dense_) sum += d->square_sum();
    return sum;
  }
  void update(const StepInfo& info) override {
    for (auto& g : groups_) g->update(info);
    for (Dense* d : dense_) d->update(info);
  }
  void clear() override {
    for (auto& g : groups_) g->clear();
    for (Dense* d : dense_) d->clear();
    bag_batches_.clear();
    local_bags_.clear();
    bag_gradients_given_ = false;
  }

  /// A batch of bag lookups (docs/design.md, "Bags"). Requests pooled at
  /// the owners: every group's ids and segments in one route, each owner
  /// sums its rows of each (bag, owner) pair, and each group replies once,
  /// a row per pair. Requests pooled locally: one plain lookup of their ids,
  /// pooled here. Pooling::automatic picks, per request, whichever moves
  /// fewer bytes over every rank (two small all-reduces). Returns one row per
  /// bag per request (bags x cols), valid until the step's clear(). A bad
  /// request (offsets, ids, weights) throws on every rank, naming its
  /// variable, before any row moves. Collective. A table stored in 16 bits
  /// is pooled in float at its owners, from its rows widened.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup_bags(const Bags<V>* batch, std::size_t count);

  /// The gradient of the pooled rows of the step's last lookup_bags() batch
  /// whose gradient was not given yet: one BagGradient per request of that
  /// batch, in its order, each bags x cols. A request pooled at the owners
  /// sends each (bag, owner) pair's row to its owner, which gives it to the
  /// bag's ids it holds (times their weights; divided by the bag's ids for
  /// mean), summed there with the step's pushed rows; one pooled locally
  /// adds those rows to its variable's gradient here, pushed at the step. A
  /// gradient that does not match its batch throws on every rank.
  /// Collective.
  template <class V>
  void bag_gradients(const BagGradient<V>* grads, std::size_t count);

  /// The rows of a batch of sparse variables: every group's keys in one
  /// route, then one reply per group (in flight together where the engine
  /// can), rows put in each caller's order. A bad id throws on every rank,
  /// naming its variable, before any row moves. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t count);

  /// Trainer::prefetch: a batched lookup whose route (validation, keys,
  /// sort, unique, and the ids to their owners: nothing that reads a row)
  /// runs now, on `background`, and whose rows are served by
  /// finish_lookup(). The ids are copied: the caller may reuse them at once.
  /// Its state (its groups' ahead_pull(), its own route buffers) is apart
  /// from plain lookups' and pushes', which may come between. One at a
  /// time. Collective.
  template <class V>
  void start_lookup(const Lookup<V>* batch, std::size_t count, Background& background);
  /// The rows of the batch start_lookup() began, as lookup() would return
  /// them now. Throws what its route threw (a bad id, ranks that prefetch
  /// different variables), on every rank. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> finish_lookup();
  /// Trainer::prefetch of plain lookups and bags together: start_lookup()
  /// of `batch`, with `bags` as lookup_bags() would look them up (their
  /// check, the choice of pooling, the plain lookup of those pooled here,
  /// the owners' segments planned and routed: nothing that reads a row).
  /// Their arrays are copied. finish_lookup() returns the plain lookups'
  /// rows, then a pooled block per request of `bags`, as lookup() and
  /// lookup_bags() would return them then, and the bags' gradient is given
  /// by bag_gradients() as for lookup_bags(). A bad request throws from
  /// finish_lookup(), on every rank. Collective.
  template <class V>
  void start_lookup(const Lookup<V>* batch, std::size_t count, const Bags<V>* bags, std::size_t bag_count,
                    Background& background);
  /// Forgets the batch start_lookup() began (its route has run).
  void cancel_lookup() override {
    if (ahead_) ahead_->cancel();
    ahead_.reset();
  }

 private:
  // Sparse tables and dense variables (members.hpp).
  class GroupBase;  // what a group does in a step, whatever its element type
  class Table;      // what the synchronizer asks of a sharded table, whatever its type
  template <class S>
  class TableMember;
  template <class S>
  class Group;  // the tables of one storage type and width, updated alike
  template <class Var>
  class TableOf;  // a sparse variable, a table of its group
  class Dense;
  template <class Var>
  class DenseOf;  // a dense variable, sharded over its owners
  template <class S>
  Group<S>& group_for(std::size_t cols, const optim::Bound<Optimizer>& bound, Rounding rounding);
  template <class V>
  TableOf<V>& table_of(V& var);

  /// Pushes the gradient rows of `groups` in one route over `buffers`,
  /// booked to their tables in proportion to the rows each sends. `early`:
  /// ready()'s push, on the communication thread (a table whose gradient has
  /// a problem sends no rows: the step's agreement reports it); otherwise
  /// start_exchange()'s, of the groups ready() did not push.
  void push(const std::vector<GroupBase*>& groups, bool early, sharded::RouteBuffers<space>& buffers) {
    auto shared = engine_->stats().shared(ShardedPS::name);
    std::vector<sharded::RouteLane*> lanes;
    detail::Fingerprint word;
    word.add("push");
    {
      const detail::Span span(early ? "push: plan (early)" : "push: plan");
      for (GroupBase* g : groups) {
        lanes.push_back(&g->plan_push(shared, early));
        word.add(g->identity());
      }
    }
    if (lanes.empty()) return;
    const detail::Span span(early ? "push: route (early)" : "push: route");
    sharded::route_lanes(*engine_, lanes.data(), lanes.size(), buffers, sharded::push_shape(word.value()),
                        [&](bool detailed) {
                          std::string out = "groups ";
                          for (std::size_t k = 0; k < groups.size(); ++k)
                            out += (k ? ", " : "") + groups[k]->describe(detailed);
                          return early ? out + " (ready)" : out;
                        });
  }

  // Batched lookups (lookups.hpp).
  class BatchBase;
  template <class S>
  class Batch;  // a batched lookup of tables of storage type S, from gather() to serve()
  template <class V, class S = storage_type_t<V>>
  void gather(Batch<S>& b, const Lookup<V>* batch, std::size_t count, bool ahead, bool ids_copied = false);
  template <class S>
  void route(Batch<S>& b);
  template <class S>
  std::vector<Rows<compute_t<S>, space>> serve(Batch<S>& b);
  template <class S>
  void serve_part(Batch<S>& b, bool early);
  template <class S>
  std::vector<Rows<compute_t<S>, space>> finish_ahead(Batch<S>& b);

  // Lookups of bags (bag_lookups.hpp).
  class BagBatchBase;
  template <class S>
  class BagBatch;  // a lookup_bags() batch of tables stored as S, kept until clear() for its gradient
  template <class V>
  class BagsAhead;  // a lookup of bags ahead, from start_lookup() to finish_lookup()
  /// A batch of bags up to what reads a row (collective): its check, the
  /// choice of pooling, the plain lookup of `lookups` and of the bags
  /// pooled here (into `here`) gathered into `plain` and routed, the
  /// owners' segments planned and routed. `ahead`: a lookup ahead's
  /// buffers and pools, kept apart from the step's.
  template <class V, class S = storage_type_t<V>>
  void route_bags(BagBatch<S>& b, Batch<S>& plain, bool ahead, const Lookup<V>* lookups, std::size_t n,
                  const Bags<V>* batch, std::size_t count, std::vector<std::vector<index_t>>& offsets,
                  const std::optional<std::string>& problem, std::vector<Bags<V>>& here);
  /// The rest (collective): `plain`'s rows (if any; the first n returned),
  /// the bags pooled here, the owners' pooled rows; keeps the batch for its
  /// gradient.
  template <class V, class S = storage_type_t<V>>
  std::vector<Rows<typename V::value_type, space>> serve_bags(std::unique_ptr<BagBatch<S>> record, Batch<S>* plain,
                                                              std::size_t n, const std::vector<Bags<V>>& here);
  template <class V>
  std::vector<bool> choose_pooling(const Bags<V>* batch, std::size_t count,
                                   const std::vector<std::vector<index_t>>& offsets,
                                   const std::optional<std::string>& problem);
  Engine* engine_;
  const Optimizer* opt_;  // the trainer's: its learning rate changes between steps
  struct Settings : Common {
    sharded::Options sharded;
  };
  Settings options_;  // the settings it was made with
  std::vector<std::unique_ptr<GroupBase>> groups_;
  std::vector<const std::type_info*> group_types_;
  std::vector<std::size_t> group_cols_;
  Members<Table> tables_;  // the sparse variables, in registration order
  Members<Dense> dense_;
  sharded::RouteBuffers<space> route_;  // the push's route, and batched lookups'
  sharded::RouteBuffers<space> ahead_route_;  // a lookup ahead's route (start_lookup)
  sharded::RouteBuffers<space> ahead_parts_;  // its rows in two parts (ShardedOptions::early_rows)
  std::unique_ptr<BatchBase> ahead_;         // the lookup ahead, from start_lookup() to finish_lookup()
  sharded::RouteBuffers<space> bag_route_;    // bag lookups' and their gradients' routes
  sharded::RouteBuffers<space> ahead_bag_route_;  // a lookup of bags ahead's route
  std::vector<std::unique_ptr<BagBatchBase>> bag_batches_;  // this step's lookup_bags(), in order
  LocalBagsOfEachType<space> local_bags_;                    // its requests pooled here
  bool bag_gradients_given_ = false;
};

}  // namespace parallax::policy
