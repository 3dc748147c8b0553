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
#include <parallax/detail/fault.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/detail/worker.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/variable.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {

namespace detail {
/// A distinct address per type: the key of a policy's synchronizer.
template <class T>
inline constexpr char type_key = 0;
}  // namespace detail

template <class Arch, class Optimizer, class Engine>
class Trainer;

/// A batched lookup of sparse variables of type V started ahead by
/// Trainer::prefetch(), whose rows Trainer::rows() takes, once. Move-only;
/// empty when default-made or moved from.
template <class V>
class Prefetched {
 public:
  Prefetched() = default;
  Prefetched(Prefetched&& o) noexcept
      : trainer_(std::exchange(o.trainer_, nullptr)), serial_(std::exchange(o.serial_, 0)),
        taken_(std::exchange(o.taken_, false)) {}
  Prefetched& operator=(Prefetched&& o) noexcept {
    trainer_ = std::exchange(o.trainer_, nullptr);
    serial_ = std::exchange(o.serial_, 0);
    taken_ = std::exchange(o.taken_, false);
    return *this;
  }
  Prefetched(const Prefetched&) = delete;
  Prefetched& operator=(const Prefetched&) = delete;

  /// Whether it holds a prefetch whose rows have not been taken.
  bool pending() const noexcept { return trainer_ != nullptr && !taken_; }

 private:
  template <class A, class O, class E>
  friend class Trainer;
  Prefetched(const void* trainer, std::uint64_t serial) : trainer_(trainer), serial_(serial) {}

  const void* trainer_ = nullptr;  // the trainer that made it
  std::uint64_t serial_ = 0;       // its number among that trainer's prefetches
  bool taken_ = false;
};

