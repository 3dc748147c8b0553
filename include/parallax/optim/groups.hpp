#pragma once
/// @file
/// Groups: an optimizer per group of variables (PyTorch's param_groups,
/// Optax's multi_transform), typed at compile time. The usual recipe,
/// Adagrad on the embedding tables and AdamW on the dense layers:
///
///     namespace opt = px::optim;
///     auto groups = opt::Groups(opt::group(opt::select::sparse(), opt::Adagrad{}.with_lr(0.05f)),
///                               opt::group(opt::select::dense(), opt::AdamW{}.with_weight_decay(0.01f)))
///                       .no_weight_decay(opt::select::named({"bias1", "bias2"}))
///                       .scale_lr(opt::select::named({"user_emb"}), 0.5f);
///     px::Trainer<px::arch::Hybrid, decltype(groups)> trainer(ctx, groups, emb, user_emb, w1, bias1, ...);
///
/// Every variable lands in exactly one group, or the trainer's constructor
/// throws on every rank naming the variable and the groups it matched. A
/// variable's updates use its group's optimizer with
///
///     lr = group's lr * Groups::lr * (its lr scales, multiplied)
///
/// and no weight decay where no_weight_decay() selects it. Groups::lr
/// (1 by default) is the trainer's learning rate: TrainerOptions::schedule
/// and Trainer::set_learning_rate scale every group's rate through it.
/// Each variable keeps the state its own optimizer needs (an Adagrad table
/// one value per element, an Adam layer two). Checkpoints record each
/// variable's optimizer ("groups:adagrad,adam,..." in registration order):
/// a checkpoint restores onto any rank count into a trainer whose
/// variables use the same optimizers, and into any other throws, naming the
/// first variable whose optimizer differs. AsyncPS refuses Groups at
/// compile time.

#include <parallax/error.hpp>
#include <parallax/optim/adagrad.hpp>
#include <parallax/optim/adam.hpp>
#include <parallax/optim/optimizer.hpp>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::optim {

/// Which variables a group, an lr scale or a decay exclusion applies to.
using Selector = std::function<bool(const VariableInfo&)>;

