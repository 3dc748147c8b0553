#pragma once
/// @file
/// SGD with momentum (the TensorFlow / PyTorch formulation), with optional
/// decoupled weight decay.

#include <parallax/optim/optimizer.hpp>

namespace parallax::optim {

/// v <- mu * v + g;  w <- w - lr * v   (Nesterov: w <- w - lr * (g + mu * v)),
/// then w <- w - lr * weight_decay * w_before
struct Momentum {
  float lr = 0.01f;
  float momentum = 0.9f;
  bool nesterov = false;
  /// Decoupled weight decay (SGDW): applied to the weight, not through the
  /// velocity. Sparse variables decay lazily: only the rows a step touches.
  float weight_decay = 0.f;

  // Named setters (C++17 has no designated initializers): each returns a copy
  // with one field set, e.g. `Momentum{}.with_lr(1e-3f)`.
  Momentum with_lr(float v) const { Momentum o = *this; o.lr = v; return o; }
  Momentum with_momentum(float v) const { Momentum o = *this; o.momentum = v; return o; }
  Momentum with_nesterov(bool v) const { Momentum o = *this; o.nesterov = v; return o; }
  Momentum with_weight_decay(float v) const { Momentum o = *this; o.weight_decay = v; return o; }

  static constexpr const char* name = "momentum";
  static constexpr int slots = 1;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    T lr, mu, decay;
    bool nesterov;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& v, T& s1) const {
      if (decay != T(0)) update<true>(w, g, v, s1);
      else update<false>(w, g, v, s1);
    }
    /// The rule with the decay known (see optim::detail::Decayed).
    template <bool Decay>
    PARALLAX_HOST_DEVICE void update(T& w, T g, T& v, T&) const {
      const T w0 = w;
      v = mu * v + g;
      w -= nesterov ? lr * (g + mu * v) : lr * v;
      if constexpr (Decay) w -= decay * w0;
    }
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {static_cast<T>(lr), static_cast<T>(momentum), static_cast<T>(lr) * static_cast<T>(weight_decay), nesterov};
  }
};

}  // namespace parallax::optim
