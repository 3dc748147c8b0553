#pragma once
/// @file
/// ShardedPS's part of a trainer. Sparse variables are sharded over the
/// ranks in table groups (one per element type and width, or one per table
/// with ShardedOptions::group_tables off): a batched lookup routes every
/// group's keys in one route and each group replies once; a step pushes
/// every group's gradient rows in one route, and each owner sums and updates
/// a group at once. Dense variables are sharded too (DenseShards): each
/// owner sums and updates its rows, then every rank gathers the replica it
/// reads.

#include <parallax/bags.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/bag_pool.hpp>
#include <parallax/policy/sharded_ps/dense_shards.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/policy/sharded_ps/table_group.hpp>
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
inline int partitions_for(const TrainerOptions& o, const std::string& name, std::size_t rows, int ranks) {
  if (auto it = o.partitions.find(name); it != o.partitions.end()) return it->second;
  if (o.sharded.partitions > 0) return o.sharded.partitions;
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(ranks), std::max<std::size_t>(rows, 1)));
}

template <class Engine, class Optimizer>
class ShardedSynchronizer final : public Synchronizer<Engine> {
 public:
  using space = engine::space_of_t<Engine>;

  ShardedSynchronizer(Engine& engine, const Optimizer& opt, const TrainerOptions& options)
      : engine_(&engine), opt_(&opt), options_(options) {}
  ShardedSynchronizer(const ShardedSynchronizer&) = delete;
  ShardedSynchronizer& operator=(const ShardedSynchronizer&) = delete;

  template <class Var>
  Member& add(Var var) {
    const PartitionMap map(var.rows(), partitions_for(options_, var.name(), var.rows(), engine_->size()),
                           engine_->size());
    if constexpr (Var::is_sparse()) {
      using T = typename Var::value_type;
      Group<T>& g = group_for<T>(var.cols(), bind_variable(*opt_, var));
      const std::size_t index = g.tables.add(var.name(), map);
      auto m = std::make_unique<TableOf<Var>>(std::move(var), *engine_, g, index);
      g.members.push_back(m.get());
      tables_.push_back(m.get());
      members_of_tables_.push_back(m.get());
      table_group_.push_back(g);
      table_index_.push_back(index);
      members_.push_back(std::move(m));
    } else {
      auto m = std::make_unique<DenseOf<Var>>(std::move(var), *engine_, *opt_, map);
      dense_.push_back(m.get());
      members_.push_back(std::move(m));
    }
    return *members_.back();
  }

  /// Lays every group out (shared windows: collective) and places its
  /// tables' initial values and optimizer state.
  void prepare() override {
    for (auto& g : groups_) g->build();
  }

