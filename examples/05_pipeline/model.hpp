#pragma once
/// @file
/// The model of example 05: a deep residual MLP (an input layer, `blocks`
/// residual blocks h + relu(h W + b), a softmax head), cut into pipeline
/// stages. A StageModel holds the layers [first, last) of one stage, and only
/// their variables, and gives the pipeline its forward and backward passes
/// (px::pipeline::Stage). Gradients accumulate over the step's
/// micro-batches (products with beta = 1) until the trainer's step() applies
/// and clears them. The variables and the arithmetic live in Space (host,
/// or a GPU in the CUDA twin): products are examples::gemm calls, the rest
/// px::for_each functors. Activations, errors and what a backward needs
/// (`saved`) stay in Space too: on a GPU the pipeline moves them between
/// stages over a device engine (engine::MpiStaged or engine::Nccl).

#include "../common/gemm.hpp"
#include "../common/layers.hpp"

#include <parallax/parallax.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples::pipeline_mlp {

namespace px = parallax;
namespace pp = px::pipeline;

/// Sizes of the model.
struct Config {
  std::size_t inputs = 32;
  std::size_t width = 64;
  std::size_t blocks = 32;
  std::size_t classes = 10;
  std::uint64_t seed = 1;

  /// Layers in the chain: the input layer, the blocks, the head.
  std::size_t layers() const noexcept { return blocks + 2; }
  std::size_t in(std::size_t l) const noexcept { return l == 0 ? inputs : width; }
  std::size_t out(std::size_t l) const noexcept { return l + 1 == layers() ? classes : width; }
  std::size_t parameters(std::size_t l) const noexcept { return (in(l) + 1) * out(l); }
  std::size_t parameters() const noexcept {
    std::size_t n = 0;
    for (std::size_t l = 0; l < layers(); ++l) n += parameters(l);
    return n;
  }
};

/// The replica's examples of one step.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> x;              ///< rows x inputs
  std::vector<std::int32_t> labels;  ///< rows
};

namespace detail {
/// z = act(z + b) row by row (`cols` per row); relu unless `linear`.
struct BiasActivation {
  float* z;
  const float* b;
  std::size_t cols;
  bool linear;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = z[i] + b[i % cols];
    z[i] = linear || v > 0.f ? v : 0.f;
  }
};
/// y = x + r (a block's skip connection).
struct Add {
  float* y;
  const float* x;
  const float* r;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { y[i] = x[i] + r[i]; }
};
/// dz = dy where the relu's output s is positive, else 0.
struct ReluGrad {
  float* dz;
  const float* dy;
  const float* s;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { dz[i] = s[i] > 0.f ? dy[i] : 0.f; }
};
}  // namespace detail

/// One stage: layers [first, last) of the chain, in Space.
template <class Space>
class StageModel {
 public:
  using Var = px::Variable<px::Dense, float, Space>;
  using Buf = px::Buffer<float, Space>;

  StageModel(const px::Context& ctx, const Config& cfg, std::size_t first, std::size_t last)
      : cfg_(cfg), first_(first), last_(last) {
    for (std::size_t l = first; l < last; ++l) {
      const std::string name = "layer" + std::to_string(l);
      px::Init w_init = px::init::Glorot{cfg.seed + l};
      // A block's branch starts small, so that 32 of them add up to a
      // signal of the input's scale rather than growing block by block.
      if (kind(l) == Kind::block)
        w_init = px::init::Normal{0.f, 0.05f / std::sqrt(static_cast<float>(cfg.width)), cfg.seed + l};
      vars_.emplace_back(ctx, name + "_w", px::Shape{cfg.in(l), cfg.out(l)}, w_init);
      vars_.emplace_back(ctx, name + "_b", px::Shape{1, cfg.out(l)});
    }
  }

