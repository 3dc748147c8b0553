// trainer::LearningRate: the base rate times the schedule's factor of a step.

#include "support.hpp"

#include <parallax/trainer/learning_rate.hpp>

#include <cstdint>
#include <limits>

namespace {
struct NoRate {};  // an optimizer without a learning rate
}  // namespace

TEST_CASE("LearningRate is the base rate times the schedule's factor, set on the optimizer", "[trainer][schedule]") {
  px::optim::Adam adam{0.25f};
  px::trainer::LearningRate<px::optim::Adam> rate(adam, px::schedule::LinearWarmup{4});
  CHECK(rate.base() == 0.25);
  for (std::uint64_t s = 1; s <= 6; ++s) CHECK(rate.at(s) == 0.25 * px::schedule::LinearWarmup{4}(s));
  rate.apply(adam, 2);
  CHECK(adam.lr == static_cast<float>(0.25 * 0.5));
  rate.set_base(1.0);
  CHECK(rate.at(8) == 1.0);
  CHECK_THAT(test::error_of([&] { rate.set_base(std::numeric_limits<double>::quiet_NaN()); }),
             Catch::Contains("set_learning_rate") && Catch::Contains("not a finite rate"));
  CHECK_THAT(test::error_of([&] { rate.set_base(-1); }), Catch::Contains("not a finite rate >= 0"));
  CHECK(rate.base() == 1.0);
  // Without a schedule: the base rate, times exactly 1.
  px::trainer::LearningRate<px::optim::Adam> plain(adam, {});
  CHECK(plain.at(1000) == static_cast<double>(adam.lr));
}

TEST_CASE("a schedule needs an optimizer with a learning rate", "[trainer][schedule]") {
  CHECK_THAT(test::error_of([] { px::trainer::LearningRate<NoRate> r(NoRate{}, px::schedule::StepDecay{}); }),
             Catch::Contains("TrainerOptions::schedule needs an optimizer with a learning rate"));
  CHECK(test::error_of([] { px::trainer::LearningRate<NoRate> r(NoRate{}, {}); }).empty());
}
