#pragma once
/// @file
/// A Trainer's variables and the synchronizers of their policies: the
/// registration (the ranks agree on the variables first), one synchronizer
/// per policy in the order the variables first name them, and the lookups a
/// trainer makes of them. A step's phases run over synchronizers() in that
/// order, so every rank makes the same engine calls in the same order.

#include <parallax/arch.hpp>
#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/asynchronous.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/variable.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::trainer {

/// A distinct address per type: the key of a policy's synchronizer.
template <class T>
inline constexpr char type_key = 0;

template <class Arch, class Engine, class Optimizer>
class Registry {
 public:
  using Synchronizer = policy::Synchronizer<Engine>;
  template <class Policy>
  using synchronizer_t = policy::synchronizer_t<Policy, Engine, Optimizer>;

  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  /// The variables may join another trainer once it is gone.
  ~Registry() { release(); }

  /// Registers `vars` (variables or collections of them) for `owner`, places
  /// them and prepares every synchronizer. Collective; every rank must pass
  /// the same variables in the same order, or every rank throws naming the
  /// first difference. `opt` and `options` must outlive the registry.
  template <class... Args>
  void add_all(Engine& engine, const Optimizer& opt, const TrainerOptions& options, const void* owner,
               Args&... vars) {
    static_assert(sizeof...(Args) > 0, "a Trainer needs at least one variable");
    static_assert((is_variable_v<detail::variable_of_t<Args>> && ...),
                  "Trainer takes parallax::Variable arguments, or std::vectors of them (px::Variables<V>)");
    static_assert((std::is_same_v<typename detail::variable_of_t<Args>::space, engine::space_of_t<Engine>> && ...),
                  "every variable must live in the engine's memory space (HostSpace for engine::Mpi)");
    static_assert((policy::check<policy_for_t<Arch, detail::variable_of_t<Args>>, detail::variable_of_t<Args>, Engine,
                                 Optimizer>() &&
                   ...));
    std::vector<detail::VarRecord> records;
    std::vector<optim::VariableInfo> infos;
    auto record = [&](auto& v) {
      using V = std::remove_reference_t<decltype(v)>;
      records.push_back(detail::VarRecord::make(v.name(), v.shape(), data_type_of_v<storage_type_t<V>>, V::is_sparse(),
                                        policy_for_t<Arch, V>::name));
      infos.push_back({v.name(), V::is_sparse()});
    };
    (detail::for_each_variable(vars, record), ...);
    std::vector<std::string> names;
    for (const auto& r : records) names.emplace_back(r.name);
    std::sort(names.begin(), names.end());
    for (std::size_t i = 1; i < names.size(); ++i)
      PARALLAX_EXPECTS(names[i] != names[i - 1], "two variables are named '", names[i], "'; names must be unique");
    auto unregistered = [](const auto& v) {
      PARALLAX_EXPECTS(v.state().trainer == nullptr, "variable '", v.name(), "' is already registered with another Trainer");
    };
    (detail::for_each_variable(vars, unregistered), ...);
    detail::agree_on_variables(engine, records);
    // Every rank has the same variables now: a variable optim::Groups places
    // in no group, or in two, throws here on every rank alike.
    optimizer_name_ = optim::saved_name(opt, infos);
    try {
      (detail::for_each_variable(vars, [&](auto& v) { add(engine, opt, options, owner, v); }), ...);
      for (auto& s : synchronizers_) s.second->prepare();
    } catch (...) {
      release();  // the variables may join another trainer
      throw;
    }
  }
  /// Unlinks every variable from its trainer.
  void release() noexcept {
    for (const void** t : registered_) *t = nullptr;
    registered_.clear();
  }

  template <class Policy>
  synchronizer_t<Policy>& synchronizer_of() {
    return static_cast<synchronizer_t<Policy>&>(*synchronizers_[index_of<Policy>()].second);
  }
  template <class Policy>
  std::size_t index_of() const {
    for (std::size_t i = 0; i < synchronizers_.size(); ++i)
      if (synchronizers_[i].first == &type_key<Policy>) return i;
    throw error(detail::concat("this Trainer has no variable synchronised by ", Policy::name));
  }
  Synchronizer& synchronizer(std::size_t i) { return *synchronizers_[i].second; }
  std::size_t size() const noexcept { return synchronizers_.size(); }
  const char* policy_name(std::size_t i) const { return policy_names_[i]; }
  /// The synchronizer that holds member `m`.
  Synchronizer& synchronizer_holding(const policy::Member& m) {
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (members_[i] == &m) return synchronizer(member_synchronizer_[i]);
    throw error(detail::concat("variable '", m.name(), "' is not registered with this Trainer"));
  }

