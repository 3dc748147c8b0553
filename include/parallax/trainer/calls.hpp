#pragma once
/// @file
/// A trainer on the timeline (TrainerOptions::timeline, detail/timeline.hpp):
/// each call into it as a span, the user's time between two calls, and the
/// recording itself when this trainer started it.

#include <parallax/context.hpp>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/timeline.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <string>

namespace parallax::trainer {

class Calls {
 public:
  Calls() = default;
  /// Starts recording to `path` unless it is empty or a recording runs
  /// (once the trainer is made: the recording ends with it).
  void record(const Context& ctx, const std::string& path) {
    if (path.empty() || detail::Timeline::get().on()) return;
    detail::Timeline::get().start(ctx.comm(), path);
    records_ = true;
  }
  Calls(const Calls&) = delete;
  Calls& operator=(const Calls&) = delete;
  /// Writes the recording it started (collective, unless the job failed).
  ~Calls() {
    if (!records_ || detail::job_failed()) return;
    try {
      detail::Timeline::get().finish();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "parallax: %s\n", e.what());
    }
  }

  /// One call: the user's time since the previous call, then the call's span.
  class Scope {
   public:
    Scope(Calls& calls, const char* name) : calls_(&calls), user_(name) {
      detail::Timeline& timeline = detail::Timeline::get();
      if (timeline.on() && calls.last_end_ >= 0) timeline.record("user", "user", calls.last_end_, timeline.now_us());
      span_.emplace(name);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      span_.reset();
      detail::Timeline& timeline = detail::Timeline::get();
      if (timeline.on()) calls_->last_end_ = timeline.now_us();
    }

   private:
    Calls* calls_;
    detail::UserCall user_;  // diagnoses name the call
    std::optional<detail::Span> span_;
  };

 private:
  bool records_ = false;  // this trainer started the recording
  double last_end_ = -1;  // of the last call, on the timeline, microseconds
};

}  // namespace parallax::trainer
