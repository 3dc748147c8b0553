#pragma once
/// @file
/// parallax::nn (optional, needs a CBLAS; target parallax::nn): a fully
/// connected layer y = act(x W + b) whose weights are parallax dense
/// variables, with its forward and backward passes, written once for every
/// memory space:
///
///     px::nn::DenseLayer<px::HostSpace> hidden(ctx, "hidden", in, 64, px::nn::Activation::relu, seed);
///     const float* h = hidden.forward(ex, x, rows);
///     ...                                    // fill hidden.output_grad()
///     hidden.backward(ex, x, rows, dx);      // writes hidden.w.grad(), hidden.b.grad(), dx
///
/// The products are nn::gemm calls (a BLAS; gemm.hpp), the bias, the
/// activation and the bias's gradient PARALLAX_HOST_DEVICE functors run by
/// px::for_each. Matrices are row-major; a batch is `rows` rows. Each output
/// element of a functor is written by exactly one call, so the functors'
/// results do not depend on the thread count (gemm.hpp says what the
/// products promise).

#include <parallax/context.hpp>
#include <parallax/init.hpp>
#include <parallax/nn/gemm.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace parallax::nn {

/// a . b over n elements, with four partial sums (more parallelism than one).
template <class T>
PARALLAX_HOST_DEVICE inline T dot(const T* a, const T* b, std::size_t n) {
  T s0 = T(0), s1 = T(0), s2 = T(0), s3 = T(0);
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

enum class Activation : int { none, relu, tanh };

template <class T>
PARALLAX_HOST_DEVICE inline T activate(Activation a, T v) {
  switch (a) {
    case Activation::relu: return v > T(0) ? v : T(0);
    case Activation::tanh: return std::tanh(v);
    case Activation::none: break;
  }
  return v;
}
/// d activation / d input, from the activation's output y.
template <class T>
PARALLAX_HOST_DEVICE inline T activation_slope(Activation a, T y) {
  switch (a) {
    case Activation::relu: return y > T(0) ? T(1) : T(0);
    case Activation::tanh: return T(1) - y * y;
    case Activation::none: break;
  }
  return T(1);
}

/// y[r, c] = act(y[r, c] + b[c]): the bias and activation after the
/// product. A row kernel (px::for_each_rows).
template <class T>
struct BiasActivation {
  T* y;
  const T* b;
  std::size_t out;
  Activation act;
  PARALLAX_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const {
    y[r * out + c] = activate(act, y[r * out + c] + b[c]);
  }
};

/// dy[j] *= act'(y[j]): turns the gradient of the output into that of the pre-activation.
template <class T>
struct ActivationBackward {
  const T* y;
  T* dy;
  Activation act;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { dy[j] *= activation_slope(act, y[j]); }
};

/// sums[c] = sum_r m[r, c] over the rows in order, for a rows x cols matrix:
/// call e sums columns [e Tile, (e + 1) Tile). The host takes tiles of 16
/// (a row's part is one or two cache lines, the sums stay in registers), a
/// GPU one column a thread; the same additions in the same order either way.
template <class T, std::size_t Tile>
struct ColumnSums {
  const T* m;
  T* sums;
  std::size_t rows, cols;
  static constexpr std::size_t tile = Tile;
  static std::size_t calls(std::size_t cols) { return (cols + Tile - 1) / Tile; }
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t c0 = e * Tile, n = cols - c0 < Tile ? cols - c0 : Tile;
    T acc[Tile] = {};
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t i = 0; i < n; ++i) acc[i] += m[r * cols + c0 + i];
    for (std::size_t i = 0; i < n; ++i) sums[c0 + i] = acc[i];
  }
};

/// A fully connected layer y = act(x W + b) over dense variables `<name>_w`
/// (in x out, Glorot) and `<name>_b` (1 x out, zeros). Holds its output and
/// its output's gradient in Space between forward() and backward(). Its
/// products are MatMul calls (nn::Gemm: gemm.hpp; a program may pass a type
/// of its own that times or replaces them); the bias, the activation and the
/// bias's gradient are functors.
template <class Space, class T = float, class MatMul = Gemm>
class DenseLayer {
  static_assert(std::is_same_v<T, float>, "nn::gemm is single precision");
  /// The bias gradient's column sums: tiles on the host, columns on a GPU.
  using BiasGrad = ColumnSums<T, std::is_same_v<Space, HostSpace> ? 16 : 1>;

 public:
  using Var = Variable<parallax::Dense, T, Space>;

  DenseLayer(const Context& ctx, const std::string& name, std::size_t in, std::size_t out, Activation act,
        std::uint64_t seed, MatMul matmul = {})
      : w(ctx, name + "_w", {in, out}, init::Glorot{seed}), b(ctx, name + "_b", {1, out}), in_(in), out_(out),
        act_(act), matmul_(matmul) {}

  std::size_t in() const noexcept { return in_; }
  std::size_t out() const noexcept { return out_; }
  /// The output of the last forward(), rows x out.
  T* output() noexcept { return y_.data(); }
  /// The gradient of the output, rows x out: fill it, then call backward().
  T* output_grad() noexcept { return dy_.data(); }

  /// Computes act(x W + b) for `rows` rows of x (in Space); returns output().
  T* forward(const Exec<Space>& ex, const T* x, std::size_t rows) {
    y_.resize_discard(rows * out_);
    dy_.resize_discard(rows * out_);
    if (rows) {
      matmul_(ex, Op::none, Op::none, rows, out_, in_, 1.0f, x, in_, w.value().data(), out_, 0.0f, y_.data(), out_);
      for_each_rows(ex, rows, out_, BiasActivation<T>{y_.data(), b.value().data(), out_, act_});
    }
    return y_.data();
  }

  /// From output_grad(): writes the gradients of W and b (w.grad(), b.grad())
  /// and, if dx is not null, the gradient of the input x (rows x in). x is
  /// the input forward() was given.
  void backward(const Exec<Space>& ex, const T* x, std::size_t rows, T* dx) {
    if (act_ != Activation::none && rows) for_each(ex, rows * out_, ActivationBackward<T>{y_.data(), dy_.data(), act_});
    // dW = x^T dy (zero for no rows); db = the column sums of dy; dx = dy W^T.
    matmul_(ex, Op::transpose, Op::none, in_, out_, rows, 1.0f, x, in_, dy_.data(), out_, 0.0f, w.grad().data(), out_);
    for_each(ex, BiasGrad::calls(out_), BiasGrad{dy_.data(), b.grad().data(), rows, out_}, Cost{rows * BiasGrad::tile});
    if (dx && rows)
      matmul_(ex, Op::none, Op::transpose, rows, in_, out_, 1.0f, dy_.data(), out_, w.value().data(), out_, 0.0f, dx,
              in_);
  }

  Var w, b;

 private:
  std::size_t in_, out_;
  Activation act_;
  MatMul matmul_;
  Buffer<T, Space> y_, dy_;
};

}  // namespace parallax::nn
