#pragma once
/// @file
/// The protocol between a Trainer and its communicator policies.
///
/// A policy is a tag type (RingAllReduce, AllGatherv, ShardedPS, or one of
/// your own) that names its synchronizer:
///
///     struct MyPolicy {
///       static constexpr const char* name = "MyPolicy";
///       template <class Engine, class Optimizer>
///       using synchronizer = MySynchronizer<Engine, Optimizer>;
///     };
///
/// A trainer makes one synchronizer per policy its variables use and hands
/// it every such variable, in registration order. The synchronizer derives
/// from policy::Synchronizer<Engine> (the phases of a step, below) and has
///
///     MySynchronizer(Engine&, const Optimizer&, const policy::Common&);  // keep a reference to
///                                                                        // the optimizer: its
///                                                                        // learning rate changes
///     template <class Var> policy::Member& add(Var var);   // the variable, placed
///
/// A built-in policy's tag also lists the settings of its own that its
/// synchronizer receives after the common ones (RingAllReduce:
/// `using options = std::tuple<ring::Options>;`, so its synchronizer takes
/// `(Engine&, const Optimizer&, const Common&, const ring::Options&)`); a
/// TrainerOptions carries each of them (`ring`, `sharded`, `async`).
///
/// A synchronizer that takes sparse variables also has
///
///     template <class V>
///     std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t n);
///
/// To look up ahead (Trainer::prefetch), a sparse variable's synchronizer
/// splits that lookup in two phases:
///
///     template <class V>
///     void start_lookup(const Lookup<V>* batch, std::size_t n, Background& background);
///     template <class V>
///     std::vector<Rows<typename V::value_type, space>> finish_lookup();
///
/// start_lookup() is collective and does what reads no row (copies the ids,
/// which the caller may reuse at once; validates them; plans and routes
/// them), posting what communicates to `background`; it keeps that state
/// apart from plain lookups' and from the step's, which may come between.
/// finish_lookup() (collective) returns the rows lookup() would return at
/// that moment, or throws, on every rank alike, what the first phase found
/// (a bad id, ranks that disagree). One lookup ahead at a time;
/// cancel_lookup() forgets it. Without these two, a policy's variables
/// cannot be prefetched (a compile error names it).
///
/// To look up bags of ids pooled into one row per bag (bags.hpp;
/// docs/design.md, "Bags"), a sparse variable's synchronizer has
///
///     template <class V>
///     std::vector<Rows<typename V::value_type, space>> lookup_bags(const Bags<V>* batch, std::size_t n);
///     template <class V>
///     void bag_gradients(const BagGradient<V>* grads, std::size_t n);
///
/// both collective: the pooled rows, one per bag, and the gradient of the
/// step's last batch of bags that awaits one. looks_up_bags_v says whether
/// a policy has them (ShardedPS and AllGatherv do). To look bags up ahead
/// (Trainer::prefetch with bags), with plain lookups, it also has
///
///     template <class V>
///     void start_lookup(const Lookup<V>* batch, std::size_t n, const Bags<V>* bags, std::size_t m,
///                       Background& background);
///
/// whose finish_lookup<V>() returns the n lookups' rows, then the m pooled
/// blocks, and whose bags take their gradient by bag_gradients() as
/// lookup_bags()'s do (looks_up_bags_ahead_v; ShardedPS has it).
///
/// policy::check<Policy, Var, Engine, Optimizer>() names what a policy lacks.
/// Before a step, the user may say a variable's gradient is final
/// (Trainer::ready): its synchronizer's ready() may start moving it, on the
/// trainer's communication thread, and, with TrainerOptions::
/// update_when_ready, apply the optimizer to it there once it is summed. A step runs phase by phase over every
/// synchronizer, in the order their policies first appear among the
/// variables: problem() and has_gradient()
/// (then one agreement among the ranks), start_exchange(), finish_exchange(),
/// gradient_square_sum() when the trainer clips by the global norm,
/// update(), clear(). Every rank makes the same calls in the same order, so
/// collectives inside the phases match.

