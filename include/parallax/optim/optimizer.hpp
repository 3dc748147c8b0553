#pragma once
/// @file
/// What every optimizer shares: its state (slots shaped like the variable, or
/// like the rank's shard of it) and the two kernels that apply an update rule
/// to a whole buffer (dense) or to touched rows only (sparse, "lazy").
///
/// An optimizer is a struct of hyper-parameters with
///
///     static constexpr const char* name;
///     static constexpr int slots;                 // 0, 1 or 2 state values per element
///     template <class T> T slot_initial(int k) const;
///     template <class T> Rule<T> rule(std::uint64_t step) const;  // step counts from 1
///
/// where `Rule<T>` is a PARALLAX_HOST_DEVICE functor
/// `void operator()(T& w, T g, T& s0, T& s1) const`. `optim::check<O>()`
/// checks a type against this contract, naming what it lacks. A rule with a
/// `decay` member may also offer `template <bool Decay> void update(...)`,
/// the same update with the decay's presence a constant: the kernels then
/// pick it once per call instead of testing it per element.
///
/// Rows stored in 16 bits (bf16, fp16): apply_rows() over a `H*` table loads
/// each element to float, updates it with float gradients and float state,
/// and stores it back rounded to nearest even or, with Rounding::stochastic,
/// rounded stochastically from a hash of (seed, step, row id, column), so a
/// run's bits depend neither on threads nor on the rank count.
/// apply_rows_rowwise_adagrad() keeps Adagrad's accumulator per row (one
/// float per row, FBGEMM's row-wise Adagrad) instead of per element.

#include <parallax/config.hpp>
#include <parallax/half.hpp>
#include <parallax/init.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::optim {

/// State values per element an optimizer may keep: the update rule receives
/// two (s0, s1).
inline constexpr int max_slots = 2;

template <class... Optimizers>
class Groups;  // optim/groups.hpp: an optimizer per group of variables

/// True for optim::Groups<...>: it meets the trainer's optimizer slot by
/// binding each variable to one of its optimizers (optim/groups.hpp) rather
/// than by a rule of its own.
template <class O>
struct is_groups : std::false_type {};
template <class... Os>
struct is_groups<Groups<Os...>> : std::true_type {};
template <class O>
inline constexpr bool is_groups_v = is_groups<O>::value;

namespace contract {
template <class O, class = void>
struct named : std::false_type {};
template <class O>
struct named<O, std::enable_if_t<std::is_convertible_v<decltype(O::name), const char*>>> : std::true_type {};
template <class O, class = void>
struct slot_count : std::false_type {};
template <class O>
struct slot_count<O, std::enable_if_t<std::is_convertible_v<decltype(O::slots), int>>> : std::true_type {};
template <class O, class T, class = void>
struct initial : std::false_type {};
template <class O, class T>
struct initial<O, T, std::enable_if_t<std::is_convertible_v<decltype(std::declval<const O&>().template slot_initial<T>(0)), T>>>
    : std::true_type {};
template <class O, class T, class = void>
struct rule : std::false_type {};
template <class O, class T>
struct rule<O, T,
            std::void_t<decltype(std::declval<const O&>().template rule<T>(std::uint64_t{1})(
                std::declval<T&>(), std::declval<T>(), std::declval<T&>(), std::declval<T&>()))>> : std::true_type {};
template <class O, class = void>
struct learning_rate : std::false_type {};
template <class O>
struct learning_rate<O, std::enable_if_t<std::is_floating_point_v<decltype(std::declval<O&>().lr)>>> : std::true_type {};
template <class O>
constexpr int slots_or_zero() {
  if constexpr (slot_count<O>::value) return O::slots;
  else return 0;
}
}  // namespace contract

/// True when O has a learning rate `lr` a trainer can schedule and set
/// (every built-in optimizer has; the contract does not require one).
template <class O>
inline constexpr bool has_learning_rate_v = contract::learning_rate<O>::value;

/// True when O meets the optimizer contract (see check()).
template <class O>
inline constexpr bool is_optimizer_v = is_groups_v<O> || (contract::named<O>::value && contract::slot_count<O>::value &&
                                       contract::slots_or_zero<O>() >= 0 && contract::slots_or_zero<O>() <= max_slots &&
                                       contract::initial<O, float>::value && contract::initial<O, double>::value &&
                                       contract::rule<O, float>::value && contract::rule<O, double>::value);

