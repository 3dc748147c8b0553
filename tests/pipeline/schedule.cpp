// pipeline/schedule.hpp: GPipe and 1F1B as readable lists of passes, their
// activation peaks, their simulated bubbles against (S - 1) / (M + S - 1),
// and schedules of one's own refused when they cannot run.
#include "support.hpp"

#include <parallax/pipeline/schedule.hpp>

#include <string>
#include <vector>

namespace pp = px::pipeline;

TEST_CASE("schedule: GPipe and 1F1B read as lists of passes", "[pipeline]") {
  CHECK(pp::Schedule::gpipe(2, 3).describe() ==
        "stage 0: F0 F1 F2 B2 B1 B0\n"
        "stage 1: F0 F1 F2 B2 B1 B0\n");
  CHECK(pp::Schedule::one_f_one_b(3, 4).describe() ==
        "stage 0: F0 F1 F2 B0 F3 B1 B2 B3\n"
        "stage 1: F0 F1 B0 F2 B1 F3 B2 B3\n"
        "stage 2: F0 B0 F1 B1 F2 B2 F3 B3\n");
  CHECK(pp::Schedule::one_f_one_b(4, 2).describe() ==
        "stage 0: F0 F1 B0 B1\n"
        "stage 1: F0 F1 B0 B1\n"
        "stage 2: F0 F1 B0 B1\n"
        "stage 3: F0 B0 F1 B1\n");
  CHECK(pp::schedule_kind("1f1b") == pp::ScheduleKind::one_f_one_b);
  CHECK(pp::schedule_kind("gpipe") == pp::ScheduleKind::gpipe);
  CHECK(test::error_of([] { pp::schedule_kind("zigzag"); }).find("unknown pipeline schedule 'zigzag'") !=
        std::string::npos);
}

TEST_CASE("schedule: 1F1B holds at most S micro-batches' activations, GPipe all M", "[pipeline]") {
  for (int S = 1; S <= 6; ++S)
    for (int M = 1; M <= 12; ++M) {
      INFO("S " << S << ", M " << M);
      const auto g = pp::Schedule::gpipe(S, M), f = pp::Schedule::one_f_one_b(S, M);
      CHECK(g.peak_in_flight() == M);
      CHECK(f.peak_in_flight() <= S);
      for (int s = 0; s < S; ++s) {
        CHECK(g.peak_in_flight(s) == M);
        CHECK(f.peak_in_flight(s) == std::min(S - s, M));
      }
    }
}

TEST_CASE("schedule: balanced stages leave GPipe and 1F1B a bubble of (S - 1) / (M + S - 1)", "[pipeline]") {
  for (int S = 1; S <= 5; ++S)
    for (int M = 1; M <= 10; ++M)
      for (double b : {1.0, 2.0}) {  // backward as long as the forward, and twice as long
        INFO("S " << S << ", M " << M << ", backward/forward " << b);
        const std::vector<double> fwd(static_cast<std::size_t>(S), 1.0), bwd(static_cast<std::size_t>(S), b);
        const double want = pp::gpipe_bubble_fraction(S, M);
        const auto g = pp::Schedule::gpipe(S, M).simulate(fwd, bwd);
        CHECK(g.makespan == Approx((M + S - 1) * (1 + b)));
        CHECK(g.bubble_fraction() == Approx(want).margin(1e-12));
        CHECK(pp::Schedule::one_f_one_b(S, M).simulate(fwd, bwd).bubble_fraction() == Approx(want).margin(1e-12));
      }
}

TEST_CASE("schedule: a schedule of one's own is checked before it runs", "[pipeline]") {
  using pp::Action;
  const auto F = pp::Pass::forward, B = pp::Pass::backward;
  // Stage 1 waits for F1 while stage 0 first needs B0 back from stage 1.
  const std::string deadlock = test::error_of([&] {
    pp::Schedule("mine", 2, {{{F, 0}, {B, 0}, {F, 1}, {B, 1}}, {{F, 0}, {F, 1}, {B, 1}, {B, 0}}});
  });
  CHECK(deadlock == "schedule 'mine' deadlocks: stage 0 waits in B0 for stage 1's B0; stage 1 waits in F1 for stage "
                    "0's F1");
  CHECK(test::error_of([&] { pp::Schedule("mine", 1, {{{B, 0}, {F, 0}}}); }) ==
        "schedule 'mine': stage 0 runs B0 before F0");
  CHECK(test::error_of([&] { pp::Schedule("mine", 2, {{{F, 0}, {B, 0}, {F, 1}}}); }) ==
        "schedule 'mine': stage 0 never runs B1");
  CHECK(test::error_of([&] { pp::Schedule("mine", 1, {{{F, 0}, {F, 0}, {B, 0}}}); }) ==
        "schedule 'mine': stage 0 runs F0 twice");
  CHECK(test::error_of([&] { pp::Schedule("mine", 1, {{{F, 0}, {B, 2}}}); }).find("outside 0..0") != std::string::npos);
  CHECK(test::error_of([] { pp::Schedule::gpipe(0, 2); }) == "a pipeline schedule needs at least one stage, got 0");
  // A valid one of one's own: 1F1B by hand equals the built-in.
  const pp::Schedule mine("mine", 2, {{{F, 0}, {F, 1}, {B, 0}, {B, 1}}, {{F, 0}, {B, 0}, {F, 1}, {B, 1}}});
  CHECK(mine == pp::Schedule::one_f_one_b(2, 2));
}
