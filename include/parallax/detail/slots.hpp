#pragma once
// The Trainer's per-variable machinery. A slot owns a variable's placement
// (replica or shard), its optimizer state, and the policy that synchronises
// it. The slot type is chosen at compile time from the variable's policy
// (make_slot); the Trainer then drives every slot through one interface.

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/detail/checkpoint_io.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/policy/allgatherv.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/space.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax::detail {

/// What a step hands every slot.
struct StepInfo {
  std::uint64_t step = 0;  // 1-based number of the step being taken
  double scale = 1.0;      // gradient scale (1/N for the mean over ranks)
};

template <class Engine, class Optimizer>
class SlotBase {
 public:
  using space = engine::space_of_t<Engine>;
  virtual ~SlotBase() = default;

  virtual const std::string& name() const = 0;
  virtual const void* identity() const = 0;
  virtual const char* policy() const = 0;
  virtual VarRecord record() const = 0;
  /// Dense gradients this slot wants summed by the trainer's fused all-reduce.
  virtual void fused_tensors(std::vector<TensorRef>&) {}
  /// Moves that gradient to `at` (room for it in the engine's space, aligned
  /// for its elements), where it stays while the slot lives. The trainer
  /// lays every fused gradient out in one arena, end to end, so the fused
  /// all-reduce sends and receives them where they lie, with no packing.
  virtual void move_fused_gradient(void* /*at*/) {}
  /// The first problem with this step's data on this rank, if any.
  virtual std::optional<std::string> problem() = 0;
  virtual bool has_gradient() const = 0;
  /// Communicates (unless fused) and applies the optimizer.
  virtual void synchronize(const StepInfo& info) = 0;
  /// For slots whose rows the trainer routes together with other slots'
  /// (ShardedPS: one route a step for all of them): prepares this step's
  /// rows and returns the slot's lane of the route; null for slots that
  /// synchronise alone. May be collective (local aggregation's first hop).
  virtual RouteLane* plan_push() { return nullptr; }
  /// After the trainer's route: what synchronize() does once rows arrived.
  virtual void finish_push(const StepInfo&) {}
  /// Forgets this step's gradient and lookups.
  virtual void clear() = 0;
  /// Rows of the variable this rank stores (replica: all of them).
  virtual std::size_t stored_rows() const = 0;
  /// Whether those rows live in shared memory that peers' lookups read.
  virtual bool in_shared_memory() const { return false; }
  /// The whole variable, row-major, on the host of every rank. Collective.
  virtual void fetch(void* host_out) = 0;

  // Checkpoints: a slot saves the rows it holds, in its layout, and loads the
  // rows it needs from whatever layout the checkpoint was saved in.
  /// 0: replicated (rank 0 saves every row); P: sharded in P partitions.
  virtual int saved_partitions() const = 0;
  /// Writes this rank's rows of the value, then of each optimizer slot.
  virtual void save(AtomicFile& out) = 0;
  /// Reads this rank's rows (value and optimizer slots) of variable `index`.
  virtual void load(CheckpointReader& in, std::size_t index) = 0;
};

/// Writes n elements of a buffer in `Space` to a checkpoint file.
template <class T, class Space>
void save_block(AtomicFile& out, const T* data, std::size_t n) {
  std::vector<T> host(n);
  space_traits<Space>::copy_to_host(host.data(), data, n * sizeof(T));
  out.write(host.data(), n * sizeof(T));
}

/// Reads the rows a rank holds (all rows when `map` is null, else its
/// partitions, back to back) of one saved array into `out` (in Space).
template <class T, class Space>
void load_block(CheckpointReader& in, std::size_t v, int what, const PartitionMap* map, int rank, std::size_t rows,
                std::size_t cols, T* out) {
  std::vector<T> host(map ? map->shard_rows(rank) * cols : rows * cols);
  if (!map) {
    in.read_rows(v, what, 0, rows, host.data());
  } else {
    for (std::size_t t = 0; t < map->partitions_on(rank); ++t) {
      const int p = rank + static_cast<int>(t) * map->ranks;
      in.read_rows(v, what, map->begin(p), map->size(p), host.data() + map->shard_offset(p) * cols);
    }
  }
  space_traits<Space>::copy_from_host(out, host.data(), host.size() * sizeof(T));
}

/// Saves / loads a value and its optimizer state as one layout.
template <class Optimizer, class T, class Space>
void save_state(AtomicFile& out, const T* value, optim::State<Optimizer, T, Space>& state, std::size_t n) {
  save_block<T, Space>(out, value, n);
  for (int k = 0; k < Optimizer::slots; ++k) save_block<T, Space>(out, state.slot(k), n);
}
template <class Optimizer, class T, class Space>
void load_state(CheckpointReader& in, std::size_t v, const PartitionMap* map, int rank, std::size_t rows,
                std::size_t cols, T* value, optim::State<Optimizer, T, Space>& state) {
  load_block<T, Space>(in, v, 0, map, rank, rows, cols, value);
  for (int k = 0; k < Optimizer::slots; ++k) load_block<T, Space>(in, v, k + 1, map, rank, rows, cols, state.slot(k));
}

/// A sparse slot: lookups return rows from wherever they live.
template <class T, class Engine, class Optimizer>
class SparseSlot : public SlotBase<Engine, Optimizer> {
 public:
  using space = engine::space_of_t<Engine>;
  /// Rows for n ids (in space), valid until clear(). Collective for sharded slots.
  virtual Rows<T, space> lookup(const index_t* ids, std::size_t n) = 0;
  /// A lookup in a batch (Trainer::lookup of several variables), around one
  /// route shared by the batch: plan_lookup() returns this slot's lane of it
  /// (null for slots whose lookups are local, which keep the ids for later);
  /// after the route start_reply() serves and starts the reply (sharded
  /// slots), the engine's wait_started() completes every slot's reply at
  /// once, and finish_lookup() returns the rows. `ids` stay valid between.
  virtual RouteLane* plan_lookup(const index_t* ids, std::size_t n) = 0;
  virtual void start_reply() {}
  virtual Rows<T, space> finish_lookup() = 0;
  /// This rank's bad id found by plan_lookup() (no_problem if none), and the
  /// error to throw when the route reports one for this slot.
  virtual index_t lookup_problem() const { return no_problem; }
  [[noreturn]] virtual void lookup_failed(const RemoteProblem& p) {
    throw error(concat("variable '", this->name(), "': lookup id ", p.id, " is out of range on rank ", p.rank));
  }

 protected:
  /// A fresh output buffer per lookup in a step, so earlier rows stay valid.
  Buffer<T, space>& next_buffer(std::size_t elements) {
    if (used_ == buffers_.size()) buffers_.emplace_back();
    Buffer<T, space>& b = buffers_[used_++];
    b.resize_discard(elements);
    return b;
  }
  void release_buffers() noexcept { used_ = 0; }

 private:
  std::vector<Buffer<T, space>> buffers_;
  std::size_t used_ = 0;
};

/// Shared by every slot: the variable, the engine, the optimizer.
template <class Base, class Var, class Engine, class Optimizer, class Policy>
class SlotCommon : public Base {
 public:
  using T = typename Var::value_type;
  using space = engine::space_of_t<Engine>;

  SlotCommon(Var var, Engine& engine, const Optimizer& opt) : var_(std::move(var)), engine_(&engine), opt_(opt) {}
  SlotCommon(const SlotCommon&) = delete;
  SlotCommon& operator=(const SlotCommon&) = delete;
  /// The variable may join another trainer once this one is gone.
  ~SlotCommon() override { var_.state().trainer = nullptr; }
  const std::string& name() const override { return var_.name(); }
  const void* identity() const override { return &var_.state(); }
  const char* policy() const override { return Policy::name; }
  VarRecord record() const override {
    return VarRecord::make(var_.name(), var_.shape(), data_type_of_v<T>, Var::is_sparse(), Policy::name);
  }

 protected:
  Exec<space>& ex() { return engine_->exec(); }
  auto scope() { return engine_->stats().scope(var_.name(), Policy::name); }
  static T scale_of(const StepInfo& s) { return static_cast<T>(s.scale); }

  Var var_;
  Engine* engine_;
  Optimizer opt_;
};

/// The partition count of a sharded variable: the configured one, or one per
/// rank (but no more than the variable has rows).
inline int partitions_for(const ShardedOptions& so, std::size_t rows, int ranks) {
  if (so.partitions > 0) return so.partitions;
  return static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(ranks), std::max<std::size_t>(rows, 1)));
}