/// The optimizer contract (above), checked member by member: each one O
/// lacks is a compile error that names it. Returns true.
template <class O>
constexpr bool check() {
  // optim::Groups passes: each of its optimizers is checked (optim/groups.hpp).
  static_assert(is_groups_v<O> || contract::named<O>::value,
                "parallax optimizer: needs `static constexpr const char* name`");
  static_assert(is_groups_v<O> || contract::slot_count<O>::value,
                "parallax optimizer: needs `static constexpr int slots` (state values per element)");
  static_assert(is_groups_v<O> || (contract::slots_or_zero<O>() >= 0 && contract::slots_or_zero<O>() <= max_slots),
                "parallax optimizer: `slots` must be 0, 1 or 2 (the update rule receives two state values)");
  static_assert(is_groups_v<O> || (contract::initial<O, float>::value && contract::initial<O, double>::value),
                "parallax optimizer: needs `template <class T> T slot_initial(int k) const`");
  static_assert(is_groups_v<O> || (contract::rule<O, float>::value && contract::rule<O, double>::value),
                "parallax optimizer: needs `template <class T> Rule<T> rule(std::uint64_t step) const`, where Rule<T> "
                "is callable as rule(T& w, T g, T& s0, T& s1)");
  return true;
}

namespace detail {

template <class T>
struct Fill {
  T* out;
  T value;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = value; }
};

/// Whether a rule offers `update<bool Decay>` beside operator(): the
/// update with its weight decay's presence known, chosen once per call.
template <class Rule, class T, class = void>
struct has_decay_update : std::false_type {};
template <class Rule, class T>
struct has_decay_update<Rule, T,
                        std::void_t<decltype(std::declval<const Rule&>().template update<true>(
                            std::declval<T&>(), std::declval<T>(), std::declval<T&>(), std::declval<T&>()))>>
    : std::true_type {};

/// A rule whose decay is known to be present (Decay) or zero: the kernels'
/// loops then hold no branch on it, so the host's vectorise.
template <class Rule, bool Decay>
struct Decayed {
  Rule rule;
  template <class T>
  PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& s0, T& s1) const {
    rule.template update<Decay>(w, g, s0, s1);
  }
};

/// Calls f(rule) with the rule, or with it as Decayed<Rule, true|false>
/// when it offers update<Decay>.
template <class T, class Rule, class F>
void with_decay_known(const Rule& rule, F&& f) {
  if constexpr (has_decay_update<Rule, T>::value) {
    if (rule.decay != T(0)) f(Decayed<Rule, true>{rule});
    else f(Decayed<Rule, false>{rule});
  } else {
    f(rule);
  }
}

/// Calls rule(w, g, s0[at], s1[at]) with the optimizer's `Slots` state
/// values (placeholders for the others), or, for Slots = -1, with those of
/// s0 and s1 that are not null. Known at compile time, the loops over
/// elements and rows hold no test of the pointers, so the host's vectorise.
template <int Slots, class Rule, class T>
PARALLAX_HOST_DEVICE inline void apply_rule(const Rule& rule, T& w, T g, T* s0, T* s1, std::size_t at) {
  T unused0 = T(0), unused1 = T(0);
  if constexpr (Slots == 0) rule(w, g, unused0, unused1);
  else if constexpr (Slots == 1) rule(w, g, s0[at], unused1);
  else if constexpr (Slots == 2) rule(w, g, s0[at], s1[at]);
  else rule(w, g, s0 ? s0[at] : unused0, s1 ? s1[at] : unused1);
}

template <class Rule, class T, int Slots = -1>
struct DenseUpdate {
  Rule rule;
  T* w;
  const T* g;
  T* s0;
  T* s1;
  T scale;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { apply_rule<Slots>(rule, w[i], g[i] * scale, s0, s1, i); }
};

template <class Rule, class T, int Slots = -1>
struct RowUpdate {
  Rule rule;
  T* w;
  T* s0;
  T* s1;
  const index_t* rows;  // local rows of w, unique
  const T* g;           // one row of cols per entry of rows
  std::size_t cols;
  T scale;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols + c;
    apply_rule<Slots>(rule, w[at], g[j * cols + c] * scale, s0, s1, at);
  }
  /// The rows of w and of the state that entry j updates (for_each_rows on
  /// the host asks for them ahead: they are scattered over the table).
  void prefetch(std::size_t j) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols;
    prefetch_bytes(w + at, cols * sizeof(T));
    if (Slots >= 1 || (Slots < 0 && s0)) prefetch_bytes(s0 + at, cols * sizeof(T));
    if (Slots >= 2 || (Slots < 0 && s1)) prefetch_bytes(s1 + at, cols * sizeof(T));
  }
};

}  // namespace detail

