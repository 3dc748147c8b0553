#pragma once
/// @file
/// AsyncPS's synchronizer: every variable is cut into partitions (as
/// ShardedPS cuts them) whose owners keep the rows, with their optimizer
/// state, in a shared-memory window; every row has a lock beside it. A rank
/// reads the rows it looks up straight from their owners' shards and
/// applies its own pushes to them, each row under its lock, so a push is
/// applied exactly once, when it is made, and no owner has to be inside
/// parallax for its rows to be served: no progress thread and no spare core
/// are needed. After a step's pushes a rank ticks its clock and waits for
/// the staleness bound (clock.hpp).
///
/// Row rule: a reader holds a row's lock while it copies the row, a writer
/// while it applies the optimizer to the row and its state. A lookup of
/// several rows is not atomic across rows (another rank's push may land
/// between two of them), as in every asynchronous parameter server.
///
/// A table stored in 16 bits (bf16, fp16) keeps its rows so in the shard,
/// with its optimizer state in float beside them: a lookup widens the rows
/// it reads, a push applies the optimizer in float and stores each value
/// with the table's rounding (optim's store_rounded: the draws hash the
/// step, the row's id and the column).
///
/// Across hosts (the RMA route, rma.hpp) the shards live in one-sided
/// windows instead, and the owner's passive-target lock takes the row
/// locks' place: a lookup reads each owner's rows under its shared lock, a
/// push reads its rows and their optimizer state under the exclusive lock,
/// applies the optimizer here (the same rule in the same order as the
/// shared-memory route) and writes them back before the unlock.

#include <parallax/detail/fault.hpp>
#include <parallax/detail/shared_window.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/async_ps.hpp>
#include <parallax/policy/async_ps/bags.hpp>
#include <parallax/policy/async_ps/clock.hpp>
#include <parallax/policy/async_ps/rma.hpp>
#include <parallax/policy/asynchronous.hpp>
#include <parallax/policy/members.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

template <class Engine, class Optimizer>
class AsyncSynchronizer final : public Synchronizer<Engine>, public Asynchronous {
 public:
  using space = engine::space_of_t<Engine>;
  static_assert(std::is_same_v<space, HostSpace>, "AsyncPS keeps its shards in host shared memory: use engine::Mpi");
  static_assert(!optim::is_groups_v<Optimizer>,
                "AsyncPS applies one optimizer's rule to every row it owns: it does not take optim::Groups (use a "
                "synchronous architecture, or one optimizer)");

  AsyncSynchronizer(Engine& engine, const Optimizer& opt, const Common& common, const async::Options& async,
                    const sharded::Options& sharded)
      : engine_(&engine), opt_(&opt), options_{common, sharded, async} {
    PARALLAX_EXPECTS(async.staleness >= -1, "TrainerOptions::async.staleness must be >= 0, or -1 for "
                                            "unbounded; got ", async.staleness);
  }

