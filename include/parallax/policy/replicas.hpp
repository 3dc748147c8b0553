#pragma once
/// @file
/// Members that keep a full replica of their variable on every rank, for
/// any policy to use: a dense variable (its value and gradient are the
/// Variable's own buffers) and a sparse one (a replica of its rows, looked up
/// locally). They hold the optimizer state and do the checkpoint I/O; the
/// policy decides how gradients are summed before apply().

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/error.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::detail {
/// Ids outside [0, rows) read row 0 instead (their values are never used:
/// the step that follows throws).
struct ClampBadIds {
  const index_t* in;
  index_t* out;
  index_t rows;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = (in[i] < 0 || in[i] >= rows) ? 0 : in[i]; }
};
}  // namespace parallax::detail

namespace parallax::policy {

/// Output buffers of the lookups of one step: a fresh one per lookup, so the
/// rows a step's earlier lookups returned stay valid until the step ends.
template <class T, class Space>
class LookupBuffers {
 public:
  Buffer<T, Space>& next(std::size_t elements) {
    if (used_ == buffers_.size()) buffers_.emplace_back();
    Buffer<T, Space>& b = buffers_[used_++];
    b.resize_discard(elements);
    return b;
  }
  /// The step is over: the buffers may be reused.
  void release() noexcept { used_ = 0; }

 private:
  std::vector<Buffer<T, Space>> buffers_;
  std::size_t used_ = 0;
};

/// A dense variable replicated on every rank: value() and grad() are the
/// Variable's own; apply() runs the optimizer over every element.
template <class Var, class Engine, class Optimizer>
class DenseReplica : public MemberOf<Var> {
  static_assert(!Var::is_sparse(), "DenseReplica holds dense variables");

 public:
  using T = typename Var::value_type;
  using space = engine::space_of_t<Engine>;

  DenseReplica(Var var, Engine& engine, const Optimizer& opt, const char* policy)
      : MemberOf<Var>(std::move(var), policy), engine_(&engine), opt_(bind_variable(opt, this->var_)),
        state_(*opt_, this->var_.shape().elements()) {}

  Engine& engine() noexcept { return *engine_; }
  Buffer<T, space>& value() noexcept { return this->var_.state().value; }
  Buffer<T, space>& grad() noexcept { return this->var_.state().grad; }
  bool has_gradient() const noexcept { return this->var_.state().grad_touched; }
  /// value <- rule(value, scale * grad), every element.
  void apply(const StepInfo& info) {
    optim::apply_dense(engine_->exec(), *opt_, info.step, value().data(), grad().data(), value().size(), state_,
                       static_cast<T>(info.scale));
  }
  /// Forgets the step's gradient; `zero`: false where it is zero already.
  void clear(bool zero = true) {
    if (zero) grad().zero();
    this->var_.state().grad_touched = false;
  }

  std::size_t stored_rows() const override { return this->var_.rows(); }
  void fetch(void* out) override {
    space_traits<space>::copy_to_host(out, value().data(), value().bytes());
  }
  int saved_partitions() const override { return 0; }
  void save(detail::AtomicFile& out) override {
    if (engine_->rank() != 0) return;
    const auto slots = slots_of(state_);
    save_state<T, space>(out, value().data(), slots.data(), Optimizer::slots, value().size());
  }
  void load(detail::CheckpointReader& in, std::size_t index) override {
    const auto slots = slots_of(state_);
    load_state<T, space>(in, index, nullptr, 0, this->var_.rows(), this->var_.cols(), value().data(), slots.data(),
                         Optimizer::slots);
  }

 private:
  Engine* engine_;
  optim::Bound<Optimizer> opt_;  // the trainer's optimizer: its learning rate changes between steps
  optim::State<Optimizer, T, space> state_;
};

/// A sparse variable replicated on every rank (AllGatherv, and RingAllReduce
/// for sparse variables): lookups are local gathers; lookup_replicas() agrees
/// on their ids across ranks, so a bad id throws at lookup() on every rank.
template <class Var, class Engine, class Optimizer>
class SparseReplica : public MemberOf<Var> {
  static_assert(Var::is_sparse(), "SparseReplica holds sparse variables");

 public:
  using T = typename Var::value_type;
  using S = storage_type_t<Var>;  // the replica's element: T, or bf16 / fp16 (computed in T = float)
  using space = engine::space_of_t<Engine>;