// ---------------------------------------------------------------- dense

/// Dense + RingAllReduce: a replica everywhere; the gradient joins the fused all-reduce.
template <class Var, class Engine, class Optimizer>
class DenseRingSlot final : public SlotCommon<SlotBase<Engine, Optimizer>, Var, Engine, Optimizer, RingAllReduce> {
  using Common = SlotCommon<SlotBase<Engine, Optimizer>, Var, Engine, Optimizer, RingAllReduce>;
  using typename Common::T;

 public:
  DenseRingSlot(Var var, Engine& engine, const Optimizer& opt, const ShardedOptions&)
      : Common(std::move(var), engine, opt), state_(opt, this->var_.shape().elements()) {}
  /// Gives the variable its own gradient back, out of the trainer's arena.
  ~DenseRingSlot() override {
    auto& g = this->var_.state().grad;
    if (g.owned()) return;
    try {
      Buffer<T, typename Common::space> own(g.size());
      space_traits<typename Common::space>::copy(own.data(), g.data(), g.bytes());
      g = std::move(own);
    } catch (...) {
      g = Buffer<T, typename Common::space>();  // out of memory: the next step's grad() starts empty
    }
  }

  void fused_tensors(std::vector<TensorRef>& out) override {
    auto& s = this->var_.state();
    out.push_back(TensorRef{s.grad.data(), s.grad.size(), data_type_of_v<T>});
  }
  void move_fused_gradient(void* at) override {
    auto& g = this->var_.state().grad;
    T* to = static_cast<T*>(at);
    space_traits<typename Common::space>::copy(to, g.data(), g.bytes());
    g = Buffer<T, typename Common::space>::borrow(to, g.size());
  }
  std::optional<std::string> problem() override { return std::nullopt; }
  bool has_gradient() const override { return this->var_.state().grad_touched; }
  void synchronize(const StepInfo& info) override {
    auto& s = this->var_.state();
    optim::apply_dense(this->ex(), this->opt_, info.step, s.value.data(), s.grad.data(), s.value.size(), state_,
                       this->scale_of(info));
  }
  void clear() override {
    auto& s = this->var_.state();
    s.grad.zero();
    s.grad_touched = false;
  }
  std::size_t stored_rows() const override { return this->var_.rows(); }
  void fetch(void* out) override {
    const auto& v = this->var_.state().value;
    space_traits<typename Common::space>::copy_to_host(out, v.data(), v.bytes());
  }
  int saved_partitions() const override { return 0; }
  void save(AtomicFile& out) override {
    if (this->engine_->rank() == 0) save_state(out, this->var_.state().value.data(), state_, this->var_.shape().elements());
  }
  void load(CheckpointReader& in, std::size_t index) override {
    load_state(in, index, nullptr, 0, this->var_.rows(), this->var_.cols(), this->var_.state().value.data(), state_);
  }