#include <parallax/bags.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/algorithms.hpp>
#include <parallax/detail/checkpoint_io.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/partition.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {

/// One request of a batched Trainer::lookup: a sparse variable and the ids
/// to look up in it (`n` ids at `ids`, in the trainer's memory space; they
/// must stay valid until the lookup returns). Requests of one batch share
/// the variable type; CTAD reads it: `px::Lookup{emb, ids}`.
template <class V>
struct Lookup {
  V* var;
  const index_t* ids;
  std::size_t n;

  Lookup(V& v, const index_t* i, std::size_t count) : var(&v), ids(i), n(count) {}
  Lookup(V& v, const Buffer<index_t, typename V::space>& i) : var(&v), ids(i.data()), n(i.size()) {}
  /// Host ids, for variables in HostSpace.
  template <class S = typename V::space, std::enable_if_t<std::is_same_v<S, HostSpace>, int> = 0>
  Lookup(V& v, const std::vector<index_t>& i) : var(&v), ids(i.data()), n(i.size()) {}
};

namespace policy {

/// A second thread for the work of a step's update phase: the trainer's
/// communication thread where it has a core of its own (a host space whose
/// hardware threads cover one more thread a rank), idle once the step has
/// its sums. Work split between it and the caller is element-wise (each
/// variable's update on one thread), so the results are those of the caller
/// alone, bit for bit.
class Helper {
 public:
  /// Runs `there` on the helper and `here` in the caller; returns when both
  /// have, rethrowing the first failure (the caller's first).
  virtual void share(std::function<void()> there, const std::function<void()>& here) = 0;

 protected:
  ~Helper() = default;
};

/// What a step hands every synchronizer.
struct StepInfo {
  std::uint64_t step = 0;  ///< 1-based number of the step being taken
  double scale = 1.0;      ///< gradient scale (1/N for the mean over ranks)
  /// Whether the step looks for non-finite gradients (on_non_finite is not
  /// ignore): work ready() posts may look at a gradient before its exchange
  /// and keep the verdict for Member::non_finite_gradient().
  bool check_finite = false;
  /// The update phase's second thread (Helper); null where there is none.
  Helper* helper = nullptr;
};

/// A variable as its synchronizer holds it: what the trainer, checkpoints
/// and statistics ask of each variable, whatever its policy.
class Member {
 public:
  virtual ~Member() = default;
  /// The variable's shared state: Variable handles of one variable share it.
  virtual const void* identity() const = 0;
  virtual const std::string& name() const = 0;
  /// The policy's name.
  virtual const char* policy() const = 0;
  /// What a checkpoint records of the variable; its type is that of the
  /// saved elements (a table stored in 16 bits with float optimizer state
  /// saves its rows widened to float, exactly, beside that state).
  virtual detail::VarRecord record() const = 0;
  /// The type the variable's rows are stored in (what a restore converts
  /// the saved elements to).
  virtual DataType stored_type() const { return static_cast<DataType>(record().type); }
  /// Rows of the variable this rank stores (a replica: all of them).
  virtual std::size_t stored_rows() const = 0;
  /// Whether those rows live in shared memory that peers' lookups read.
  virtual bool in_shared_memory() const { return false; }
  /// Bytes of the variable's values this rank stores (its rows in their
  /// storage type; no optimizer state, no buffers).
  virtual std::size_t stored_bytes() const {
    throw error(detail::concat("variable '", name(), "': policy ", policy(), " does not report its stored bytes"));
  }
  /// The whole variable, row-major, on the host of every rank. Collective.
  virtual void fetch(void* host_out) = 0;
  /// The first NaN or infinity in the gradient this rank gave since the last
  /// step, as a sentence naming the variable and where it is; local (the
  /// trainer asks when TrainerOptions::check_finite is on, before the
  /// exchange, and agrees on it across ranks). MemberOf reads the
  /// variable's own gradient; a member that keeps it elsewhere overrides.
  virtual std::optional<std::string> non_finite_gradient() { return std::nullopt; }

