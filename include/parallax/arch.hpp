#pragma once
/// @file
/// Architectures: the compile-time routing table from a variable's sparsity to
/// its communicator policy; `arch::all`, the list of them that command lines,
/// the examples and the planner read; and with_arch(), which picks one by
/// name. Includes the built-in policies' machinery, which the architectures
/// name.
///
/// An architecture is a type with a `name` (what `--arch` takes), an `about`
/// (a line for --help) and a `policy<Sparsity>` alias. Adding one is a
/// struct here and its entry in `all`: with_arch(), the examples' `--arch`
/// and plan::Model (which prices the built-in synchronous policies) follow
/// the list (docs/tutorial.md, "Adding an architecture").

#include <parallax/dynamic/variable.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/allgatherv/synchronizer.hpp>
#include <parallax/policy/async_ps.hpp>
#include <parallax/policy/dynamic_ps/synchronizer.hpp>
#include <parallax/policy/ring_allreduce/synchronizer.hpp>
#include <parallax/policy/sharded_ps/synchronizer.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace parallax {
namespace arch {

/// Parallax's hybrid: dense variables all-reduced, sparse ones sharded.
struct Hybrid {
  static constexpr const char* name = "hybrid";
  static constexpr const char* about = "dense variables all-reduced, sparse ones sharded";  ///< for --help
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, ShardedPS, RingAllReduce>;
};

/// All-reduce only, as Horovod: dense all-reduced, sparse all-gathered.
struct AllReduce {
  static constexpr const char* name = "allreduce";
  static constexpr const char* about = "sparse variables all-gathered, as Horovod";  ///< for --help
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, AllGatherv, RingAllReduce>;
};

/// Parameter server only, as TensorFlow's PS: every variable sharded.
struct PS {
  static constexpr const char* name = "ps";
  static constexpr const char* about = "every variable sharded, as TensorFlow's PS";  ///< for --help
  template <class Sparsity>
  using policy = ShardedPS;
};

/// A list of architectures, as types.
template <class... Archs>
struct List {
  static constexpr std::size_t size = sizeof...(Archs);
};

/// The synchronous architectures, in the order tables print them: what
/// with_arch() and the examples' `--arch` accept, what plan::Model compares.
using all = List<Hybrid, AllReduce, PS>;

/// Calls `f(A{})` for every architecture A of the list, in order.
template <class... Archs, class F>
void for_each(List<Archs...>, F&& f) {
  (f(Archs{}), ...);
}

/// The names of a list, for messages: "hybrid, allreduce or ps".
template <class... Archs>
std::string names(List<Archs...>, std::string_view last_separator = " or ") {
  const char* each[] = {Archs::name...};
  std::string out;
  for (std::size_t i = 0; i < sizeof...(Archs); ++i) {
    if (i > 0) out += i + 1 == sizeof...(Archs) ? std::string(last_separator) : std::string(", ");
    out += each[i];
  }
  return out;
}

/// Whether the list has an architecture of that name.
template <class... Archs>
bool has(List<Archs...>, std::string_view name) {
  return ((name == Archs::name) || ...);
}

/// Returns `f(A{})` for the first architecture A of the list whose
/// `key(A{})` equals `name`; where none does, throws parallax::error with
/// the message `unknown()` returns.
template <class Key, class F, class Unknown, class A, class... Rest>
decltype(auto) pick(List<A, Rest...>, std::string_view name, Key key, F&& f, Unknown unknown) {
  if (name == key(A{})) return std::forward<F>(f)(A{});
  if constexpr (sizeof...(Rest) > 0)
    return pick(List<Rest...>{}, name, key, std::forward<F>(f), unknown);
  else
    throw error(unknown());
}

}  // namespace arch

namespace detail {
template <class Arch, class V, bool Dynamic = dynamic::is_dynamic_v<V>>
struct policy_for {
  using type = std::conditional_t<std::is_same_v<typename V::policy, use_arch>,
                                  typename Arch::template policy<typename V::sparsity>, typename V::policy>;
};
/// Dynamic variables: replicated by AllGatherv where the architecture gathers
/// sparse variables, else sharded by DynamicPS.
template <class Arch, class V>
struct policy_for<Arch, V, true> {
  using sparse = typename Arch::template policy<Sparse>;
  static_assert(!std::is_same_v<sparse, AsyncPS>,
                "parallax: a DynamicVariable needs a synchronous architecture (hybrid, allreduce or ps); "
                "the asynchronous ones (AsyncPS) do not hold dynamic tables");
  static_assert(detail::is_any_of_v<typename V::policy, use_arch, DynamicPS, AllGatherv>,
                "parallax: a DynamicVariable is synchronised by DynamicPS or AllGatherv only (ShardedPS and AsyncPS "
                "hold fixed tables); leave its Policy argument as use_arch");
  using type = std::conditional_t<std::is_same_v<typename V::policy, use_arch>,
                                  std::conditional_t<std::is_same_v<sparse, AllGatherv>, AllGatherv, DynamicPS>,
                                  typename V::policy>;
};
}  // namespace detail

/// The policy that synchronises variable type V under architecture Arch: V's
/// own policy if it names one, else the architecture's choice for its
/// sparsity; a DynamicVariable's is AllGatherv under an architecture that
/// gathers sparse variables (allreduce), else DynamicPS.
template <class Arch, class V>
using policy_for_t = typename detail::policy_for<Arch, V>::type;

/// Calls `f(A{})` for the architecture A of arch::all named `name` (for
/// "hybrid", `f(arch::Hybrid{})`) and returns what it returns, so a program
/// can instantiate its trainer for the architecture named on its command line:
///
///     px::with_arch(args.arch, [&](auto arch) {
///       px::Trainer<decltype(arch), px::optim::Adam> trainer(ctx, opt, emb, w);
///       ...
///     });
template <class F>
decltype(auto) with_arch(std::string_view name, F&& f) {
  return arch::pick(
      arch::all{}, name, [](auto a) { return std::string_view(decltype(a)::name); }, std::forward<F>(f),
      [&] { return detail::concat("unknown architecture '", name, "': expected ", arch::names(arch::all{})); });
}

}  // namespace parallax
