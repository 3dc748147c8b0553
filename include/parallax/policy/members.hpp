#pragma once
/// @file
/// policy::Members<Kind>: a synchronizer's bookkeeping of its members, so a
/// policy writes only what it does with them. A synchronizer steps its
/// members through an interface of its own (`Kind`: the phases it runs on
/// each, whatever the variable's type) and finds a variable's member again
/// for a lookup; Members owns them in registration order, as Kind, and does
/// that search once for every policy.

#include <parallax/error.hpp>
#include <parallax/policy/policy.hpp>

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

/// The members of one kind a synchronizer holds, in the order they were
/// added: each a policy::Member (usually through MemberOf) and a `Kind`.
/// Iterating yields `Kind*`.
template <class Kind>
class Members {
 public:
  /// Makes a member of type M from `args` and keeps it; returns it (the
  /// synchronizer's add() returns it as the Member the trainer records).
  template <class M, class... Args>
  M& add(Args&&... args) {
    static_assert(std::is_base_of_v<Member, M> && std::is_base_of_v<Kind, M>,
                  "policy::Members<Kind>: a member derives from policy::Member (MemberOf) and from Kind");
    auto m = std::make_unique<M>(std::forward<Args>(args)...);
    M& ref = *m;
    kinds_.push_back(&ref);
    owned_.push_back(std::move(m));
    return ref;
  }

  /// The member, of type M, that holds `var` (a Variable handle: members are
  /// matched by its shared state); throws naming the variable and `policy`
  /// when none does.
  template <class M, class V>
  M& of(const V& var, const char* policy) {
    for (auto& m : owned_)
      if (m->identity() == &var.state()) return static_cast<M&>(*m);
    throw error(detail::concat("variable '", var.name(), "' is not synchronised by ", policy));
  }

  /// The index of `variable` (a Member the trainer recorded) among these
  /// members, or size() when it is not one of them.
  std::size_t find(const Member& variable) const noexcept {
    std::size_t i = 0;
    while (i < owned_.size() && owned_[i]->identity() != variable.identity()) ++i;
    return i;
  }

  /// Member `i` (in the order added) as the trainer sees it.
  const Member& member(std::size_t i) const noexcept { return *owned_[i]; }
  Kind* operator[](std::size_t i) const noexcept { return kinds_[i]; }
  std::size_t size() const noexcept { return kinds_.size(); }
  bool empty() const noexcept { return kinds_.empty(); }
  auto begin() const noexcept { return kinds_.begin(); }
  auto end() const noexcept { return kinds_.end(); }

 private:
  std::vector<std::unique_ptr<Member>> owned_;
  std::vector<Kind*> kinds_;  // the same members, as Kind
};

}  // namespace parallax::policy