  /// A group's push starts, on the communication thread, once all its
  /// tables are ready: its own route, so its rows travel while the user
  /// computes the other gradients. A table whose gradient has a problem
  /// sends no rows; the step's agreement reports the problem.
  void ready(const Member& variable, const StepInfo&, Background& background) override {
    for (std::size_t i = 0; i < tables_.size(); ++i) {
      if (members_of_tables_[i]->identity() != variable.identity()) continue;
      GroupBase& g = table_group_[i];
      if (g.pushed || !g.mark_ready(table_index_[i])) return;
      g.pushed = true;
      background.post([this, &g] {
        auto shared = engine_->stats().shared(ShardedPS::name);
        detail::RouteLane* lane = &g.plan_push(shared, true);
        const detail::Span span("push: route (early)");
        detail::route_lanes(*engine_, &lane, 1, g.early_route,
                            detail::push_shape(detail::Fingerprint().add("push").add(g.identity()).value()),
                            [&](bool detailed) { return "group " + g.describe(detailed) + " (ready)"; });
      });
      return;
    }
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
    lanes_.clear();
    auto shared = engine_->stats().shared(ShardedPS::name);
    detail::Fingerprint word;
    word.add("push");
    {
      const detail::Span span("push: plan");
      for (auto& g : groups_)
        if (!g->pushed) {
          lanes_.push_back(&g->plan_push(shared, false));
          word.add(g->identity());
        }
    }
    if (lanes_.empty()) return;
    const detail::Span span("push: route");
    detail::route_lanes(*engine_, lanes_.data(), lanes_.size(), route_, detail::push_shape(word.value()),
                        [&](bool detailed) {
                          std::string out = "groups ";
                          bool first = true;
                          for (auto& g : groups_)
                            if (!g->pushed) {
                              out += (first ? "" : ", ") + g->describe(detailed);
                              first = false;
                            }
                          return out;
                        });
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
  /// variable, before any row moves. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup_bags(const Bags<V>* batch, std::size_t count) {
    using T = typename V::value_type;
    auto offsets = check_bags(*engine_, batch, count);
    auto record = std::make_unique<BagBatch<T>>();
    BagBatch<T>& b = *record;
    b.local = choose_pooling(batch, count, offsets);
    b.rows.resize(count);
    b.request_group.assign(count, 0);
    b.request_at.assign(count, 0);
    for (std::size_t i = 0; i < count; ++i) {
      TableOf<V>& t = table_of(*batch[i].var);
      b.vars.push_back(&batch[i].var->state());
      b.names.push_back(&t.name());
      b.bags.push_back(offsets[i].size() - 1);
    }
    // Pooled here: one plain lookup of their ids.
    std::vector<Bags<V>> here;
    std::vector<Lookup<V>> plain;
    for (std::size_t i = 0; i < count; ++i)
      if (b.local[i]) {
        b.request_at[i] = here.size();
        here.push_back(batch[i]);
        plain.emplace_back(*batch[i].var, batch[i].ids, batch[i].n);
      }
    if (!here.empty()) {
      LocalBags<T, space>& local = local_bags_.template of<T>();
      b.local_first = local.pooled();
      const auto looked_up = lookup(plain.data(), plain.size());
      const detail::Span span("bags: pooled locally");
      const auto pooled = local.pool(engine_->exec(), here.data(), here.size(), looked_up);
      for (std::size_t i = 0; i < count; ++i)
        if (b.local[i]) b.rows[i] = pooled[b.request_at[i]];
    }
    // Pooled at the owners.
    std::vector<std::vector<typename BagPool<T, Engine>::Request>> requests;
    std::vector<std::pair<const std::string*, std::uint64_t>> parts;
    detail::Fingerprint word;
    word.add("bags");
    for (std::size_t i = 0; i < count; ++i) {
      if (b.local[i]) continue;
      TableOf<V>& t = table_of(*batch[i].var);
      Group<T>& g = static_cast<Group<T>&>(t.group());
      auto at = std::find(b.groups.begin(), b.groups.end(), &g);
      if (at == b.groups.end()) {
        b.groups.push_back(&g);
        requests.emplace_back();
        at = b.groups.end() - 1;
      }
      const auto gi = static_cast<std::size_t>(at - b.groups.begin());
      const Bags<V>& q = batch[i];
      T* out = g.outputs.next(b.bags[i] * g.tables.cols()).data();
      b.request_group[i] = gi;
      b.request_at[i] = requests[gi].size();
      b.rows[i] = Rows<T, space>{out, b.bags[i], g.tables.cols()};
      requests[gi].push_back({t.index(), std::move(offsets[i]), q.ids, q.n, q.weights, q.combiner, out});
      parts.emplace_back(&t.name(), g.weight(q.n));
      word.add(g.tables.identity()).add(t.index()).add(static_cast<std::uint64_t>(q.combiner));
    }
    b.word = word.value();
    if (!b.groups.empty()) {
      std::vector<detail::RouteLane*> lanes;
      {
        const detail::Span span("bags: plan");
        for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
          BagPool<T, Engine>& pool = b.groups[gi]->next_bag_pool();
          pool.plan(b.groups[gi]->tables, std::move(requests[gi]));
          b.pools.push_back(&pool);
          lanes.push_back(&pool.entry_lane());
          lanes.push_back(&pool.segment_lane());
        }
      }
      auto shared = engine_->stats().shared(ShardedPS::name);
      for (const auto& [name, weight] : parts) shared.part(*name, weight);
      {
        const detail::Span span("bags: route");
        detail::route_lanes(*engine_, lanes.data(), lanes.size(), bag_route_, detail::lookup_shape(b.word),
                            [&](bool detailed) { return b.describe(detailed, "bags of "); });
      }
      {
        const detail::Span span("bags: owners pool and reply");
        for (std::size_t gi = 0; gi < b.groups.size(); ++gi) b.pools[gi]->serve(b.groups[gi]->tables);
        if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
      }
      const detail::Span span("bags: partial sums added");
      for (auto* pool : b.pools) pool->finish();
    }
    std::vector<Rows<T, space>> rows = b.rows;
    bag_batches_.push_back(std::move(record));
    return rows;
  }

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
  void bag_gradients(const BagGradient<V>* grads, std::size_t count) {
    using T = typename V::value_type;
    BagBatch<T>* b = nullptr;
    for (std::size_t i = bag_batches_.size(); i-- > 0 && !b;)
      if (!bag_batches_[i]->given) b = dynamic_cast<BagBatch<T>*>(bag_batches_[i].get());
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
          problem = detail::bag_gradient_problem(grads[i].var->name(), b->bags[i], b->rows[i].cols, grads[i].rows,
                                                 grads[i].cols);
      }
    }
    detail::agree(*engine_, problem);
    b->given = true;
    bag_gradients_given_ = true;
    for (std::size_t i = 0; i < count; ++i)
      if (b->local[i]) local_bags_.template of<T>().expand(engine_->exec(), b->local_first + b->request_at[i], grads[i]);
    if (b->groups.empty()) return;
    std::vector<std::vector<const T*>> per_group(b->groups.size());
    for (std::size_t gi = 0; gi < b->groups.size(); ++gi) per_group[gi].resize(b->pools[gi]->requests());
    std::vector<detail::RouteLane*> lanes;
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (std::size_t i = 0; i < count; ++i) {
      if (b->local[i]) continue;
      per_group[b->request_group[i]][b->request_at[i]] = grads[i].values;
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
      detail::route_lanes(*engine_, lanes.data(), lanes.size(), bag_route_,
                          detail::push_shape(detail::Fingerprint().add("bag gradients").add(b->word).value()),
                          [&](bool detailed) { return b->describe(detailed, "gradients of bags of "); });
    }
    const detail::Span span("bag gradients: owners expand");
    for (std::size_t gi = 0; gi < b->groups.size(); ++gi) b->pools[gi]->expand(b->groups[gi]->tables);
  }

  /// The rows of a batch of sparse variables: every group's keys in one
  /// route, then one reply per group (in flight together where the engine
  /// can), rows put in each caller's order. A bad id throws on every rank,
  /// naming its variable, before any row moves. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t count) {
    using T = typename V::value_type;
    Batch<T> b;
    gather(b, batch, count, false);
    // One booking for the whole lookup: its route and its replies.
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (const auto& [name, weight] : b.parts) shared.part(*name, weight);
    route(b);
    return serve(b);
  }

  /// Trainer::prefetch: a batched lookup whose route (validation, keys,
  /// sort, unique, and the ids to their owners: nothing that reads a row)
  /// runs now, on `background`, and whose rows are served by
  /// finish_lookup(). The ids are copied: the caller may reuse them at once.
  /// Its state (its groups' ahead_pull(), its own route buffers) is apart
  /// from plain lookups' and pushes', which may come between. One at a
  /// time. Collective.
  template <class V>
  void start_lookup(const Lookup<V>* batch, std::size_t count, Background& background) {
    using T = typename V::value_type;
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
      } catch (...) {
        b.failure = std::current_exception();  // rows() throws it, on every rank alike
      }
      b.routed = true;
    });
  }
  /// The rows of the batch start_lookup() began, as lookup() would return
  /// them now. Throws what its route threw (a bad id, ranks that prefetch
  /// different variables), on every rank. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> finish_lookup() {
    using T = typename V::value_type;
    std::unique_ptr<BatchBase> taken = std::move(ahead_);
    auto* b = dynamic_cast<Batch<T>*>(taken.get());
    PARALLAX_EXPECTS(b != nullptr, "ShardedPS: finish_lookup() without a start_lookup() of this element type");
    if (b->failure) std::rethrow_exception(b->failure);
    PARALLAX_EXPECTS(b->routed, "the prefetch's route never ran: the communication thread failed before it (see the "
                                "error the trainer threw then); prefetch the batch again");
    auto shared = engine_->stats().shared(ShardedPS::name);
    for (const auto& [name, weight] : b->parts) shared.part(*name, weight);
    // Rows read in place: the route came before this step's update, so the
    // owners say they are done writing once more (a route of headers alone).
    bool direct = false;
    for (auto* g : b->groups) direct = direct || g->tables.reads_directly();
    if (direct && engine_->size() > 1) {
      const detail::Span span("prefetch: owners updated");
      for (auto* g : b->groups) g->tables.sync_shard();
      const auto word = detail::Fingerprint().add("prefetch rows").add(b->word).value();
      detail::route_lanes(*engine_, nullptr, 0, ahead_route_, detail::prefetch_shape(word),
                          [&](bool detailed) { return b->describe(detailed); });
    }
    return serve(*b);
  }
  /// Forgets the batch start_lookup() began (its route has run).
  void cancel_lookup() override { ahead_.reset(); }

 private:
  // ---------------------------------------------------------------- sparse tables

  /// What a group does in a step, whatever its element type.
  class GroupBase {
   public:
    virtual ~GroupBase() = default;
    virtual void build() = 0;
    /// Plans this step's push of every table. `validate`: a table whose
    /// gradient has a problem sends no rows (its problem waits for the
    /// step's agreement).
    virtual detail::RouteLane& plan_push(CommStats::Shared& route, bool validate) = 0;
    virtual std::uint64_t identity() const = 0;
    virtual std::string describe(bool detailed) const = 0;
    /// Marks table t ready; true when every table of the group is.
    bool mark_ready(std::size_t t) {
      if (ready_.size() <= t) ready_.resize(t + 1, false);
      if (!ready_[t]) {
        ready_[t] = true;
        ++ready_count_;
      }
      return ready_count_ == tables_count();
    }
    void reset_ready() {
      ready_.assign(ready_.size(), false);
      ready_count_ = 0;
      pushed = false;
    }
    virtual std::size_t tables_count() const = 0;
    virtual void finish_push() = 0;
    virtual double square_sum() = 0;
    virtual void update(const StepInfo&) = 0;
    virtual void clear() = 0;
    bool pushed = false;  // this step's push has started (ready())
    /// The buffers of a push ready() started: the group's own, since the
    /// rows it brings are summed where they landed, after other routes.
    detail::RouteBuffers<space> early_route;

   private:
    std::vector<bool> ready_;
    std::size_t ready_count_ = 0;
  };

  /// What the synchronizer asks of a sharded table, whatever its type.
  class Table {
   public:
    virtual ~Table() = default;
    virtual std::optional<std::string> problem() = 0;
    virtual bool has_gradient() const = 0;
  };

  template <class T>
  class TableMember : public Table {
   public:
    /// Coalesces this step's gradient and says where it lies.
    virtual typename TableGroup<T, Engine>::Push push() = 0;
    virtual void fill_initial(TableGroup<T, Engine>& tables) = 0;
    virtual void clear() = 0;
  };

  template <class T>
  class Group final : public GroupBase {
   public:
    Group(Engine& engine, const optim::Bound<Optimizer>& bound, std::size_t cols, const ShardedOptions& o)
        : tables(engine, cols, o.local_aggregation, o.shared_memory), engine_(&engine), opt_(bound) {}
    const optim::Bound<Optimizer>& bound() const noexcept { return opt_; }

    void build() override {
      tables.build();
      for (TableMember<T>* m : members) m->fill_initial(tables);
      state.reset(*opt_, tables.shard().size());
    }
    std::size_t tables_count() const override { return members.size(); }
    std::uint64_t identity() const override { return tables.identity(); }
    std::string describe(bool detailed) const override { return tables.describe(detailed); }
    detail::RouteLane& plan_push(CommStats::Shared& route, bool validate) override {
      pushes_.clear();
      for (std::size_t t = 0; t < members.size(); ++t) {
        if (validate && members[t]->problem()) pushes_.push_back({t, nullptr, nullptr, 0});
        else pushes_.push_back(members[t]->push());
        route.part(tables.name(t), weight(pushes_.back().k));
      }
      // Local aggregation's first hop carries this group's tables alone.
      std::optional<CommStats::Shared> hop;
      if (tables.aggregates()) {
        hop.emplace(engine_->stats(), ShardedPS::name);
        for (std::size_t t = 0; t < members.size(); ++t) hop->part(tables.name(t), weight(pushes_[t].k));
      }
      return tables.plan_push(pushes_.data(), pushes_.size());
    }
    /// What k rows of this group put on the wire: the share a table's bytes take.
    std::uint64_t weight(std::size_t k) const { return k * (sizeof(index_t) + tables.cols() * sizeof(T)); }
    void finish_push() override { rows_ = tables.finish_push(local_rows_, sums_); }
    double square_sum() override { return detail::sum_of_squares(engine_->exec(), sums_.data(), rows_ * tables.cols()); }
    void update(const StepInfo& info) override {
      auto& ex = engine_->exec();
      optim::apply_rows(ex, *opt_, info.step, tables.shard().data(), local_rows_.data(), sums_.data(), rows_,
                        tables.cols(), state, static_cast<T>(info.scale));
      ex.synchronize();
    }
    void clear() override {
      for (TableMember<T>* m : members) m->clear();
      outputs.release();
      tables.clear_owned_rows();
      bag_pools_used_ = 0;
      this->reset_ready();
    }
    /// A BagPool for this step's next bag lookup of the group (kept, with
    /// what its owners hold for the backward pass, until clear()).
    BagPool<T, Engine>& next_bag_pool() {
      if (bag_pools_used_ == bag_pools_.size()) bag_pools_.push_back(std::make_unique<BagPool<T, Engine>>(*engine_));
      return *bag_pools_[bag_pools_used_++];
    }

    TableGroup<T, Engine> tables;
    std::vector<TableMember<T>*> members;  // by table index
    optim::State<Optimizer, T, space> state;  // shaped like the group shard
    LookupBuffers<T, space> outputs;

   private:
    Engine* engine_;
    optim::Bound<Optimizer> opt_;  // every table's: the trainer's optimizer, whose learning rate changes
    std::vector<typename TableGroup<T, Engine>::Push> pushes_;
    std::vector<std::unique_ptr<BagPool<T, Engine>>> bag_pools_;
    std::size_t bag_pools_used_ = 0;
    Buffer<index_t, space> local_rows_;
    Buffer<T, space> sums_;
    std::size_t rows_ = 0;
  };

  /// A sparse variable, table `index` of its group.
  template <class Var>
  class TableOf final : public MemberOf<Var>, public TableMember<typename Var::value_type> {
    using T = typename Var::value_type;

   public:
    TableOf(Var var, Engine& engine, Group<T>& group, std::size_t index)
        : MemberOf<Var>(std::move(var), ShardedPS::name), engine_(&engine), group_(&group), index_(index) {}

    GroupBase& group() noexcept { return *group_; }
    std::size_t index() const noexcept { return index_; }

    std::optional<std::string> problem() override { return gradient().find_problem(engine_->exec()); }
    bool has_gradient() const override { return this->var_.state().sparse_grad.touched(); }
    typename TableGroup<T, Engine>::Push push() override {
      auto& g = gradient();
      g.coalesce(engine_->exec());
      return {index_, g.indices(), g.values(), g.size()};
    }
    void fill_initial(TableGroup<T, Engine>& tables) override {
      const detail::InitRule rule = this->var_.rule();
      const std::size_t cols = this->var_.cols();
      auto& ex = engine_->exec();
      tables.initialize(index_, [&](const index_t* rows, std::size_t k, T* out) {
        for_each(ex, k * cols, detail::FillInit<T>{rule, out, cols, 0, rows});
        ex.synchronize();
      });
    }
    void clear() override {
      gradient().clear();
      this->var_.state().grad_touched = false;
    }

    std::size_t stored_rows() const override { return group_->tables.shard_rows(index_); }
    bool in_shared_memory() const override { return group_->tables.shared(); }
    void fetch(void* out) override {
      auto scope = engine_->stats().scope(this->var_.name(), ShardedPS::name);
      DenseShards<T, Engine> layout(*engine_, group_->tables.map(index_), this->var_.cols());
      Buffer<T, space> full(this->var_.shape().elements());
      layout.gather(group_->tables.shard_of(index_), full.data());
      space_traits<space>::copy_to_host(out, full.data(), full.bytes());
    }
    int saved_partitions() const override { return group_->tables.map(index_).parts; }
    void save(detail::AtomicFile& out) override {
      const std::size_t offset = group_->tables.base(index_) * this->var_.cols();
      const auto slots = slots_of(group_->state, offset);
      save_state<T, space>(out, group_->tables.shard_of(index_), slots.data(), Optimizer::slots,
                           stored_rows() * this->var_.cols());
    }
    void load(detail::CheckpointReader& in, std::size_t index) override {
      const std::size_t offset = group_->tables.base(index_) * this->var_.cols();
      const auto slots = slots_of(group_->state, offset);
      load_state<T, space>(in, index, &group_->tables.map(index_), engine_->rank(), this->var_.rows(),
                           this->var_.cols(), group_->tables.shard_of(index_), slots.data(), Optimizer::slots);
    }

   private:
    SparseGrad<T, space>& gradient() { return this->var_.state().sparse_grad; }

    Engine* engine_;
    Group<T>* group_;
    std::size_t index_;
  };

  // ---------------------------------------------------------------- batched lookups

  class BatchBase {
   public:
    virtual ~BatchBase() = default;
  };
  /// A batched lookup of tables of element type T, from gather() to serve().
  template <class T>
  class Batch final : public BatchBase {
   public:
    using Request = typename TableGroup<T, Engine>::Request;
    using Pull = typename TableGroup<T, Engine>::Pull;

    bool ahead = false;  // a lookup ahead (start_lookup): its groups' ahead_pull(), the ahead route
    std::vector<Group<T>*> groups;  // in the order the batch first names them
    std::vector<std::vector<Request>> requests;  // per group
    std::vector<std::size_t> request_group, request_at;  // per request of the batch: its group, its place there
    std::vector<std::pair<const std::string*, std::uint64_t>> parts;  // per request: its table's name, share of the bytes
    std::vector<detail::RouteLane*> lanes;
    std::uint64_t word = 0;  // the route's shape: each request's (group, table), in order
    Buffer<index_t, space> ids;  // a lookup ahead's copy of the ids
    std::exception_ptr failure;  // what a lookup ahead's route threw
    bool routed = false;         // a lookup ahead's route ran

    Pull& pull(Group<T>& g) noexcept { return ahead ? g.tables.ahead_pull() : g.tables.plain_pull(); }
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

  /// Per request of a bag batch: whether it is pooled locally. Requests of
  /// Pooling::automatic weigh the bytes both ways would move (this rank's
  /// sends: ids and pairs, or unique ids, each way), added over the ranks,
  /// so every rank picks alike; the ranks check first that they look up
  /// the same tables with the same pooling (else they throw, on every rank).
  template <class V>
  std::vector<bool> choose_pooling(const Bags<V>* batch, std::size_t count,
                                   const std::vector<std::vector<index_t>>& offsets) {
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
      const auto& tables = static_cast<Group<T>&>(t.group()).tables;
      const PartitionMap& map = tables.map(t.index());
      std::vector<index_t> ids(q.n);
      if (q.n) space_traits<space>::copy_to_host(ids.data(), q.ids, q.n * sizeof(index_t));
      const int me = engine_->rank();
      const std::int64_t row = static_cast<std::int64_t>(tables.cols() * sizeof(T));
      const std::int64_t per_id = q.combiner == Combiner::weighted_sum ? 12 : 8;
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
      // At the owners: the ids, a count and a row back per pair; a row and its
      // count per pair pushed. Here: a key and a row back per unique id (rows
      // read in place: a row per id, repeats too), and each pushed.
      cost.push_back(per_id * remote + pairs * (16 + 2 * row));
      cost.push_back((tables.reads_directly() ? remote * row : unique * (8 + row)) + unique * (8 + row));
    }
    if (automatic.empty()) return local;
    std::int64_t agree[2] = {static_cast<std::int64_t>(word.value()), -static_cast<std::int64_t>(word.value())};
    {
      auto scope = engine_->stats().scope("", "control");
      engine_->allreduce(agree, agree, 2, DataType::i64, ReduceOp::min);
    }
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

  /// A lookup_bags() batch, kept until clear() for its gradient.
  class BagBatchBase {
   public:
    virtual ~BagBatchBase() = default;
    bool given = false;  // its gradient was given
  };
  template <class T>
  class BagBatch final : public BagBatchBase {
   public:
    std::vector<Group<T>*> groups;  // in the order the batch first names them
    std::vector<BagPool<T, Engine>*> pools;  // per group
    std::vector<bool> local;        // per request: pooled here (LocalBags), not at the owners
    std::size_t local_first = 0;    // the LocalBags index of the first request pooled here
    std::vector<const void*> vars;  // per request: its variable's state
    std::vector<const std::string*> names;
    // Per request: its group, its place there (pooled here: among those pooled here), its bags.
    std::vector<std::size_t> request_group, request_at, bags;
    std::vector<Rows<T, space>> rows;  // per request: the pooled rows
    std::uint64_t word = 0;  // the route's shape: each request's (group, table), in order
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

  /// Sorts a batch's requests into their groups (and, ahead, copies the ids).
  template <class V, class T = typename V::value_type>
  void gather(Batch<T>& b, const Lookup<V>* batch, std::size_t count, bool ahead) {
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
      if (ahead && batch[i].n) {
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
  template <class T>
  void route(Batch<T>& b) {
    b.lanes.clear();
    index_t bad = detail::no_problem;
    std::size_t bad_lane = 0, bad_table = 0;
    detail::Span plan(b.ahead ? "prefetch: plan" : "lookup: plan");
    for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
      auto& p = b.pull(*b.groups[gi]);
      b.lanes.push_back(&b.groups[gi]->tables.plan_lookup(b.requests[gi].data(), b.requests[gi].size(), p));
      if (bad == detail::no_problem && p.problem() != detail::no_problem) {
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
    if (auto problem = detail::route_lanes(*engine_, b.lanes.data(), b.lanes.size(), b.ahead ? ahead_route_ : route_,
                                           b.ahead ? detail::prefetch_shape(b.word) : detail::lookup_shape(b.word),
                                           [&](bool detailed) { return b.describe(detailed); }, bad, bad_lane,
                                           bad_table))
      b.groups[problem->lane]->tables.fail(*problem, "lookup id");
  }

  /// The owners serve a routed batch's rows as their shards hold them now;
  /// each group's rows land in one buffer, request after request, valid
  /// until the step's clear().
  template <class T>
  std::vector<Rows<T, space>> serve(Batch<T>& b) {
    for (std::size_t gi = 0; gi < b.groups.size(); ++gi) {
      Group<T>& g = *b.groups[gi];
      std::size_t total = 0;
      for (const auto& r : b.requests[gi]) total += r.n;
      T* out = g.outputs.next(total * g.tables.cols()).data();
      for (std::size_t r = 0; r < b.requests[gi].size(); ++r) {
        b.requests[gi][r].out = out;
        g.tables.place(b.pull(g), r, out);
        out += b.requests[gi][r].n * g.tables.cols();
      }
    }
    {
      const detail::Span span("lookup: serve and reply");
      for (auto* g : b.groups) g->tables.start_reply(b.pull(*g));
      if constexpr (engine::supports_v<Engine, engine::op_start_alltoallv>) engine_->wait_started();
    }
    const detail::Span span("lookup: rows in order");
    for (auto* g : b.groups) g->tables.finish_lookup(b.pull(*g));

    std::vector<Rows<T, space>> rows;
    rows.reserve(b.request_group.size());
    for (std::size_t i = 0; i < b.request_group.size(); ++i) {
      const auto& r = b.requests[b.request_group[i]][b.request_at[i]];
      rows.push_back(Rows<T, space>{r.out, r.n, b.groups[b.request_group[i]]->tables.cols()});
    }
    return rows;
  }

  /// The group that stores sparse variables of type T and `cols` columns
  /// updated alike (one state buffer, one update call: the same binding to
  /// the optimizer); a new one per table when grouping is off.
  template <class T>
  Group<T>& group_for(std::size_t cols, const optim::Bound<Optimizer>& bound) {
    if (options_.sharded.group_tables)
      for (std::size_t i = 0; i < groups_.size(); ++i)
        if (group_types_[i] == &typeid(T) && group_cols_[i] == cols &&
            static_cast<Group<T>&>(*groups_[i]).bound() == bound)
          return static_cast<Group<T>&>(*groups_[i]);
    groups_.push_back(std::make_unique<Group<T>>(*engine_, bound, cols, options_.sharded));
    group_types_.push_back(&typeid(T));
    group_cols_.push_back(cols);
    return static_cast<Group<T>&>(*groups_.back());
  }

  template <class V>
  TableOf<V>& table_of(V& var) {
    for (auto& m : members_)
      if (m->identity() == &var.state()) return static_cast<TableOf<V>&>(*m);
    throw error(detail::concat("variable '", var.name(), "' is not synchronised by ShardedPS"));
  }

  // ---------------------------------------------------------------- dense

  class Dense {
   public:
    virtual ~Dense() = default;
    virtual bool has_gradient() const = 0;
    virtual void reduce() = 0;
    virtual double square_sum() = 0;
    virtual void update(const StepInfo&) = 0;
    virtual void clear() = 0;
  };

  /// A dense variable: owners hold the master rows and the optimizer state;
  /// every rank keeps a replica for its forward pass.
  template <class Var>
  class DenseOf final : public MemberOf<Var>, public Dense {
    using T = typename Var::value_type;

   public:
    DenseOf(Var var, Engine& engine, const Optimizer& opt, PartitionMap map)
        : MemberOf<Var>(std::move(var), ShardedPS::name), engine_(&engine), opt_(bind_variable(opt, this->var_)),
          shards_(engine, map, this->var_.cols()) {
      shards_.take_shard(this->var_.state().value.data(), shards_.shard().data());
      state_.reset(*opt_, shards_.shard_elements());
      sum_.resize_discard(shards_.shard_elements());
    }
    bool has_gradient() const override { return this->var_.state().grad_touched; }
    void reduce() override {
      auto scope = engine_->stats().scope(this->var_.name(), ShardedPS::name);
      shards_.reduce(this->var_.state().grad.data(), sum_.data());
    }
    double square_sum() override { return detail::sum_of_squares(engine_->exec(), sum_.data(), shards_.shard_elements()); }
    void update(const StepInfo& info) override {
      auto scope = engine_->stats().scope(this->var_.name(), ShardedPS::name);
      auto& ex = engine_->exec();
      optim::apply_dense(ex, *opt_, info.step, shards_.shard().data(), sum_.data(), shards_.shard_elements(), state_,
                         static_cast<T>(info.scale));
      ex.synchronize();
      shards_.gather(shards_.shard().data(), this->var_.state().value.data());
    }
    void clear() override {
      this->var_.state().grad.zero();
      this->var_.state().grad_touched = false;
    }

    std::size_t stored_rows() const override { return shards_.map().shard_rows(engine_->rank()); }
    void fetch(void* out) override {
      const auto& v = this->var_.state().value;
      space_traits<space>::copy_to_host(out, v.data(), v.bytes());
    }
    int saved_partitions() const override { return shards_.map().parts; }
    void save(detail::AtomicFile& out) override {
      const auto slots = slots_of(state_);
      save_state<T, space>(out, shards_.shard().data(), slots.data(), Optimizer::slots, shards_.shard_elements());
    }
    void load(detail::CheckpointReader& in, std::size_t index) override {
      const int me = engine_->rank();
      const auto slots = slots_of(state_);
      load_state<T, space>(in, index, &shards_.map(), me, this->var_.rows(), this->var_.cols(),
                           shards_.shard().data(), slots.data(), Optimizer::slots);
      load_block<T, space>(in, index, 0, nullptr, me, this->var_.rows(), this->var_.cols(),
                           this->var_.state().value.data());
    }

   private:
    Engine* engine_;
    optim::Bound<Optimizer> opt_;  // the trainer's optimizer: its learning rate changes between steps
    DenseShards<T, Engine> shards_;
    optim::State<Optimizer, T, space> state_;
    Buffer<T, space> sum_;
  };

  Engine* engine_;
  const Optimizer* opt_;  // the trainer's: its learning rate changes between steps
  TrainerOptions options_;
  std::vector<std::unique_ptr<GroupBase>> groups_;
  std::vector<const std::type_info*> group_types_;
  std::vector<std::size_t> group_cols_;
  std::vector<std::unique_ptr<Member>> members_;  // registration order
  std::vector<Table*> tables_;
  std::vector<const Member*> members_of_tables_;                  // per table: its member
  std::vector<std::reference_wrapper<GroupBase>> table_group_;  // per table: its group
  std::vector<std::size_t> table_index_;                        // per table: its index in the group
  std::vector<Dense*> dense_;
  std::vector<detail::RouteLane*> lanes_;
  detail::RouteBuffers<space> route_;  // the push's route, and batched lookups'
  detail::RouteBuffers<space> ahead_route_;  // a lookup ahead's route (start_lookup)
  std::unique_ptr<BatchBase> ahead_;         // the lookup ahead, from start_lookup() to finish_lookup()
  detail::RouteBuffers<space> bag_route_;    // bag lookups' and their gradients' routes
  std::vector<std::unique_ptr<BagBatchBase>> bag_batches_;  // this step's lookup_bags(), in order
  LocalBagsOfEachType<space> local_bags_;                    // its requests pooled here
  bool bag_gradients_given_ = false;
};

}  // namespace parallax::policy
