#pragma once
/// @file
/// The model of example 05: a deep residual MLP (an input layer, `blocks`
/// residual blocks h + relu(h W + b), a softmax head), cut into pipeline
/// stages. A StageModel holds the layers [first, last) of one stage, and only
/// their variables, and gives the pipeline its forward and backward passes
/// (px::pipeline::Stage). Gradients accumulate over the step's
/// micro-batches (products with beta = 1) until the trainer's step() applies
/// and clears them. Host memory; the products are examples::gemm calls.

#include "../common/gemm.hpp"
#include "../common/layers.hpp"

#include <parallax/parallax.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
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

/// One stage: layers [first, last) of the chain.
class StageModel {
 public:
  using Var = px::Variable<px::Dense, float>;

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

  /// The replica's batch of the coming run (read by the first stage, for
  /// the inputs, and the last, for the labels).
  void set_batch(const Batch& b) {
    batch_ = &b;
    loss_ = hits_ = 0;
  }
  /// Correct predictions of the last run (last stage).
  double hits() const noexcept { return hits_; }

  pp::Stage<float> stage() {
    pp::Stage<float> st;
    st.name = "layers " + std::to_string(first_) + ".." + std::to_string(last_ - 1);
    st.in_width = first_ == 0 ? 0 : cfg_.in(first_);
    st.out_width = last_ == cfg_.layers() ? 0 : cfg_.out(last_ - 1);
    st.parameters = parameters();
    st.forward = [this](const pp::MicroBatch& mb, const float* in, float* out, std::vector<float>& saved) {
      return forward(mb, in, out, saved);
    };
    st.backward = [this](const pp::MicroBatch& mb, const float* in, const float* out_grad, float* in_grad,
                         std::vector<float>& saved) { backward(mb, in, out_grad, in_grad, saved); };
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

  double forward(const pp::MicroBatch& mb, const float* in, float* out, std::vector<float>& saved) {
    const std::size_t rows = mb.rows;
    std::size_t total = 0;
    for (std::size_t l = first_; l < last_; ++l) total += saved_size(l, rows);
    saved.assign(total, 0.f);
    const float* x = in ? in : batch_->x.data() + mb.first * cfg_.inputs;
    float* at = saved.data();
    double loss = 0;
    for (std::size_t l = first_; l < last_; ++l) {
      const std::size_t i_w = cfg_.in(l), o_w = cfg_.out(l);
      const float* W = vars_[2 * (l - first_)].value().data();
      const float* b = vars_[2 * (l - first_) + 1].value().data();
      float* z = at;  // the layer's pre-activation, then its saved values
      gemm(ex_, Op::none, Op::none, rows, o_w, i_w, 1.0f, x, i_w, W, o_w, 0.0f, z, o_w);
      for (std::size_t e = 0; e < rows; ++e)
        for (std::size_t o = 0; o < o_w; ++o) {
          float& v = z[e * o_w + o];
          v += b[o];
          if (kind(l) != Kind::head) v = v > 0.f ? v : 0.f;
        }
      if (kind(l) == Kind::block) {
        float* y = z + rows * o_w;
        for (std::size_t k = 0; k < rows * o_w; ++k) y[k] = x[k] + z[k];
        x = y;
        at = y + rows * o_w;
      } else if (kind(l) == Kind::input) {
        x = z;
        at = z + rows * o_w;
      } else {  // the head: logits -> gradient of the replica's mean loss
        std::vector<float> row_loss(rows), correct(rows);
        const auto* labels = batch_->labels.data() + mb.first;
        for (std::size_t e = 0; e < rows; ++e)
          SoftmaxCrossEntropy<float>{z, labels, row_loss.data(), correct.data(), o_w,
                                     1.0f / static_cast<float>(mb.batch_rows)}(e);
        for (std::size_t e = 0; e < rows; ++e) {
          loss += row_loss[e];
          hits_ += correct[e];
        }
        at = z + rows * o_w;
      }
    }
    if (out) std::copy(x, x + rows * cfg_.out(last_ - 1), out);
    loss_ += loss;
    return loss;
  }

  void backward(const pp::MicroBatch& mb, const float* in, const float* out_grad, float* in_grad,
                std::vector<float>& saved) {
    const std::size_t rows = mb.rows;
    // Where each layer's saved values start, and its input.
    std::vector<const float*> start(last_ - first_), input(last_ - first_);
    const float* at = saved.data();
    const float* x = in ? in : batch_->x.data() + mb.first * cfg_.inputs;
    for (std::size_t l = first_; l < last_; ++l) {
      start[l - first_] = at;
      input[l - first_] = x;
      const std::size_t n = rows * cfg_.out(l);
      x = kind(l) == Kind::block ? at + n : at;
      at += saved_size(l, rows);
    }
    std::vector<float> dy, dz, dx;
    if (out_grad) dy.assign(out_grad, out_grad + rows * cfg_.out(last_ - 1));
    for (std::size_t l = last_; l-- > first_;) {
      const std::size_t i_w = cfg_.in(l), o_w = cfg_.out(l), n = rows * o_w;
      Var& w = vars_[2 * (l - first_)];
      Var& b = vars_[2 * (l - first_) + 1];
      const float* s = start[l - first_];
      if (kind(l) == Kind::head) dz.assign(s, s + n);
      else {
        dz.resize(n);
        for (std::size_t k = 0; k < n; ++k) dz[k] = s[k] > 0.f ? dy[k] : 0.f;  // relu's slope from its output
      }
      gemm(ex_, Op::transpose, Op::none, i_w, o_w, rows, 1.0f, input[l - first_], i_w, dz.data(), o_w, 1.0f,
           w.grad().data(), o_w);
      float* db = b.grad().data();
      for (std::size_t e = 0; e < rows; ++e)
        for (std::size_t o = 0; o < o_w; ++o) db[o] += dz[e * o_w + o];
      if (l == first_ && !in_grad) break;
      // dx = dz W^T, plus dy itself through a block's skip connection.
      if (kind(l) == Kind::block) dx = dy;
      else dx.assign(rows * i_w, 0.f);
      gemm(ex_, Op::none, Op::transpose, rows, i_w, o_w, 1.0f, dz.data(), o_w, w.value().data(), o_w, 1.0f, dx.data(),
           i_w);
      dy.swap(dx);
    }
    if (in_grad) std::copy(dy.begin(), dy.end(), in_grad);
  }

  Config cfg_;
  std::size_t first_, last_;
  std::vector<Var> vars_;
  const Batch* batch_ = nullptr;
  double loss_ = 0, hits_ = 0;
  px::Exec<px::HostSpace> ex_{};
};

}  // namespace examples::pipeline_mlp
