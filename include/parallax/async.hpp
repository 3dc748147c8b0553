#pragma once
/// @file
/// Asynchronous training: the architectures that route variables to the
/// AsyncPS policy, and a helper that picks one from a command line's
/// `--arch` and `--sync`. The staleness bound is a run-time setting
/// (TrainerOptions::async.staleness); whether a step waits for the others'
/// gradients is the trainer's type, as every policy choice in parallax.

#include <parallax/arch.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/async_ps.hpp>
#include <parallax/policy/async_ps/synchronizer.hpp>
#include <parallax/policy/ring_allreduce/synchronizer.hpp>
#include <parallax/types.hpp>

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace parallax {
namespace arch {

/// Asynchronous parameter server, as TensorFlow's PS and Parallax's async
/// mode: every variable, dense and sparse, through AsyncPS. No step makes a
/// collective call, so fast ranks go on while a slow one computes (up to the
/// staleness bound).
struct Async {
  static constexpr const char* name = "ps+async";
  using synchronous = PS;  ///< what `--arch ps --sync async` names
  template <class Sparsity>
  using policy = ::parallax::AsyncPS;
};

/// Persia's split: sparse variables through AsyncPS, dense ones all-reduced
/// synchronously. The all-reduce keeps the ranks in lock step, so a slow
/// rank still sets everyone's pace; what is asynchronous is only that a
/// sparse push lands when it is made.
struct AsyncHybrid {
  static constexpr const char* name = "hybrid+async";
  using synchronous = Hybrid;  ///< what `--arch hybrid --sync async` names
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, ::parallax::AsyncPS, RingAllReduce>;
};

/// The asynchronous architectures, each the asynchronous form of the
/// synchronous one its `synchronous` names (which with_arch(name, "async")
/// looks up).
using all_async = List<Async, AsyncHybrid>;

/// The names of the synchronous architectures that have an asynchronous
/// form: "ps or hybrid".
inline std::string async_names() {
  std::string out;
  for_each(all_async{}, [&](auto a) {
    if (!out.empty()) out += " or ";
    out += decltype(a)::synchronous::name;
  });
  return out;
}

}  // namespace arch

/// with_arch() for `sync` "sync"; for "async", calls `f(A{})` for the
/// architecture A of arch::all_async whose synchronous form is named `name`
/// (for "ps", `f(arch::Async{})`; "allreduce" has no parameter server to be
/// asynchronous with).
template <class F>
decltype(auto) with_arch(std::string_view name, std::string_view sync, F&& f) {
  if (sync == "sync") return with_arch(name, std::forward<F>(f));
  PARALLAX_EXPECTS(sync == "async", "unknown --sync '", sync, "': expected sync or async");
  return arch::pick(
      arch::all_async{}, name, [](auto a) { return std::string_view(decltype(a)::synchronous::name); },
      std::forward<F>(f), [&] {
        return detail::concat("architecture '", name, "' has no asynchronous form: use ", arch::async_names(),
                              " (arch::all_async)");
      });
}

}  // namespace parallax
