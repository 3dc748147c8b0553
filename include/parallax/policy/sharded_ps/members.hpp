#pragma once
/// @file
/// ShardedSynchronizer's members (declared in steps.hpp): its sparse
/// variables as tables of a TableGroup (Group, one per element type and
/// width updated alike; TableOf, one per variable) and its dense variables
/// sharded over their owners (DenseOf).

#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/bag_pool.hpp>
#include <parallax/policy/sharded_ps/dense_shards.hpp>
#include <parallax/policy/sharded_ps/steps.hpp>
#include <parallax/policy/sharded_ps/table_group.hpp>
#include <parallax/space.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace parallax::policy {

// ---------------------------------------------------------------- sparse tables

/// What a group does in a step, whatever its element type.
template <class Engine, class Optimizer>
class ShardedSynchronizer<Engine, Optimizer>::GroupBase {
 public:
  virtual ~GroupBase() = default;
  virtual void build() = 0;
  /// Plans this step's push of every table. `validate`: a table whose
  /// gradient has a problem sends no rows (its problem waits for the
  /// step's agreement).
  virtual sharded::RouteLane& plan_push(CommStats::Shared& route, bool validate) = 0;
  virtual std::uint64_t identity() const = 0;
  virtual std::string describe(bool detailed) const = 0;
  /// Marks table t ready; true when every table of the group is.
  bool mark_ready(std::size_t t) {
    if (ready_.size() <= t) ready_.resize(t + 1, false);
    if (!ready_[t]) {
      ready_[t] = true;
      ++ready_count_;
    }
    return all_ready();
  }
  /// Every table of the group was marked ready this step.
  bool all_ready() const { return ready_count_ == tables_count(); }
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
  sharded::RouteBuffers<space> early_route;

 private:
  std::vector<bool> ready_;
  std::size_t ready_count_ = 0;
};

/// What the synchronizer asks of a sharded table, whatever its type.
template <class Engine, class Optimizer>
class ShardedSynchronizer<Engine, Optimizer>::Table {
 public:
  virtual ~Table() = default;
  /// The group that stores the table, and its index there.
  virtual GroupBase& group() noexcept = 0;
  virtual std::size_t index() const noexcept = 0;
  virtual std::optional<std::string> problem() = 0;
  virtual bool has_gradient() const = 0;
};

/// S: the tables' storage type (their value type computed in: compute_t<S>).
template <class Engine, class Optimizer>
template <class S>
class ShardedSynchronizer<Engine, Optimizer>::TableMember : public Table {
 public:
  using Tables = sharded::TableGroup<compute_t<S>, Engine, S>;
  /// Coalesces this step's gradient and says where it lies.
  virtual typename Tables::Push push() = 0;
  virtual void fill_initial(Tables& tables) = 0;
  virtual void clear() = 0;
};

/// S: the element type the tables store; T = compute_t<S>, the one they
/// are looked up, pushed, summed and updated in (float for bf16 / fp16).
template <class Engine, class Optimizer>
template <class S>
class ShardedSynchronizer<Engine, Optimizer>::Group final : public GroupBase {
 public:
  using T = compute_t<S>;
  Group(Engine& engine, const optim::Bound<Optimizer>& bound, std::size_t cols, const ShardedOptions& o,
        Rounding rounding, Compression compress)
      : tables(engine, cols, o.local_aggregation, o.shared_memory, compress), engine_(&engine), opt_(bound),
        rounding_(rounding) {
    tables.serve_early(o.early_rows);
  }
  const optim::Bound<Optimizer>& bound() const noexcept { return opt_; }
  /// How updates round a 16-bit group's rows (every table's own: tables
  /// that round otherwise are not grouped).
  Rounding rounding() const noexcept { return rounding_; }