  // Checkpoints: a member saves the rows it holds, in its layout, and loads
  // the rows it needs from whatever layout the checkpoint was saved in.
  /// 0: replicated (rank 0 saves every row); P: sharded in P partitions.
  virtual int saved_partitions() const = 0;
  /// Writes this rank's rows of the value, then of each optimizer slot.
  virtual void save(detail::AtomicFile& out) = 0;
  /// Reads this rank's rows (value and optimizer slots) of variable `index`.
  virtual void load(detail::CheckpointReader& in, std::size_t index) = 0;

  // A member without a fixed row layout (a dynamic table) writes files of
  // its own into the checkpoint's directory instead, which the checkpoint's
  // manifest lists and checks like the rank files; Checkpoints then calls
  // these two and never the three above.
  /// Whether this member saves files of its own.
  virtual bool saves_files() const { return false; }
  /// Writes this member's files into the directory `dir` and returns, on
  /// rank 0, every file every rank wrote (name in `dir`, size, CRC-32C).
  /// Collective; a failure throws on every rank.
  virtual std::vector<detail::ManifestFile> save_files(const std::string& dir) {
    throw error(detail::concat("variable '", name(), "' saves no files of its own (dir ", dir, ")"));
  }
  /// Replaces this member's contents with what save_files() wrote into
  /// `dir`, at any rank count. Collective; what fails the checks throws on
  /// every rank before anything changes.
  virtual void load_files(const std::string& dir) {
    throw error(detail::concat("variable '", name(), "' loads no files of its own (dir ", dir, ")"));
  }
};

/// Where a synchronizer's ready() posts the work it starts early: it runs
/// in the order posted, on the trainer's communication thread (or at once,
/// where there is none), while the user's kernels run; the trainer waits
/// for it before its next call that communicates. Posted work may make
/// engine calls: nothing else does while it can run.
class Background {
 public:
  virtual void post(std::function<void()> work) = 0;

 protected:
  ~Background() = default;
};

/// A policy's part of a trainer: the variables it synchronises and the
/// phases of their step. See the file comment for the order of the calls.
template <class Engine>
class Synchronizer {
 public:
  using space = engine::space_of_t<Engine>;
  virtual ~Synchronizer() = default;

  /// Once, after every variable was added and before the first lookup or
  /// step: lay out what spans variables (fusion buckets, table groups,
  /// shared windows). Collective.
  virtual void prepare() {}

  /// `variable` (one of this synchronizer's members) has its final gradient
  /// for step `info.step`. Every rank marks the same variables in the same
  /// order, so work posted to `background` (collective calls too) matches
  /// across ranks. A problem with the gradient must not be thrown here: the
  /// step's agreement reports it. With TrainerOptions::update_when_ready the
  /// posted work may also apply the optimizer to what it summed (`info`
  /// and the optimizer's learning rate are the step's), and update() then
  /// skips it. Default: nothing (the step moves every gradient).
  virtual void ready(const Member& variable, const StepInfo& info, Background& background) {
    (void)variable;
    (void)info;
    (void)background;
  }
  /// Whether work posted by ready() this step applied (or will apply) the
  /// optimizer to some variable before update(): a step that fails then
  /// cannot be abandoned as if nothing happened. Default: never.
  virtual bool updated_early() const { return false; }

  /// This rank's first problem with this step's data, as a sentence that
  /// names the variable; local (the trainer agrees on it across ranks).
  virtual std::optional<std::string> problem() = 0;
  /// Whether any variable was given a gradient on this rank this step.
  virtual bool has_gradient() const = 0;
  /// Starts moving this step's gradients. May complete them (on engines that
  /// cannot leave calls in flight). Collective.
  virtual void start_exchange(const StepInfo&) {}
  /// Completes the exchange: every gradient is summed where it is applied.
  /// Collective.
  virtual void finish_exchange(const StepInfo&) = 0;
  /// After finish_exchange(): the sum of the squares of the summed gradients
  /// this rank will apply, counting every element of every variable once
  /// over all ranks (a replica's on rank 0 only, a shard's on its owner),
  /// before the step's scale. The trainer adds them over the ranks for
  /// clipping by the global norm. Local. Nothing: the policy cannot say (and
  /// its variables cannot be clipped).
  virtual std::optional<double> gradient_square_sum() { return std::nullopt; }
  /// Applies the optimizer to what this rank stores; afterwards every value
  /// a lookup or value() reads is current. May communicate (collective).
  virtual void update(const StepInfo&) = 0;
  /// Forgets this step's gradients and lookups (after a step, or a failed
  /// one); not a lookup ahead, which outlives the step it was started in.
  virtual void clear() = 0;
  /// Forgets the lookup start_lookup() began, if any (after the background
  /// work it posted has run). Default: nothing kept.
  virtual void cancel_lookup() {}

