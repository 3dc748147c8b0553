#pragma once
/// @file
/// A trainer's communication thread (TrainerOptions::overlap, as resolved):
/// where ready() and prefetch() post the work they start, and the wait for
/// it before the trainer's next call that communicates. Without a thread
/// the work runs at once, in the caller.

#include <parallax/detail/worker.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <type_traits>
#include <utility>

namespace parallax::trainer {

class CommThread final : public policy::Background, public policy::Helper {
 public:
  /// `lends_core`: the thread also takes part of step()'s update (helper()).
  CommThread(bool threaded, bool lends_core) : worker_(threaded), lends_core_(threaded && lends_core) {}
  /// Whether a trainer over `Space` with these (resolved) options lends its
  /// thread's core to the update: on a host, where the thread has a core of
  /// its own, or wherever it runs with overlap_needs_spare_core off. The
  /// split is element-wise, so the model is the same bit for bit.
  template <class Space>
  static bool lends_core(const Context& ctx, const TrainerOptions& options) {
    return std::is_same_v<Space, HostSpace> && (spare_core_per_rank(ctx) || !options.overlap_needs_spare_core);
  }
  bool lends_core() const noexcept { return lends_core_; }
  /// The update phase's second thread (StepInfo::helper), or null.
  policy::Helper* helper() noexcept { return lends_core_ ? this : nullptr; }
  void post(std::function<void()> work) override { worker_.post(std::move(work)); }
  /// Helper: `there` on the thread (after the work posted before it), `here`
  /// in the caller meanwhile.
  void share(std::function<void()> there, const std::function<void()>& here) override {
    worker_.post(std::move(there));
    std::exception_ptr failed;
    try {
      here();
    } catch (...) {
      failed = std::current_exception();
    }
    try {
      worker_.drain();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
    if (failed) std::rethrow_exception(failed);
  }
  /// Waits for the work posted; on its first failure calls `failed()`,
  /// then throws it.
  template <class Failed>
  void drain(Failed&& failed) {
    try {
      worker_.drain();
    } catch (...) {
      failed();
      throw;
    }
  }
  /// drain() in a destructor: a failure is printed, naming `rank`.
  void drain_quietly(int rank) noexcept {
    try {
      worker_.drain();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "parallax: rank %d: %s\n", rank, e.what());
    }
  }
  bool threaded() const noexcept { return worker_.threaded(); }

 private:
  detail::Worker worker_;
  bool lends_core_;
};

}  // namespace parallax::trainer
