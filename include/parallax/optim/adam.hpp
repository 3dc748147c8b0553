#pragma once
/// @file
/// Adam (Kingma & Ba), and AdamW (Loshchilov & Hutter) with a weight decay.
/// For sparse variables the update is lazy, as TensorFlow's LazyAdam: only
/// touched rows move, and their moments (and, with weight decay, their
/// weights) decay only when touched; the bias correction uses the global
/// step.

#include <parallax/optim/optimizer.hpp>

#include <cmath>

namespace parallax::optim {

/// m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
/// w <- w - lr * sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps) - lr * weight_decay * w_before
struct Adam {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  /// Decoupled weight decay: with it, this is AdamW (PyTorch's AdamW scales
  /// the decay by the learning rate the same way).
  float weight_decay = 0.f;

  // Named setters (C++17 has no designated initializers): each returns a copy
  // with one field set, e.g. `Adam{}.with_lr(1e-3f)`.
  Adam with_lr(float v) const { Adam o = *this; o.lr = v; return o; }
  Adam with_beta1(float v) const { Adam o = *this; o.beta1 = v; return o; }
  Adam with_beta2(float v) const { Adam o = *this; o.beta2 = v; return o; }
  Adam with_eps(float v) const { Adam o = *this; o.eps = v; return o; }
  Adam with_weight_decay(float v) const { Adam o = *this; o.weight_decay = v; return o; }

  static constexpr const char* name = "adam";
  static constexpr int slots = 2;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    T step_size, b1, b2, eps, decay;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& m, T& v) const {
      if (decay != T(0)) update<true>(w, g, m, v);
      else update<false>(w, g, m, v);
    }
    /// The rule with the decay known (see optim::detail::Decayed): no branch
    /// inside, so the host's loop over a row vectorises; the same bits.
    template <bool Decay>
    PARALLAX_HOST_DEVICE void update(T& w, T g, T& m, T& v) const {
      const T w0 = w;
      m = b1 * m + (T(1) - b1) * g;
      v = b2 * v + (T(1) - b2) * g * g;
      w -= step_size * m / (std::sqrt(v) + eps);
      if constexpr (Decay) w -= decay * w0;
    }
  };
  template <class T>
  Rule<T> rule(std::uint64_t step) const {
    const double t = static_cast<double>(step);
    const double correction = std::sqrt(1.0 - std::pow(double(beta2), t)) / (1.0 - std::pow(double(beta1), t));
    return {static_cast<T>(lr * correction), static_cast<T>(beta1), static_cast<T>(beta2), static_cast<T>(eps),
            static_cast<T>(lr) * static_cast<T>(weight_decay)};
  }
};

/// AdamW: Adam with its decoupled weight decay, for the hyper-parameters by
/// name (`AdamW{}.with_weight_decay(0.01f)`, or C++20's
/// `AdamW{.lr = 1e-3f, .weight_decay = 0.01f}`). The same type as Adam,
/// so checkpoints of either restore into the other.
using AdamW = Adam;

}  // namespace parallax::optim