/// Data-parallel training of a set of variables: synchronous, unless every
/// variable's policy is asynchronous (arch::Async; see asynchronous()).
///
/// @tparam Arch      arch::Hybrid, arch::AllReduce or arch::PS: which policy
///                   each variable gets (a variable may name its own); the
///                   asynchronous arch::Async and arch::AsyncHybrid (async.hpp)
/// @tparam Optimizer optim::Sgd, Momentum, Adagrad or Adam
/// @tparam Engine    the transport (engine::Mpi for HostSpace variables)
///
/// Per step, every rank calls lookup() for the sparse rows it needs (or
/// takes with rows() those it prefetch()ed during the previous step), writes
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
  /// Whether prefetch() and rows() serve variables of type V here (their
  /// policy looks up ahead; an asynchronous one does not): code written for
  /// any architecture tests it with `if constexpr`.
  template <class V>
  static constexpr bool can_prefetch = policy::looks_up_ahead_v<policy_for_t<Arch, V>, V, Engine, Optimizer>;

  /// Registers the variables and places them (replicas, shards). Each
  /// argument is a variable or a collection of variables of one kind
  /// (px::Variables<V>, a std::vector). Collective; every rank must pass the
  /// same variables in the same order, or every rank throws parallax::error
  /// naming the first difference.
  template <class... Args>
  Trainer(const Context& ctx, Optimizer opt, Args&... vars) : Trainer(ctx, TrainerOptions{}, opt, vars...) {}

  template <class... Args>
  Trainer(const Context& ctx, TrainerOptions options, Optimizer opt, Args&... vars)
      : ctx_(&ctx),
        options_(std::move(options)),
        opt_(opt),
        engine_(std::make_unique<Engine>(ctx, engine_options(ctx, options_))),
        worker_(communication_thread(ctx, options_)) {
    static_assert(sizeof...(Args) > 0, "a Trainer needs at least one variable");
    static_assert((is_variable_v<detail::variable_of_t<Args>> && ...),
                  "Trainer takes parallax::Variable arguments, or std::vectors of them (px::Variables<V>)");
    static_assert((std::is_same_v<typename detail::variable_of_t<Args>::space, space> && ...),
                  "every variable must live in the engine's memory space (HostSpace for engine::Mpi)");
    static_assert((policy::check<policy_for_t<Arch, detail::variable_of_t<Args>>, detail::variable_of_t<Args>, Engine,
                                 Optimizer>() &&
                   ...));
    if constexpr (optim::has_learning_rate_v<Optimizer>) base_lr_ = static_cast<double>(opt_.lr);
    else PARALLAX_EXPECTS(!options_.schedule, "TrainerOptions::schedule needs an optimizer with a learning rate `lr`");
    PARALLAX_EXPECTS(!options_.update_when_ready || options_.clip_norm <= 0,
                     "TrainerOptions::update_when_ready updates a variable before the step has every gradient, ",
                     "so it cannot scale them by their global norm: clip_norm must be 0, not ", options_.clip_norm);
    PARALLAX_EXPECTS(!options_.update_when_ready || !options_.check_finite,
                     "TrainerOptions::update_when_ready updates a variable before the step has checked every "
                     "gradient, so check_finite must be off");

    std::vector<detail::VarRecord> records;
    auto record = [&](auto& v) {
      using V = std::remove_reference_t<decltype(v)>;
      records.push_back(detail::VarRecord::make(v.name(), v.shape(), data_type_of_v<typename V::value_type>,
                                                V::is_sparse(), policy_for_t<Arch, V>::name));
    };
    (detail::for_each_variable(vars, record), ...);
    std::vector<std::string> names;
    for (const auto& r : records) names.emplace_back(r.name);
    std::sort(names.begin(), names.end());
    for (std::size_t i = 1; i < names.size(); ++i)
      PARALLAX_EXPECTS(names[i] != names[i - 1], "two variables are named '", names[i], "'; names must be unique");
    (detail::for_each_variable(vars, [&](auto& v) { check_unregistered(v); }), ...);
    detail::agree_on_variables(*engine_, records);

    try {
      (detail::for_each_variable(vars, [&](auto& v) { add(v); }), ...);
      for (auto& s : synchronizers_) s.second->prepare();
      check_asynchronous();
    } catch (...) {
      for (const void** t : registered_) *t = nullptr;  // the variables may join another trainer
      throw;
    }
    checkpoints_ = std::make_unique<Checkpoints<Engine>>(*engine_, options_.checkpoint, Optimizer::name,
                                                         Optimizer::slots, members_);
    if (options_.timeline.empty())
      if (const char* env = std::getenv("PARALLAX_TIMELINE")) options_.timeline = env;
    if (!options_.timeline.empty() && !detail::Timeline::get().on()) {
      detail::Timeline::get().start(ctx.comm(), options_.timeline);
      records_timeline_ = true;
    }
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// The variables may join another trainer once this one is gone. A
  /// trainer that records the timeline writes it (collective, unless the
  /// job failed).
  ~Trainer() {
    try {
      worker_.drain();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "parallax: rank %d: %s\n", engine_->rank(), e.what());
    }
    for (const void** t : registered_) *t = nullptr;
    if (records_timeline_ && !detail::job_failed()) {
      try {
        detail::Timeline::get().finish();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "parallax: %s\n", e.what());
      }
    }
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
    const Call call(*this, "lookup");
    finish_background();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    check_batch(batch, count, "lookup");
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

  /// Starts the batched lookup of the next batch while this one computes:
  /// what does not read the tables (the ids are copied, validated, keyed,
  /// sorted, de-duplicated and routed to their owners) runs now, on the
  /// communication thread (TrainerOptions::overlap) or at once; rows()
  /// takes the rows later, typically after this step's step(), and they
  /// equal what lookup() of the same batch would return at that moment, bit
  /// for bit. The ids may be reused once prefetch() returns. A policy that
  /// replicates its tables has nothing to route: it keeps the ids and
  /// gathers the rows in rows().
  ///
  /// Collective: every rank prefetches the same variables in the same
  /// order, where the others do. One prefetch at a time (a second one
  /// before rows() throws). The prefetch survives step() (also one that
  /// throws), plain lookups and save(); restore() cancels it. A bad id, or
  /// ranks that prefetch different variables, throw from rows() on every
  /// rank, naming the variable and the rank, as lookup() would.
  template <class V>
  Prefetched<V> prefetch(const Lookup<V>* batch, std::size_t count) {
    static_assert(V::is_sparse(), "prefetch() is for sparse variables; read a dense variable's value() directly");
    using Policy = policy_for_t<Arch, V>;
    static_assert(policy::looks_up_ahead_v<Policy, V, Engine, Optimizer>,
                  "prefetch(): this variable's policy cannot look up ahead (its synchronizer has no "
                  "start_lookup / finish_lookup); use lookup()");
    ensure_usable();
    const Call call(*this, "prefetch");
    PARALLAX_EXPECTS(in_flight_ == 0, "prefetch(): the prefetch of ", in_flight_what_,
                     " is in flight; take its rows with rows() first (one prefetch at a time)");
    check_batch(batch, count, "prefetch");
    synchronizer_of<Policy>().start_lookup(batch, count, background_);
    in_flight_ = ++prefetches_;
    in_flight_synchronizer_ = synchronizer_index_of<Policy>();
    in_flight_what_.clear();
    for (std::size_t i = 0; i < count; ++i) in_flight_what_ += detail::concat(i ? ", '" : "'", batch[i].var->name(), "'");
    if (count == 0) in_flight_what_ = "no variables";
    return Prefetched<V>(this, in_flight_);
  }
  template <class V>
  Prefetched<V> prefetch(const std::vector<Lookup<V>>& batch) {
    return prefetch(batch.data(), batch.size());
  }
  template <class V>
  Prefetched<V> prefetch(std::initializer_list<Lookup<V>> batch) {
    return prefetch(batch.begin(), batch.size());
  }

  /// The rows of a prefetch, `result[i]` for its `batch[i]`: what lookup()
  /// of its batch would return now, valid until step(). Takes the prefetch
  /// (once), whether it returns or throws. Collective.
  template <class V>
  std::vector<Rows<typename V::value_type, space>> rows(Prefetched<V>& p) {
    ensure_usable();
    const Call call(*this, "rows");
    PARALLAX_EXPECTS(p.trainer_ != nullptr, "rows(): this Prefetched holds no prefetch (it was made empty, or moved from)");
    PARALLAX_EXPECTS(p.trainer_ == this, "rows(): this prefetch was made by another Trainer");
    PARALLAX_EXPECTS(!p.taken_, "rows(): the rows of this prefetch were taken already; rows() takes them once "
                                "(prefetch again, or look up)");
    PARALLAX_EXPECTS(p.serial_ != cancelled_, "rows(): this prefetch (of ", cancelled_what_, ") was cancelled by ",
                     cancelled_by_, "; prefetch its batch again");
    PARALLAX_EXPECTS(p.serial_ == in_flight_, "rows(): this prefetch is no longer in flight");
    p.taken_ = true;
    in_flight_ = 0;
    finish_background();
    engine_->set_step(static_cast<std::int64_t>(steps_ + 1));
    return synchronizer_of<policy_for_t<Arch, V>>().template finish_lookup<V>();
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> rows(Prefetched<V>&& p) {
    return rows(p);
  }

  /// Says the gradients of `vars` (variables or collections) are final for
  /// this step, so their policies may start moving them while the caller
  /// computes the others: a backward pass marks each layer's as it finishes
  /// it, from the last layer to the first. Each policy decides what a ready
  /// gradient starts (a fusion bucket's all-reduce once all of its gradients
  /// are ready, a table group's push once all of its tables are: see its
  /// synchronizer's ready()). The work runs on the trainer's communication
  /// thread (TrainerOptions::overlap), or at once, and step() finishes it;
  /// the sums are the ones step() alone would make, bit for bit. Optional:
  /// without it, step() moves every gradient. Every rank marks the same
  /// variables in the same order; a gradient must not change once ready.
  /// With TrainerOptions::update_when_ready, a ready variable's update may
  /// follow its sum at once (see there).
  template <class... Args>
  void ready(Args&... vars) {
    ensure_usable();
    const detail::Span span("ready");
    if (!step_begun_) {
      // The step's learning rate, set before any work it posts may read it.
      if constexpr (optim::has_learning_rate_v<Optimizer>)
        opt_.lr = static_cast<decltype(opt_.lr)>(base_lr_ * schedule_factor(steps_ + 1));
      step_begun_ = true;
    }
    const policy::StepInfo info = step_info();
    auto mark = [&](auto& v) {
      policy::Member& m = member_of(v);
      synchronizers_[synchronizer_index_of(m)].second->ready(m, info, background_);
    };
    (detail::for_each_variable(vars, mark), ...);
  }

  /// Synchronises every variable's gradient with its policy and applies the
  /// optimizer, then clears the gradients. Collective. Throws on every rank
  /// if any rank gave bad data (ids out of range, wrong shapes; NaN or
  /// infinities with TrainerOptions::check_finite), naming the rank and the
  /// step, or if no rank gave any gradient; the step is then abandoned.
  void step() {
    ensure_usable();
    const Call call(*this, "step");
    finish_background();
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
    if (asynchronous_) {
      // No agreement: an asynchronous step waits for no other rank. A
      // problem with this rank's data abandons its step here only.
      if (problem) {
        abandon_step();
        throw error(detail::concat("rank ", engine_->rank(), ": ", *problem));
      }
    } else {
      try {
        const detail::Span span("agreement");
        save_requested = detail::agree(*engine_, problem, has_gradient,
                                       "step(): no variable was given a gradient on any rank since the last step",
                                       checkpoints_->time_to_save());
      } catch (...) {
        abandon_step();  // on every rank alike
        throw;
      }
    }
    policy::StepInfo info = step_info();
    try {
      for (std::size_t i = 0; i < synchronizers_.size(); ++i) {
        const auto span = detail::Span::named("parallax", "start exchange: ", policy_names_[i]);
        synchronizers_[i].second->start_exchange(info);
      }
      for (std::size_t i = 0; i < synchronizers_.size(); ++i) {
        const auto span = detail::Span::named("parallax", "finish exchange: ", policy_names_[i]);
        synchronizers_[i].second->finish_exchange(info);
      }
      if (options_.clip_norm > 0) {
        const detail::Span span("clip by the global norm");
        info.scale *= clip_factor(info.scale);
      }
    } catch (...) {
      abandon_step();  // an exchange the ranks disagree on, or a failed norm
      throw;
    }
    if constexpr (optim::has_learning_rate_v<Optimizer>)
      opt_.lr = static_cast<decltype(opt_.lr)>(base_lr_ * schedule_factor(info.step));
    for (std::size_t i = 0; i < synchronizers_.size(); ++i) {
      const auto span = detail::Span::named("parallax", "update: ", policy_names_[i]);
      synchronizers_[i].second->update(info);
    }
    clear();
    ++steps_;
    if (checkpoints_->due(steps_, save_requested)) save(options_.checkpoint.dir);
  }

  /// Saves every variable, its optimizer state, the step count and the base
  /// learning rate as checkpoint `dir/step-<steps()>` (see
  /// Checkpoints::save). Collective; returns the checkpoint's path.
  /// In asynchronous training every rank waits for the others before and
  /// after: the checkpoint holds every push made before the save on any
  /// rank and none made after.
  std::string save(const std::string& dir) {
    ensure_usable();
    finish_background();
    PARALLAX_EXPECTS(!updated_early(), "save(): this step's updates began (TrainerOptions::update_when_ready); ",
                     "save after step()");
    std::optional<double> lr;
    if constexpr (optim::has_learning_rate_v<Optimizer>) lr = base_lr_;
    quiesce();
    std::string path = checkpoints_->save(dir, steps_, lr);
    quiesce();
    return path;
  }
  /// save() into checkpoint.dir.
  std::string save() {
    PARALLAX_EXPECTS(!options_.checkpoint.dir.empty(), "save(): TrainerOptions::checkpoint.dir is empty");
    return save(options_.checkpoint.dir);
  }

  /// Restores every variable, its optimizer state, the step count and the
  /// base learning rate (when the checkpoint recorded one) from
  /// the checkpoint directory `path`, onto any number of ranks (sharded
  /// variables are cut again). Everything is checked first (manifest, model,
  /// every file's size and CRC-32C) and a problem found by any rank is thrown
  /// on every rank before anything is loaded. Collective.
  void restore(const std::string& path) {
    finish_background();
    // The trainer goes back to another step, whose next batch is not the
    // one prefetched: the prefetch is cancelled, whether or not the restore
    // succeeds.
    if (in_flight_ != 0) {
      synchronizers_[in_flight_synchronizer_].second->cancel_lookup();
      cancelled_ = std::exchange(in_flight_, 0);
      cancelled_what_ = in_flight_what_;
      cancelled_by_ = "restore(\"" + path + "\")";
    }
    std::uint64_t step = 0;
    quiesce();
    try {
      step = checkpoints_->restore(path);
    } catch (...) {
      if (checkpoints_->damaged()) unusable_ = "a restore failed while loading; the variables may be half-loaded";
      throw;
    }
    clear();
    steps_ = step;
    for (auto& s : synchronizers_) s.second->restored(step);
    if constexpr (optim::has_learning_rate_v<Optimizer>)
      if (auto lr = checkpoints_->restored_learning_rate()) base_lr_ = *lr;
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

  /// Whether every variable's policy is asynchronous (arch::Async; see
  /// async.hpp): then no step waits for the other ranks' gradients, lookup()
  /// and step() are not collective, and each rank runs at most
  /// TrainerOptions::async.staleness steps ahead of the slowest.
  bool asynchronous() const noexcept { return asynchronous_; }
  /// Asynchronous policies: returns once every rank called it and every
  /// push made before is applied (save(), restore() and fetch() do it
  /// themselves). Collective. Nothing for synchronous policies.
  void quiesce() {
    for (auto& s : synchronizers_) s.second->quiesce();
  }
  /// What the staleness bound did on this rank: its clock, the most it ran
  /// ahead, each rank's lag behind it and the wait each one caused. Throws
  /// when no variable has an asynchronous policy.
  const AsyncStats& async_stats() {
    for (auto& s : synchronizers_)
      if (const AsyncStats* a = s.second->async_stats()) return *a;
    throw error("async_stats(): no variable of this Trainer has an asynchronous policy (AsyncPS)");
  }

  /// The learning rate the next step applies: the base rate times the
  /// schedule's factor for that step (TrainerOptions::schedule).
  double learning_rate() const {
    static_assert(optim::has_learning_rate_v<Optimizer>, "this optimizer has no learning rate `lr`");
    return base_lr_ * schedule_factor(steps_ + 1);
  }
  /// Sets the base learning rate, which the schedule scales (the
  /// optimizer's `lr` until then). Every rank must set the same.
  void set_learning_rate(double lr) {
    static_assert(optim::has_learning_rate_v<Optimizer>, "this optimizer has no learning rate `lr`");
    PARALLAX_EXPECTS(std::isfinite(lr) && lr >= 0, "set_learning_rate: ", lr, " is not a finite rate >= 0");
    PARALLAX_EXPECTS(!(options_.update_when_ready && step_begun_), "set_learning_rate: ready() was called this ",
                     "step, whose updates may have begun at the old rate (TrainerOptions::update_when_ready); ",
                     "set the rate before the step's first ready()");
    base_lr_ = lr;
  }
  /// The global L2 norm of the last step's gradient as applied, before
  /// clipping; measured only when TrainerOptions::clip_norm is positive (0
  /// otherwise).
  double gradient_norm() const noexcept { return gradient_norm_; }

  /// The whole variable, row-major, on the host of every rank (collective for
  /// sharded variables). For tests, evaluation and export.
  template <class V>
  std::vector<typename V::value_type> fetch(const V& var) {
    finish_background();
    quiesce();  // asynchronous: every push before is in, and none lands while the rows are read
    std::vector<typename V::value_type> out(var.shape().elements());
    member_of(var).fetch(out.data());
    quiesce();
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

  /// Bytes and calls of every engine call so far, by variable and policy
  /// (after the work ready() started has finished).
  CommStats& stats() {
    finish_background();
    return engine_->stats();
  }
  Engine& engine() noexcept { return *engine_; }
  const Context& context() const noexcept { return *ctx_; }
  /// Whether ready() and prefetch() hand their work to a communication
  /// thread (TrainerOptions::overlap and overlap_needs_spare_core), or do it
  /// at once, in the caller.
  bool overlapping() const noexcept { return worker_.threaded(); }
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
  /// A call into the trainer on the timeline: the user's time since the
  /// previous call, then the call's own span.
  class Call {
   public:
    Call(Trainer& t, const char* name) : trainer_(&t) {
      detail::Timeline& timeline = detail::Timeline::get();
      if (timeline.on() && t.last_call_end_ >= 0)
        timeline.record("user", "user", t.last_call_end_, timeline.now_us());
      span_.emplace(name);
    }
    ~Call() {
      span_.reset();
      detail::Timeline& timeline = detail::Timeline::get();
      if (timeline.on()) trainer_->last_call_end_ = timeline.now_us();
    }

   private:
    Trainer* trainer_;
    std::optional<detail::Span> span_;
  };

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
      policy_names_.push_back(Policy::name);
      it = synchronizers_.end() - 1;
    }
    auto& s = static_cast<policy::synchronizer_t<Policy, Engine, Optimizer>&>(*it->second);
    members_.push_back(&s.add(var));
    member_synchronizer_.push_back(static_cast<std::size_t>(it - synchronizers_.begin()));
    var.state().trainer = this;
    registered_.push_back(&var.state().trainer);
  }
  template <class Policy>
  policy::synchronizer_t<Policy, Engine, Optimizer>& synchronizer_of() {
    for (auto& [key, s] : synchronizers_)
      if (key == &detail::type_key<Policy>) return static_cast<policy::synchronizer_t<Policy, Engine, Optimizer>&>(*s);
    throw error(detail::concat("this Trainer has no variable synchronised by ", Policy::name));
  }

  /// A batched lookup's variables: held by this trainer, each once.
  template <class V>
  void check_batch(const Lookup<V>* batch, std::size_t count, const char* call) {
    for (std::size_t i = 0; i < count; ++i) {
      member_of(*batch[i].var);  // throws for a variable this trainer does not hold
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(!batch[j].var->same_as(*batch[i].var), "variable '", batch[i].var->name(),
                         "' appears twice in one batched ", call, "; give it all its ids in one request");
    }
  }
  template <class Policy>
  std::size_t synchronizer_index_of() const {
    for (std::size_t i = 0; i < synchronizers_.size(); ++i)
      if (synchronizers_[i].first == &detail::type_key<Policy>) return i;
    return 0;
  }

  /// Whether every synchronizer is asynchronous, and the settings that
  /// asynchronous training cannot honour.
  void check_asynchronous() {
    asynchronous_ = true;
    for (auto& s : synchronizers_) asynchronous_ = asynchronous_ && s.second->asynchronous();
    if (!asynchronous_) return;
    PARALLAX_EXPECTS(options_.clip_norm <= 0, "TrainerOptions::clip_norm needs the global gradient norm of a step, ",
                     "which asynchronous training (", Arch::name, ") has not: every rank steps alone");
    PARALLAX_EXPECTS(options_.checkpoint.every_seconds <= 0, "TrainerOptions::checkpoint.every_seconds needs ",
                     "the ranks to agree at every step, which asynchronous training (", Arch::name,
                     ") does not do: save every_steps instead");
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
    step_begun_ = false;
  }
  policy::StepInfo step_info() const {
    return policy::StepInfo{steps_ + 1, options_.reduction == Reduction::mean ? 1.0 / engine_->size() : 1.0};
  }
  /// Whether work ready() posted this step updated some variable (update_when_ready).
  bool updated_early() const {
    for (const auto& [key, s] : synchronizers_)
      if (s->updated_early()) return true;
    return false;
  }
  /// The step failed: its gradients are forgotten on every rank. If some
  /// variable was already updated (update_when_ready), the model is part
  /// way through the step and the trainer refuses work until restore().
  void abandon_step() {
    if (updated_early())
      unusable_ = detail::concat("step ", steps_ + 1, " failed after updating some variables early ",
                                 "(TrainerOptions::update_when_ready): the model is part way through that step; ",
                                 "restore() a checkpoint");
    clear();
  }
  std::size_t synchronizer_index_of(const policy::Member& m) const {
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (members_[i] == &m) return member_synchronizer_[i];
    return 0;
  }
  /// Waits for the work ready() started; if it failed, the step is
  /// abandoned on every rank alike (the failure is an engine's, which names
  /// itself on every rank).
  void finish_background() {
    try {
      worker_.drain();
    } catch (...) {
      abandon_step();
      throw;
    }
  }
  /// Whether the host's hardware threads cover every local rank's OpenMP
  /// team and one more thread each (the communication thread's core).
  static bool spare_core(const Context& ctx) {
    const long hardware = static_cast<long>(std::thread::hardware_concurrency());
    return hardware >= static_cast<long>(ctx.topology().local_size()) * (ctx.threads() + 1);
  }
  /// The trainer's Background: its worker.
  static bool communication_thread(const Context& ctx, const TrainerOptions& o) {
    if (!o.overlap || !ctx.serialized_threads()) return false;
    if (!o.overlap_needs_spare_core || !std::is_same_v<space, HostSpace>) return true;
    return spare_core(ctx);
  }
  /// The engine's options. A communication thread without a core of its own
  /// shares the rank's with the user's thread: an automatic engine then
  /// yields in its waits, so a wait on one thread leaves the core to the
  /// other (docs/benchmarks.md, "Overlap of communication with compute").
  static engine::Options engine_options(const Context& ctx, const TrainerOptions& o) {
    engine::Options e = o.engine;
    if (e.yield == engine::Options::Yield::automatic && communication_thread(ctx, o) && !spare_core(ctx))
      e.yield = engine::Options::Yield::always;
    return e;
  }

  class Posting final : public policy::Background {
   public:
    explicit Posting(detail::Worker& w) : worker_(&w) {}
    void post(std::function<void()> work) override { worker_->post(std::move(work)); }

   private:
    detail::Worker* worker_;
  };
  double schedule_factor(std::uint64_t step) const { return options_.schedule ? options_.schedule(step) : 1.0; }
  /// The factor that brings the step's gradient (each synchronizer's sums
  /// times `scale`) within clip_norm: one all-reduce of the square sums.
  double clip_factor(double scale) {
    double sum = 0;
    for (std::size_t i = 0; i < synchronizers_.size(); ++i) {
      const auto part = synchronizers_[i].second->gradient_square_sum();
      if (!part) throw error(detail::concat("clipping by the global norm: policy ", policy_names_[i],
                                            " cannot report its gradients' norm"));
      sum += *part;
    }
    {
      auto scope = engine_->stats().scope("", "control");
      engine_->allreduce(&sum, &sum, 1, DataType::f64, ReduceOp::sum);
    }
    gradient_norm_ = std::sqrt(sum) * scale;
    return gradient_norm_ > options_.clip_norm ? options_.clip_norm / gradient_norm_ : 1.0;
  }
  void ensure_usable() const {
    if (!unusable_.empty()) throw error(detail::concat("this Trainer cannot be used: ", unusable_));
  }

  const Context* ctx_;
  TrainerOptions options_;
  Optimizer opt_;
  std::unique_ptr<Engine> engine_;
  Synchronizers synchronizers_;         // one per policy, in the order the variables first name them
  std::vector<const char*> policy_names_;  // of each synchronizer
  std::vector<policy::Member*> members_;  // every variable, in registration order
  std::vector<std::size_t> member_synchronizer_;  // each member's synchronizer
  std::vector<const void**> registered_;  // each variable's link to this trainer
  std::unique_ptr<Checkpoints<Engine>> checkpoints_;
  detail::Worker worker_;  // the communication thread (after the synchronizers: its work uses them)
  Posting background_{worker_};
  Buffer<index_t, space> staged_ids_;
  std::uint64_t steps_ = 0;
  double base_lr_ = 0;        // the learning rate the schedule scales
  double gradient_norm_ = 0;  // of the last step, when clipping
  bool records_timeline_ = false;
  bool asynchronous_ = false;  // every synchronizer is asynchronous: steps make no collective call
  bool step_begun_ = false;    // ready() was called since the last step (its learning rate is set)
  double last_call_end_ = -1;  // on the timeline, microseconds
  std::string unusable_;  // why the trainer refuses work, if it does
  // Prefetches (numbered from 1): the one in flight (0: none), its
  // synchronizer and variables; the last one cancelled, what and by what.
  std::uint64_t prefetches_ = 0, in_flight_ = 0, cancelled_ = 0;
  std::size_t in_flight_synchronizer_ = 0;
  std::string in_flight_what_, cancelled_what_, cancelled_by_;
};

}  // namespace parallax
