#pragma once
/// @file
/// Adagrad (Duchi et al.), with TensorFlow's initial accumulator.

#include <parallax/optim/optimizer.hpp>

#include <cmath>

namespace parallax::optim {

/// a <- a + g^2;  w <- w - lr * g / (sqrt(a) + eps)
struct Adagrad {
  float lr = 0.01f;
  float initial_accumulator = 0.1f;
  float eps = 1e-7f;

  // Named setters (C++17 has no designated initializers): each returns a copy
  // with one field set, e.g. `Adagrad{}.with_lr(1e-3f)`.
  Adagrad with_lr(float v) const { Adagrad o = *this; o.lr = v; return o; }
  Adagrad with_initial_accumulator(float v) const { Adagrad o = *this; o.initial_accumulator = v; return o; }
  Adagrad with_eps(float v) const { Adagrad o = *this; o.eps = v; return o; }

  static constexpr const char* name = "adagrad";
  static constexpr int slots = 1;
  template <class T>
  T slot_initial(int) const {
    return static_cast<T>(initial_accumulator);
  }
  template <class T>
  struct Rule {
    T lr, eps;
    PARALLAX_HOST_DEVICE void operator()(T& w, T g, T& a, T&) const {
      a += g * g;
      w -= lr * g / (std::sqrt(a) + eps);
    }
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {static_cast<T>(lr), static_cast<T>(eps)};
  }
};

}  // namespace parallax::optim