/// How an update stores a value in 16 bits (half.hpp).
using Rounding = parallax::Rounding;

/// The 32 random bits stochastic rounding uses for element (row id, col) at
/// `step` (half.hpp's round_stochastic): a counter-based hash (splitmix64,
/// as init's), so a draw depends on nothing but these four numbers.
PARALLAX_HOST_DEVICE inline std::uint32_t rounding_bits(std::uint64_t seed, std::uint64_t step, std::uint64_t row,
                                                        std::uint64_t col) noexcept {
  using parallax::detail::splitmix64;
  std::uint64_t h = splitmix64(seed ^ 0x6A09E667F3BCC908ull);
  h = splitmix64(h ^ step);
  h = splitmix64(h ^ row);
  h = splitmix64(h ^ col);
  return static_cast<std::uint32_t>(h >> 32);
}

namespace detail {

/// `x` stored as H with `rounding` (element (row id, col) at `step`).
template <class H>
PARALLAX_HOST_DEVICE inline H store_rounded(float x, const Rounding& rounding, std::uint64_t step, index_t id,
                                            std::size_t col) {
  if (rounding.mode == Rounding::stochastic)
    return H::round_stochastic(x, rounding_bits(rounding.seed, step, static_cast<std::uint64_t>(id), col));
  return H(x);
}

/// RowUpdate over rows stored as H: the element and its update in float,
/// the state in float, the result stored rounded.
template <class Rule, class H, int Slots = -1>
struct HalfRowUpdate {
  Rule rule;
  H* w;
  float* s0;
  float* s1;
  const index_t* rows;  // local rows of w, unique
  const index_t* ids;   // their global row ids (stochastic rounding's draws)
  const float* g;       // one row of cols per entry of rows
  std::size_t cols;
  float scale;
  Rounding rounding;
  std::uint64_t step;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols + c;
    float value = w[at];
    apply_rule<Slots>(rule, value, g[j * cols + c] * scale, s0, s1, at);
    w[at] = store_rounded<H>(value, rounding, step, ids[j], c);
  }
  void prefetch(std::size_t j) const {
    const std::size_t at = static_cast<std::size_t>(rows[j]) * cols;
    prefetch_bytes(w + at, cols * sizeof(H));
    if (Slots >= 1 || (Slots < 0 && s0)) prefetch_bytes(s0 + at, cols * sizeof(float));
    if (Slots >= 2 || (Slots < 0 && s1)) prefetch_bytes(s1 + at, cols * sizeof(float));
  }
};

/// Row-wise Adagrad over one row: a <- a + mean over the row of g^2, then
/// w <- w - lr * g / (sqrt(a) + eps) for every element, in float.
template <class W>
struct RowwiseAdagradUpdate {
  W* w;
  float* accumulator;   // one per local row
  const index_t* rows;  // local rows of w, unique
  const index_t* ids;   // their global row ids
  const float* g;
  std::size_t cols;
  float scale, lr, eps;
  Rounding rounding;
  std::uint64_t step;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const auto r = static_cast<std::size_t>(rows[j]);
    const float* gj = g + j * cols;
    float squares = 0;
    for (std::size_t c = 0; c < cols; ++c) squares += (gj[c] * scale) * (gj[c] * scale);
    const float a = accumulator[r] + squares / static_cast<float>(cols);
    accumulator[r] = a;
    const float rate = lr / (std::sqrt(a) + eps);
    for (std::size_t c = 0; c < cols; ++c) {
      const float value = static_cast<float>(w[r * cols + c]) - rate * (gj[c] * scale);
      if constexpr (is_half_v<W>)
        w[r * cols + c] = store_rounded<W>(value, rounding, step, ids[j], c);
      else
        w[r * cols + c] = value;
    }
  }
};

}  // namespace detail

