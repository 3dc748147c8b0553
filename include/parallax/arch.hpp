#pragma once
/// @file
/// Architectures: the compile-time routing table from a variable's sparsity to
/// its communicator policy, and a helper to pick one from a command line.
/// Includes the built-in policies' machinery, which the architectures name.

#include <parallax/dynamic/variable.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/allgatherv/synchronizer.hpp>
#include <parallax/policy/dynamic_ps/synchronizer.hpp>
#include <parallax/policy/ring_allreduce/synchronizer.hpp>
#include <parallax/policy/sharded_ps/synchronizer.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <string_view>
#include <type_traits>
#include <utility>

namespace parallax {
namespace arch {

/// Parallax's hybrid: dense variables all-reduced, sparse ones sharded.
struct Hybrid {
  static constexpr const char* name = "hybrid";
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, ShardedPS, RingAllReduce>;
};

/// All-reduce only, as Horovod: dense all-reduced, sparse all-gathered.
struct AllReduce {
  static constexpr const char* name = "allreduce";
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, AllGatherv, RingAllReduce>;
};

/// Parameter server only, as TensorFlow's PS: every variable sharded.
struct PS {
  static constexpr const char* name = "ps";
  template <class Sparsity>
  using policy = ShardedPS;
};

}  // namespace arch

namespace detail {
template <class Arch, class V, bool Dynamic = dynamic::is_dynamic_v<V>>
struct policy_for {
  using type = std::conditional_t<std::is_same_v<typename V::policy, use_arch>,
                                  typename Arch::template policy<typename V::sparsity>, typename V::policy>;
};
/// Dynamic variables: DynamicPS under every synchronous architecture.
template <class Arch, class V>
struct policy_for<Arch, V, true> {
  static_assert(!std::is_same_v<typename Arch::template policy<Sparse>, AsyncPS>,
                "parallax: a DynamicVariable needs a synchronous architecture (hybrid, allreduce or ps: DynamicPS); "
                "the asynchronous ones (AsyncPS) do not hold dynamic tables");
  static_assert(std::is_same_v<typename V::policy, use_arch> || std::is_same_v<typename V::policy, DynamicPS>,
                "parallax: a DynamicVariable is synchronised by DynamicPS only (AllGatherv, ShardedPS and AsyncPS "
                "hold fixed tables); leave its Policy argument as use_arch");
  using type = DynamicPS;
};
}  // namespace detail

/// The policy that synchronises variable type V under architecture Arch: V's
/// own policy if it names one, else the architecture's choice for its
/// sparsity; a DynamicVariable's is DynamicPS.
template <class Arch, class V>
using policy_for_t = typename detail::policy_for<Arch, V>::type;

/// Calls `f(arch::Hybrid{})`, `f(arch::AllReduce{})` or `f(arch::PS{})` for
/// "hybrid", "allreduce" or "ps", and returns what it returns, so a program
/// can instantiate its trainer for the architecture named on its command line:
///
///     px::with_arch(args.arch, [&](auto arch) {
///       px::Trainer<decltype(arch), px::optim::Adam> trainer(ctx, opt, emb, w);
///       ...
///     });
template <class F>
decltype(auto) with_arch(std::string_view name, F&& f) {
  if (name == arch::Hybrid::name) return std::forward<F>(f)(arch::Hybrid{});
  if (name == arch::AllReduce::name) return std::forward<F>(f)(arch::AllReduce{});
  if (name == arch::PS::name) return std::forward<F>(f)(arch::PS{});
  throw error(detail::concat("unknown architecture '", name, "': expected hybrid, allreduce or ps"));
}

}  // namespace parallax
