#pragma once
/// @file
/// The dense layer's kernels as hand-written functors (a row of the product
/// per call), as the examples ran them before their matrix products went to
/// a BLAS: the reference DenseLayer is tested against (tests/layers.cpp)
/// and a baseline of bench/dense_math.cpp.

#include "common/layers.hpp"

#include <parallax/parallax.hpp>

#include <cstddef>

namespace examples::reference {

/// y[0..n) += a * x[0..n)
template <class T>
PARALLAX_HOST_DEVICE inline void axpy(T a, const T* x, T* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/// y[r, :] = act(x[r, :] W + b), one row r per call.
template <class T>
struct DenseForward {
  const T* x;
  const T* w;  // in x out
  const T* b;  // out
  T* y;
  std::size_t in, out;
  Activation act;
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const {
    T* yr = y + r * out;
    for (std::size_t o = 0; o < out; ++o) yr[o] = b[o];
    for (std::size_t i = 0; i < in; ++i) axpy(x[r * in + i], w + i * out, yr, out);
    for (std::size_t o = 0; o < out; ++o) yr[o] = activate(act, yr[o]);
  }
};

/// dx[r, i] = dy[r, :] . W[i, :]
template <class T>
struct DenseBackwardInput {
  const T* dy;
  const T* w;
  T* dx;
  std::size_t in, out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t r = e / in, i = e % in;
    dx[e] = dot(dy + r * out, w + i * out, out);
  }
};

/// dW[i, :] = sum_r x[r, i] dy[r, :], one row i per call; row `in` (if
/// `db` is given) is the bias: db = sum_r dy[r, :].
template <class T>
struct DenseBackwardWeight {
  const T* x;
  const T* dy;
  T* dw;
  T* db;
  std::size_t rows, in, out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const {
    T* target = i < in ? dw + i * out : db;
    for (std::size_t o = 0; o < out; ++o) target[o] = T(0);
    for (std::size_t r = 0; r < rows; ++r) axpy(i < in ? x[r * in + i] : T(1), dy + r * out, target, out);
  }
};

}  // namespace examples::reference