  /// The stage's variables, for its trainer.
  std::vector<Var>& variables() noexcept { return vars_; }
  std::size_t parameters() const {
    std::size_t n = 0;
    for (const Var& v : vars_) n += v.shape().elements();
    return n;
  }
  /// Where the stage's kernels run: the trainer's (its stream on a GPU).
  void set_exec(const px::Exec<Space>& ex) { ex_ = ex; }

  /// The replica's batch of the coming run (read by the first stage, for
  /// the inputs, and the last, for the labels).
  void set_batch(const Batch& b) {
    batch_ = &b;
    hits_ = 0;
  }
  /// Correct predictions of the last run (last stage).
  double hits() const noexcept { return hits_; }

  using Saved = typename pp::Stage<float, Space>::Saved;

  pp::Stage<float, Space> stage() {
    pp::Stage<float, Space> st;
    st.name = "layers " + std::to_string(first_) + ".." + std::to_string(last_ - 1);
    st.in_width = first_ == 0 ? 0 : cfg_.in(first_);
    st.out_width = last_ == cfg_.layers() ? 0 : cfg_.out(last_ - 1);
    st.parameters = parameters();
    st.forward = [this](const pp::MicroBatch& mb, const float* in, float* out, Saved& saved) {
      return forward(mb, in, out, saved);
    };
    st.backward = [this](const pp::MicroBatch& mb, const float* in, const float* out_grad, float* in_grad,
                         Saved& saved) { backward(mb, in, out_grad, in_grad, saved); };
    return st;
  }

 private:
  enum class Kind { input, block, head };
  Kind kind(std::size_t l) const { return l == 0 ? Kind::input : l + 1 == cfg_.layers() ? Kind::head : Kind::block; }

  // saved holds, per layer of the stage, in order: the input layer's output
  // y; a block's branch r = relu(x W + b), then its output y = x + r; the
  // head's gradient of the loss with respect to its logits.
  std::size_t saved_size(std::size_t l, std::size_t rows) const {
    return (kind(l) == Kind::block ? 2 : 1) * rows * cfg_.out(l);
  }

  /// The stage's input in Space: the previous stage's activations (already
  /// there), or the batch's features on the first stage.
  const float* input(const pp::MicroBatch& mb, const float* in) {
    if (in) return in;
    x_.assign_from_host(batch_->x.data() + mb.first * cfg_.inputs, mb.rows * cfg_.inputs);
    return x_.data();
  }

  double forward(const pp::MicroBatch& mb, const float* in, float* out, Saved& saved) {
    const std::size_t rows = mb.rows;
    std::size_t total = 0;
    for (std::size_t l = first_; l < last_; ++l) total += saved_size(l, rows);
    scratch_.resize_discard(total);
    const float* x = input(mb, in);
    float* at = scratch_.data();
    double loss = 0;
    for (std::size_t l = first_; l < last_; ++l) {
      const std::size_t i_w = cfg_.in(l), o_w = cfg_.out(l), n = rows * o_w;
      const float* W = vars_[2 * (l - first_)].value().data();
      const float* b = vars_[2 * (l - first_) + 1].value().data();
      float* z = at;  // the layer's pre-activation, then its saved values
      gemm(ex_, Op::none, Op::none, rows, o_w, i_w, 1.0f, x, i_w, W, o_w, 0.0f, z, o_w);
      if (n) px::for_each(ex_, n, detail::BiasActivation{z, b, o_w, kind(l) == Kind::head});
      if (kind(l) == Kind::block) {
        float* y = z + n;
        if (n) px::for_each(ex_, n, detail::Add{y, x, z});
        x = y;
        at = y + n;
      } else if (kind(l) == Kind::input) {
        x = z;
        at = z + n;
      } else {  // the head: logits -> gradient of the replica's mean loss
        labels_.assign_from_host(batch_->labels.data() + mb.first, rows);
        row_loss_.resize_discard(rows);
        correct_.resize_discard(rows);
        if (rows)
          px::for_each(ex_, rows,
                       SoftmaxCrossEntropy<float>{z, labels_.data(), row_loss_.data(), correct_.data(), o_w,
                                                  1.0f / static_cast<float>(mb.batch_rows)},
                       px::Cost{o_w});
        ex_.synchronize();
        loss = sum_to_host(row_loss_, rows);
        hits_ += sum_to_host(correct_, rows);
        at = z + n;
      }
    }
    // The output is the last layer's y, the end of what is saved (not on the
    // last stage).
    const std::size_t out_n = out ? rows * cfg_.out(last_ - 1) : 0;
    if (out_n) ex_.copy(out, scratch_.data() + total - out_n, out_n * sizeof(float));
    ex_.synchronize();
    if constexpr (std::is_same_v<Space, px::HostSpace>) saved.assign(scratch_.data(), scratch_.data() + total);
    else std::swap(saved, scratch_);
    return loss;
  }

