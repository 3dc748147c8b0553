#pragma once
/// @file
/// Trainer: owns a model's variables and runs each step's phases over the
/// synchronizers of their policies (chosen at compile time), then the
/// optimizer update; saves and restores them through Checkpoints.

#include <parallax/arch.hpp>
#include <parallax/checkpoint.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {

namespace detail {
/// A distinct address per type: the key of a policy's synchronizer.
template <class T>
inline constexpr char type_key = 0;
}  // namespace detail

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
  static_assert(engine::check<Engine>());
  static_assert(optim::check<Optimizer>());

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
    static_assert((policy::check<policy_for_t<Arch, Vars>, Vars, Engine, Optimizer>() && ...));

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
    for (auto& s : synchronizers_) s.second->prepare();
    checkpoints_ = std::make_unique<Checkpoints<Engine>>(*engine_, options_.checkpoint, Optimizer::name,
                                                         Optimizer::slots, members_);
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// The variables may join another trainer once this one is gone.
  ~Trainer() {
    for (const void** t : registered_) *t = nullptr;
  }

  /// The rows of a sparse variable for `n` ids (in the engine's space),
  /// aligned to the ids (duplicates allowed). Collective (a sharded
  /// variable's rows come from their owners). The rows stay valid until
  /// step().
  template <class V>
  Rows<typename V::value_type, space> lookup(V& var, const index_t* ids, std::size_t n) {
    const Lookup<V> one(var, ids, n);
    return lookup(&one, 1).front();
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
  /// The rows of several sparse variables at once, `result[i]` for
  /// `batch[i]`, as lookup() of each in turn would return them. Their
  /// policy serves the batch as a whole (a sharded policy routes every
  /// variable's ids together). A bad id throws on every rank, naming its
  /// variable, before any row moves. Collective; the rows stay valid until
  /// step().
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t count) {
    static_assert(V::is_sparse(), "lookup() is for sparse variables; read a dense variable's value() directly");
    ensure_usable();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    for (std::size_t i = 0; i < count; ++i) {
      member_of(*batch[i].var);  // throws for a variable this trainer does not hold
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(!batch[j].var->same_as(*batch[i].var), "variable '", batch[i].var->name(),
                         "' appears twice in one batched lookup; give it all its ids in one request");
    }
    return synchronizer_of<policy_for_t<Arch, V>>().lookup(batch, count);
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const std::vector<Lookup<V>>& batch) {
    return lookup(batch.data(), batch.size());
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(std::initializer_list<Lookup<V>> batch) {
    return lookup(batch.begin(), batch.size());
  }

  /// Synchronises every variable's gradient with its policy and applies the
  /// optimizer, then clears the gradients. Collective. Throws on every rank
  /// if any rank gave bad data (ids out of range, wrong shapes; NaN or
  /// infinities with TrainerOptions::check_finite), naming the rank and the
  /// step, or if no rank gave any gradient; the step is then abandoned.
  void step() {
    ensure_usable();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    std::optional<std::string> problem;
    bool has_gradient = false;
    for (auto& [key, s] : synchronizers_) {
      if (!problem) problem = s->problem();
      has_gradient = has_gradient || s->has_gradient();
    }
    if (options_.check_finite)
      for (policy::Member* m : members_)
        if (!problem) problem = m->non_finite_gradient();
    if (problem) *problem += detail::concat(" (step ", steps_ + 1, ")");
    bool save_requested = false;
    try {
      save_requested = detail::agree(*engine_, problem, has_gradient,
                                     "step(): no variable was given a gradient on any rank since the last step",
                                     checkpoints_->time_to_save());
    } catch (...) {
      clear();  // the step is abandoned on every rank alike
      throw;
    }
    const policy::StepInfo info{steps_ + 1, options_.reduction == Reduction::mean ? 1.0 / engine_->size() : 1.0};
    try {
      for (auto& [key, s] : synchronizers_) s->start_exchange(info);
      for (auto& [key, s] : synchronizers_) s->finish_exchange(info);
    } catch (...) {
      clear();  // an exchange the ranks disagree on: nothing was applied
      throw;
    }
    for (auto& [key, s] : synchronizers_) s->update(info);
    clear();
    ++steps_;
    if (checkpoints_->due(steps_, save_requested)) save(options_.checkpoint.dir);
  }

  /// Saves every variable and its optimizer state as checkpoint
  /// `dir/step-<steps()>` (see Checkpoints::save). Collective; returns the
  /// checkpoint's path.
  std::string save(const std::string& dir) {
    ensure_usable();
    return checkpoints_->save(dir, steps_);
  }
  /// save() into checkpoint.dir.
  std::string save() {
    PARALLAX_EXPECTS(!options_.checkpoint.dir.empty(), "save(): TrainerOptions::checkpoint.dir is empty");
    return save(options_.checkpoint.dir);
  }

  /// Restores every variable, its optimizer state and the step count from
  /// the checkpoint directory `path`, onto any number of ranks (sharded
  /// variables are cut again). Everything is checked first (manifest, model,
  /// every file's size and CRC-32C) and a problem found by any rank is thrown
  /// on every rank before anything is loaded. Collective.
  void restore(const std::string& path) {
    std::uint64_t step = 0;
    try {
      step = checkpoints_->restore(path);
    } catch (...) {
      if (checkpoints_->damaged()) unusable_ = "a restore failed while loading; the variables may be half-loaded";
      throw;
    }
    clear();
    steps_ = step;
    unusable_.clear();
  }

  /// Restores the newest complete checkpoint under `dir` and returns true,
  /// or returns false (changing nothing) if there is none. Collective.
  bool restore_latest(const std::string& dir) {
    const auto step = checkpoints_->latest(dir);
    if (!step) return false;
    restore(dir + "/" + detail::checkpoint_dir_name(*step));
    return true;
  }

  /// Steps completed.
  std::uint64_t steps() const noexcept { return steps_; }

  /// The whole variable, row-major, on the host of every rank (collective for
  /// sharded variables). For tests, evaluation and export.
  template <class V>
  std::vector<typename V::value_type> fetch(const V& var) {
    std::vector<typename V::value_type> out(var.shape().elements());
    member_of(var).fetch(out.data());
    return out;
  }

  /// Rows of `var` stored on this rank (its shard, for a sharded variable).
  template <class V>
  std::size_t stored_rows(const V& var) {
    return member_of(var).stored_rows();
  }
  /// Whether `var`'s rows on this rank live in shared memory that the other
  /// ranks' lookups read directly (see ShardedOptions::shared_memory).
  template <class V>
  bool in_shared_memory(const V& var) {
    return member_of(var).in_shared_memory();
  }
  /// The name of the policy synchronising `var`.
  template <class V>
  std::string policy_of(const V& var) {
    return member_of(var).policy();
  }

  /// Bytes and calls of every engine call so far, by variable and policy.
  CommStats& stats() noexcept { return engine_->stats(); }
  Engine& engine() noexcept { return *engine_; }
  const Context& context() const noexcept { return *ctx_; }
  const TrainerOptions& options() const noexcept { return options_; }
  /// The synchronizer of a policy this trainer uses (for tests and tools).
  template <class Policy>
  policy::synchronizer_t<Policy, Engine, Optimizer>& synchronizer() {
    return synchronizer_of<Policy>();
  }

  /// One line per variable: policy, rows stored here.
  std::string describe() const {
    std::ostringstream os;
    for (const policy::Member* m : members_)
      os << m->name() << ": " << m->policy() << ", " << m->stored_rows() << " rows on rank " << engine_->rank()
         << (m->in_shared_memory() ? " (shared memory)" : "") << "\n";
    return os.str();
  }

 private:
  using Synchronizers = std::vector<std::pair<const void*, std::unique_ptr<policy::Synchronizer<Engine>>>>;

  template <class V>
  void add(V& var) {
    using Policy = policy_for_t<Arch, V>;
    const void* key = &detail::type_key<Policy>;
    auto it = synchronizers_.begin();
    while (it != synchronizers_.end() && it->first != key) ++it;
    if (it == synchronizers_.end()) {
      synchronizers_.emplace_back(key, std::make_unique<policy::synchronizer_t<Policy, Engine, Optimizer>>(
                                           *engine_, opt_, options_));
      it = synchronizers_.end() - 1;
    }
    auto& s = static_cast<policy::synchronizer_t<Policy, Engine, Optimizer>&>(*it->second);
    members_.push_back(&s.add(var));
    var.state().trainer = this;
    registered_.push_back(&var.state().trainer);
  }
  template <class Policy>
  policy::synchronizer_t<Policy, Engine, Optimizer>& synchronizer_of() {
    for (auto& [key, s] : synchronizers_)
      if (key == &detail::type_key<Policy>) return static_cast<policy::synchronizer_t<Policy, Engine, Optimizer>&>(*s);
    throw error(detail::concat("this Trainer has no variable synchronised by ", Policy::name));
  }

  template <class V>
  void check_unregistered(const V& var) {
    PARALLAX_EXPECTS(var.state().trainer == nullptr, "variable '", var.name(),
                     "' is already registered with another Trainer");
  }
  template <class V>
  policy::Member& member_of(const V& var) {
    for (policy::Member* m : members_)
      if (m->identity() == &var.state()) return *m;
    throw error(detail::concat("variable '", var.name(), "' is not registered with this Trainer"));
  }
  void clear() {
    for (auto& [key, s] : synchronizers_) s->clear();
  }
  void ensure_usable() const {
    if (!unusable_.empty()) throw error(detail::concat("this Trainer cannot be used: ", unusable_));
  }

  const Context* ctx_;
  TrainerOptions options_;
  Optimizer opt_;
  std::unique_ptr<Engine> engine_;
  Synchronizers synchronizers_;         // one per policy, in the order the variables first name them
  std::vector<policy::Member*> members_;  // every variable, in registration order
  std::vector<const void**> registered_;  // each variable's link to this trainer
  std::unique_ptr<Checkpoints<Engine>> checkpoints_;
  Buffer<index_t, space> staged_ids_;
  std::uint64_t steps_ = 0;
  std::string unusable_;  // why the trainer refuses work, if it does
};

}  // namespace parallax
