#pragma once
/// @file
/// Placement help: splits a chain of layers into S contiguous stages whose
/// largest cost is as small as it can be (the pipeline runs at the pace of
/// its slowest stage), then predicts what the split gives: each stage's cost
/// and parameter bytes, and the bubble fraction of a schedule played with
/// those costs (Schedule::simulate). Costs come from the user: measured by
/// a short profiling run, or estimated (floating-point operations).

#include <parallax/context.hpp>
#include <parallax/error.hpp>
#include <parallax/pipeline/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace parallax::pipeline {

/// A split of layers 0..L-1 into stages, and what it is predicted to give.
struct Placement {
  /// Stage s holds layers [first_layer[s], first_layer[s + 1]); S + 1 entries.
  std::vector<std::size_t> first_layer;
  std::vector<double> stage_cost;          ///< per stage: the sum of its layers' costs
  std::vector<std::size_t> stage_bytes;    ///< per stage: the sum of its layers' parameter bytes
  double predicted_bubble = 0;             ///< of the schedule placement() was given
  std::string schedule;                    ///< its name

  int stages() const noexcept { return static_cast<int>(stage_cost.size()); }
  /// The stage that holds `layer`.
  int stage_of(std::size_t layer) const {
    for (int s = 0; s < stages(); ++s)
      if (layer < first_layer[static_cast<std::size_t>(s) + 1]) return s;
    throw error(detail::concat("Placement::stage_of: layer ", layer, " is past the last stage"));
  }
  double max_cost() const { return stage_cost.empty() ? 0 : *std::max_element(stage_cost.begin(), stage_cost.end()); }

  /// One line per stage (layers, cost, parameter bytes), then the
  /// predicted bubble fraction.
  std::string describe() const {
    std::ostringstream os;
    for (int s = 0; s < stages(); ++s) {
      const auto us = static_cast<std::size_t>(s);
      os << "stage " << s << ": layers " << first_layer[us] << ".." << first_layer[us + 1] - 1 << ", cost "
         << stage_cost[us] << ", parameters " << stage_bytes[us] << " bytes\n";
    }
    os << "predicted bubble fraction (" << schedule << "): " << predicted_bubble << "\n";
    return os.str();
  }
};

/// Splits layers with costs `layer_cost` (forward plus backward, per
/// micro-batch) and parameter bytes `layer_bytes` into `schedule.stages()`
/// contiguous stages of at least one layer each, minimising the largest
/// stage cost (among equally good splits, the one whose last stage starts
/// earliest, recursively), and plays `schedule` with the stages' costs, each pass split
/// into forward and backward as 1 : backward_ratio.
inline Placement place_layers(const std::vector<double>& layer_cost, const std::vector<std::size_t>& layer_bytes,
                              const Schedule& schedule, double backward_ratio = 2.0) {
  const std::size_t L = layer_cost.size();
  const auto S = static_cast<std::size_t>(schedule.stages());
  PARALLAX_EXPECTS(layer_bytes.size() == L, "place_layers: ", L, " layer costs but ", layer_bytes.size(),
                   " layer byte counts");
  PARALLAX_EXPECTS(L >= S, "place_layers: ", L, " layers cannot fill ", S, " stages (each needs a layer)");
  for (std::size_t i = 0; i < L; ++i)
    PARALLAX_EXPECTS(layer_cost[i] >= 0, "place_layers: layer ", i, " has a negative cost, ", layer_cost[i]);
  PARALLAX_EXPECTS(backward_ratio >= 0, "place_layers: backward_ratio must be >= 0, got ", backward_ratio);

  std::vector<double> prefix(L + 1, 0);
  for (std::size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + layer_cost[i];
  // best[k][i]: the smallest largest cost of layers 0..i-1 in k stages; cut[k][i] where the k-th stage starts.
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<std::size_t>> cut(S + 1, std::vector<std::size_t>(L + 1, 0));
  best[0][0] = 0;
  for (std::size_t k = 1; k <= S; ++k)
    for (std::size_t i = k; i <= L; ++i)
      for (std::size_t j = k - 1; j < i; ++j) {
        const double c = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (c < best[k][i]) {  // strict: the earliest start of the last stage wins ties
          best[k][i] = c;
          cut[k][i] = j;
        }
      }

  Placement p;
  p.first_layer.assign(S + 1, 0);
  p.first_layer[S] = L;
  for (std::size_t k = S, i = L; k > 0; --k) {
    i = cut[k][i];
    p.first_layer[k - 1] = i;
  }
  p.stage_cost.assign(S, 0);
  p.stage_bytes.assign(S, 0);
  for (std::size_t s = 0; s < S; ++s)
    for (std::size_t i = p.first_layer[s]; i < p.first_layer[s + 1]; ++i) {
      p.stage_cost[s] += layer_cost[i];
      p.stage_bytes[s] += layer_bytes[i];
    }
  std::vector<double> fwd(S), bwd(S);
  for (std::size_t s = 0; s < S; ++s) {
    fwd[s] = p.stage_cost[s] / (1 + backward_ratio);
    bwd[s] = p.stage_cost[s] - fwd[s];
  }
  p.predicted_bubble = schedule.simulate(fwd, bwd).bubble_fraction();
  p.schedule = schedule.name();
  return p;
}

/// A short profiling run: times `run_layer(i)` (one forward and backward
/// pass of layer i on a representative micro-batch) for every layer, once
/// to warm up and then `repeats` times, keeps each layer's median, and
/// averages the medians over the ranks of `world`, so that every rank gets
/// the same costs and place_layers() makes the same split everywhere.
/// Collective over world; returns seconds per layer.
template <class RunLayer>
std::vector<double> profile_layers(const Context& world, std::size_t layers, RunLayer&& run_layer, int repeats = 5) {
  PARALLAX_EXPECTS(repeats >= 1, "profile_layers: repeats must be at least 1, got ", repeats);
  std::vector<double> cost(layers, 0.0), times(static_cast<std::size_t>(repeats));
  for (std::size_t i = 0; i < layers; ++i) {
    run_layer(i);
    for (auto& t : times) {
      const auto t0 = std::chrono::steady_clock::now();
      run_layer(i);
      t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    std::nth_element(times.begin(), times.begin() + repeats / 2, times.end());
    cost[i] = times[static_cast<std::size_t>(repeats / 2)];
  }
  cost = world.sum(std::move(cost));
  for (double& c : cost) c /= world.size();
  return cost;
}

}  // namespace parallax::pipeline
