#pragma once
/// @file
/// The examples' building blocks, written once for every memory space: a
/// fully connected layer whose weights are parallax dense variables, and the
/// kernels of its forward and backward passes and of the losses, as
/// PARALLAX_HOST_DEVICE functors launched with px::for_each.
///
/// Matrices are row-major; a batch is `rows` rows. Kernels that sum over a
/// long axis loop over contiguous memory (one output row per call), so the
/// host build vectorises them; each output element is written by exactly one
/// call, so results do not depend on the thread count.

#include <parallax/parallax.hpp>

#include <cmath>
#include <cstddef>
#include <string>

namespace examples {

namespace px = parallax;

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

/// y[0..n) += a * x[0..n)
template <class T>
PARALLAX_HOST_DEVICE inline void axpy(T a, const T* x, T* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * x[i];
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

// ---------------------------------------------------------------- dense layer kernels

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

/// dy[j] *= act'(y[j]): turns the gradient of the output into that of the pre-activation.
template <class T>
struct ActivationBackward {
  const T* y;
  T* dy;
  Activation act;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { dy[j] *= activation_slope(act, y[j]); }
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

/// A fully connected layer y = act(x W + b) over dense variables `<name>_w`
/// (in x out, Glorot) and `<name>_b` (1 x out, zeros). Holds its output and
/// scratch buffers in Space between forward() and backward().
template <class Space, class T = float>
class DenseLayer {
 public:
  using Var = px::Variable<px::Dense, T, Space>;

  DenseLayer(const px::Context& ctx, const std::string& name, std::size_t in, std::size_t out, Activation act,
             std::uint64_t seed)
      : w(ctx, name + "_w", {in, out}, px::init::Glorot{seed}), b(ctx, name + "_b", {1, out}), in_(in), out_(out),
        act_(act) {}

  std::size_t in() const noexcept { return in_; }
  std::size_t out() const noexcept { return out_; }
  /// The output of the last forward(), rows x out.
  T* output() noexcept { return y_.data(); }
  /// The gradient of the output, rows x out: fill it, then call backward().
  T* output_grad() noexcept { return dy_.data(); }

  /// Computes act(x W + b) for `rows` rows of x (in Space); returns output().
  T* forward(const px::Exec<Space>& ex, const T* x, std::size_t rows) {
    y_.resize_discard(rows * out_);
    dy_.resize_discard(rows * out_);
    if (rows)
      px::for_each(ex, rows, DenseForward<T>{x, w.value().data(), b.value().data(), y_.data(), in_, out_, act_},
                   px::Cost{in_ * out_});
    return y_.data();
  }

  /// From output_grad(): writes the gradients of W and b (w.grad(), b.grad())
  /// and, if dx is not null, the gradient of the input x (rows x in).
  void backward(const px::Exec<Space>& ex, const T* x, std::size_t rows, T* dx) {
    if (act_ != Activation::none && rows)
      px::for_each(ex, rows * out_, ActivationBackward<T>{y_.data(), dy_.data(), act_});
    px::for_each(ex, in_ + 1, DenseBackwardWeight<T>{x, dy_.data(), w.grad().data(), b.grad().data(), rows, in_, out_},
                 px::Cost{rows * out_});
    if (dx && rows)
      px::for_each(ex, rows * in_, DenseBackwardInput<T>{dy_.data(), w.value().data(), dx, in_, out_}, px::Cost{out_});
  }

  Var w, b;

 private:
  std::size_t in_, out_;
  Activation act_;
  px::Buffer<T, Space> y_, dy_;
};

// ---------------------------------------------------------------- losses

/// Softmax cross-entropy per row of `classes` logits, in place: the logits
/// become the gradient of (loss / scale_rows), and loss[r] the row's loss.
/// Also writes correct[r] = 1 if the largest logit is the label's.
template <class T>
struct SoftmaxCrossEntropy {
  T* logits;
  const std::int32_t* labels;
  T* loss;
  T* correct;
  std::size_t classes;
  T inv_rows;  // 1 / rows of the local batch: the loss is a mean
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const {
    T* z = logits + r * classes;
    T top = z[0];
    std::size_t arg = 0;
    for (std::size_t c = 1; c < classes; ++c)
      if (z[c] > top) top = z[c], arg = c;
    const auto label = static_cast<std::size_t>(labels[r]);
    const T true_logit = z[label];
    T sum = T(0);
    for (std::size_t c = 0; c < classes; ++c) {  // one exp per logit, kept for the gradient
      z[c] = std::exp(z[c] - top);
      sum += z[c];
    }
    loss[r] = std::log(sum) - (true_logit - top);
    correct[r] = arg == label ? T(1) : T(0);
    for (std::size_t c = 0; c < classes; ++c) z[c] = (z[c] / sum - (c == label ? T(1) : T(0))) * inv_rows;
  }
};

/// Logistic loss of one logit per row: dz[r] = the gradient of (loss / rows),
/// loss[r] the row's loss, correct[r] whether the sign of z[r] matches the label.
template <class T>
struct LogisticLoss {
  const T* z;
  T* dz;
  const std::int32_t* labels;
  T* loss;
  T* correct;
  T inv_rows;
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const {
    const T v = z[r];
    const T y = labels[r] ? T(1) : T(0);
    // log(1 + exp(-|v|)) + max(v, 0) - v y, stable for large |v|
    loss[r] = std::log1p(std::exp(-std::fabs(v))) + (v > T(0) ? v : T(0)) - v * y;
    correct[r] = (v > T(0)) == (y > T(0)) ? T(1) : T(0);
    dz[r] = (T(1) / (T(1) + std::exp(-v)) - y) * inv_rows;
  }
};

/// The sum of n values in Space, on the host (n is a batch: small).
template <class T, class Space>
double sum_to_host(const px::Buffer<T, Space>& b, std::size_t n) {
  const std::vector<T> h = b.to_host();
  double s = 0;
  for (std::size_t i = 0; i < n && i < h.size(); ++i) s += static_cast<double>(h[i]);
  return s;
}

}  // namespace examples