  /// After a restore: the ranks go on from `step`. Collective.
  virtual void restored(std::uint64_t step) { (void)step; }
  // A policy whose steps wait for no other rank (AsyncPS) also derives from
  // policy::Asynchronous (asynchronous.hpp), which the trainer detects.
};

/// The synchronizer of Policy for this engine and optimizer.
template <class Policy, class Engine, class Optimizer>
using synchronizer_t = typename Policy::template synchronizer<Engine, Optimizer>;

/// The settings Policy's synchronizer receives beside policy::Common: the
/// types its tag lists as `using options = std::tuple<...>;` (none without
/// one), each one a TrainerOptions carries (TrainerOptions::own).
template <class Policy, class = void>
struct own_options {
  using type = std::tuple<>;
};
template <class Policy>
struct own_options<Policy, std::void_t<typename Policy::options>> {
  using type = typename Policy::options;
};
template <class Policy>
using own_options_t = typename own_options<Policy>::type;

template <class S, class Engine, class Optimizer, class... Own>
std::unique_ptr<S> make_synchronizer_with(Engine& engine, const Optimizer& opt, const TrainerOptions& options,
                                          std::tuple<Own...>*) {
  return std::make_unique<S>(engine, opt, static_cast<const Common&>(options), options.template own<Own>()...);
}

/// Policy's synchronizer, made from the common settings and its own
/// (own_options_t<Policy>), which outlive it.
template <class Policy, class Engine, class Optimizer>
std::unique_ptr<synchronizer_t<Policy, Engine, Optimizer>> make_synchronizer(Engine& engine, const Optimizer& opt,
                                                                             const TrainerOptions& options) {
  return make_synchronizer_with<synchronizer_t<Policy, Engine, Optimizer>>(
      engine, opt, options, static_cast<own_options_t<Policy>*>(nullptr));
}

namespace contract {
template <class P, class = void>
struct named : std::false_type {};
template <class P>
struct named<P, std::enable_if_t<std::is_convertible_v<decltype(P::name), const char*>>> : std::true_type {};
template <class P, class E, class O, class = void>
struct names_synchronizer : std::false_type {};
template <class P, class E, class O>
struct names_synchronizer<P, E, O, std::void_t<synchronizer_t<P, E, O>>> : std::true_type {};
template <class S, class E, class O, class Own>
struct constructible : std::false_type {};
template <class S, class E, class O, class... Own>
struct constructible<S, E, O, std::tuple<Own...>>
    : std::is_constructible<S, E&, const O&, const Common&, const Own&...> {};
template <class S, class V, class = void>
struct adds : std::false_type {};
template <class S, class V>
struct adds<S, V, std::enable_if_t<std::is_same_v<decltype(std::declval<S&>().add(std::declval<V&>())), Member&>>>
    : std::true_type {};
template <class S, class V, class = void>
struct looks_up : std::false_type {};
template <class S, class V>
struct looks_up<S, V, std::void_t<decltype(std::declval<S&>().lookup(std::declval<const Lookup<V>*>(), std::size_t{}))>>
    : std::true_type {};

template <class S, class V, class = void>
struct looks_up_ahead : std::false_type {};
template <class S, class V>
struct looks_up_ahead<
    S, V,
    std::void_t<decltype(std::declval<S&>().start_lookup(std::declval<const Lookup<V>*>(), std::size_t{},
                                                         std::declval<Background&>())),
                decltype(std::declval<S&>().template finish_lookup<V>())>> : std::true_type {};

template <class S, class V, class = void>
struct looks_up_bags_ahead : std::false_type {};
template <class S, class V>
struct looks_up_bags_ahead<
    S, V,
    std::void_t<decltype(std::declval<S&>().start_lookup(std::declval<const Lookup<V>*>(), std::size_t{},
                                                         std::declval<const Bags<V>*>(), std::size_t{},
                                                         std::declval<Background&>())),
                decltype(std::declval<S&>().template finish_lookup<V>())>> : std::true_type {};

template <class S, class V, class = void>
struct looks_up_bags : std::false_type {};
template <class S, class V>
struct looks_up_bags<
    S, V,
    std::void_t<decltype(std::declval<S&>().lookup_bags(std::declval<const Bags<V>*>(), std::size_t{})),
                decltype(std::declval<S&>().bag_gradients(std::declval<const BagGradient<V>*>(), std::size_t{}))>>
    : std::true_type {};

template <class P, class E, class O>
constexpr bool synchronizer_ok() {
  if constexpr (names_synchronizer<P, E, O>::value) {
    using S = synchronizer_t<P, E, O>;
    return std::is_base_of_v<Synchronizer<E>, S> && constructible<S, E, O, own_options_t<P>>::value;
  } else {
    return false;
  }
}
template <class P, class V, class E, class O>
constexpr bool adds_ok() {
  if constexpr (synchronizer_ok<P, E, O>()) return adds<synchronizer_t<P, E, O>, V>::value;
  else return false;
}
template <class P, class V, class E, class O>
constexpr bool lookup_ok() {
  if constexpr (synchronizer_ok<P, E, O>() && V::is_sparse()) return looks_up<synchronizer_t<P, E, O>, V>::value;
  else return true;
}
}  // namespace contract

/// Whether Policy's synchronizer can look up variables of type Var ahead
/// (start_lookup / finish_lookup; see the file comment).
template <class Policy, class Var, class Engine, class Optimizer>
inline constexpr bool looks_up_ahead_v = contract::looks_up_ahead<synchronizer_t<Policy, Engine, Optimizer>, Var>::value;

/// Whether Policy's synchronizer can look up bags of variables of type Var
/// ahead, with plain lookups (start_lookup with bags / finish_lookup; see
/// the file comment).
template <class Policy, class Var, class Engine, class Optimizer>
inline constexpr bool looks_up_bags_ahead_v =
    contract::looks_up_bags_ahead<synchronizer_t<Policy, Engine, Optimizer>, Var>::value;

/// Whether Policy's synchronizer can look up bags of variables of type Var
/// (lookup_bags / bag_gradients; see the file comment).
template <class Policy, class Var, class Engine, class Optimizer>
inline constexpr bool looks_up_bags_v = contract::looks_up_bags<synchronizer_t<Policy, Engine, Optimizer>, Var>::value;

/// Whether Policy stores sparse variables' rows in 16 bits (a tag with
/// `static constexpr bool stores_half = true`): its synchronizer keeps
/// Var::storage_type rows and computes in Var::value_type.
template <class Policy, class = void>
struct stores_half : std::false_type {};
template <class Policy>
struct stores_half<Policy, std::enable_if_t<Policy::stores_half>> : std::true_type {};

/// Whether Policy can synchronise variables of type Var in a trainer over
/// Engine with Optimizer (see check()).
template <class Policy, class Var, class Engine, class Optimizer>
inline constexpr bool is_policy_for_v =
    contract::named<Policy>::value && contract::synchronizer_ok<Policy, Engine, Optimizer>() &&
    contract::adds_ok<Policy, Var, Engine, Optimizer>() && contract::lookup_ok<Policy, Var, Engine, Optimizer>();

/// The policy contract (the file comment), checked piece by piece: each one
/// Policy lacks for Var is a compile error that names it. Returns true.
template <class Policy, class Var, class Engine, class Optimizer>
constexpr bool check() {
  static_assert(contract::named<Policy>::value, "parallax policy: the tag needs `static constexpr const char* name`");
  static_assert(contract::names_synchronizer<Policy, Engine, Optimizer>::value,
                "parallax policy: the tag needs `template <class Engine, class Optimizer> using synchronizer = ...;`");
  static_assert(contract::synchronizer_ok<Policy, Engine, Optimizer>(),
                "parallax policy: the synchronizer must derive from policy::Synchronizer<Engine> and be constructible "
                "from (Engine&, const Optimizer&, const policy::Common&, const Own&...) for the settings its tag's "
                "`options` lists (none without one)");
  static_assert(!stores_half_v<Var> || stores_half<Policy>::value,
                "parallax policy: this policy does not store 16-bit (bf16, fp16) tables; use ShardedPS or AllGatherv "
                "(the Hybrid, PS and AllReduce architectures), or a float table");
  static_assert(contract::adds_ok<Policy, Var, Engine, Optimizer>(),
                "parallax policy: the synchronizer needs `policy::Member& add(Var)` for this variable type");
  static_assert(contract::lookup_ok<Policy, Var, Engine, Optimizer>(),
                "parallax policy: a sparse variable's synchronizer needs `lookup(const Lookup<V>* batch, size_t n)`, "
                "returning a std::vector of Rows");
  return true;
}

// ---------------------------------------------------------------- helpers for writing members

/// Shared by members: the variable, its name, its record.
template <class Var>
class MemberOf : public Member {
 public:
  using T = typename Var::value_type;
  using S = storage_type_t<Var>;
  MemberOf(Var var, const char* policy) : var_(std::move(var)), policy_(policy) {}
  MemberOf(const MemberOf&) = delete;
  MemberOf& operator=(const MemberOf&) = delete;