  SparseReplica(Var var, Engine& engine, const Optimizer& opt, const char* policy)
      : MemberOf<Var>(std::move(var), policy), engine_(&engine), opt_(bind_variable(opt, this->var_)),
        value_(this->var_.shape().elements()) {
    this->var_.fill_initial(ex(), value_.data(), 0, this->var_.rows());
    ex().synchronize();
    state_.reset(*opt_, value_.size());
  }

  Engine& engine() noexcept { return *engine_; }
  Buffer<S, space>& value() noexcept { return value_; }
  SparseGrad<T, space>& gradient() noexcept { return this->var_.state().sparse_grad; }

  /// Rows for n ids (in space), valid until clear(). An id outside the
  /// table sets `problem` (unless already set) and reads row 0 or the last.
  Rows<T, space> lookup(const index_t* ids, std::size_t n, std::optional<std::string>& problem) {
    const std::size_t cols = this->var_.cols();
    Buffer<T, space>& out = buffers_.next(n * cols);
    const index_t* rows = ids;
    if (auto bad = detail::find_out_of_range(ex(), ids, n, this->var_.rows())) {
      if (!problem)
        problem = detail::concat("variable '", this->var_.name(), "': lookup id ",
                                 detail::read_one<index_t, space>(ids + *bad), " is outside [0, ",
                                 this->var_.rows(), ")");
      safe_ids_.resize_discard(n);
      for_each(ex(), n, detail::ClampBadIds{ids, safe_ids_.data(), static_cast<index_t>(this->var_.rows())});
      rows = safe_ids_.data();
    }
    for_each_rows(ex(), n, cols, detail::GatherRows<T, S>{value_.data(), rows, out.data(), cols});
    ex().synchronize();
    return Rows<T, space>{out.data(), n, cols};
  }
  std::optional<std::string> problem() { return gradient().find_problem(ex()); }
  bool has_gradient() const { return this->var_.state().sparse_grad.touched(); }
  /// The optimizer over rows `rows` (k unique rows, sums in `g`).
  /// A 16-bit replica: in float, stored with the variable's rounding (its
  /// draws hash the rows' ids, here the rows themselves).
  void apply_rows(const StepInfo& info, const index_t* rows, const T* g, std::size_t k) {
    if constexpr (is_half_v<S>)
      optim::apply_rows(ex(), *opt_, info.step, value_.data(), rows, rows, g, k, this->var_.cols(), state_,
                        static_cast<T>(info.scale), this->var_.state().rounding);
    else
      optim::apply_rows(ex(), *opt_, info.step, value_.data(), rows, g, k, this->var_.cols(), state_,
                        static_cast<T>(info.scale));
    ex().synchronize();
  }
  /// The optimizer over every element (a dense gradient `g`).
  void apply_dense(const StepInfo& info, const T* g) {
    static_assert(!is_half_v<S>, "a 16-bit replica is updated by rows (apply_rows)");
    optim::apply_dense(ex(), *opt_, info.step, value_.data(), g, value_.size(), state_, static_cast<T>(info.scale));
    ex().synchronize();
  }
  void clear() {
    gradient().clear();
    this->var_.state().grad_touched = false;
    buffers_.release();
  }

  std::size_t stored_rows() const override { return this->var_.rows(); }
  /// The rows as T (a 16-bit replica's widened, exactly).
  void fetch(void* out) override {
    if constexpr (is_half_v<S>) {
      Buffer<T, space> wide(value_.size());
      for_each(ex(), value_.size(), detail::Convert<T, S>{value_.data(), wide.data()});
      ex().synchronize();
      space_traits<space>::copy_to_host(out, wide.data(), wide.bytes());
    } else {
      space_traits<space>::copy_to_host(out, value_.data(), value_.bytes());
    }
  }
  int saved_partitions() const override { return 0; }
  void save(detail::AtomicFile& out) override {
    if (engine_->rank() != 0) return;
    const auto slots = slots_of(state_);
    save_stored<T, S, space>(ex(), out, value_.data(), slots.data(), Optimizer::slots, value_.size());
  }
  void load(detail::CheckpointReader& in, std::size_t index) override {
    const auto slots = slots_of(state_);
    load_stored<T, S, space>(ex(), in, index, nullptr, 0, this->var_.rows(), this->var_.cols(), value_.data(),
                             slots.data(), Optimizer::slots, value_.size());
  }

 protected:
  Exec<space>& ex() { return engine_->exec(); }

