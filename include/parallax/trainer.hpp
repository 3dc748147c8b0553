#pragma once
/// @file
/// Trainer: the user's face of training. It owns a model's variables and hands each call to the parts
/// under trainer/ (docs/design.md, "The trainer's parts"): the variables and their synchronizers
/// (registry.hpp), a step's phases (step.hpp) with its learning rate and clipping, lookups ahead
/// (prefetch.hpp), saves (saves.hpp), the communication thread and the timeline.

#include <parallax/arch.hpp>
#include <parallax/checkpoint.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/trainer/calls.hpp>
#include <parallax/trainer/comm_thread.hpp>
#include <parallax/trainer/prefetch.hpp>
#include <parallax/trainer/registry.hpp>
#include <parallax/trainer/saves.hpp>
#include <parallax/trainer/step.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace parallax {

/// Data-parallel training of a set of variables: synchronous, unless every
/// variable's policy is asynchronous (arch::Async; see asynchronous()).
///
/// @tparam Arch      arch::Hybrid, arch::AllReduce or arch::PS: which policy each variable gets (a
///                   variable may name its own); the asynchronous arch::Async, AsyncHybrid (async.hpp)
/// @tparam Optimizer optim::Sgd, Momentum, Adagrad, Adam, or optim::Groups of them per variable
/// @tparam Engine    the transport (engine::Mpi for HostSpace variables)
///
/// Per step, every rank calls lookup() for the sparse rows it needs (or takes with rows() those it
/// prefetch()ed during the previous step), writes gradients (`dense.grad()`, `sparse.grad().add(ids,
/// rows)`), and calls step(). Every call is collective: all ranks make the same calls in the same order.
template <class Arch, class Optimizer, class Engine = engine::Mpi>
class Trainer {
  static_assert(engine::check<Engine>());
  static_assert(optim::check<Optimizer>());

 public:
  using space = engine::space_of_t<Engine>;
  using arch = Arch;
  using optimizer = Optimizer;
  using engine_type = Engine;
  /// The rows of a sparse variable of type V, as lookups return them.
  template <class V>
  using RowsOf = Rows<typename V::value_type, space>;
  /// Whether prefetch() and rows() serve variables of type V here (their policy looks up ahead; an
  /// asynchronous one does not): code written for any architecture tests it with `if constexpr`.
  template <class V>
  static constexpr bool can_prefetch = policy::looks_up_ahead_v<policy_for_t<Arch, V>, V, Engine, Optimizer>;
  /// Whether prefetch() takes bags of variables of type V here (ShardedPS).
  template <class V>
  static constexpr bool can_prefetch_bags = policy::looks_up_bags_ahead_v<policy_for_t<Arch, V>, V, Engine, Optimizer>;