  template <class V>
  policy::Member& member_of(const V& var) {
    for (policy::Member* m : members_)
      if (m->identity() == &var.state()) return *m;
    throw error(detail::concat("variable '", var.name(), "' is not registered with this Trainer"));
  }
  /// Every variable, in registration order.
  const std::vector<policy::Member*>& members() const noexcept { return members_; }
  /// The optimizer checkpoints record (optim::saved_name).
  const std::string& optimizer_name() const noexcept { return optimizer_name_; }

  /// A batched lookup's variables: held by this trainer, each once.
  template <class Request>
    void check_batch(const Request* batch, std::size_t count, const char* call) {
    for (std::size_t i = 0; i < count; ++i) {
      member_of(*batch[i].var);  // throws for a variable this trainer does not hold
      for (std::size_t j = 0; j < i; ++j)
        PARALLAX_EXPECTS(!batch[j].var->same_as(*batch[i].var), "variable '", batch[i].var->name(),
                         "' appears twice in one batched ", call, "; give it all its ids in one request");
    }
  }

  /// Calls f(synchronizer) on each, in order.
  template <class F>
  void for_each(F&& f) {
    for (auto& s : synchronizers_) f(*s.second);
  }
  /// Calls f(synchronizer, policy name) on each, in order, inside a span of
  /// the timeline named "<phase>: <policy>".
  template <class F>
  void each_phase(const char* phase, F&& f) {
    for (std::size_t i = 0; i < synchronizers_.size(); ++i) {
      const auto span = detail::Span::named("parallax", phase, ": ", policy_names_[i]);
      f(*synchronizers_[i].second);
    }
  }
  /// Whether every synchronizer is asynchronous (policy::Asynchronous).
  bool asynchronous() const {
    for (const auto& s : synchronizers_)
      if (!dynamic_cast<const policy::Asynchronous*>(s.second.get())) return false;
    return true;
  }
  /// The first asynchronous synchronizer's staleness statistics, if any.
  const AsyncStats* async_stats() {
    for (auto& s : synchronizers_)
      if (auto* a = dynamic_cast<policy::Asynchronous*>(s.second.get())) return &a->async_stats();
    return nullptr;
  }
  /// Asynchronous synchronizers: returns once every rank called it and
  /// every push made before is applied. Collective.
  void quiesce() {
    for (auto& s : synchronizers_)
      if (auto* a = dynamic_cast<policy::Asynchronous*>(s.second.get())) a->quiesce();
  }
  /// Whether work ready() posted this step updated some variable (update_when_ready).
  bool updated_early() const {
    for (const auto& s : synchronizers_)
      if (s.second->updated_early()) return true;
    return false;
  }

  /// One line per variable: policy, rows stored on rank `rank`.
  std::string describe(int rank) const {
    std::ostringstream os;
    for (const policy::Member* m : members_)
      os << m->name() << ": " << m->policy() << ", " << m->stored_rows() << " rows on rank " << rank
         << (m->in_shared_memory() ? " (shared memory)" : "") << "\n";
    return os.str();
  }

 private:
  template <class V>
  void add(Engine& engine, const Optimizer& opt, const TrainerOptions& options, const void* owner, V& var) {
    using Policy = policy_for_t<Arch, V>;
    const void* key = &type_key<Policy>;
    auto it = synchronizers_.begin();
    while (it != synchronizers_.end() && it->first != key) ++it;
    if (it == synchronizers_.end()) {
      synchronizers_.emplace_back(key, policy::make_synchronizer<Policy>(engine, opt, options));
      policy_names_.push_back(Policy::name);
      it = synchronizers_.end() - 1;
    }
    auto& s = static_cast<synchronizer_t<Policy>&>(*it->second);
    members_.push_back(&s.add(var));
    member_synchronizer_.push_back(static_cast<std::size_t>(it - synchronizers_.begin()));
    var.state().trainer = owner;
    registered_.push_back(&var.state().trainer);
  }

  std::vector<std::pair<const void*, std::unique_ptr<Synchronizer>>> synchronizers_;  // keyed by policy
  std::vector<const char*> policy_names_;          // of each synchronizer
  std::vector<policy::Member*> members_;           // every variable, in registration order
  std::vector<std::size_t> member_synchronizer_;   // each member's synchronizer
  std::vector<const void**> registered_;           // each variable's link to its trainer
  std::string optimizer_name_;                     // what checkpoints record
};

}  // namespace parallax::trainer