  void backward(const pp::MicroBatch& mb, const float* in, const float* out_grad, float* in_grad, Saved& saved) {
    const std::size_t rows = mb.rows;
    ones_.assign_from_host(std::vector<float>(rows, 1.f).data(), rows);
    // Where each layer's saved values start, and its input.
    std::vector<const float*> start(last_ - first_), inputs(last_ - first_);
    const float* at = saved.data();
    const float* x = input(mb, in);
    for (std::size_t l = first_; l < last_; ++l) {
      start[l - first_] = at;
      inputs[l - first_] = x;
      const std::size_t n = rows * cfg_.out(l);
      x = kind(l) == Kind::block ? at + n : at;
      at += saved_size(l, rows);
    }
    if (out_grad) {
      dy_.resize_discard(rows * cfg_.out(last_ - 1));
      ex_.copy(dy_.data(), out_grad, dy_.size() * sizeof(float));
    }
    for (std::size_t l = last_; l-- > first_;) {
      const std::size_t i_w = cfg_.in(l), o_w = cfg_.out(l), n = rows * o_w;
      Var& w = vars_[2 * (l - first_)];
      Var& b = vars_[2 * (l - first_) + 1];
      const float* dz = start[l - first_];  // the head saved its gradient
      if (kind(l) != Kind::head) {
        dz_.resize_discard(n);
        if (n) px::for_each(ex_, n, detail::ReluGrad{dz_.data(), dy_.data(), start[l - first_]});
        dz = dz_.data();
      }
      // dW += x^T dz; db += 1^T dz (the column sums).
      gemm(ex_, Op::transpose, Op::none, i_w, o_w, rows, 1.0f, inputs[l - first_], i_w, dz, o_w, 1.0f,
           w.grad().data(), o_w);
      gemm(ex_, Op::none, Op::none, 1, o_w, rows, 1.0f, ones_.data(), rows, dz, o_w, 1.0f, b.grad().data(), o_w);
      if (l == first_ && !in_grad) break;
      // dx = dz W^T, plus dy itself through a block's skip connection.
      dx_.resize_discard(rows * i_w);
      if (kind(l) == Kind::block) ex_.copy(dx_.data(), dy_.data(), n * sizeof(float));
      else dx_.zero();
      gemm(ex_, Op::none, Op::transpose, rows, i_w, o_w, 1.0f, dz, o_w, w.value().data(), o_w, 1.0f, dx_.data(), i_w);
      std::swap(dy_, dx_);
    }
    if (in_grad) ex_.copy(in_grad, dy_.data(), rows * cfg_.in(first_) * sizeof(float));
    ex_.synchronize();
  }

  Config cfg_;
  std::size_t first_, last_;
  std::vector<Var> vars_;
  const Batch* batch_ = nullptr;
  double hits_ = 0;
  px::Exec<Space> ex_{};
  Buf scratch_, x_, dy_, dz_, dx_, ones_, row_loss_, correct_;
  px::Buffer<std::int32_t, Space> labels_;
};

}  // namespace examples::pipeline_mlp
