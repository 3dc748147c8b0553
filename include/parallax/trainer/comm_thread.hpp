#pragma once
/// @file
/// A trainer's communication thread (TrainerOptions::overlap, as resolved):
/// where ready() and prefetch() post the work they start, and the wait for
/// it before the trainer's next call that communicates. Without a thread
/// the work runs at once, in the caller.

#include <parallax/detail/worker.hpp>
#include <parallax/policy/policy.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <utility>

namespace parallax::trainer {

class CommThread final : public policy::Background, public policy::Helper {
 public:
  explicit CommThread(bool threaded) : worker_(threaded) {}
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
};

}  // namespace parallax::trainer
