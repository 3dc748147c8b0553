#pragma once
/// @file
/// Trainer: owns a model's variables and runs each step's synchronisation and
/// optimizer update, routing every variable to its policy at compile time.

#include <parallax/arch.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/slots.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/space.hpp>
#include <parallax/variable.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax {

/// How the ranks' gradients are combined.
enum class Reduction {
  mean,  ///< sum over ranks divided by the rank count: with equal local batches
         ///< and per-rank mean losses, the gradient of the global batch's mean loss
  sum,   ///< plain sum over ranks (for gradients already scaled by the global batch)
};

/// Settings of a Trainer. Every field has a working default.
struct TrainerOptions {
  Reduction reduction = Reduction::mean;
  RingOptions ring;        ///< RingAllReduce: algorithm, segments, fusion buckets
  ShardedOptions sharded;  ///< ShardedPS: default partition count, local aggregation
  /// Partition count per variable name, overriding sharded.partitions.
  std::map<std::string, int> partitions;
  engine::Options engine;  ///< deadline of every collective
};

/// Synchronous data-parallel training of a set of variables.
///
/// @tparam Arch      arch::Hybrid, arch::AllReduce or arch::PS: which policy
///                   each variable gets (a variable may name its own)
/// @tparam Optimizer optim::Sgd, Momentum, Adagrad or Adam
/// @tparam Engine    the transport (engine::Mpi for HostSpace variables)
///
/// Per step, every rank calls lookup() for the sparse rows it needs, writes
/// gradients (`dense.grad()`, `sparse.grad().add(ids, rows)`), and calls
/// step(). Every call is collective: all ranks make the same calls in the
/// same order.
template <class Arch, class Optimizer, class Engine = engine::Mpi>
class Trainer {
 public:
  using space = engine::space_of_t<Engine>;
  using arch = Arch;
  using optimizer = Optimizer;
  using engine_type = Engine;

  /// Registers the variables and places them (replicas, shards). Collective;
  /// every rank must pass the same variables in the same order, or every
  /// rank throws parallax::error naming the first difference.
  template <class... Vars>
  Trainer(const Context& ctx, Optimizer opt, Vars&... vars) : Trainer(ctx, TrainerOptions{}, opt, vars...) {}