/// An optimizer's per-element state for `n` elements (a variable or a shard).
template <class Optimizer, class T, class Space>
class State {
  static_assert(Optimizer::slots >= 0 && Optimizer::slots <= max_slots,
                "parallax optimizer: `slots` must be 0, 1 or 2 (the update rule receives two state values)");

 public:
  State() = default;
  State(const Optimizer& opt, std::size_t n, const Exec<Space>& ex = Exec<Space>{}) { reset(opt, n, ex); }

  void reset(const Optimizer& opt, std::size_t n, const Exec<Space>& ex = Exec<Space>{}) {
    for (int k = 0; k < Optimizer::slots; ++k) {
      slot_[k].resize_discard(n);
      for_each(ex, n, detail::Fill<T>{slot_[k].data(), opt.template slot_initial<T>(k)});
    }
    ex.synchronize();
  }
  /// Slot k's values, or null for k >= slots().
  T* slot(int k) noexcept { return k < Optimizer::slots ? slot_[k].data() : nullptr; }
  Buffer<T, Space>& buffer(int k) noexcept { return slot_[k]; }
  static constexpr int slots() noexcept { return Optimizer::slots; }

 private:
  Buffer<T, Space> slot_[Optimizer::slots > 0 ? Optimizer::slots : 1];
};

/// What a synchronizer sees of a variable when it binds it to an optimizer.
struct VariableInfo {
  std::string name;
  bool sparse = false;
};

/// A variable's optimizer, as its synchronizer holds it: `*bound` is what
/// apply_dense / apply_rows / State take. For a single optimizer, a pointer
/// to the trainer's (whose learning rate changes between steps); for
/// optim::Groups, the variable's group with its learning-rate scale and
/// weight-decay exclusion (optim/groups.hpp). Equal bindings may share one
/// state buffer and one update call (ShardedPS groups tables by them).
template <class Optimizer>
class Bound {
 public:
  explicit Bound(const Optimizer& opt) : opt_(&opt) {}
  const Optimizer& operator*() const noexcept { return *opt_; }
  bool operator==(const Bound& other) const noexcept { return opt_ == other.opt_; }
  bool operator!=(const Bound& other) const noexcept { return !(*this == other); }

 private:
  const Optimizer* opt_;
};

/// The binding of variable `var` to `opt` (optim::Groups overloads it:
/// there it picks the variable's group, or throws naming the variable).
template <class Optimizer>
Bound<Optimizer> bind(const Optimizer& opt, const VariableInfo& var) {
  if constexpr (is_groups_v<Optimizer>) return opt.bind(var);
  else return Bound<Optimizer>(opt);
}

/// What a checkpoint records as the optimizer of `vars` (in registration
/// order): the optimizer's name, or optim::Groups' per variable (which
/// throws naming a variable in no group or in two).
template <class Optimizer>
std::string saved_name(const Optimizer& opt, const std::vector<VariableInfo>& vars) {
  if constexpr (is_groups_v<Optimizer>) return opt.saved_name(vars);
  else return Optimizer::name;
}

namespace detail {
// The kernels over the state's slots s0, s1 (null past Optimizer::slots),
// for State and for optim::Groups' state alike.
template <class Optimizer, class T, class Space>
void dense_update(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, T* w, const T* g, std::size_t n,
                  T* s0, T* s1, T scale) {
  if (n == 0) return;
  with_decay_known<T>(opt.template rule<T>(step), [&](auto rule) {
    for_each(ex, n, DenseUpdate<decltype(rule), T, Optimizer::slots>{rule, w, g, s0, s1, scale});
  });
}
template <class Optimizer, class T, class Space>
void row_update(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, T* w, const index_t* rows,
                const T* g, std::size_t k, std::size_t cols, T* s0, T* s1, T scale) {
  with_decay_known<T>(opt.template rule<T>(step), [&](auto rule) {
    for_each_rows(ex, k, cols, RowUpdate<decltype(rule), T, Optimizer::slots>{rule, w, s0, s1, rows, g, cols, scale});
  });
}
template <class Optimizer, class H, class Space>
void half_row_update(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, H* w, const index_t* rows,
                     const index_t* ids, const float* g, std::size_t k, std::size_t cols, float* s0, float* s1,
                     float scale, Rounding rounding) {
  with_decay_known<float>(opt.template rule<float>(step), [&](auto rule) {
    for_each_rows(ex, k, cols,
                  HalfRowUpdate<decltype(rule), H, Optimizer::slots>{rule, w, s0, s1, rows, ids, g, cols, scale,
                                                                      rounding, step});
  });
}
}  // namespace detail

