#pragma once
/// @file
/// A trainer's learning rate: the base rate (the optimizer's `lr`, or
/// Trainer::set_learning_rate) times the schedule's factor for the step
/// (TrainerOptions::schedule, optim/schedule.hpp), set on the optimizer
/// before the step's first update.

#include <parallax/error.hpp>
#include <parallax/optim/optimizer.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>

namespace parallax::trainer {

template <class Optimizer>
class LearningRate {
 public:
  LearningRate(const Optimizer& opt, std::function<double(std::uint64_t)> schedule) : schedule_(std::move(schedule)) {
    if constexpr (optim::has_learning_rate_v<Optimizer>) base_ = static_cast<double>(opt.lr);
    else PARALLAX_EXPECTS(!schedule_, "TrainerOptions::schedule needs an optimizer with a learning rate `lr`");
  }
  /// The rate of step `step` (counting from 1).
  double at(std::uint64_t step) const { return base_ * (schedule_ ? schedule_(step) : 1.0); }
  /// The rate the schedule scales.
  double base() const noexcept { return base_; }
  void set_base(double lr) {
    PARALLAX_EXPECTS(std::isfinite(lr) && lr >= 0, "set_learning_rate: ", lr, " is not a finite rate >= 0");
    base_ = lr;
  }
  /// Gives `opt` the rate of step `step`.
  void apply(Optimizer& opt, std::uint64_t step) const {
    if constexpr (optim::has_learning_rate_v<Optimizer>) opt.lr = static_cast<decltype(opt.lr)>(at(step));
  }

 private:
  std::function<double(std::uint64_t)> schedule_;  // empty: a factor of 1
  double base_ = 0;
};

}  // namespace parallax::trainer