 private:
  optim::State<Optimizer, T, typename Common::space> state_;
};

/// Dense + ShardedPS: owners hold the master rows and the optimizer state;
/// every rank keeps a replica for its forward pass.
template <class Var, class Engine, class Optimizer>
class DenseShardedSlot final : public SlotCommon<SlotBase<Engine, Optimizer>, Var, Engine, Optimizer, ShardedPS> {
  using Common = SlotCommon<SlotBase<Engine, Optimizer>, Var, Engine, Optimizer, ShardedPS>;
  using typename Common::T;

 public:
  DenseShardedSlot(Var var, Engine& engine, const Optimizer& opt, const ShardedOptions& so)
      : Common(std::move(var), engine, opt),
        shards_(engine, PartitionMap(this->var_.rows(), partitions_for(so, this->var_.rows(), engine.size()), engine.size()),
                this->var_.cols()) {
    shards_.take_shard(this->var_.state().value.data(), shards_.shard().data());
    state_.reset(opt, shards_.shard_elements());
    sum_.resize_discard(shards_.shard_elements());
  }
  std::optional<std::string> problem() override { return std::nullopt; }
  bool has_gradient() const override { return this->var_.state().grad_touched; }
  void synchronize(const StepInfo& info) override {
    auto scope = this->scope();
    auto& s = this->var_.state();
    shards_.reduce(s.grad.data(), sum_.data());
    optim::apply_dense(this->ex(), this->opt_, info.step, shards_.shard().data(), sum_.data(),
                       shards_.shard_elements(), state_, this->scale_of(info));
    this->ex().synchronize();
    shards_.gather(shards_.shard().data(), s.value.data());
  }
  void clear() override {
    auto& s = this->var_.state();
    s.grad.zero();
    s.grad_touched = false;
  }
  std::size_t stored_rows() const override { return shards_.map().shard_rows(this->engine_->rank()); }
  void fetch(void* out) override {
    const auto& v = this->var_.state().value;
    space_traits<typename Common::space>::copy_to_host(out, v.data(), v.bytes());
  }
  int saved_partitions() const override { return shards_.map().parts; }
  void save(AtomicFile& out) override { save_state(out, shards_.shard().data(), state_, shards_.shard_elements()); }
  void load(CheckpointReader& in, std::size_t index) override {
    const int me = this->engine_->rank();
    load_state(in, index, &shards_.map(), me, this->var_.rows(), this->var_.cols(), shards_.shard().data(), state_);
    load_block<T, typename Common::space>(in, index, 0, nullptr, me, this->var_.rows(), this->var_.cols(),
                                          this->var_.state().value.data());
  }