namespace detail {
/// Whether O is a variable's binding to one of optim::Groups' optimizers
/// (it offers visit(f): f(the group's optimizer, as the variable uses it)).
template <class O, class = void>
struct visits : std::false_type {};
template <class O>
struct visits<O, std::enable_if_t<O::visits_optimizer>> : std::true_type {};
/// f(opt), or f(the optimizer a Groups binding stands for).
template <class Optimizer, class F>
void with_optimizer(const Optimizer& opt, F&& f) {
  if constexpr (visits<Optimizer>::value) opt.visit(f);
  else f(opt);
}
}  // namespace detail

/// w[i] <- rule(w[i], scale * g[i]) for i < n. `state` is the
/// State<Optimizer, T, Space> of the n elements; `opt` is the optimizer, or
/// a variable's binding to optim::Groups (`*bound`).
template <class Optimizer, class T, class Space, class S>
void apply_dense(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, T* w, const T* g, std::size_t n,
                 S& state, T scale) {
  detail::with_optimizer(opt, [&](const auto& o) {
    detail::dense_update(ex, o, step, w, g, n, state.slot(0), state.slot(1), scale);
  });
}

/// For each of the k unique local rows r: w[r, :] <- rule(w[r, :], scale * g[j, :]);
/// other rows and their state stay as they are (lazy update). `opt` and
/// `state` as apply_dense's.
template <class Optimizer, class T, class Space, class S>
void apply_rows(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, T* w, const index_t* rows,
                const T* g, std::size_t k, std::size_t cols, S& state, T scale) {
  detail::with_optimizer(opt, [&](const auto& o) {
    detail::row_update(ex, o, step, w, rows, g, k, cols, state.slot(0), state.slot(1), scale);
  });
}

/// apply_rows() for a table stored in 16 bits (H is bf16 or fp16): each
/// element of the k unique local rows is loaded to float, updated with the
/// float gradient and the optimizer's float state (`state` holds one value
/// per element of the table, as for a float table), and stored back with
/// `rounding`. `ids` are the rows' global ids (the stochastic draws hash
/// them, so they do not depend on where a row lives); the same as `rows`
/// for a table that is not sharded.
template <class Optimizer, class H, class Space, class S, std::enable_if_t<is_half_v<H>, int> = 0>
void apply_rows(const Exec<Space>& ex, const Optimizer& opt, std::uint64_t step, H* w, const index_t* rows,
                const index_t* ids, const float* g, std::size_t k, std::size_t cols, S& state, float scale,
                Rounding rounding = {}) {
  detail::with_optimizer(opt, [&](const auto& o) {
    detail::half_row_update(ex, o, step, w, rows, ids, g, k, cols, state.slot(0), state.slot(1), scale, rounding);
  });
}

/// Row-wise Adagrad (FBGEMM's): for each of the k unique local rows r, one
/// float accumulator a[r] (start it at `opt.initial_accumulator`):
/// a[r] <- a[r] + mean over the row of (scale * g)^2, then
/// w[r, :] <- w[r, :] - opt.lr * scale * g / (sqrt(a[r]) + opt.eps). W is
/// float, or bf16 / fp16 stored back with `rounding` (ids as apply_rows').
/// `opt` is an optim::Adagrad (anything with lr and eps). A table of R rows
/// keeps R floats of state instead of R x cols.
template <class Adagrad, class W, class Space>
void apply_rows_rowwise_adagrad(const Exec<Space>& ex, const Adagrad& opt, std::uint64_t step, W* w,
                                const index_t* rows, const index_t* ids, const float* g, std::size_t k,
                                std::size_t cols, float* accumulator, float scale, Rounding rounding = {}) {
  static_assert(std::is_same_v<W, float> || is_half_v<W>, "row-wise Adagrad updates float, bf16 or fp16 rows");
  if (k == 0 || cols == 0) return;
  for_each(ex, k,
           detail::RowwiseAdagradUpdate<W>{w, accumulator, rows, ids, g, cols, scale, static_cast<float>(opt.lr),
                                           static_cast<float>(opt.eps), rounding, step},
           Cost{2 * cols});
}

}  // namespace parallax::optim
