#pragma once
/// @file
/// Clipping by the global norm (TrainerOptions::clip_norm, PyTorch's
/// clip_grad_norm_): the L2 norm of a step's whole gradient, every variable
/// summed over the ranks, and the factor that brings it within the bound.

#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <cmath>
#include <cstddef>

namespace parallax::trainer {

/// The global L2 norm of the step's gradient as applied: each
/// synchronizer's square sum of what this rank applies (after
/// finish_exchange), added over the ranks with one 8-byte all-reduce, times
/// `scale` (the step's). Collective; the same on every rank.
template <class Registry, class Engine>
double global_norm(Registry& registry, Engine& engine, double scale) {
  double sum = 0;
  for (std::size_t i = 0; i < registry.size(); ++i) {
    const auto part = registry.synchronizer(i).gradient_square_sum();
    if (!part) throw error(detail::concat("clipping by the global norm: policy ", registry.policy_name(i),
                                  " cannot report its gradients' norm"));
    sum += *part;
  }
  {
    auto scope = engine.stats().scope("", "control");
    engine.allreduce(&sum, &sum, 1, DataType::f64, ReduceOp::sum);
  }
  return std::sqrt(sum) * scale;
}

/// The factor that scales a gradient of norm `norm` to at most `clip_norm`.
inline double clip_factor(double norm, double clip_norm) { return norm > clip_norm ? clip_norm / norm : 1.0; }

}  // namespace parallax::trainer