 private:
  DenseShards<T, Engine> shards_;
  optim::State<Optimizer, T, typename Common::space> state_;
  Buffer<T, typename Common::space> sum_;
};

// ---------------------------------------------------------------- sparse

template <class T, class Space>
struct ZeroBadRows {
  // Rows of ids outside [0, rows) read row 0 instead (their values are
  // never used: the step that follows throws).
  const index_t* in;
  index_t* out;
  index_t rows;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = (in[i] < 0 || in[i] >= rows) ? 0 : in[i]; }
};

/// Sparse + ShardedPS: this rank stores its partitions and their optimizer state.
template <class Var, class Engine, class Optimizer>
class SparseShardedSlot final
    : public SlotCommon<SparseSlot<typename Var::value_type, Engine, Optimizer>, Var, Engine, Optimizer, ShardedPS> {
  using Common = SlotCommon<SparseSlot<typename Var::value_type, Engine, Optimizer>, Var, Engine, Optimizer, ShardedPS>;
  using typename Common::T;
  using typename Common::space;

 public:
  SparseShardedSlot(Var var, Engine& engine, const Optimizer& opt, const ShardedOptions& so)
      : Common(std::move(var), engine, opt),
        table_(engine,
               PartitionMap(this->var_.rows(), partitions_for(so, this->var_.rows(), engine.size()), engine.size()),
               this->var_.cols(), this->var_.name(), so.local_aggregation, so.shared_memory) {
    const detail::InitRule rule = this->var_.rule();
    const std::size_t cols = this->var_.cols();
    auto& ex = this->ex();
    table_.initialize([&](const index_t* rows, std::size_t k, T* out) {
      for_each(ex, k * cols, FillInit<T>{rule, out, cols, 0, rows});
      ex.synchronize();
    });
    state_.reset(opt, table_.shard().size());
  }

  Rows<T, space> lookup(const index_t* ids, std::size_t n) override {
    auto scope = this->scope();
    Buffer<T, space>& out = this->next_buffer(n * this->var_.cols());
    table_.lookup(ids, n, out.data());
    return Rows<T, space>{out.data(), n, this->var_.cols()};
  }
  RouteLane* plan_lookup(const index_t* ids, std::size_t n) override {
    auto scope = this->scope();
    planned_ = n;
    return &table_.plan_lookup(ids, n);
  }
  void start_reply() override {
    auto scope = this->scope();
    reply_ = &this->next_buffer(planned_ * this->var_.cols());
    table_.start_reply(reply_->data());
  }
  Rows<T, space> finish_lookup() override {
    table_.gather_reply(planned_, reply_->data());
    return Rows<T, space>{reply_->data(), planned_, this->var_.cols()};
  }
  index_t lookup_problem() const override { return table_.lookup_problem(); }
  [[noreturn]] void lookup_failed(const RemoteProblem& p) override { table_.fail(p, "lookup id"); }
  std::optional<std::string> problem() override { return this->var_.state().sparse_grad.find_problem(this->ex()); }
  bool has_gradient() const override { return this->var_.state().sparse_grad.touched(); }
  void synchronize(const StepInfo& info) override {
    auto scope = this->scope();
    plan_push();
    table_.route_planned();
    finish_push(info);
  }
  RouteLane* plan_push() override {
    auto scope = this->scope();
    auto& g = this->var_.state().sparse_grad;
    g.coalesce(this->ex());
    return &table_.plan_push(g.indices(), g.values(), g.size());
  }
  void finish_push(const StepInfo& info) override {
    auto scope = this->scope();
    const std::size_t m = table_.finish_push(local_rows_, sums_);
    optim::apply_rows(this->ex(), this->opt_, info.step, table_.shard().data(), local_rows_.data(), sums_.data(), m,
                      this->var_.cols(), state_, this->scale_of(info));
    this->ex().synchronize();
  }
  void clear() override {
    this->var_.state().sparse_grad.clear();
    this->var_.state().grad_touched = false;
    this->release_buffers();
  }
  std::size_t stored_rows() const override { return table_.shard_rows(); }
  bool in_shared_memory() const override { return table_.shared(); }
  void fetch(void* out) override {
    auto scope = this->scope();
    DenseShards<T, Engine> layout(*this->engine_, table_.map(), this->var_.cols());
    Buffer<T, space> full(this->var_.shape().elements());
    layout.gather(table_.shard().data(), full.data());
    space_traits<space>::copy_to_host(out, full.data(), full.bytes());
  }
  int saved_partitions() const override { return table_.map().parts; }
  void save(AtomicFile& out) override { save_state(out, table_.shard().data(), state_, table_.shard().size()); }
  void load(CheckpointReader& in, std::size_t index) override {
    load_state(in, index, &table_.map(), this->engine_->rank(), this->var_.rows(), this->var_.cols(),
               table_.shard().data(), state_);
  }
  ShardedTable<T, Engine>& table() noexcept { return table_; }

 private:
  ShardedTable<T, Engine> table_;
  std::size_t planned_ = 0;  // ids of the batched lookup between its parts
  Buffer<T, space>* reply_ = nullptr;  // where its rows land (start_reply)
  optim::State<Optimizer, T, space> state_;
  Buffer<index_t, space> local_rows_;
  Buffer<T, space> sums_;
};