  const void* identity() const override { return &var_.state(); }
  const std::string& name() const override { return var_.name(); }
  const char* policy() const override { return policy_; }
  detail::VarRecord record() const override {
    return detail::VarRecord::make(var_.name(), var_.shape(), data_type_of_v<T>, Var::is_sparse(), policy_);
  }
  DataType stored_type() const override { return data_type_of_v<S>; }
  std::size_t stored_bytes() const override { return stored_rows() * var_.cols() * sizeof(S); }
  /// The first NaN or infinity in `grad()`: for a dense variable its element
  /// (row, column), for a sparse one the row's id and its place among the
  /// rows added this step.
  std::optional<std::string> non_finite_gradient() override {
    using space = typename Var::space;
    auto& state = var_.state();
    const std::size_t cols = var_.cols();
    auto value_at = [](const T* p) {
      const T v = detail::read_one<T, space>(p);
      return v != v ? "NaN" : v > 0 ? "+Inf" : "-Inf";
    };
    if constexpr (Var::is_sparse()) {
      const auto& g = state.sparse_grad;
      if (!g.touched()) return std::nullopt;
      const auto at = detail::find_non_finite(check_exec_, g.values(), g.size() * cols);
      if (!at) return std::nullopt;
      return detail::concat("gradient of variable '", var_.name(), "' holds ", value_at(g.values() + *at),
                            " in the row for id ", detail::read_one<index_t, space>(g.indices() + *at / cols),
                            " (row ", *at / cols, " of the ", g.size(), " added this step), column ", *at % cols);
    } else {
      if (!state.grad_touched) return std::nullopt;
      const auto at = detail::find_non_finite(check_exec_, state.grad.data(), state.grad.size());
      if (!at) return std::nullopt;
      return detail::concat("gradient of variable '", var_.name(), "' holds ", value_at(state.grad.data() + *at),
                            " at element ", *at, " (row ", *at / cols, ", column ", *at % cols, ")");
    }
  }
  Var& variable() noexcept { return var_; }

