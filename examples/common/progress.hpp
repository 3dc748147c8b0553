#pragma once
/// @file
/// The examples' progress line and summary: global mean loss, samples per
/// second, bytes sent per step per rank (from the trainer's CommStats,
/// exact), where the steps' time went (profile.hpp), and the Passed /
/// Failed verdict.
///
/// Losses and counts are combined across ranks with MPI directly on the
/// context's communicator, outside the trainer, so reporting neither shows in
/// the trainer's byte statistics nor needs the engine's memory space.

#include "profile.hpp"

#include <parallax/parallax.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace examples {

namespace px = parallax;

/// What a training run measured.
struct Summary {
  std::uint64_t steps = 0;
  double first_loss = 0;       ///< global mean loss of step 1 (the untrained model)
  double final_loss = 0;       ///< global mean loss over the last progress window
  std::uint64_t final_from = 0;  ///< first step of that window
  std::uint64_t warmup = 1;    ///< first steps left out of samples_per_s
  double samples_per_s = 0;    ///< steps warmup+1..end; 0 when every step was warm-up
  double seconds = 0;          ///< steps warmup+1..end
  double bytes_per_step = 0;   ///< bytes sent per step by a rank, mean over the ranks
  double bytes_per_step_max = 0;  ///< the same, the busiest rank
  /// Engine calls per step of a rank (collectives and point-to-point), the
  /// busiest rank: each pays the link's latency at least once.
  double calls_per_step = 0;
  int ranks = 1;
  /// Steps the trainer skipped for a gradient that was not finite
  /// (TrainerOptions::on_non_finite), the most on any rank, and why the
  /// last one was (rank 0's).
  std::uint64_t skipped_steps = 0;
  std::string skipped_why;
  /// Share of the measured time (steps warmup+1..end) in each Part, mean
  /// over the ranks; the rest is the model's other kernels.
  double share[part_count] = {};

  /// The shares and the calls as the result line's fields: "gemm_share=0.412 ... calls_per_step=12".
  std::string shares() const {
    char text[200];
    std::snprintf(text, sizeof text, "gemm_share=%.3f parallax_share=%.3f input_share=%.3f calls_per_step=%.1f",
                  share[static_cast<int>(Part::gemm)], share[static_cast<int>(Part::parallax)],
                  share[static_cast<int>(Part::input)], calls_per_step);
    return text;
  }
};

/// "12.3 MiB" style.
inline std::string format_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

/// Prints a progress line at step 1 and every `every` steps (rank 0), and a
/// summary at the end. Every call is collective: all ranks call record()
/// after each step and finish() once.
///
/// While it lives it is the current StepProfile of its thread: the parts of
/// the steps timed with examples::timed() are reported beside samples/s.
///
/// samples/s leaves out the first `warmup` steps: they pay one-time costs
/// (first touches of freshly grown buffers, the allocator settling) that
/// differ between architectures; a full-replica all-reduce run touches
/// several times the memory of a sharded one in its first steps.
template <class Trainer>
class Progress {
 public:
  using clock = std::chrono::steady_clock;

  /// Construct right before the training loop (bytes count from here).
  Progress(Trainer& trainer, std::size_t global_batch, std::size_t every, const char* unit = "samples",
           std::size_t warmup = 1)
      : trainer_(&trainer), ctx_(&trainer.context()), batch_(global_batch), every_(std::max<std::size_t>(every, 1)),
        warmup_(warmup), unit_(unit), root_(trainer.context().is_root()), scope_(profile_) {
    summary_.ranks = trainer.context().size();
    summary_.warmup = warmup;
    window_start_ = steady_start_ = clock::now();
    sent_at_window_ = sent_at_start_ = sent();
    calls_at_start_ = trainer.stats().total().calls;
  }

  /// After every step: this rank's mean loss over its share of the batch.
  void record(double local_loss) {
    ++steps_;
    window_loss_ += local_loss;
    ++window_steps_;
    if (steps_ == 1 || steps_ % every_ == 0 || steps_ == warmup_) flush();
  }

