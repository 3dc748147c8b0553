#pragma once
/// @file
/// The examples' building blocks, written once for every memory space: the
/// fully connected layer of parallax::nn (<parallax/nn/dense.hpp>: forward
/// and backward, weights as parallax dense variables) with its products timed
/// as Part::gemm (gemm.hpp), and the losses, as PARALLAX_HOST_DEVICE functors
/// launched with px::for_each.
///
/// Matrices are row-major; a batch is `rows` rows. Each output element of a
/// functor is written by exactly one call, so the functors' results do not
/// depend on the thread count.

#include "gemm.hpp"

#include <parallax/nn/dense.hpp>
#include <parallax/parallax.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace examples {

namespace px = parallax;

using px::nn::Activation;
using px::nn::ActivationBackward;
using px::nn::activate;
using px::nn::activation_slope;
using px::nn::BiasActivation;
using px::nn::ColumnSums;
using px::nn::dot;

/// nn::DenseLayer with its products charged to Part::gemm.
template <class Space, class T = float>
using DenseLayer = px::nn::DenseLayer<Space, T, TimedGemm>;

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
