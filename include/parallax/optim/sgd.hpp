#pragma once
/// @file
/// Plain stochastic gradient descent.

#include <parallax/optim/optimizer.hpp>

namespace parallax::optim {

/// w <- w - lr * g
struct Sgd {
  float lr = 0.01f;

  static constexpr const char* name = "sgd";
  static constexpr int slots = 0;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    T lr;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T&, T&) const { w -= lr * g; }
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {static_cast<T>(lr)};
  }
};

}  // namespace parallax::optim