  /// Prints the summary (rank 0) and returns it on every rank.
  Summary finish() {
    if (window_steps_) flush();
    Summary& s = summary_;
    s.steps = steps_;
    const std::uint64_t measured = steps_ > warmup_ ? steps_ - warmup_ : 0;
    s.seconds = measured ? std::chrono::duration<double>(last_flush_ - steady_start_).count() : 0;
    s.samples_per_s = measured && s.seconds > 0 ? static_cast<double>(measured * batch_) / s.seconds : 0;
    double bytes[2] = {static_cast<double>(sent() - sent_at_start_) / static_cast<double>(std::max<std::uint64_t>(steps_, 1)), 0};
    bytes[1] = ctx_->max(bytes[0]);
    bytes[0] = ctx_->sum(bytes[0]);
    s.bytes_per_step = bytes[0] / s.ranks;
    s.bytes_per_step_max = bytes[1];
    s.calls_per_step = ctx_->max(static_cast<double>(trainer_->stats().total().calls - calls_at_start_) /
                                 static_cast<double>(std::max<std::uint64_t>(steps_, 1)));
    std::vector<double> parts(part_count);
    for (int p = 0; p < part_count; ++p)
      parts[p] = s.seconds > 0 ? (profile_.seconds(Part(p)) - at_steady_[p]) / s.seconds / s.ranks : 0;
    parts = ctx_->sum(std::move(parts));
    std::copy(parts.begin(), parts.end(), s.share);
    if (root_) {
      std::printf("summary: %llu steps of %zu %s on %d rank%s\n", static_cast<unsigned long long>(s.steps), batch_, unit_,
                  s.ranks, s.ranks == 1 ? "" : "s");
      std::printf("  loss: step 1 %.4f, final %.4f (mean of steps %llu-%llu)\n", s.first_loss, s.final_loss,
                  static_cast<unsigned long long>(s.final_from), static_cast<unsigned long long>(s.steps));
      std::printf("  skipped steps (a gradient not finite): %llu%s%s\n", static_cast<unsigned long long>(s.skipped_steps),
                  s.skipped_why.empty() ? "" : "; the last: ", s.skipped_why.c_str());
      if (measured)
        std::printf("  %s/s: %.1f (steps %llu-%llu, %.2f s%s)\n", unit_, s.samples_per_s,
                    static_cast<unsigned long long>(warmup_ + 1), static_cast<unsigned long long>(s.steps), s.seconds,
                    warmup_ ? "; the steps before warm up" : "");
      else
        std::printf("  %s/s: n/a (all %llu steps were warm-up, --warmup %llu)\n", unit_,
                    static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(warmup_));
      std::printf("  bytes sent per step per rank: %s mean, %s busiest rank; engine calls per step: %.1f (trainer.stats())\n",
                  format_bytes(s.bytes_per_step).c_str(), format_bytes(s.bytes_per_step_max).c_str(), s.calls_per_step);
      if (measured) {
        const double gemm = s.share[int(Part::gemm)], parallax = s.share[int(Part::parallax)], input = s.share[int(Part::input)];
        std::printf("  time (mean over ranks): the model's matrix products %.1f%%, its other kernels %.1f%%, parallax "
                    "%.1f%% (lookups, gradients, trainer.step(), waiting for other ranks included), making batches %.1f%%\n",
                    100 * gemm, 100 * (1 - gemm - parallax - input), 100 * parallax, 100 * input);
      }
      std::fflush(stdout);
    }
    return s;
  }

 private:
  std::uint64_t sent() const { return trainer_->stats().total().sent(); }

  void flush() {
    double loss = ctx_->sum(window_loss_);  // also lines the ranks up for the clock
    summary_.skipped_steps = static_cast<std::uint64_t>(ctx_->max(static_cast<double>(trainer_->skipped_steps())));
    summary_.skipped_why = trainer_->skipped_why();
    loss /= static_cast<double>(window_steps_) * summary_.ranks;
    const auto now = clock::now();
    const double secs = std::chrono::duration<double>(now - window_start_).count();
    const std::uint64_t sent_now = sent();
    const double bytes = static_cast<double>(sent_now - sent_at_window_) / static_cast<double>(window_steps_);
    if (steps_ == 1) summary_.first_loss = loss;
    if (steps_ == warmup_) {
      steady_start_ = now;
      for (int p = 0; p < part_count; ++p) at_steady_[p] = profile_.seconds(Part(p));
    }
    summary_.final_loss = loss;
    summary_.final_from = steps_ - window_steps_ + 1;
    if (root_) {
      std::printf("step %6llu  loss %8.4f  %s/s %10.1f  sent/step/rank %s", static_cast<unsigned long long>(steps_),
                  loss, unit_, secs > 0 ? static_cast<double>(window_steps_ * batch_) / secs : 0.0,
                  format_bytes(bytes).c_str());
      if (summary_.skipped_steps > 0)
        std::printf("  skipped %llu", static_cast<unsigned long long>(summary_.skipped_steps));
      std::printf("\n");
      std::fflush(stdout);
    }
    window_loss_ = 0;
    window_steps_ = 0;
    window_start_ = last_flush_ = now;
    sent_at_window_ = sent_now;
  }

  Trainer* trainer_;
  const px::Context* ctx_;
  std::size_t batch_, every_, warmup_;
  const char* unit_;
  bool root_;
  std::uint64_t steps_ = 0, window_steps_ = 0;
  double window_loss_ = 0;
  clock::time_point window_start_, steady_start_, last_flush_;
  std::uint64_t sent_at_start_ = 0, sent_at_window_ = 0, calls_at_start_ = 0;
  Summary summary_;
  StepProfile profile_;
  StepProfile::Scope scope_;
  double at_steady_[part_count] = {};  // profile_ when the warm-up ended
};

/// Prints the verdict (rank 0) in CUTLASS's style and returns main's exit code.
inline int verdict(const px::Context& ctx, bool passed, const std::string& why) {
  if (ctx.is_root()) {
    std::printf("%s\n%s\n", why.c_str(), passed ? "Passed" : "Failed");
    std::fflush(stdout);
  }
  return passed ? 0 : 1;
}

}  // namespace examples