/// Selectors by sparsity and by name.
namespace select {
/// Every sparse variable (the embedding tables).
inline Selector sparse() {
  return [](const VariableInfo& v) { return v.sparse; };
}
/// Every dense variable.
inline Selector dense() {
  return [](const VariableInfo& v) { return !v.sparse; };
}
/// Every variable.
inline Selector all() {
  return [](const VariableInfo&) { return true; };
}
/// The variables with these names.
inline Selector named(std::vector<std::string> names) {
  return [names = std::move(names)](const VariableInfo& v) {
    return std::find(names.begin(), names.end(), v.name) != names.end();
  };
}
/// The variables whose names end with `suffix` (e.g. "bias").
inline Selector name_ends_with(std::string suffix) {
  return [suffix = std::move(suffix)](const VariableInfo& v) {
    return v.name.size() >= suffix.size() && v.name.compare(v.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
}
}  // namespace select

/// One group: the variables `select` picks, updated by `optimizer`.
template <class Optimizer>
struct Group {
  static_assert(check<Optimizer>());
  static_assert(!is_groups_v<Optimizer>, "optim::Groups do not nest");
  Selector select;
  Optimizer optimizer;
};
template <class Optimizer>
Group<Optimizer> group(Selector select, Optimizer optimizer) {
  return Group<Optimizer>{std::move(select), optimizer};
}

namespace detail {
template <class O, class = void>
struct has_weight_decay : std::false_type {};
template <class O>
struct has_weight_decay<O, std::void_t<decltype(std::declval<O&>().weight_decay)>> : std::true_type {};

template <class... Os>
constexpr int most_slots() {
  int most = 0;
  ((most = std::max(most, Os::slots)), ...);
  return most;
}
}  // namespace detail

/// An optimizer per group of variables; see the file's comment.
template <class... Optimizers>
class Groups {
  static_assert(sizeof...(Optimizers) > 0, "optim::Groups needs at least one group");

 public:
  static constexpr const char* name = "groups";
  /// The most state values per element any group's optimizer keeps.
  static constexpr int slots = detail::most_slots<Optimizers...>();

  /// The factor on every group's learning rate: the trainer's learning rate
  /// (its schedule sets it each step).
  float lr = 1.f;

  explicit Groups(Group<Optimizers>... groups) : groups_(std::move(groups)...) {
    std::size_t i = 0;
    std::apply([&](const auto&... g) { (has_selector(static_cast<bool>(g.select), i++), ...); }, groups_);
  }

  /// Multiplies the learning rate of the variables `select` picks by `factor`.
  Groups& scale_lr(Selector select, float factor) {
    PARALLAX_EXPECTS(select, "optim::Groups::scale_lr: no selector");
    PARALLAX_EXPECTS(factor >= 0, "optim::Groups::scale_lr: factor ", factor, " is negative");
    scales_.push_back({std::move(select), factor});
    return *this;
  }
  /// Turns weight decay off for the variables `select` picks (biases, embeddings).
  Groups& no_weight_decay(Selector select) {
    PARALLAX_EXPECTS(select, "optim::Groups::no_weight_decay: no selector");
    no_decay_.push_back(std::move(select));
    return *this;
  }

  /// The index of `var`'s group; throws naming the variable unless exactly one group picks it.
  std::size_t group_of(const VariableInfo& var) const {
    std::vector<std::size_t> hits;
    std::size_t i = 0;
    std::apply([&](const auto&... g) { ((g.select(var) ? hits.push_back(i++) : void(i++)), ...); }, groups_);
    if (hits.size() == 1) return hits.front();
    std::string which;
    for (std::size_t h : hits) which += (which.empty() ? "" : ", ") + std::to_string(h) + " (" + names()[h] + ")";
    if (hits.empty())
      throw error(parallax::detail::concat("optim::Groups: variable '", var.name, "' (", var.sparse ? "sparse" : "dense",
                                           ") is in no group; every variable needs exactly one"));
    throw error(parallax::detail::concat("optim::Groups: variable '", var.name, "' is in ", hits.size(),
                                         " groups: ", which, "; every variable needs exactly one"));
  }
  /// The name of each group's optimizer.
  static std::vector<std::string> names() { return {Optimizers::name...}; }

  /// `var`'s binding: its group, lr scale and decay; throws as group_of().
  Bound<Groups> bind(const VariableInfo& var) const {
    float scale = 1.f;
    for (const auto& s : scales_)
      if (s.first(var)) scale *= s.second;
    bool decay = true;
    for (const auto& s : no_decay_)
      if (s(var)) decay = false;
    return Bound<Groups>(*this, group_of(var), scale, decay);
  }

  /// What checkpoints record: each variable's optimizer, in order.
  std::string saved_name(const std::vector<VariableInfo>& vars) const {
    std::string out = "groups:";
    for (std::size_t v = 0; v < vars.size(); ++v) out += (v ? "," : "") + names()[group_of(vars[v])];
    return out;
  }

  /// f(group g's optimizer), the optimizer's own type.
  template <class F>
  void visit_group(std::size_t g, F&& f) const {
    std::size_t i = 0;
    std::apply([&](const auto&... gr) { ((i++ == g ? f(gr.optimizer) : void()), ...); }, groups_);
  }

 private:
  static void has_selector(bool has, std::size_t group) {
    PARALLAX_EXPECTS(has, "optim::Groups: group ", group, " has no selector");
  }

  std::tuple<Group<Optimizers>...> groups_;
  std::vector<std::pair<Selector, float>> scales_;
  std::vector<Selector> no_decay_;
};

template <class... Os>
Groups(Group<Os>...) -> Groups<Os...>;

/// The usual recipe's type, Adagrad for one group (the tables) and Adam /
/// AdamW for the other (the dense layers): parallax::trainers compiles its
/// trainers (trainers.hpp).
using AdagradAdamW = Groups<Adagrad, Adam>;

/// A variable's binding to its group of optim::Groups: `*bound` is itself,
/// and apply_dense / apply_rows run the group's optimizer with the
/// variable's rate and decay.
template <class... Os>
class Bound<Groups<Os...>> {
 public:
  static constexpr bool visits_optimizer = true;

  Bound(const Groups<Os...>& groups, std::size_t group, float lr_scale, bool decay)
      : groups_(&groups), group_(group), lr_scale_(lr_scale), decay_(decay) {}
  const Bound& operator*() const noexcept { return *this; }
  bool operator==(const Bound& o) const noexcept {
    return groups_ == o.groups_ && group_ == o.group_ && lr_scale_ == o.lr_scale_ && decay_ == o.decay_;
  }
  bool operator!=(const Bound& o) const noexcept { return !(*this == o); }

  std::size_t group() const noexcept { return group_; }
  float lr_scale() const noexcept { return lr_scale_; }
  bool decays() const noexcept { return decay_; }
  /// State values per element of the group's optimizer.
  int slots() const {
    int n = 0;
    groups_->visit_group(group_, [&](const auto& o) { n = std::decay_t<decltype(o)>::slots; });
    return n;
  }
  template <class T>
  T slot_initial(int k) const {
    T v{};
    groups_->visit_group(group_, [&](const auto& o) { v = o.template slot_initial<T>(k); });
    return v;
  }
  /// f(the group's optimizer as this variable uses it now: its rate times
  /// Groups::lr times the scale, its decay off where excluded).
  template <class F>
  void visit(F&& f) const {
    groups_->visit_group(group_, [&](const auto& o) {
      auto mine = o;
      if constexpr (has_learning_rate_v<std::decay_t<decltype(o)>>)
        mine.lr = static_cast<decltype(mine.lr)>(o.lr * groups_->lr * lr_scale_);
      if constexpr (detail::has_weight_decay<std::decay_t<decltype(o)>>::value)
        if (!decay_) mine.weight_decay = 0;
      f(static_cast<const decltype(mine)&>(mine));
    });
  }

 private:
  const Groups<Os...>* groups_;  // the trainer's: its lr changes between steps
  std::size_t group_;
  float lr_scale_;
  bool decay_;
};

/// The state of one variable (or one ShardedPS group of tables) bound to a
/// group: the slots its group's optimizer keeps, the others absent (null).
template <class... Os, class T, class Space>
class State<Groups<Os...>, T, Space> {
 public:
  State() = default;
  State(const Bound<Groups<Os...>>& bound, std::size_t n, const Exec<Space>& ex = Exec<Space>{}) {
    reset(bound, n, ex);
  }
  void reset(const Bound<Groups<Os...>>& bound, std::size_t n, const Exec<Space>& ex = Exec<Space>{}) {
    used_ = bound.slots();
    for (int k = 0; k < Groups<Os...>::slots; ++k) {
      if (k >= used_) {
        slot_[k] = Buffer<T, Space>();
        continue;
      }
      slot_[k].resize_discard(n);
      for_each(ex, n, detail::Fill<T>{slot_[k].data(), bound.template slot_initial<T>(k)});
    }
    ex.synchronize();
  }
  /// Slot k's values, or null for a slot the variable's optimizer does not keep.
  T* slot(int k) noexcept { return k < Groups<Os...>::slots && k < used_ ? slot_[k].data() : nullptr; }

 private:
  Buffer<T, Space> slot_[Groups<Os...>::slots > 0 ? Groups<Os...>::slots : 1];
  int used_ = 0;
};

}  // namespace parallax::optim
