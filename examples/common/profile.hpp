#pragma once
/// @file
/// Where the examples' training steps spend their time, in the parts a user
/// comparing frameworks asks about: parallax's calls, the model's matrix
/// products, making the input batches, and (the rest of the step) the
/// model's other kernels.
///
///     const auto rows = examples::timed(ex, examples::Part::parallax, [&] { return trainer.lookup(emb, ids); });
///
/// charges the call's wall time to the profile that is current on this
/// thread (examples::Progress makes its own current while it lives); with
/// none, timed() only calls. On a device, timed() synchronises the stream
/// before and after, so a part is charged for its kernels, not for the
/// launches; the profile then costs the overlap of host and device work.

#include <parallax/parallax.hpp>

#include <chrono>
#include <cstddef>
#include <type_traits>
#include <utility>

namespace examples {

namespace px = parallax;

/// The parts of a step a StepProfile times; the rest of the step is the
/// model's other work (softmax, gathers, activations, copies).
enum class Part : int {
  parallax,  ///< lookups, adding gradients, trainer.step(): exchanges (waiting for peers included), optimizer
  gemm,      ///< the model's matrix products (examples::gemm)
  input,     ///< making the batches (reading, sampling): a data loader's work
};
inline constexpr int part_count = 3;

/// Seconds per Part, summed over the calls charged to it.
class StepProfile {
 public:
  StepProfile() = default;
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  void add(Part part, double seconds) noexcept { seconds_[static_cast<int>(part)] += seconds; }
  double seconds(Part part) const noexcept { return seconds_[static_cast<int>(part)]; }

  /// The profile timed() charges on this thread, or null.
  static StepProfile* current() noexcept { return slot(); }

  /// Makes `p` current on this thread for its lifetime, then restores the
  /// one before.
  class Scope {
   public:
    explicit Scope(StepProfile& p) noexcept : previous_(std::exchange(slot(), &p)) {}
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() { slot() = previous_; }

   private:
    StepProfile* previous_;
  };

 private:
  static StepProfile*& slot() noexcept {
    thread_local StepProfile* p = nullptr;
    return p;
  }
  double seconds_[part_count] = {};
};

namespace detail {
/// Calls f(), then `after()`, and returns what f returned.
template <class F, class After>
auto then(F&& f, After&& after) -> decltype(std::forward<F>(f)()) {
  using R = decltype(std::forward<F>(f)());
  if constexpr (std::is_void_v<R>) {
    std::forward<F>(f)();
    after();
  } else {
    R r = std::forward<F>(f)();
    after();
    return r;
  }
}
}  // namespace detail

/// Calls f() and returns what it returns, charging its time to `part` of
/// the current profile (host work: nothing to synchronise).
template <class F>
auto timed(Part part, F&& f) -> decltype(std::forward<F>(f)()) {
  StepProfile* p = StepProfile::current();
  if (!p) return std::forward<F>(f)();
  const auto t0 = std::chrono::steady_clock::now();
  return detail::then(std::forward<F>(f), [&] {
    p->add(part, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  });
}

/// The same for work issued on `ex`: its stream is synchronised before f()
/// (earlier kernels are not this part's) and after (f's kernels are).
template <class Space, class F>
auto timed(const px::Exec<Space>& ex, Part part, F&& f) -> decltype(std::forward<F>(f)()) {
  if (!StepProfile::current()) return std::forward<F>(f)();
  ex.synchronize();
  return timed(part, [&]() -> decltype(std::forward<F>(f)()) {
    return detail::then(std::forward<F>(f), [&] { ex.synchronize(); });
  });
}

/// Says the gradients of `vars` are final (Trainer::ready) when `on`
/// (--overlap on), charged to Part::parallax. The stream is synchronised
/// first: ready() may hand the gradients to the communication thread at
/// once, so the kernels that write them must have finished.
template <class Trainer, class... Vars>
void ready(Trainer& trainer, bool on, Vars&... vars) {
  if (!on) return;
  auto& ex = trainer.engine().exec();
  ex.synchronize();
  timed(Part::parallax, [&] { trainer.ready(vars...); });
}

}  // namespace examples
