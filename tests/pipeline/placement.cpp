// pipeline/placement.hpp: the balanced split of layers into stages equals
// the best one found by trying every split, on small random cases, and
// predicts the schedule's bubble and each stage's memory.
#include "support.hpp"

#include <parallax/pipeline/placement.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <chrono>
#include <random>
#include <thread>
#include <string>
#include <vector>

namespace pp = px::pipeline;

namespace {

/// The smallest largest stage cost over every split of `cost` into S
/// non-empty contiguous stages.
double brute_force(const std::vector<double>& cost, int S) {
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t, int, double)> go = [&](std::size_t from, int left, double worst) {
    if (left == 1) {
      double c = 0;
      for (std::size_t i = from; i < cost.size(); ++i) c += cost[i];
      best = std::min(best, std::max(worst, c));
      return;
    }
    double c = 0;
    for (std::size_t end = from + 1; end + static_cast<std::size_t>(left - 1) <= cost.size(); ++end) {
      c += cost[end - 1];
      go(end, left - 1, std::max(worst, c));
    }
  };
  go(0, S, 0);
  return best;
}

}  // namespace

TEST_CASE("placement: the split minimises the largest stage cost, as trying every split does", "[pipeline]") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t L = 1 + rng() % 9;
    const int S = 1 + static_cast<int>(rng() % std::min<std::size_t>(L, 4));
    std::vector<double> cost(L);
    std::vector<std::size_t> bytes(L);
    for (std::size_t i = 0; i < L; ++i) {
      cost[i] = static_cast<double>(1 + rng() % 20);
      bytes[i] = 4 * (1 + rng() % 100);
    }
    INFO("trial " << trial << ": " << L << " layers, " << S << " stages");
    const pp::Placement p = pp::place_layers(cost, bytes, pp::Schedule::gpipe(S, 4));
    CHECK(p.max_cost() == brute_force(cost, S));
    REQUIRE(p.first_layer.size() == static_cast<std::size_t>(S) + 1);
    CHECK(p.first_layer.front() == 0);
    CHECK(p.first_layer.back() == L);
    std::size_t total_bytes = 0;
    for (int s = 0; s < S; ++s) {
      const auto us = static_cast<std::size_t>(s);
      CHECK(p.first_layer[us] < p.first_layer[us + 1]);  // no empty stage
      double c = 0;
      std::size_t b = 0;
      for (std::size_t i = p.first_layer[us]; i < p.first_layer[us + 1]; ++i) c += cost[i], b += bytes[i];
      CHECK(p.stage_cost[us] == c);
      CHECK(p.stage_bytes[us] == b);
      CHECK(p.stage_of(p.first_layer[us]) == s);
      total_bytes += b;
    }
    std::size_t all = 0;
    for (auto b : bytes) all += b;
    CHECK(total_bytes == all);
  }
}

TEST_CASE("placement: predicts the schedule's bubble and each stage's memory", "[pipeline]") {
  // Eight equal layers on four stages: two each, balanced, so GPipe's bubble
  // is (S - 1) / (M + S - 1).
  const std::vector<double> cost(8, 3.0);
  const std::vector<std::size_t> bytes = {10, 20, 30, 40, 50, 60, 70, 80};
  const pp::Placement p = pp::place_layers(cost, bytes, pp::Schedule::gpipe(4, 8));
  CHECK(p.first_layer == std::vector<std::size_t>{0, 2, 4, 6, 8});
  CHECK(p.stage_bytes == std::vector<std::size_t>{30, 70, 110, 150});
  CHECK(p.predicted_bubble == Approx(pp::gpipe_bubble_fraction(4, 8)));
  CHECK(p.describe() ==
        "stage 0: layers 0..1, cost 6, parameters 30 bytes\n"
        "stage 1: layers 2..3, cost 6, parameters 70 bytes\n"
        "stage 2: layers 4..5, cost 6, parameters 110 bytes\n"
        "stage 3: layers 6..7, cost 6, parameters 150 bytes\n"
        "predicted bubble fraction (gpipe): 0.272727\n");
  // An unbalanced chain: the heavy layer gets a stage of its own, and the
  // pipeline's bubble grows beyond the balanced formula.
  const pp::Placement q = pp::place_layers({1, 1, 6, 1, 1}, {1, 1, 1, 1, 1}, pp::Schedule::one_f_one_b(3, 4));
  CHECK(q.first_layer == std::vector<std::size_t>{0, 2, 3, 5});
  CHECK(q.predicted_bubble > pp::gpipe_bubble_fraction(3, 4));
  CHECK(test::error_of([] { pp::place_layers({1, 1}, {1, 1}, pp::Schedule::gpipe(3, 1)); }) ==
        "place_layers: 2 layers cannot fill 3 stages (each needs a layer)");
}

TEST_CASE("placement: a profiling run gives every rank the same measured costs", "[pipeline]") {
  // Layer i sleeps (i + 1) ms on rank 0 and 2 (i + 1) ms elsewhere: the
  // costs are the ranks' mean, the same bits everywhere.
  const auto& w = test::world();
  const auto cost = pp::profile_layers(w, 4, [&](std::size_t i) {
    const double ms = static_cast<double>(i + 1) * (w.rank() == 0 ? 1 : 2);
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
  }, 3);
  REQUIRE(cost.size() == 4);
  std::string bits(reinterpret_cast<const char*>(cost.data()), cost.size() * sizeof(double));
  CHECK(test::same_on_every_rank(bits));
  const double scale = w.size() == 1 ? 1.0 : (1.0 + 2.0 * (w.size() - 1)) / w.size();
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(cost[i] >= 1e-3 * static_cast<double>(i + 1) * scale);
    if (i) CHECK(cost[i] > cost[i - 1]);
  }
  // The measured costs place like any others.
  const pp::Placement p = pp::place_layers(cost, {1, 1, 1, 1}, pp::Schedule::gpipe(2, 4));
  CHECK(p.first_layer == std::vector<std::size_t>{0, 3, 4});
  CHECK(test::error_of([&] { pp::profile_layers(w, 1, [](std::size_t) {}, 0); }) ==
        "profile_layers: repeats must be at least 1, got 0");
}
