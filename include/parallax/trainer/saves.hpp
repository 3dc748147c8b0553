#pragma once
/// @file
/// A trainer's saves and restores: its variables' Checkpoints with the step
/// count and the base learning rate, taken while asynchronous policies are
/// quiet (every push made before is in, none lands during).

#include <parallax/checkpoint.hpp>
#include <parallax/detail/fault.hpp>
#include <parallax/error.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/options.hpp>
#include <parallax/trainer/registry.hpp>
#include <parallax/trainer/step.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace parallax::trainer {

template <class Arch, class Engine, class Optimizer>
class Saves {
 public:
  Saves(Engine& engine, const CheckpointOptions& options, Registry<Arch, Engine, Optimizer>& registry,
        Steps<Arch, Engine, Optimizer>& steps)
      : checkpoints_(engine, options, registry.optimizer_name(), Optimizer::slots, registry.members()),
        registry_(&registry), steps_(&steps) {}

  Checkpoints<Engine>& checkpoints() noexcept { return checkpoints_; }
  const Checkpoints<Engine>& checkpoints() const noexcept { return checkpoints_; }

  /// Asynchronous policies: returns once every rank called it and every
  /// push made before is applied. Collective.
  void quiesce() { registry_->quiesce(); }

  /// Checkpoint `dir/step-<steps>`; returns its path. Collective.
  std::string save(const std::string& dir) {
    const detail::UserCall user("save");
    PARALLAX_EXPECTS(!registry_->updated_early(), "save(): this step's updates began (TrainerOptions::update_when_ready); ",
                     "save after step()");
    std::optional<double> lr;
    if constexpr (optim::has_learning_rate_v<Optimizer>) lr = steps_->rate().base();
    quiesce();
    std::string path = checkpoints_.save(dir, steps_->done(), lr);
    quiesce();
    return path;
  }
  /// Loads checkpoint `path`, then the step count and the base learning
  /// rate it recorded. A restore that fails while loading leaves the
  /// trainer refusing work. Collective.
  void restore(const std::string& path) {
    const detail::UserCall user("restore");
    std::uint64_t step = 0;
    quiesce();
    try {
      step = checkpoints_.restore(path);
    } catch (...) {
      if (checkpoints_.damaged()) steps_->damaged();
      throw;
    }
    steps_->restored(step);
    registry_->for_each([&](auto& s) { s.restored(step); });
    if constexpr (optim::has_learning_rate_v<Optimizer>)
      if (auto lr = checkpoints_.restored_learning_rate()) steps_->rate().set_base(*lr);
  }

 private:
  Checkpoints<Engine> checkpoints_;
  Registry<Arch, Engine, Optimizer>* registry_;
  Steps<Arch, Engine, Optimizer>* steps_;
};

}  // namespace parallax::trainer