/// Sparse variables kept as a full replica on every rank (AllGatherv and
/// RingAllReduce): lookups are local gathers.
template <class Var, class Engine, class Optimizer, class Policy>
class SparseReplicaSlot
    : public SlotCommon<SparseSlot<typename Var::value_type, Engine, Optimizer>, Var, Engine, Optimizer, Policy> {
  using Common = SlotCommon<SparseSlot<typename Var::value_type, Engine, Optimizer>, Var, Engine, Optimizer, Policy>;

 protected:
  using typename Common::T;
  using typename Common::space;

 public:
  SparseReplicaSlot(Var var, Engine& engine, const Optimizer& opt)
      : Common(std::move(var), engine, opt), value_(this->var_.shape().elements()) {
    this->var_.fill_initial(this->ex(), value_.data(), 0, this->var_.rows());
    this->ex().synchronize();
    state_.reset(opt, value_.size());
  }

  Rows<T, space> lookup(const index_t* ids, std::size_t n) override {
    auto& ex = this->ex();
    const std::size_t cols = this->var_.cols();
    Buffer<T, space>& out = this->next_buffer(n * cols);
    const index_t* rows = ids;
    if (auto bad = find_out_of_range(ex, ids, n, this->var_.rows())) {
      // Local lookups are not collective: the problem is reported by the next step().
      if (!lookup_problem_)
        lookup_problem_ = concat("variable '", this->var_.name(), "': lookup id ", read_one<index_t, space>(ids + *bad),
                                 " is outside [0, ", this->var_.rows(), ")");
      safe_ids_.resize_discard(n);
      for_each(ex, n, ZeroBadRows<T, space>{ids, safe_ids_.data(), static_cast<index_t>(this->var_.rows())});
      rows = safe_ids_.data();
    }
    for_each_rows(ex, n, cols, GatherRows<T>{value_.data(), rows, out.data(), cols});
    ex.synchronize();
    return Rows<T, space>{out.data(), n, cols};
  }
  RouteLane* plan_lookup(const index_t* ids, std::size_t n) override {
    planned_ids_ = ids;
    planned_ = n;
    return nullptr;
  }
  Rows<T, space> finish_lookup() override { return lookup(planned_ids_, planned_); }
  std::optional<std::string> problem() override {
    if (lookup_problem_) return lookup_problem_;
    return this->var_.state().sparse_grad.find_problem(this->ex());
  }
  bool has_gradient() const override { return this->var_.state().sparse_grad.touched(); }
  void clear() override {
    this->var_.state().sparse_grad.clear();
    this->var_.state().grad_touched = false;
    lookup_problem_.reset();
    this->release_buffers();
  }
  std::size_t stored_rows() const override { return this->var_.rows(); }
  void fetch(void* out) override { space_traits<space>::copy_to_host(out, value_.data(), value_.bytes()); }
  int saved_partitions() const override { return 0; }
  void save(AtomicFile& out) override {
    if (this->engine_->rank() == 0) save_state(out, value_.data(), state_, value_.size());
  }
  void load(CheckpointReader& in, std::size_t index) override {
    load_state(in, index, nullptr, 0, this->var_.rows(), this->var_.cols(), value_.data(), state_);
  }

 protected:
  Buffer<T, space> value_;
  optim::State<Optimizer, T, space> state_;
  Buffer<index_t, space> safe_ids_;
  std::optional<std::string> lookup_problem_;
  const index_t* planned_ids_ = nullptr;  // the batched lookup's ids, between its two parts
  std::size_t planned_ = 0;
};

