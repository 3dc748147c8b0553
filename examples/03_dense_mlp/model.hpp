#pragma once
/// @file
/// The classifier of example 03, shared with bench/end_to_end.cpp: an MLP
/// with dense variables only (inputs -> hidden -> hidden -> classes, ReLU,
/// softmax cross-entropy). Every architecture all-reduces or shards its
/// gradients whole; under the hybrid it is exactly data-parallel all-reduce,
/// the case where the hybrid must cost nothing. Templated on the memory space;
/// the products are gemm() calls (common/layers.hpp).

#include "../common/layers.hpp"
#include "../common/profile.hpp"

#include <parallax/parallax.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace examples::dense_mlp {

namespace px = parallax;

/// Sizes of the model.
struct Config {
  std::size_t inputs = 32;
  std::size_t hidden = 256;
  std::size_t classes = 10;
  std::uint64_t seed = 1;
};

/// One rank's share of a step.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> x;               ///< rows x inputs
  std::vector<std::int32_t> labels;   ///< rows
};

template <class Space>
class Model {
 public:
  using T = float;
  using Var = typename DenseLayer<Space, T>::Var;

  Model(const px::Context& ctx, const Config& cfg)
      : layer1(ctx, "layer1", cfg.inputs, cfg.hidden, Activation::relu, cfg.seed),
        layer2(ctx, "layer2", cfg.hidden, cfg.hidden, Activation::relu, cfg.seed),
        layer3(ctx, "layer3", cfg.hidden, cfg.classes, Activation::none, cfg.seed),
        variables_{layer1.w, layer1.b, layer2.w, layer2.b, layer3.w, layer3.b},
        cfg_(cfg) {}

  const Config& config() const noexcept { return cfg_; }
  /// Every variable, first layer first, for the trainer: a collection of
  /// handles to the layers' variables.
  px::Variables<Var>& variables() noexcept { return variables_; }

  /// Forward pass: losses into loss_, hits into hits_, the gradient of the
  /// mean loss w.r.t. the logits into layer3's output gradient.
  template <class Trainer>
  void forward(Trainer& trainer, const Batch& batch) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows, classes = cfg_.classes;
    x_.assign_from_host(batch.x.data(), batch.x.size());
    labels_.assign_from_host(batch.labels.data(), rows);
    const T* z = layer3.forward(ex, layer2.forward(ex, layer1.forward(ex, x_.data(), rows), rows), rows);
    loss_.resize_discard(rows);
    hits_.resize_discard(rows);
    ex.copy(layer3.output_grad(), z, rows * classes * sizeof(T));
    if (rows)
      px::for_each(ex, rows,
                   SoftmaxCrossEntropy<T>{layer3.output_grad(), labels_.data(), loss_.data(), hits_.data(), classes,
                                          T(1) / static_cast<T>(rows)},
                   px::Cost{classes});
    ex.synchronize();
  }

  /// One training step; returns this rank's mean loss. Collective. With
  /// `overlap`, the backward pass marks each layer's gradient ready as soon
  /// as it has written it (Trainer::ready), so the trainer all-reduces it
  /// while the layers below compute.
  template <class Trainer>
  double train_step(Trainer& trainer, const Batch& batch, bool overlap = false) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows;
    forward(trainer, batch);
    layer3.backward(ex, layer2.output(), rows, layer2.output_grad());
    ready(trainer, overlap, layer3.w, layer3.b);
    layer2.backward(ex, layer1.output(), rows, layer1.output_grad());
    ready(trainer, overlap, layer2.w, layer2.b);
    layer1.backward(ex, x_.data(), rows, nullptr);
    ready(trainer, overlap, layer1.w, layer1.b);
    ex.synchronize();
    timed(ex, Part::parallax, [&] { trainer.step(); });
    return rows ? sum_to_host(loss_, rows) / static_cast<double>(rows) : 0.0;
  }

  /// Sums of loss and of correct predictions over a batch (forward only).
  template <class Trainer>
  std::pair<double, double> evaluate(Trainer& trainer, const Batch& batch) {
    forward(trainer, batch);
    return {sum_to_host(loss_, batch.rows), sum_to_host(hits_, batch.rows)};
  }

  DenseLayer<Space, T> layer1, layer2, layer3;

 private:
  px::Variables<Var> variables_;  // handles: the layers' own variables
  Config cfg_;
  px::Buffer<T, Space> x_, loss_, hits_;
  px::Buffer<std::int32_t, Space> labels_;
};

}  // namespace examples::dense_mlp