  void build() override {
    tables.build();
    for (TableMember<S>* m : members) m->fill_initial(tables);
    state.reset(*opt_, tables.shard().size());
  }
  std::size_t tables_count() const override { return members.size(); }
  std::uint64_t identity() const override { return tables.identity(); }
  std::string describe(bool detailed) const override { return tables.describe(detailed); }
  sharded::RouteLane& plan_push(CommStats::Shared& route, bool validate) override {
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
  /// The global id of each of the rows_ updated rows (stochastic rounding's
  /// draws hash them, so they do not depend on where a row lives).
  const index_t* global_ids() {
    std::vector<index_t> local(rows_), ids(rows_);
    space_traits<space>::copy_to_host(local.data(), local_rows_.data(), rows_ * sizeof(index_t));
    const int me = engine_->rank();
    std::size_t t = 0;
    for (std::size_t j = 0; j < rows_; ++j) {  // ascending: the tables in order
      const auto r = static_cast<std::size_t>(local[j]);
      while (t + 1 < tables.tables() && r >= tables.base(t + 1)) ++t;
      ids[j] = tables.map(t).global_row(me, r - tables.base(t));
    }
    global_ids_ = Buffer<index_t, space>::from_host(ids);
    return global_ids_.data();
  }
  void finish_push() override { rows_ = tables.finish_push(local_rows_, sums_); }
  double square_sum() override { return detail::sum_of_squares(engine_->exec(), sums_.data(), rows_ * tables.cols()); }
  void update(const StepInfo& info) override {
    auto& ex = engine_->exec();
    if constexpr (is_half_v<S>) {
      const index_t* ids = rounding_.mode == Rounding::stochastic ? global_ids() : local_rows_.data();
      optim::apply_rows(ex, *opt_, info.step, tables.shard().data(), local_rows_.data(), ids, sums_.data(), rows_,
                        tables.cols(), state, static_cast<T>(info.scale), rounding_);
    } else {
      optim::apply_rows(ex, *opt_, info.step, tables.shard().data(), local_rows_.data(), sums_.data(), rows_,
                        tables.cols(), state, static_cast<T>(info.scale));
    }
    ex.synchronize();
  }
  void clear() override {
    for (TableMember<S>* m : members) m->clear();
    outputs.release();
    tables.clear_owned_rows();
    bag_pools_used_ = 0;
    this->reset_ready();
  }
  /// A BagPool for this step's next bag lookup of the group (kept, with
  /// what its owners hold for the backward pass, until clear()).
  sharded::BagPool<T, Engine, S>& next_bag_pool() {
    if (bag_pools_used_ == bag_pools_.size()) bag_pools_.push_back(std::make_unique<sharded::BagPool<T, Engine, S>>(*engine_));
    return *bag_pools_[bag_pools_used_++];
  }
  /// The BagPool of a lookup of bags ahead (Trainer::prefetch), apart from
  /// the step's: routed during one step, served in a later one.
  sharded::BagPool<T, Engine, S>& ahead_bag_pool() {
    if (!ahead_bag_pool_) ahead_bag_pool_ = std::make_unique<sharded::BagPool<T, Engine, S>>(*engine_);
    return *ahead_bag_pool_;
  }
  /// The lookup ahead's pool joins this step's (kept until clear() for
  /// the gradient); the next lookup ahead gets another.
  void adopt_ahead_bag_pool() {
    if (bag_pools_used_ == bag_pools_.size()) bag_pools_.push_back(nullptr);
    std::swap(bag_pools_[bag_pools_used_++], ahead_bag_pool_);
  }

  sharded::TableGroup<T, Engine, S> tables;
  std::vector<TableMember<S>*> members;  // by table index
  optim::State<Optimizer, T, space> state;  // shaped like the group shard, in T
  LookupBuffers<T, space> outputs;

 private:
  Engine* engine_;
  optim::Bound<Optimizer> opt_;  // every table's: the trainer's optimizer, whose learning rate changes
  std::vector<typename sharded::TableGroup<T, Engine, S>::Push> pushes_;
  std::vector<std::unique_ptr<sharded::BagPool<T, Engine, S>>> bag_pools_;
  std::size_t bag_pools_used_ = 0;
  std::unique_ptr<sharded::BagPool<T, Engine, S>> ahead_bag_pool_;
  Buffer<index_t, space> local_rows_;
  Buffer<T, space> sums_;
  std::size_t rows_ = 0;
  Rounding rounding_;
  Buffer<index_t, space> global_ids_;  // global_ids()
};

/// A sparse variable, table `index` of its group.
template <class Engine, class Optimizer>
template <class Var>
class ShardedSynchronizer<Engine, Optimizer>::TableOf final : public MemberOf<Var>,
                                                               public TableMember<storage_type_t<Var>> {
  using T = typename Var::value_type;
  using S = storage_type_t<Var>;
  using Tables = typename TableMember<S>::Tables;

 public:
  TableOf(Var var, Engine& engine, Group<S>& group, std::size_t index)
      : MemberOf<Var>(std::move(var), ShardedPS::name), engine_(&engine), group_(&group), index_(index) {}

  GroupBase& group() noexcept override { return *group_; }
  std::size_t index() const noexcept override { return index_; }

  std::optional<std::string> problem() override { return gradient().find_problem(engine_->exec()); }
  bool has_gradient() const override { return this->var_.state().sparse_grad.touched(); }
  typename Tables::Push push() override {
    auto& g = gradient();
    g.coalesce(engine_->exec());
    return {index_, g.indices(), g.values(), g.size()};
  }
  void fill_initial(Tables& tables) override {
    const detail::InitRule rule = this->var_.rule();
    const std::size_t cols = this->var_.cols();
    auto& ex = engine_->exec();
    tables.initialize(index_, [&](const index_t* rows, std::size_t k, S* out) {
      for_each(ex, k * cols, detail::FillInit<S>{rule, out, cols, 0, rows});
      ex.synchronize();
    });
  }
  void clear() override {
    gradient().clear();
    this->var_.state().grad_touched = false;
  }

  std::size_t stored_rows() const override { return group_->tables.shard_rows(index_); }
  bool in_shared_memory() const override { return group_->tables.shared(); }
  /// The rows as T (16-bit rows widened, exactly, before they are gathered).
  void fetch(void* out) override {
    auto scope = engine_->stats().scope(this->var_.name(), ShardedPS::name);
    sharded::DenseShards<T, Engine> layout(*engine_, group_->tables.map(index_), this->var_.cols());
    Buffer<T, space> full(this->var_.shape().elements());
    if constexpr (is_half_v<S>) {
      auto& ex = engine_->exec();
      const std::size_t n = stored_rows() * this->var_.cols();
      Buffer<T, space> wide(n);
      if (n) for_each(ex, n, detail::Convert<T, S>{group_->tables.shard_of(index_), wide.data()});
      ex.synchronize();
      layout.gather(wide.data(), full.data());
    } else {
      layout.gather(group_->tables.shard_of(index_), full.data());
    }
    space_traits<space>::copy_to_host(out, full.data(), full.bytes());
  }
  int saved_partitions() const override { return group_->tables.map(index_).parts; }
  void save(detail::AtomicFile& out) override {
    const std::size_t offset = group_->tables.base(index_) * this->var_.cols();
    const auto slots = slots_of(group_->state, offset);
    save_stored<T, S, space>(engine_->exec(), out, group_->tables.shard_of(index_), slots.data(), Optimizer::slots,
                             stored_rows() * this->var_.cols());
  }
  void load(detail::CheckpointReader& in, std::size_t index) override {
    const std::size_t offset = group_->tables.base(index_) * this->var_.cols();
    const auto slots = slots_of(group_->state, offset);
    load_stored<T, S, space>(engine_->exec(), in, index, &group_->tables.map(index_), engine_->rank(),
                             this->var_.rows(), this->var_.cols(), group_->tables.shard_of(index_), slots.data(),
                             Optimizer::slots, stored_rows() * this->var_.cols());
  }

 private:
  SparseGrad<T, space>& gradient() { return this->var_.state().sparse_grad; }

  Engine* engine_;
  Group<S>* group_;
  std::size_t index_;
};

/// The group that stores sparse variables of storage type S and `cols`
/// columns updated alike (one state buffer, one update call: the same
/// binding to the optimizer, and for 16-bit tables the same rounding); a
/// new one per table when grouping is off.
template <class Engine, class Optimizer>
template <class S>
auto ShardedSynchronizer<Engine, Optimizer>::group_for(std::size_t cols, const optim::Bound<Optimizer>& bound,
                                                       Rounding rounding) -> Group<S>& {
  auto same = [&](Rounding r) { return !is_half_v<S> || (r.mode == rounding.mode && r.seed == rounding.seed); };
  if (options_.sharded.group_tables)
    for (std::size_t i = 0; i < groups_.size(); ++i)
      if (group_types_[i] == &typeid(S) && group_cols_[i] == cols &&
          static_cast<Group<S>&>(*groups_[i]).bound() == bound && same(static_cast<Group<S>&>(*groups_[i]).rounding()))
        return static_cast<Group<S>&>(*groups_[i]);
  groups_.push_back(std::make_unique<Group<S>>(*engine_, bound, cols, options_.sharded, rounding, options_.compress));
  group_types_.push_back(&typeid(S));
  group_cols_.push_back(cols);
  return static_cast<Group<S>&>(*groups_.back());
}

template <class Engine, class Optimizer>
template <class V>
auto ShardedSynchronizer<Engine, Optimizer>::table_of(V& var) -> TableOf<V>& {
  return tables_.template of<TableOf<V>>(var, ShardedPS::name);
}

// ---------------------------------------------------------------- dense

template <class Engine, class Optimizer>
class ShardedSynchronizer<Engine, Optimizer>::Dense {
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
template <class Engine, class Optimizer>
template <class Var>
class ShardedSynchronizer<Engine, Optimizer>::DenseOf final : public MemberOf<Var>, public Dense {
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
  double square_sum() override {
    return detail::sum_of_squares(engine_->exec(), sum_.data(), shards_.shard_elements());
  }
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
  sharded::DenseShards<T, Engine> shards_;
  optim::State<Optimizer, T, space> state_;
  Buffer<T, space> sum_;
};

}  // namespace parallax::policy