/// Sparse + AllGatherv: every rank gathers every rank's rows and applies the
/// same lazy update to its replica.
template <class Var, class Engine, class Optimizer>
class SparseGatherSlot final : public SparseReplicaSlot<Var, Engine, Optimizer, AllGatherv> {
  using Base = SparseReplicaSlot<Var, Engine, Optimizer, AllGatherv>;
  using typename Base::T;
  using typename Base::space;

 public:
  SparseGatherSlot(Var var, Engine& engine, const Optimizer& opt, const ShardedOptions&)
      : Base(std::move(var), engine, opt), gatherer_(engine, this->var_.cols()) {}

  void synchronize(const StepInfo& info) override {
    auto scope = this->scope();
    auto& g = this->var_.state().sparse_grad;
    g.coalesce(this->ex());
    const std::size_t m = gatherer_.gather(g.indices(), g.values(), g.size(), ids_, sums_);
    optim::apply_rows(this->ex(), this->opt_, info.step, this->value_.data(), ids_.data(), sums_.data(), m,
                      this->var_.cols(), this->state_, this->scale_of(info));
    this->ex().synchronize();
  }

 private:
  SparseAllGatherer<T, Engine> gatherer_;
  Buffer<index_t, space> ids_;
  Buffer<T, space> sums_;
};

