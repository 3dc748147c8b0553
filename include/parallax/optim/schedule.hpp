#pragma once
/// @file
/// Learning-rate schedules: the factor a trainer multiplies its base
/// learning rate by at each step (TrainerOptions::schedule). A schedule is
/// any callable `double(std::uint64_t step)`, step counting from 1, so these
/// small types, their compositions and a lambda of your own all fit:
///
///     options.schedule = px::schedule::Warmup<px::schedule::Cosine>{100, {900, 0.1}};
///
/// A schedule is a function of the step count alone, so a restored trainer
/// (whose steps() is restored) continues it where it was saved.

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace parallax::optim::schedule {

/// The base learning rate throughout.
struct Constant {
  double operator()(std::uint64_t) const noexcept { return 1.0; }
};

/// From 1/steps at step 1 up to 1 at step `steps`, then 1.
struct LinearWarmup {
  std::uint64_t steps = 1;
  double operator()(std::uint64_t step) const noexcept {
    return steps == 0 ? 1.0 : std::min(1.0, static_cast<double>(step) / static_cast<double>(steps));
  }
};

/// Multiplied by `gamma` every `every` steps: gamma^floor((step - 1) / every).
struct StepDecay {
  std::uint64_t every = 1;
  double gamma = 0.1;
  double operator()(std::uint64_t step) const noexcept {
    const std::uint64_t k = every == 0 ? 0 : (std::max<std::uint64_t>(step, 1) - 1) / every;
    return std::pow(gamma, static_cast<double>(k));
  }
};

/// Half a cosine from 1 at step 0 down to `floor` at step `steps` (SGDR
/// without restarts), then `floor`.
struct Cosine {
  std::uint64_t steps = 1;
  double floor = 0.0;
  double operator()(std::uint64_t step) const noexcept {
    const double t = steps == 0 ? 1.0 : std::min(1.0, static_cast<double>(step) / static_cast<double>(steps));
    return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(3.14159265358979323846 * t));
  }
};

/// A linear warm-up over `steps` steps, then `then`, counted from the end of
/// the warm-up (its step 1 is the step after it).
template <class Then>
struct Warmup {
  std::uint64_t steps = 1;
  Then then{};
  double operator()(std::uint64_t step) const {
    if (step <= steps) return LinearWarmup{steps}(step);
    return then(step - steps);
  }
};

}  // namespace parallax::optim::schedule

namespace parallax {
namespace schedule = optim::schedule;  ///< as the tutorial writes it: px::schedule::Cosine
}  // namespace parallax