  /// Registers the variables (each argument a variable or a collection of one kind: px::Variables<V>, a
  /// std::vector) and places them. Collective; every rank must pass the same variables in the same order,
  /// or every rank throws naming the first difference. The options are resolve()d first.
  template <class... Args>
  Trainer(const Context& ctx, Optimizer opt, Args&... vars) : Trainer(ctx, TrainerOptions{}, opt, vars...) {}
  template <class... Args>
  Trainer(const Context& ctx, TrainerOptions options, Optimizer opt, Args&... vars)
      : ctx_(&ctx),
        options_(options.resolve<space>(ctx)),
        opt_(opt),
        engine_(std::make_unique<Engine>(ctx, options_.engine)),
        steps_(*engine_, registry_, options_, opt_),
        comm_(options_.overlap, trainer::CommThread::lends_core<space>(ctx, options_)) {
    registry_.add_all(*engine_, opt_, options_, this, vars...);
    steps_.registered();
    saves_.emplace(*engine_, options_.checkpoint, registry_, steps_);
    calls_.record(ctx, options_.timeline);
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  /// The variables may join another trainer once this one is gone. A
  /// trainer that records the timeline writes it (collective, unless the job failed).
  ~Trainer() {
    comm_.drain_quietly(engine_->rank());
    registry_.release();
  }

  /// The rows of a sparse variable for `n` ids (in the engine's space), aligned
  /// to the ids (duplicates allowed). Collective; valid until step().
  template <class V>
  RowsOf<V> lookup(V& var, const index_t* ids, std::size_t n) {
    const Lookup<V> one(var, ids, n);
    return lookup(&one, 1).front();
  }
  template <class V>
  RowsOf<V> lookup(V& var, const Buffer<index_t, space>& ids) { return lookup(var, ids.data(), ids.size()); }
  /// Host ids, copied to the engine's space first.
  template <class V>
  RowsOf<V> lookup(V& var, const std::vector<index_t>& ids) {
    if constexpr (std::is_same_v<space, HostSpace>) return lookup(var, ids.data(), ids.size());
    staged_ids_.assign_from_host(ids.data(), ids.size());
    return lookup(var, staged_ids_.data(), ids.size());
  }
  /// A DynamicVariable's rows for 64-bit keys (new keys get rows at their owners; index_t and uint64_t
  /// are one type's two forms, and the policy reads the ids' bits back as keys). Collective.
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  RowsOf<V> lookup(V& var, const std::vector<std::uint64_t>& keys) {
    return lookup(var, reinterpret_cast<const index_t*>(keys.data()), keys.size());
  }
  /// The rows of several sparse variables at once, `result[i]` for `batch[i]`,
  /// as lookup() of each would return them; their policy serves the batch as
  /// a whole. A bad id throws on every rank, naming its variable, before any
  /// row moves. Collective; valid until step().
  template <class V>
  std::vector<RowsOf<V>> lookup(const Lookup<V>* batch, std::size_t count) {
    static_assert(V::is_sparse(), "lookup() is for sparse variables; read a dense variable's value() directly");
    return serve<V>("lookup", batch, count, [&](auto& s) { return s.lookup(batch, count); });
  }
  template <class V>
  std::vector<RowsOf<V>> lookup(const std::vector<Lookup<V>>& batch) { return lookup(batch.data(), batch.size()); }
  template <class V>
  std::vector<RowsOf<V>> lookup(std::initializer_list<Lookup<V>> batch) { return lookup(batch.begin(), batch.size()); }

  /// Bags (multi-hot; docs/design.md, "Bags"): `result[i]` has a row per bag of
  /// `batch[i]`, the sum, mean or weighted sum of its ids' rows (zero if empty),
  /// pooled at the owners under ShardedPS, where gathered under AllGatherv, where
  /// read under AsyncPS. A bad offset, id or weight throws on every rank (under
  /// AsyncPS on its own). Collective (not under AsyncPS); until step().
  template <class V>
  std::vector<RowsOf<V>> lookup(const Bags<V>* batch, std::size_t count) {
    static_assert(policy::looks_up_bags_v<policy_for_t<Arch, V>, V, Engine, Optimizer>,
                  "lookup() of bags: this variable's policy does not pool (ShardedPS, AllGatherv and AsyncPS do; "
                  "for a dynamic table look the keys up and pool them with pool_bags())");
    return serve<V>("lookup", batch, count, [&](auto& s) { return s.lookup_bags(batch, count); });
  }
  template <class V>
  std::vector<RowsOf<V>> lookup(std::initializer_list<Bags<V>> batch) { return lookup(batch.begin(), batch.size()); }
  /// The gradient (bags x cols per request, in order) of this step's last lookup() of bags. Collective.
  template <class V>
  void bag_gradients(const BagGradient<V>* grads, std::size_t count) {
    serve<V>("bag_gradients", grads, count, [&](auto& s) { s.bag_gradients(grads, count); });
  }
  template <class V>
  void bag_gradients(const std::vector<BagGradient<V>>& grads) { bag_gradients(grads.data(), grads.size()); }
  template <class V>
  void bag_gradients(std::initializer_list<BagGradient<V>> grads) { bag_gradients(grads.begin(), grads.size()); }

  /// Starts the batched lookup of the next batch while this one computes
  /// (what reads no table runs now); rows() takes the rows later, equal bit for
  /// bit to what lookup() would return then. Collective; one at a time; it
  /// survives step(), lookups and save(); restore() cancels it. A bad id
  /// throws from rows() on every rank. See trainer/prefetch.hpp.
  template <class V>
  Prefetched<V> prefetch(const Lookup<V>* batch, std::size_t count) {
    static_assert(V::is_sparse(), "prefetch() is for sparse variables; read a dense variable's value() directly");
    using Policy = policy_for_t<Arch, V>;
    static_assert(policy::looks_up_ahead_v<Policy, V, Engine, Optimizer>,
                  "prefetch(): this variable's policy cannot look up ahead (its synchronizer has no "
                  "start_lookup / finish_lookup); use lookup()");
    steps_.ensure_usable();
    const trainer::Calls::Scope call(calls_, "prefetch");
    prefetches_.check_free();
    registry_.check_batch(batch, count, "prefetch");
    registry_.template synchronizer_of<Policy>().start_lookup(batch, count, comm_);
    return prefetches_.started(batch, count, registry_.template index_of<Policy>());
  }
  template <class V>
  Prefetched<V> prefetch(const std::vector<Lookup<V>>& batch) { return prefetch(batch.data(), batch.size()); }
  /// prefetch() of plain lookups and bags together (one prefetch at a
  /// time): rows() returns the `batch`'s rows, then a pooled block per
  /// request of `bags`, as lookup() of each would return them then, and
  /// bag_gradients() takes the bags' gradient as after lookup() of bags.
  /// What reads no row runs now (under ShardedPS the bags' check, the choice
  /// of pooling, the owners' segments planned and routed); the pooling waits
  /// for rows(). A variable appears once in all. A bad request throws from
  /// rows() on every rank. Collective.
  template <class V>
  Prefetched<V> prefetch(const Lookup<V>* batch, std::size_t count, const Bags<V>* bags, std::size_t bag_count) {
    using Policy = policy_for_t<Arch, V>;
    static_assert(policy::looks_up_bags_ahead_v<Policy, V, Engine, Optimizer>,
                  "prefetch() of bags: this variable's policy cannot look bags up ahead (ShardedPS can); use lookup()");
    steps_.ensure_usable();
    const trainer::Calls::Scope call(calls_, "prefetch");
    prefetches_.check_free();
    registry_.check_batch(batch, count, "prefetch");
    registry_.check_batch(bags, bag_count, "prefetch");
    for (std::size_t i = 0; i < bag_count; ++i)
      for (std::size_t j = 0; j < count; ++j)
        PARALLAX_EXPECTS(!batch[j].var->same_as(*bags[i].var), "variable '", bags[i].var->name(),
                         "' appears twice in one batched prefetch (looked up and in bags); give it all its ids in one "
                         "request");
    registry_.template synchronizer_of<Policy>().start_lookup(batch, count, bags, bag_count, comm_);
    return prefetches_.started(batch, count, registry_.template index_of<Policy>(), bags, bag_count);
  }
  template <class V>
  Prefetched<V> prefetch(const std::vector<Lookup<V>>& batch, const std::vector<Bags<V>>& bags) {
    return prefetch(batch.data(), batch.size(), bags.data(), bags.size());
  }
  template <class V>
  Prefetched<V> prefetch(std::initializer_list<Lookup<V>> batch, std::initializer_list<Bags<V>> bags) {
    return prefetch(batch.begin(), batch.size(), bags.begin(), bags.size());
  }
  template <class V>
  Prefetched<V> prefetch(std::initializer_list<Lookup<V>> batch) { return prefetch(batch.begin(), batch.size()); }

  /// The rows of a prefetch, `result[i]` for its `batch[i]`: what lookup() of its batch would return now,
  /// valid until step(). Takes the prefetch (once), whether it returns or throws. Collective.
  template <class V>
  std::vector<RowsOf<V>> rows(Prefetched<V>& p) {
    steps_.ensure_usable();
    const trainer::Calls::Scope call(calls_, "rows");
    prefetches_.take(p);
    finish_background();
    engine_->set_step(static_cast<std::int64_t>(steps_.done() + 1));
    return registry_.template synchronizer_of<policy_for_t<Arch, V>>().template finish_lookup<V>();
  }
  template <class V>
  std::vector<RowsOf<V>> rows(Prefetched<V>&& p) { return rows(p); }

  /// Says the gradients of `vars` are final for this step, so their policies
  /// may start moving them (on the communication thread, or at once) while the
  /// caller computes the others; step() finishes it, with the same sums, bit
  /// for bit. Optional; every rank marks the same variables in the same order,
  /// and a gradient must not change once ready (see update_when_ready).
  template <class... Args>
  void ready(Args&... vars) { steps_.ready(comm_, vars...); }

  /// Synchronises every gradient with its policy, applies the optimizer and
  /// clears the gradients; returns whether it applied them. Collective. Bad
  /// data on any rank throws on every rank, naming rank and step. A NaN or
  /// infinite gradient skips the step on every rank by default (on_non_finite).
  bool step() {
    steps_.ensure_usable();
    const trainer::Calls::Scope call(calls_, "step");
    finish_background();
    const trainer::StepOutcome outcome = steps_.run(saves_->checkpoints().time_to_save(), comm_.helper());
    if (outcome.applied && saves_->checkpoints().due(steps_.done(), outcome.save_requested))
      save(options_.checkpoint.dir);
    return outcome.applied;
  }
  /// Steps skipped for a gradient that is not finite (on_non_finite skip),
  /// since the trainer was made; and why the last one was, as a sentence
  /// naming the rank, the variable, where and the step (empty before any).
  std::uint64_t skipped_steps() const noexcept { return steps_.skipped(); }
  const std::string& skipped_why() const noexcept { return steps_.skipped_why(); }

  /// Saves variables, optimizer state, step count and base learning rate as
  /// checkpoint `dir/step-<steps()>`; returns its path. Collective.
  std::string save(const std::string& dir) {
    steps_.ensure_usable();
    finish_background();
    return saves_->save(dir);
  }
  /// save() into checkpoint.dir.
  std::string save() {
    PARALLAX_EXPECTS(!options_.checkpoint.dir.empty(), "save(): TrainerOptions::checkpoint.dir is empty");
    return save(options_.checkpoint.dir);
  }

  /// Restores what save() saved from checkpoint `path`, onto any number of
  /// ranks, converting precisions (restored_conversions() names them). All is
  /// checked first (manifest, model, sizes, CRC-32C); a problem on any rank
  /// throws on every rank before anything is loaded. Collective.
  void restore(const std::string& path) {
    finish_background();
    // Another step's batch is not the one prefetched: cancelled, whether or not the restore succeeds.
    if (const auto s = prefetches_.cancel("restore(\"" + path + "\")")) registry_.synchronizer(*s).cancel_lookup();
    saves_->restore(path);
  }

  /// Restores the newest complete checkpoint under `dir`; false if none. Collective.
  bool restore_latest(const std::string& dir) {
    const auto step = saves_->checkpoints().latest(dir);
    if (step) restore(dir + "/" + detail::checkpoint_dir_name(*step));
    return step.has_value();
  }

  std::uint64_t steps() const noexcept { return steps_.done(); }  ///< steps completed
  /// The last restore's precision conversions, one sentence each.
  const auto& restored_conversions() const { return saves_->checkpoints().restored_conversions(); }

  /// Whether every variable's policy is asynchronous (arch::Async; async.hpp):
  /// no step waits for the others beyond TrainerOptions::async.staleness.
  bool asynchronous() const noexcept { return steps_.asynchronous(); }
  /// Returns once every rank called it and every asynchronous push made before is applied.
  void quiesce() { saves_->quiesce(); }
  /// What the staleness bound did on this rank; throws without an asynchronous policy.
  const AsyncStats& async_stats() {
    if (const AsyncStats* a = registry_.async_stats()) return *a;
    throw error("async_stats(): no variable of this Trainer has an asynchronous policy (AsyncPS)");
  }

  /// The next step's learning rate: the base rate times the schedule's factor.
  double learning_rate() const { return steps_.learning_rate(); }
  /// Sets the base rate the schedule scales; every rank sets the same.
  void set_learning_rate(double lr) { steps_.set_learning_rate(lr); }
  /// The global L2 norm of the last step's gradient before clipping, measured
  /// when TrainerOptions::clip_norm is positive (0 otherwise).
  double gradient_norm() const noexcept { return steps_.gradient_norm(); }

  /// The whole variable, row-major, on every rank's host (collective if sharded).
  template <class V>
  std::vector<typename V::value_type> fetch(const V& var) {
    finish_background();
    quiesce();  // asynchronous: every push before is in, and none lands while the rows are read
    std::vector<typename V::value_type> out(var.shape().elements());
    registry_.member_of(var).fetch(out.data());
    quiesce();
    return out;
  }

  /// Rows of `var` stored on this rank (its shard, if sharded).
  template <class V>
  std::size_t stored_rows(const V& var) { return registry_.member_of(var).stored_rows(); }
  /// Bytes of `var`'s values stored on this rank, in its storage type (a
  /// bf16 table's are half a float table's); optimizer state not counted.
  template <class V>
  std::size_t stored_bytes(const V& var) { return registry_.member_of(var).stored_bytes(); }
  /// Whether `var`'s rows on this rank live in shared memory that the other
  /// ranks' lookups read directly (see ShardedOptions::shared_memory).
  template <class V>
  bool in_shared_memory(const V& var) { return registry_.member_of(var).in_shared_memory(); }
  /// The name of the policy synchronising `var`.
  template <class V>
  std::string policy_of(const V& var) { return registry_.member_of(var).policy(); }

  /// Bytes and calls of every engine call so far, by variable and policy (after ready()'s work finished).
  CommStats& stats() {
    finish_background();
    return engine_->stats();
  }
  Engine& engine() noexcept { return *engine_; }
  const Context& context() const noexcept { return *ctx_; }
  /// Whether ready() and prefetch() hand their work to a communication thread (options().overlap, as
  /// resolved), or do it at once; whether step() shares its dense updates with it (CommThread::lends_core()).
  bool overlapping() const noexcept { return comm_.threaded(); }
  bool shares_update() const noexcept { return comm_.lends_core(); }
  const TrainerOptions& options() const noexcept { return options_; }
  /// The synchronizer of a policy this trainer uses (for tests and tools).
  template <class Policy>
  policy::synchronizer_t<Policy, Engine, Optimizer>& synchronizer() {
    return registry_.template synchronizer_of<Policy>();
  }

  /// One line per variable: policy, rows stored here.
  std::string describe() const { return registry_.describe(engine_->rank()); }

 private:
  /// The one place that hands a batch of sparse variables of type V to their policy's synchronizer,
  /// `f(synchronizer)`, once the trainer is usable, ready()'s work is done and the batch checked. Collective.
  template <class V, class Request, class Serve>
  decltype(auto) serve(const char* call, const Request* batch, std::size_t count, Serve&& f) {
    steps_.ensure_usable();
    const trainer::Calls::Scope scope(calls_, call);
    finish_background();
    engine_->set_step(static_cast<std::int64_t>(steps_.done() + 1));
    registry_.check_batch(batch, count, call);
    return f(registry_.template synchronizer_of<policy_for_t<Arch, V>>());
  }
  /// Waits for the work ready() started; if it failed, the step is abandoned on every rank alike (an
  /// engine's failure names itself on every rank).
  void finish_background() { comm_.drain([&] { steps_.abandon(); }); }

  const Context* ctx_;
  TrainerOptions options_;  // resolved
  Optimizer opt_;
  std::unique_ptr<Engine> engine_;
  trainer::Registry<Arch, Engine, Optimizer> registry_;  // after the engine: the synchronizers use it
  trainer::Steps<Arch, Engine, Optimizer> steps_;
  std::optional<trainer::Saves<Arch, Engine, Optimizer>> saves_;  // made once the variables are registered
  trainer::CommThread comm_;  // after the synchronizers: its work uses them
  trainer::Calls calls_;      // the timeline
  trainer::Prefetches prefetches_{this};
  Buffer<index_t, space> staged_ids_;
};

}  // namespace parallax
