#pragma once
/// @file
/// A step's phases over a trainer's synchronizers (docs/design.md, "One
/// training step, through the code"): each synchronizer's problem() and
/// has_gradient(), the look for non-finite gradients, one agreement among
/// the ranks, start_exchange(), finish_exchange(), the global norm when
/// clipping, the learning rate, update(), clear(); and what a failed or
/// skipped step leaves behind.

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/trainer/clipping.hpp>
#include <parallax/trainer/learning_rate.hpp>
#include <parallax/trainer/registry.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

namespace parallax::trainer {

/// What a step did.
struct StepOutcome {
  bool applied = false;         ///< false: skipped for a gradient that is not finite
  bool save_requested = false;  ///< rank 0's clock asks for a timed checkpoint
};

/// The steps of a trainer: their count, the phases of each, and the state a
/// failed or skipped one leaves (the trainer refuses work after a step that
/// failed part way through its updates, until a restore).
template <class Arch, class Engine, class Optimizer>
class Steps {
 public:
  using Registry = trainer::Registry<Arch, Engine, Optimizer>;

  /// `options` resolved; what needs every gradient before any update is
  /// refused with update_when_ready.
  Steps(Engine& engine, Registry& registry, const TrainerOptions& options, Optimizer& opt)
      : engine_(&engine), registry_(&registry), options_(&options), opt_(&opt), rate_(opt, options.schedule) {
    PARALLAX_EXPECTS(!options.update_when_ready || options.clip_norm <= 0,
                     "TrainerOptions::update_when_ready updates a variable before the step has every gradient, ",
                     "so it cannot scale them by their global norm: clip_norm must be 0, not ", options.clip_norm);
    PARALLAX_EXPECTS(!options.update_when_ready || options.on_non_finite == NonFinite::ignore,
                     "TrainerOptions::update_when_ready updates a variable before the step has checked every "
                     "gradient, so on_non_finite must be ignore (or automatic), not ", to_string(options.on_non_finite));
  }
  /// Once the variables are registered: whether every synchronizer is
  /// asynchronous (then a step makes no collective call). The settings
  /// asynchronous training cannot honour throw, and release the variables.
  void registered() {
    asynchronous_ = registry_->asynchronous();
    if (!asynchronous_) return;
    try {
      PARALLAX_EXPECTS(options_->clip_norm <= 0, "TrainerOptions::clip_norm needs the global gradient norm of a step, ",
                       "which asynchronous training (", Arch::name, ") has not: every rank steps alone");
      PARALLAX_EXPECTS(options_->checkpoint.every_seconds <= 0, "TrainerOptions::checkpoint.every_seconds needs ",
                       "the ranks to agree at every step, which asynchronous training (", Arch::name,
                       ") does not do: save every_steps instead");
    } catch (...) {
      registry_->release();  // the variables may join another trainer
      throw;
    }
  }
  bool asynchronous() const noexcept { return asynchronous_; }

  /// Steps completed (skipped ones not counted).
  std::uint64_t done() const noexcept { return done_; }
  /// What every synchronizer is told about the next step.
  policy::StepInfo info() const {
    policy::StepInfo step{done_ + 1, options_->reduction == Reduction::mean ? 1.0 / engine_->size() : 1.0};
    step.check_finite = options_->on_non_finite != NonFinite::ignore;
    return step;
  }
  LearningRate<Optimizer>& rate() noexcept { return rate_; }
  double gradient_norm() const noexcept { return gradient_norm_; }
  std::uint64_t skipped() const noexcept { return skipped_; }
  const std::string& skipped_why() const noexcept { return skipped_why_; }

  /// Trainer::ready(): the variables' policies may start moving their
  /// gradients, posting the work to `background`. The step's first ready()
  /// sets its learning rate, before any work it posts may read it.
  template <class... Vars>
  void ready(policy::Background& background, Vars&... vars) {
    ensure_usable();
    const detail::Span span("ready");
    if (!begun_) rate_.apply(*opt_, done_ + 1);
    begun_ = true;
    const policy::StepInfo step = info();
    auto mark = [&](auto& v) {
      policy::Member& m = registry_->member_of(v);
      registry_->synchronizer_holding(m).ready(m, step, background);
    };
    (detail::for_each_variable(vars, mark), ...);
  }
  /// The rate of the next step.
  double learning_rate() const {
    static_assert(optim::has_learning_rate_v<Optimizer>, "this optimizer has no learning rate `lr`");
    return rate_.at(done_ + 1);
  }
  /// Trainer::set_learning_rate(): the base rate, which the schedule scales.
  void set_learning_rate(double lr) {
    static_assert(optim::has_learning_rate_v<Optimizer>, "this optimizer has no learning rate `lr`");
    PARALLAX_EXPECTS(!(options_->update_when_ready && begun_), "set_learning_rate: ready() was called this ",
                     "step, whose updates may have begun at the old rate (TrainerOptions::update_when_ready); ",
                     "set the rate before the step's first ready()");
    rate_.set_base(lr);
  }