  template <class Var>
  Member& add(Var var) {
    const std::string& name = var.name();
    int parts = options_.sharded.partitions > 0 ? options_.sharded.partitions : engine_->size();
    if (auto it = options_.partitions.find(name); it != options_.partitions.end() && it->second > 0) parts = it->second;
    parts = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(parts), var.rows()));
    const PartitionMap map(var.rows(), parts, engine_->size());
    return tables_.template add<Table<Var>>(std::move(var), *this, map);
  }

  /// The step clocks, then every table's windows. Collective.
  void prepare() override {
    using Route = AsyncOptions::Route;
    rma_ = options_.async.route == Route::rma ||
           (options_.async.route == Route::automatic && !async::one_machine(engine_->comm()));
    clock_ = std::make_unique<async::Clock>(engine_->comm(), options_.async.staleness, timeout(), rma_);
    if (rma_) watchdog_ = std::make_unique<async::Watchdog>(engine_->rank(), timeout());
    for (TableBase* t : tables_) t->build();
    engine_->barrier();
  }

  const AsyncStats& async_stats() override { return clock_->stats(); }
  /// Every rank reaches this point: every push made before is applied.
  void quiesce() override {
    auto scope = engine_->stats().scope("", "control");
    engine_->barrier();
  }
  void restored(std::uint64_t step) override {
    quiesce();
    clock_->reset(engine_->comm(), static_cast<std::int64_t>(step));
  }

  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t n) {
    std::vector<Rows<typename V::value_type, space>> out;
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) out.push_back(table_of(*batch[i].var).lookup(batch[i].ids, batch[i].n));
    return out;
  }

  /// Bags, pooled where this rank reads their rows (bags.hpp). Local.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup_bags(const Bags<V>* batch, std::size_t n) {
    return bags_.lookup(engine_->exec(), engine_->rank(), batch, n,
                        [&](V& var, const index_t* ids, std::size_t m) { return table_of(var).lookup(ids, m); });
  }
  template <class V>
  void bag_gradients(const BagGradient<V>* grads, std::size_t n) {
    bags_.gradients(engine_->exec(), engine_->rank(), grads, n);
  }

  std::optional<std::string> problem() override {
    for (TableBase* t : tables_)
      if (auto p = t->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const TableBase* t : tables_)
      if (t->has_gradient()) return true;
    return false;
  }
  void finish_exchange(const StepInfo&) override {}
  /// Pushes this rank's gradients (each row applied by this rank to its
  /// owner's shard), ticks the clock, waits for the bound, and refreshes the
  /// dense replicas from their shards.
  void update(const StepInfo& info) override {
    for (TableBase* t : tables_)
      if (t->has_gradient()) {
        auto scope = engine_->stats().scope(t->label(), AsyncPS::name);
        t->push(info);
      }
    {
      auto scope = engine_->stats().scope("", AsyncPS::name);
      clock_->tick();
    }
    for (TableBase* t : tables_) t->refresh();
  }
  void clear() override {
    for (TableBase* t : tables_) t->clear();
    bags_.clear();
  }

  const AsyncStats& stats() { return clock_->stats(); }
  async::Clock& clock() { return *clock_; }
  /// Whether the shards are reached by MPI one-sided calls (across hosts)
  /// rather than loads and stores in shared memory. Valid after prepare().
  bool rma() const noexcept { return rma_; }

 private:
  std::chrono::milliseconds timeout() const { return engine_->options().timeout; }

  /// A variable's shard windows and what a step does with them.
  class TableBase {
   public:
    virtual ~TableBase() = default;
    virtual void build() = 0;
    virtual const std::string& label() const = 0;
    virtual std::optional<std::string> problem() = 0;
    virtual bool has_gradient() const = 0;
    virtual void push(const StepInfo& info) = 0;
    virtual void refresh() = 0;
    virtual void clear() = 0;
  };

  template <class Var>
  class Table final : public MemberOf<Var>, public TableBase {
    using T = typename Var::value_type;
    using S = storage_type_t<Var>;  // what the shard stores its rows as
    static constexpr int slots = Optimizer::slots;

   public:
    Table(Var var, AsyncSynchronizer& owner, PartitionMap map)
        : MemberOf<Var>(std::move(var), AsyncPS::name), sync_(&owner), map_(map), cols_(this->var_.cols()),
          rank_(owner.engine_->rank()) {}

    void build() override {
      const std::size_t n = map_.shard_rows(rank_);
      const std::size_t bytes = rows_bytes(n) + n * cols_ * slots * sizeof(T);
      if (sync_->rma_) {
        rma_ = async::RmaWindow::create(sync_->engine_->comm(), bytes, false);
      } else {
        values_ = detail::SharedWindow<std::byte>::create(sync_->engine_->comm(), bytes);
        locks_ = detail::SharedWindow<async::RowLock>::create(sync_->engine_->comm(), n);
        PARALLAX_EXPECTS(values_ && locks_, "AsyncPS: variable '", this->var_.name(),
                         "': its shards need shared memory that every rank maps (one machine, room in /dev/shm)");
      }
      S* shard = rows_of(local());
      for (std::size_t t = 0; t < map_.partitions_on(rank_); ++t) {
        const int p = rank_ + static_cast<int>(t) * map_.ranks;
        this->var_.fill_initial(exec_, shard + map_.shard_offset(p) * cols_, map_.begin(p), map_.size(p));
      }
      for (int k = 0; k < slots; ++k)
        std::fill(slot_of(local(), n, k), slot_of(local(), n, k) + n * cols_, sync_->opt_->template slot_initial<T>(k));
      if (sync_->rma_) {
        rma_.sync();
        return;
      }
      std::fill(locks_.local(), locks_.local() + n, async::RowLock{0});
      values_.sync();
      locks_.sync();
    }
    const std::string& label() const override { return this->var_.name(); }

    std::optional<std::string> problem() override {
      if constexpr (Var::is_sparse()) return this->var_.state().sparse_grad.find_problem(exec_);
      else return std::nullopt;
    }
    bool has_gradient() const override {
      if constexpr (Var::is_sparse()) return this->var_.state().sparse_grad.touched();
      else return this->var_.state().grad_touched;
    }

    Rows<T, space> lookup(const index_t* ids, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i)
        PARALLAX_EXPECTS(ids[i] >= 0 && static_cast<std::size_t>(ids[i]) < this->var_.rows(), "lookup of variable '",
                         this->var_.name(), "': id ", ids[i], " (entry ", i, ") outside [0, ", this->var_.rows(),
                         ") on rank ", rank_);
      looked_up_.emplace_back(n * cols_);
      T* out = looked_up_.back().data();
      read_rows(ids, n, out);
      return Rows<T, space>{out, n, cols_};
    }

    void push(const StepInfo& info) override {
      const auto rule = sync_->opt_->template rule<T>(info.step);
      const T scale = static_cast<T>(info.scale);
      if constexpr (Var::is_sparse()) {
        auto& g = this->var_.state().sparse_grad;
        g.coalesce(exec_);
        apply_rows(rule, g.indices(), g.values(), g.size(), scale, info.step);
      } else {
        apply_rows(rule, all_ids().data(), this->var_.state().grad.data(), this->var_.rows(), scale, info.step);
      }
    }
    /// Dense: the replica every rank reads, from the shards.
    void refresh() override {
      if constexpr (!Var::is_sparse()) read_all(this->var_.state().value.data());
    }
    void clear() override {
      looked_up_.clear();
      if constexpr (Var::is_sparse()) {
        this->var_.state().sparse_grad.clear();
      } else {
        this->var_.state().grad.zero();
      }
      this->var_.state().grad_touched = false;
    }

    std::size_t stored_rows() const override { return map_.shard_rows(rank_); }
    bool in_shared_memory() const override { return true; }
    void fetch(void* out) override { read_all(static_cast<T*>(out)); }
    int saved_partitions() const override { return map_.parts; }
    void save(detail::AtomicFile& out) override {
      const std::size_t rows = map_.shard_rows(rank_);
      std::vector<T*> s;
      for (int k = 0; k < slots; ++k) s.push_back(slot_of(local(), rows, k));
      save_stored<T, S, space>(exec_, out, rows_of(local()), s.data(), slots, rows * cols_);
    }
    void load(detail::CheckpointReader& in, std::size_t index) override {
      const std::size_t rows = map_.shard_rows(rank_);
      std::vector<T*> s;
      for (int k = 0; k < slots; ++k) s.push_back(slot_of(local(), rows, k));
      load_stored<T, S, space>(exec_, in, index, &map_, rank_, this->var_.rows(), cols_, rows_of(local()), s.data(),
                               slots, rows * cols_);
      values_.sync();
      rma_.sync();
      if constexpr (!Var::is_sparse())
        load_block<T, space>(in, index, 0, nullptr, rank_, this->var_.rows(), cols_, this->var_.state().value.data());
    }

   private:
    // A shard of n rows, in bytes: its rows as S (padded to 8 bytes), then
    // each optimizer slot's n rows as T.
    std::size_t rows_bytes(std::size_t n) const { return (n * cols_ * sizeof(S) + 7) / 8 * 8; }
    std::size_t slot_bytes(std::size_t n, int k, std::size_t row) const {
      return rows_bytes(n) + (static_cast<std::size_t>(k) * n + row) * cols_ * sizeof(T);
    }
    static S* rows_of(std::byte* shard) { return reinterpret_cast<S*>(shard); }
    T* slot_of(std::byte* shard, std::size_t n, int k) const { return reinterpret_cast<T*>(shard + slot_bytes(n, k, 0)); }

    struct Where {
      S* row;
      T* slot[2];
      async::RowLock* lock;
    };
    Where where(index_t id) const {
      const int owner = map_.owner(id);
      const std::size_t local = map_.local_row(id);
      const std::size_t n = map_.shard_rows(owner);
      std::byte* base = const_cast<std::byte*>(values_.bases()[owner]);
      Where w{rows_of(base) + local * cols_, {nullptr, nullptr}, const_cast<async::RowLock*>(locks_.bases()[owner]) + local};
      for (int k = 0; k < slots; ++k) w.slot[k] = reinterpret_cast<T*>(base + slot_bytes(n, k, local));
      return w;
    }
    /// A row as the shard stores it, widened to T (exactly).
    void widen(const S* row, T* out) const {
      if constexpr (std::is_same_v<S, T>) std::memcpy(out, row, cols_ * sizeof(T));
      else
        for (std::size_t c = 0; c < cols_; ++c) out[c] = static_cast<T>(row[c]);
    }
    void read_row(index_t id, T* out) const {
      const Where w = where(id);
      async::lock_row(w.lock, rank_, sync_->timeout(), this->var_.name().c_str());
      widen(w.row, out);
      async::unlock_row(w.lock);
    }
    void read_all(T* out) { read_rows(all_ids().data(), this->var_.rows(), out); }
    /// This rank's shard (rows_bytes(), slot_bytes()).
    std::byte* local() const { return sync_->rma_ ? rma_.local<std::byte>() : values_.local(); }
    /// 0 .. rows - 1 (what a dense variable reads and pushes).
    const std::vector<index_t>& all_ids() {
      if (all_ids_.size() != this->var_.rows()) {
        all_ids_.resize(this->var_.rows());
        for (std::size_t r = 0; r < all_ids_.size(); ++r) all_ids_[r] = static_cast<index_t>(r);
      }
      return all_ids_;
    }
    void read_rows(const index_t* ids, std::size_t n, T* out) {
      if (!sync_->rma_) {
        for (std::size_t i = 0; i < n; ++i) read_row(ids[i], out + i * cols_);
        return;
      }
      by_owner(ids, n);
      const std::size_t row_bytes = cols_ * sizeof(S);
      for (int o = 0; o < map_.ranks; ++o) {
        const std::vector<std::size_t>& mine = owned_[static_cast<std::size_t>(o)];
        if (mine.empty()) continue;
        async::Blocks where;
        for (std::size_t i : mine) where.add(static_cast<MPI_Aint>(map_.local_row(ids[i]) * row_bytes), row_bytes);
        stored_.resize(mine.size() * cols_);
        async::Access access(rma_, o, false, *sync_->watchdog_, this->var_.name());
        access.get(stored_.data(), where);
        access.end();
        for (std::size_t j = 0; j < mine.size(); ++j) widen(stored_.data() + j * cols_, out + mine[j] * cols_);
      }
    }
    /// Sorts the entries of `ids` by owner (owned_[o]: their indices).
    void by_owner(const index_t* ids, std::size_t n) {
      owned_.resize(static_cast<std::size_t>(map_.ranks));
      for (auto& v : owned_) v.clear();
      for (std::size_t i = 0; i < n; ++i) owned_[static_cast<std::size_t>(map_.owner(ids[i]))].push_back(i);
    }
    /// The optimizer on rows `ids` (distinct) with gradients `g` (row i at
    /// g + i * cols), each row under its lock (RMA: its owner's).
    template <class Rule>
    void apply_rows(const Rule& rule, const index_t* ids, const T* g, std::size_t n, T scale, std::uint64_t step) {
      if (!sync_->rma_) {
        for (std::size_t j = 0; j < n; ++j) apply_row(rule, ids[j], g + j * cols_, scale, step);
        return;
      }
      by_owner(ids, n);
      const std::size_t row_bytes = cols_ * sizeof(S), state_bytes = cols_ * sizeof(T);
      for (int o = 0; o < map_.ranks; ++o) {
        const std::vector<std::size_t>& mine = owned_[static_cast<std::size_t>(o)];
        if (mine.empty()) continue;
        // The rows (stored_[j * cols]), then each slot of them (slot k of
        // the j-th row at buffer_[(k * m + j) * cols]), as they lie in the
        // owner's segment.
        const std::size_t shard = map_.shard_rows(o), m = mine.size();
        async::Blocks rows_at, state_at;
        for (std::size_t i : mine) rows_at.add(static_cast<MPI_Aint>(map_.local_row(ids[i]) * row_bytes), row_bytes);
        for (int k = 0; k < slots; ++k)
          for (std::size_t i : mine)
            state_at.add(static_cast<MPI_Aint>(slot_bytes(shard, k, map_.local_row(ids[i]))), state_bytes);
        stored_.resize(m * cols_);
        buffer_.resize(m * static_cast<std::size_t>(slots) * cols_);
        async::Access access(rma_, o, true, *sync_->watchdog_, this->var_.name());
        access.get(stored_.data(), rows_at);
        if (slots) access.get(buffer_.data(), state_at);
        for (std::size_t j = 0; j < m; ++j) {
          T* s[2] = {nullptr, nullptr};
          for (int k = 0; k < slots; ++k) s[k] = buffer_.data() + (static_cast<std::size_t>(k) * m + j) * cols_;
          update_row(rule, ids[mine[j]], stored_.data() + j * cols_, s, g + mine[j] * cols_, scale, step);
        }
        access.put(stored_.data(), rows_at);
        if (slots) access.put(buffer_.data(), state_at);
        access.end();
      }
    }
    template <class Rule>
    void apply_row(const Rule& rule, index_t id, const T* g, T scale, std::uint64_t step) {
      const Where w = where(id);
      async::lock_row(w.lock, rank_, sync_->timeout(), this->var_.name().c_str());
      update_row(rule, id, w.row, w.slot, g, scale, step);
      async::unlock_row(w.lock);
    }
    /// The optimizer on one row (global id `id`) stored as S and its state:
    /// in T, each value stored back with the table's rounding.
    template <class Rule>
    void update_row(const Rule& rule, index_t id, S* row, T* const* s, const T* g, T scale, std::uint64_t step) const {
      T unused0 = T(0), unused1 = T(0);
      for (std::size_t c = 0; c < cols_; ++c) {
        T& s0 = slots > 0 ? s[0][c] : unused0;
        T& s1 = slots > 1 ? s[1][c] : unused1;
        if constexpr (std::is_same_v<S, T>) {
          rule(row[c], g[c] * scale, s0, s1);
        } else {
          T value = static_cast<T>(row[c]);
          rule(value, g[c] * scale, s0, s1);
          row[c] = optim::detail::store_rounded<S>(value, this->var_.state().rounding, step, id, c);
        }
      }
    }

    AsyncSynchronizer* sync_;
    PartitionMap map_;
    std::size_t cols_;
    int rank_;
    Exec<space> exec_;
    detail::SharedWindow<std::byte> values_;  // this rank's shard: rows, then each optimizer slot
    detail::SharedWindow<async::RowLock> locks_;  // one per row of the shard
    async::RmaWindow rma_;                        // RMA route: the shard, as values_
    std::vector<std::vector<std::size_t>> owned_;  // RMA route: a call's entries by owner
    std::vector<S> stored_;                       // RMA route: one owner's rows in transit
    std::vector<T> buffer_;                       // RMA route: their optimizer state in transit
    std::vector<index_t> all_ids_;
    std::vector<std::vector<T>> looked_up_;  // this step's lookups' rows
  };

  template <class V>
  Table<V>& table_of(const V& var) {
    return tables_.template of<Table<V>>(var, "AsyncPS");
  }

  Engine* engine_;
  const Optimizer* opt_;  // the trainer's: its learning rate changes between steps
  struct Settings : Common {
    sharded::Options sharded;
    async::Options async;
  };
  Settings options_;  // the settings it was made with
  std::unique_ptr<async::Clock> clock_;
  bool rma_ = false;  // the route across hosts (rma.hpp)
  std::unique_ptr<async::Watchdog> watchdog_;  // RMA route: the deadline of one-sided calls
  Members<TableBase> tables_;                     // registration order
  async::ReadBags<space> bags_;                   // this step's lookups of bags
};

}  // namespace parallax::policy
