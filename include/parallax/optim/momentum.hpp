#pragma once
/// @file
/// SGD with momentum (the TensorFlow / PyTorch formulation).

#include <parallax/optim/optimizer.hpp>

namespace parallax::optim {

/// v <- mu * v + g;  w <- w - lr * v   (Nesterov: w <- w - lr * (g + mu * v))
struct Momentum {
  float lr = 0.01f;
  float momentum = 0.9f;
  bool nesterov = false;

  static constexpr const char* name = "momentum";
  static constexpr int slots = 1;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    T lr, mu;
    bool nesterov;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& v, T&) const {
      v = mu * v + g;
      w -= nesterov ? lr * (g + mu * v) : lr * v;
    }
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {static_cast<T>(lr), static_cast<T>(momentum), nesterov};
  }
};

}  // namespace parallax::optim