  /// The step, after the work ready() posted has finished: applied on every
  /// rank, skipped on every rank (a gradient that is not finite, with
  /// on_non_finite skip), or thrown on every rank (then abandoned).
  /// `time_to_save`: this rank's clock asks for a timed checkpoint.
  /// `helper`: a second thread for the update phase, if there is one.
  StepOutcome run(bool time_to_save, policy::Helper* helper = nullptr) {
    engine_->set_step(static_cast<std::int64_t>(done_ + 1));
    std::optional<std::string> problem, non_finite;
    bool has_gradient = false;
    registry_->for_each([&](auto& s) {
      if (!problem) problem = s.problem();
      has_gradient = has_gradient || s.has_gradient();
    });
    const NonFinite on_non_finite = options_->on_non_finite;
    if (on_non_finite != NonFinite::ignore && !problem)
      for (policy::Member* m : registry_->members())
        if (!non_finite) non_finite = m->non_finite_gradient();
    for (auto* found : {&problem, &non_finite})
      if (*found) **found += detail::concat(" (step ", done_ + 1, ")");
    if (non_finite && on_non_finite == NonFinite::fail) problem = std::exchange(non_finite, std::nullopt);
    bool save_requested = false;
    if (asynchronous_) {
      // No agreement: an asynchronous step waits for no other rank. A
      // problem with this rank's data abandons, or skips, its step here only.
      if (problem) {
        abandon();
        throw error(detail::concat("rank ", engine_->rank(), ": ", *problem));
      }
      if (non_finite) return skip(detail::concat("rank ", engine_->rank(), ": ", *non_finite));
    } else {
      detail::StepVerdict verdict;
      try {
        const detail::Span span("agreement");
        verdict = detail::agree_step(*engine_, problem, non_finite, has_gradient,
                             "step(): no variable was given a gradient on any rank since the last step", time_to_save);
      } catch (...) {
        abandon();  // on every rank alike
        throw;
      }
      if (verdict.notice) return skip(std::move(*verdict.notice));
      save_requested = verdict.request;
    }
    policy::StepInfo step = info();
    step.helper = helper;
    try {
      registry_->each_phase("start exchange", [&](auto& s) { s.start_exchange(step); });
      registry_->each_phase("finish exchange", [&](auto& s) { s.finish_exchange(step); });
      if (options_->clip_norm > 0) {
        const detail::Span span("clip by the global norm");
        gradient_norm_ = global_norm(*registry_, *engine_, step.scale);
        if (!std::isfinite(gradient_norm_) && on_non_finite != NonFinite::ignore) {
          std::string why = detail::concat("the gradient's global norm is ", std::isnan(gradient_norm_) ? "NaN" : "+Inf",
                                   " (step ", step.step, ")");
          if (on_non_finite == NonFinite::fail) throw error(why);
          return skip(std::move(why));  // the same norm on every rank: skipped on every rank
        }
        step.scale *= clip_factor(gradient_norm_, options_->clip_norm);
      }
    } catch (...) {
      abandon();  // an exchange the ranks disagree on, or a failed norm
      throw;
    }
    rate_.apply(*opt_, step.step);
    registry_->each_phase("update", [&](auto& s) { s.update(step); });
    clear();
    ++done_;
    return StepOutcome{true, save_requested};
  }

  /// Forgets the step's gradients and lookups.
  void clear() {
    registry_->for_each([](auto& s) { s.clear(); });
    begun_ = false;
  }
  /// The step failed: its gradients are forgotten on every rank. If some
  /// variable was already updated (update_when_ready), the model is part
  /// way through the step and the trainer refuses work until restore().
  void abandon() {
    if (registry_->updated_early())
      unusable_ = detail::concat("step ", done_ + 1, " failed after updating some variables early ",
                         "(TrainerOptions::update_when_ready): the model is part way through that step; ",
                         "restore() a checkpoint");
    clear();
  }
  /// Throws if the trainer refuses work (see abandon()).
  void ensure_usable() const {
    if (!unusable_.empty()) throw error(detail::concat("this Trainer cannot be used: ", unusable_));
  }
  /// A restore failed while loading: the variables may be half-loaded.
  void damaged() { unusable_ = "a restore failed while loading; the variables may be half-loaded"; }
  /// A restore succeeded: the trainer goes on after step `step`.
  void restored(std::uint64_t step) {
    clear();
    done_ = step;
    unusable_.clear();
  }

 private:
  StepOutcome skip(std::string why) {
    clear();
    ++skipped_;
    skipped_why_ = std::move(why);
    return StepOutcome{false, false};
  }

  Engine* engine_;
  Registry* registry_;
  const TrainerOptions* options_;
  Optimizer* opt_;
  LearningRate<Optimizer> rate_;
  std::uint64_t done_ = 0, skipped_ = 0;
  double gradient_norm_ = 0;  // of the last step, when clipping
  bool begun_ = false;        // ready() was called since the last step
  bool asynchronous_ = false;  // every synchronizer is: steps make no collective call
  std::string unusable_;      // why the trainer refuses work, if it does
  std::string skipped_why_;   // why the last skipped step was skipped
};

}  // namespace parallax::trainer