 protected:
  Var var_;
  const char* policy_;

 private:
  Exec<typename Var::space> check_exec_;  // for non_finite_gradient()
};

/// Writes n elements of a buffer in `Space` to a checkpoint file.
template <class T, class Space>
void save_block(detail::AtomicFile& out, const T* data, std::size_t n) {
  std::vector<T> host(n);
  space_traits<Space>::copy_to_host(host.data(), data, n * sizeof(T));
  out.write(host.data(), n * sizeof(T));
}

/// Reads the rows a rank holds (all rows when `map` is null, else its
/// partitions, back to back) of one saved array into `out` (in Space).
template <class T, class Space>
void load_block(detail::CheckpointReader& in, std::size_t v, int what, const PartitionMap* map, int rank,
                std::size_t rows, std::size_t cols, T* out) {
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

/// Saves n elements of a value and of each of its optimizer slots (`slots`
/// pointers, in Space), as one layout.
template <class T, class Space>
void save_state(detail::AtomicFile& out, const T* value, T* const* slots, int count, std::size_t n) {
  save_block<T, Space>(out, value, n);
  for (int k = 0; k < count; ++k) {
    if (slots[k]) {
      save_block<T, Space>(out, slots[k], n);
    } else {  // a slot this variable's optimizer does not keep
      const std::vector<T> zeros(n, T(0));
      out.write(zeros.data(), n * sizeof(T));
    }
  }
}
/// Loads what save_state() saved, for the rows `map` places on `rank` (all
/// rows when null).
template <class T, class Space>
void load_state(detail::CheckpointReader& in, std::size_t v, const PartitionMap* map, int rank, std::size_t rows,
                std::size_t cols, T* value, T* const* slots, int count) {
  load_block<T, Space>(in, v, 0, map, rank, rows, cols, value);
  for (int k = 0; k < count; ++k)
    if (slots[k]) load_block<T, Space>(in, v, k + 1, map, rank, rows, cols, slots[k]);
}

/// save_state() of n rows' elements stored as S (float or 16 bits) with
/// optimizer slots in T: 16-bit values are widened to T first (exactly), so
/// the checkpoint holds one type per variable, T's.
template <class T, class S, class Space>
void save_stored(Exec<Space>& ex, detail::AtomicFile& out, const S* value, T* const* slots, int count, std::size_t n) {
  if constexpr (std::is_same_v<S, T>) {
    save_state<T, Space>(out, value, slots, count, n);
  } else {
    Buffer<T, Space> wide(n);
    if (n) for_each(ex, n, detail::Convert<T, S>{value, wide.data()});
    ex.synchronize();
    save_state<T, Space>(out, wide.data(), slots, count, n);
  }
}
/// load_state() into rows stored as S: the saved T values are rounded to
/// nearest even into 16 bits (exact for values a 16-bit table saved).
template <class T, class S, class Space>
void load_stored(Exec<Space>& ex, detail::CheckpointReader& in, std::size_t v, const PartitionMap* map, int rank,
                 std::size_t rows, std::size_t cols, S* value, T* const* slots, int count, std::size_t n) {
  if constexpr (std::is_same_v<S, T>) {
    load_state<T, Space>(in, v, map, rank, rows, cols, value, slots, count);
  } else {
    Buffer<T, Space> wide(n);
    load_state<T, Space>(in, v, map, rank, rows, cols, wide.data(), slots, count);
    if (n) for_each(ex, n, detail::Convert<S, T>{wide.data(), value});
    ex.synchronize();
  }
}

/// The slots of an optimizer state as pointers (for save_state /
/// load_state), Optimizer::slots of them; null for a slot the variable's
/// optimizer does not keep (optim::Groups: saved as zeros, not loaded).
template <class Optimizer, class T, class Space>
std::vector<T*> slots_of(optim::State<Optimizer, T, Space>& state, std::size_t offset = 0) {
  std::vector<T*> out;
  for (int k = 0; k < Optimizer::slots; ++k) out.push_back(state.slot(k) ? state.slot(k) + offset : nullptr);
  return out;
}

/// A member's binding of its variable to the trainer's optimizer
/// (optim::bind; throws naming a variable optim::Groups places in no group).
template <class Optimizer, class Var>
optim::Bound<Optimizer> bind_variable(const Optimizer& opt, const Var& var) {
  return optim::bind(opt, optim::VariableInfo{var.name(), Var::is_sparse()});
}

}  // namespace policy
}  // namespace parallax