/// Sparse + RingAllReduce: the gradient is scattered into a dense buffer and
/// all-reduced whole (the baseline a dense-only framework gives a sparse
/// variable); the update is dense too.
template <class Var, class Engine, class Optimizer>
class SparseDenseRingSlot final : public SparseReplicaSlot<Var, Engine, Optimizer, RingAllReduce> {
  using Base = SparseReplicaSlot<Var, Engine, Optimizer, RingAllReduce>;
  using typename Base::T;
  using typename Base::space;

 public:
  SparseDenseRingSlot(Var var, Engine& engine, const Optimizer& opt, const ShardedOptions&, RingOptions ring)
      : Base(std::move(var), engine, opt), reducer_(engine, ring), dense_grad_(this->value_.size()) {}

  void synchronize(const StepInfo& info) override {
    auto scope = this->scope();
    auto& ex = this->ex();
    auto& g = this->var_.state().sparse_grad;
    g.coalesce(ex);
    dense_grad_.zero();
    for_each_rows(ex, g.size(), this->var_.cols(),
                  ScatterAddRows<T>{dense_grad_.data(), g.indices(), g.values(), this->var_.cols()});
    ex.synchronize();
    reducer_.allreduce(dense_grad_.data(), dense_grad_.size());
    optim::apply_dense(ex, this->opt_, info.step, this->value_.data(), dense_grad_.data(), this->value_.size(),
                       this->state_, this->scale_of(info));
    ex.synchronize();
  }

 private:
  RingAllReducer<Engine> reducer_;
  Buffer<T, space> dense_grad_;
};

/// The slot for variable type Var under Policy.
template <class Policy, class Var, class Engine, class Optimizer>
std::unique_ptr<SlotBase<Engine, Optimizer>> make_slot(Var var, Engine& engine, const Optimizer& opt,
                                                       const ShardedOptions& sharded, const RingOptions& ring) {
  constexpr bool sparse = Var::is_sparse();
  if constexpr (std::is_same_v<Policy, RingAllReduce>) {
    if constexpr (sparse) return std::make_unique<SparseDenseRingSlot<Var, Engine, Optimizer>>(std::move(var), engine, opt, sharded, ring);
    else return std::make_unique<DenseRingSlot<Var, Engine, Optimizer>>(std::move(var), engine, opt, sharded);
  } else if constexpr (std::is_same_v<Policy, ShardedPS>) {
    if constexpr (sparse) return std::make_unique<SparseShardedSlot<Var, Engine, Optimizer>>(std::move(var), engine, opt, sharded);
    else return std::make_unique<DenseShardedSlot<Var, Engine, Optimizer>>(std::move(var), engine, opt, sharded);
  } else if constexpr (std::is_same_v<Policy, AllGatherv>) {
    static_assert(sparse,
                  "parallax: AllGatherv synchronises sparse gradients (rows); a dense variable has none to gather. "
                  "Use RingAllReduce or ShardedPS for dense variables.");
    return std::make_unique<SparseGatherSlot<Var, Engine, Optimizer>>(std::move(var), engine, opt, sharded);
  } else {
    static_assert(sizeof(Policy) == 0,
                  "parallax: unknown communicator policy; use RingAllReduce, AllGatherv or ShardedPS");
  }
}

}  // namespace parallax::detail
