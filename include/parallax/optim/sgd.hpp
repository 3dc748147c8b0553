#pragma once
/// @file
/// Stochastic gradient descent, with optional decoupled weight decay.

#include <parallax/optim/optimizer.hpp>

namespace parallax::optim {

/// w <- w - lr * g - lr * weight_decay * w
struct Sgd {
  float lr = 0.01f;
  /// Decoupled weight decay (Loshchilov & Hutter's SGDW): the weight shrinks
  /// by lr * weight_decay of itself each update, apart from the gradient.
  /// Sparse variables decay lazily: only the rows a step touches.
  float weight_decay = 0.f;

  // Named setters (C++17 has no designated initializers): each returns a copy
  // with one field set, e.g. `Sgd{}.with_lr(1e-3f)`.
  Sgd with_lr(float v) const { Sgd o = *this; o.lr = v; return o; }
  Sgd with_weight_decay(float v) const { Sgd o = *this; o.weight_decay = v; return o; }

  static constexpr const char* name = "sgd";
  static constexpr int slots = 0;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    T lr, decay;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& s0, T& s1) const {
      if (decay != T(0)) update<true>(w, g, s0, s1);
      else update<false>(w, g, s0, s1);
    }
    /// The rule with the decay known (see optim::detail::Decayed): no branch
    /// inside, so the host's loop over a row vectorises; the same bits.
    template <bool Decay>
    PARALLAX_HOST_DEVICE void update(T& w, T g, T&, T&) const {
      const T w0 = w;
      w -= lr * g;
      if constexpr (Decay) w -= decay * w0;
    }
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {static_cast<T>(lr), static_cast<T>(lr) * static_cast<T>(weight_decay)};
  }
};

}  // namespace parallax::optim