  Engine* engine_;
  optim::Bound<Optimizer> opt_;  // the trainer's optimizer: its learning rate changes between steps
  Buffer<S, space> value_;
  optim::State<Optimizer, T, space> state_;  // in T (float for a 16-bit replica)
  Buffer<index_t, space> safe_ids_;
  LookupBuffers<T, space> buffers_;
};

/// What a synchronizer does with a sparse replica in a step, whatever its
/// type: the `Kind` (policy::Members) a policy's own interface derives
/// from, adding the exchange it runs.
class SparseReplicaKind {
 public:
  virtual ~SparseReplicaKind() = default;
  virtual std::optional<std::string> problem() = 0;
  virtual bool has_gradient() const = 0;
  /// Of this step's summed gradient, for clipping.
  virtual double square_sum() = 0;
  virtual void apply(const StepInfo&) = 0;
  virtual void clear() = 0;
};

/// A SparseReplica as a policy's `Kind` (derived from SparseReplicaKind):
/// SparseReplica's own steps given to it; the policy's member derives from
/// this and writes its exchange, square_sum and apply.
template <class Var, class Engine, class Optimizer, class Kind>
class SparseReplicaAs : public SparseReplica<Var, Engine, Optimizer>, public Kind {
  static_assert(std::is_base_of_v<SparseReplicaKind, Kind>, "SparseReplicaAs: Kind derives from SparseReplicaKind");
  using Base = SparseReplica<Var, Engine, Optimizer>;

 public:
  using Base::Base;
  std::optional<std::string> problem() override { return Base::problem(); }
  bool has_gradient() const override { return Base::has_gradient(); }
  void clear() override { Base::clear(); }
};

/// Local lookups of a batch of replicated variables (each request's rows
/// gathered from its member's replica), for a synchronizer whose sparse
/// members are SparseReplicas: `member_of(var)` finds one. Collective: a bad
/// id on any rank throws on every rank, naming the rank, its variable and
/// the id (one 24-byte all-reduce; the rows are local).
template <class V, class Space, class Engine, class Find>
std::vector<Rows<typename V::value_type, Space>> lookup_replicas(Engine& engine, const Lookup<V>* batch,
                                                                 std::size_t n, Find&& member_of) {
  std::vector<Rows<typename V::value_type, Space>> rows;
  rows.reserve(n);
  std::optional<std::string> problem;
  for (std::size_t i = 0; i < n; ++i)
    rows.push_back(member_of(*batch[i].var).lookup(batch[i].ids, batch[i].n, problem));
  detail::agree(engine, problem);
  return rows;
}

/// A batched lookup of replicated variables started ahead (Trainer::
/// prefetch): with nothing to route, it keeps a copy of the ids and
/// gathers the rows when they are taken, as lookup_replicas() then would
/// (a bad id throws then, on every rank, like a plain lookup's).
template <class Space>
class ReplicaLookupsAhead {
 public:
  /// Copies the batch's ids (the caller may reuse them at once).
  template <class V>
  void start(const Lookup<V>* batch, std::size_t n) {
    auto kept = std::make_unique<Kept<V>>();
    kept->ids.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      kept->ids[i].resize_discard(batch[i].n);
      space_traits<Space>::copy(kept->ids[i].data(), batch[i].ids, batch[i].n * sizeof(index_t));
      kept->batch.push_back(Lookup<V>(*batch[i].var, kept->ids[i].data(), batch[i].n));
    }
    kept_ = std::move(kept);
  }
  /// The rows, gathered now (see lookup_replicas()).
  template <class V, class Engine, class Find>
  std::vector<Rows<typename V::value_type, Space>> finish(Engine& engine, Find&& member_of) {
    std::unique_ptr<Base> taken = std::move(kept_);
    auto* kept = dynamic_cast<Kept<V>*>(taken.get());
    PARALLAX_EXPECTS(kept != nullptr, "finish_lookup() without a start_lookup() of this variable type");
    return lookup_replicas<V, Space>(engine, kept->batch.data(), kept->batch.size(), std::forward<Find>(member_of));
  }
  void cancel() noexcept { kept_.reset(); }

 private:
  struct Base {
    virtual ~Base() = default;
  };
  template <class V>
  struct Kept final : Base {
    std::vector<Buffer<index_t, Space>> ids;
    std::vector<Lookup<V>> batch;
  };
  std::unique_ptr<Base> kept_;
};

}  // namespace parallax::policy