  template <class... Vars>
  Trainer(const Context& ctx, TrainerOptions options, Optimizer opt, Vars&... vars)
      : ctx_(&ctx), options_(std::move(options)), opt_(opt), engine_(std::make_unique<Engine>(ctx, options_.engine)) {
    static_assert(sizeof...(Vars) > 0, "a Trainer needs at least one variable");
    static_assert((is_variable_v<Vars> && ...), "Trainer takes parallax::Variable arguments");
    static_assert((std::is_same_v<typename Vars::space, space> && ...),
                  "every variable must live in the engine's memory space (HostSpace for engine::Mpi)");

    std::vector<detail::VarRecord> records;
    (records.push_back(detail::VarRecord::make(vars.name(), vars.shape(), data_type_of_v<typename Vars::value_type>,
                                               Vars::is_sparse(), policy_for_t<Arch, Vars>::name)),
     ...);
    for (std::size_t i = 0; i < records.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(std::string(records[i].name) != records[j].name, "two variables are named '",
                         records[i].name, "'; names must be unique");
    (check_unregistered(vars), ...);
    detail::agree_on_variables(*engine_, records);

    (add(vars), ...);
    std::vector<TensorRef> fused;
    for (auto& s : slots_) s->fused_tensors(fused);
    reducer_ = std::make_unique<RingAllReducer<Engine>>(*engine_, options_.ring);
    fusion_ = std::make_unique<FusedAllReducer<Engine>>(*reducer_, std::move(fused));
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer() = default;  // the slots release their variables

  /// The rows of a sparse variable for `n` ids (in the engine's space),
  /// aligned to the ids (duplicates allowed). Collective for ShardedPS
  /// variables. The rows stay valid until step().
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const index_t* ids, std::size_t n) {
    static_assert(V::is_sparse(), "lookup() is for sparse variables; read a dense variable's value() directly");
    return sparse_slot(var).lookup(ids, n);
  }
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const Buffer<index_t, space>& ids) {
    return lookup(var, ids.data(), ids.size());
  }
  /// Host ids, copied to the engine's space first.
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const std::vector<index_t>& ids) {
    if constexpr (std::is_same_v<space, HostSpace>) {
      return lookup(var, ids.data(), ids.size());
    } else {
      staged_ids_.assign_from_host(ids.data(), ids.size());
      return lookup(var, staged_ids_.data(), ids.size());
    }
  }

  /// Synchronises every variable's gradient with its policy and applies the
  /// optimizer, then clears the gradients. Collective. Throws on every rank
  /// if any rank gave bad data (ids out of range, wrong shapes) or if no rank
  /// gave any gradient.
  void step() {
    std::optional<std::string> problem;
    bool has_gradient = false;
    for (auto& s : slots_) {
      if (!problem) problem = s->problem();
      has_gradient = has_gradient || s->has_gradient();
    }
    try {
      detail::agree(*engine_, problem, has_gradient,
                    "step(): no variable was given a gradient on any rank since the last step");
    } catch (...) {
      clear();  // the step is abandoned on every rank alike
      throw;
    }
    const detail::StepInfo info{steps_ + 1,
                                options_.reduction == Reduction::mean ? 1.0 / engine_->size() : 1.0};
    {
      auto scope = engine_->stats().scope("(fused dense)", RingAllReduce::name);
      fusion_->run();
    }
    for (auto& s : slots_) s->synchronize(info);
    clear();
    ++steps_;
  }

  /// Steps completed.
  std::uint64_t steps() const noexcept { return steps_; }

  /// The whole variable, row-major, on the host of every rank (collective for
  /// sharded variables). For tests, evaluation and export.
  template <class V>
  std::vector<typename V::value_type> fetch(const V& var) {
    std::vector<typename V::value_type> out(var.shape().elements());
    slot_of(var).fetch(out.data());
    return out;
  }

  /// Rows of `var` stored on this rank (a shard for ShardedPS).
  template <class V>
  std::size_t stored_rows(const V& var) { return slot_of(var).stored_rows(); }
  /// The policy synchronising `var` ("RingAllReduce", "AllGatherv", "ShardedPS").
  template <class V>
  std::string policy_of(const V& var) { return slot_of(var).policy(); }

  /// Bytes and calls of every engine call so far, by variable and policy.
  CommStats& stats() noexcept { return engine_->stats(); }
  Engine& engine() noexcept { return *engine_; }
  const Context& context() const noexcept { return *ctx_; }
  const TrainerOptions& options() const noexcept { return options_; }
  const FusedAllReducer<Engine>& fusion() const noexcept { return *fusion_; }

  /// One line per variable: policy, rows stored here.
  std::string describe() const {
    std::ostringstream os;
    for (const auto& s : slots_)
      os << s->name() << ": " << s->policy() << ", " << s->stored_rows() << " rows on rank " << engine_->rank() << "\n";
    return os.str();
  }

 private:
  using Slot = detail::SlotBase<Engine, Optimizer>;

  template <class V>
  void add(V& var) {
    using Policy = policy_for_t<Arch, V>;
    ShardedOptions sharded = options_.sharded;
    if (auto it = options_.partitions.find(var.name()); it != options_.partitions.end()) sharded.partitions = it->second;
    slots_.push_back(detail::make_slot<Policy>(var, *engine_, opt_, sharded, options_.ring));
    var.state().trainer = this;
  }
  template <class V>
  void check_unregistered(const V& var) {
    PARALLAX_EXPECTS(var.state().trainer == nullptr, "variable '", var.name(),
                     "' is already registered with another Trainer");
  }

  template <class V>
  Slot& slot_of(const V& var) {
    for (auto& s : slots_)
      if (s->identity() == &var.state()) return *s;
    throw error(detail::concat("variable '", var.name(), "' is not registered with this Trainer"));
  }
  template <class V>
  detail::SparseSlot<typename V::value_type, Engine, Optimizer>& sparse_slot(V& var) {
    return static_cast<detail::SparseSlot<typename V::value_type, Engine, Optimizer>&>(slot_of(var));
  }
  void clear() {
    for (auto& s : slots_) s->clear();
  }

  const Context* ctx_;
  TrainerOptions options_;
  Optimizer opt_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::unique_ptr<RingAllReducer<Engine>> reducer_;
  std::unique_ptr<FusedAllReducer<Engine>> fusion_;
  Buffer<index_t, space> staged_ids_;
  std::uint64_t steps_ = 0;
};

}  // namespace parallax
