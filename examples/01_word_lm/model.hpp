#pragma once
/// @file
/// The word language model of example 01, shared with bench/end_to_end.cpp:
/// a feed-forward n-gram model (Bengio et al., 2003) with the two large
/// sparse tables of LM1B.
///
///   context words --emb (sparse, vocab x dim)--> concat --dense tanh layer--> h
///   h --sampled softmax over the true word and `sampled` candidates--> loss
///
/// The softmax weights are a sparse variable of vocab x (dim + 1) rows, the
/// last column being the output bias (h is extended by a constant 1), so a
/// step touches only the rows of the true and sampled words. Candidates come
/// from TensorFlow's log-uniform sampler, the same on every rank for a step
/// (seeded by the step), with the logQ correction and accidental hits removed,
/// as tf.nn.sampled_softmax_loss does.
///
/// Templated on the memory space: the kernels are PARALLAX_HOST_DEVICE
/// functors, so the same model trains on the host and on a GPU.

#include "../common/layers.hpp"
#include "../common/synthetic.hpp"

#include <parallax/parallax.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace examples::word_lm {

namespace px = parallax;

/// Sizes of the model.
struct Config {
  std::size_t vocab = 100000;  ///< rows of both sparse tables
  std::size_t dim = 64;        ///< embedding width and hidden width
  std::size_t context = 2;     ///< words of context per prediction
  std::size_t sampled = 1024;  ///< sampled softmax candidates per step
  std::uint64_t seed = 1;      ///< initial values
};

/// One rank's share of a step's global batch: `rows` predictions, each from
/// `context` words.
struct Batch {
  std::size_t rows = 0;
  std::vector<px::index_t> context;  ///< rows x context word ids
  std::vector<px::index_t> labels;   ///< rows next-word ids
};

/// The softmax rows a step uses: each word among the sampled ones (the same
/// on every rank) and this rank's labels once, ascending; log Q of each (the
/// expected count of the word in the sample); and where the logits find
/// their rows. Ascending distinct ids are what a lookup and a gradient take
/// fastest: no sort, and the rows land in place.
struct Candidates {
  std::size_t sampled = 0;                ///< sampled words per step
  std::vector<px::index_t> ids;           ///< the distinct words, ascending
  std::vector<float> log_q;               ///< aligned to ids
  std::vector<px::index_t> sampled_row;   ///< sampled word j (ascending): its row in ids
  std::vector<px::index_t> label_row;     ///< batch row b: the row of its label in ids
  std::vector<std::int32_t> column;       ///< row r: 1 + j if it is sampled word j, else 0
};

// example-begin word_lm_candidates
/// Samples the candidates of step `step` (the same on every rank) and merges
/// in this rank's labels. Linear in the candidates: the sample comes
/// ascending, the few labels are sorted and merged in, and one walk finds
/// every sampled word's row.
inline Candidates make_candidates(const LogUniformSampler& sampler, std::size_t count, std::uint64_t seed,
                                  std::uint64_t step, const Batch& batch) {
  const auto s = sampler.sample(count, hash(seed, 0x5A3F, step));  // ascending, distinct
  std::vector<px::index_t> labels(batch.labels.begin(), batch.labels.end());
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
  Candidates c;
  c.sampled = count;
  c.ids.reserve(count + labels.size());
  std::set_union(s.ids.begin(), s.ids.end(), labels.begin(), labels.end(), std::back_inserter(c.ids));
  c.column.assign(c.ids.size(), 0);
  c.sampled_row.resize(count);
  for (std::size_t r = 0, j = 0; j < count; ++r) {
    if (c.ids[r] != s.ids[j]) continue;  // a label that was not sampled
    c.sampled_row[j] = static_cast<px::index_t>(r);
    c.column[r] = static_cast<std::int32_t>(++j);
  }
  for (px::index_t label : batch.labels)
    c.label_row.push_back(static_cast<px::index_t>(std::lower_bound(c.ids.begin(), c.ids.end(), label) - c.ids.begin()));
  c.log_q.resize(c.ids.size());
  for (std::size_t i = 0; i < c.ids.size(); ++i)
    c.log_q[i] = static_cast<float>(std::log(sampler.expected_count(c.ids[i], s.tries)));
  return c;
}
// example-end

/// Training windows of a token stream: example g is the `context` words at a
/// pseudo-random position (a function of seed and g) and the word after them.
/// The last `holdout` fraction of the stream is kept for evaluation.
class Windows {
 public:
  Windows(const std::vector<std::int32_t>& tokens, std::size_t context, std::uint64_t seed, double holdout = 0.05)
      : tokens_(&tokens), context_(context), seed_(seed) {
    const std::size_t n = tokens.size();
    split_ = n - static_cast<std::size_t>(static_cast<double>(n) * holdout);
    if (split_ < context + 1 || n - split_ < context + 1)
      throw std::invalid_argument("the corpus has " + std::to_string(n) + " words: too few for windows of " +
                                  std::to_string(context + 1));
  }

  /// Examples [first, first + count) of global batch `step` of `global_batch`.
  Batch training(std::uint64_t step, std::size_t global_batch, std::size_t first, std::size_t count) const {
    Batch b;
    b.rows = count;
    for (std::size_t e = first; e < first + count; ++e) {
      const std::uint64_t g = step * global_batch + e;
      add(b, hash(seed_, 0xE1, g) % (split_ - context_));
    }
    return b;
  }
  /// Held-out examples [first, first + count).
  Batch held_out(std::size_t first, std::size_t count) const {
    Batch b;
    b.rows = count;
    const std::size_t span = tokens_->size() - split_ - context_;
    for (std::size_t e = first; e < first + count; ++e) add(b, split_ + hash(seed_, 0xE7, e) % span);
    return b;
  }

 private:
  void add(Batch& b, std::size_t pos) const {
    for (std::size_t k = 0; k < context_; ++k) b.context.push_back((*tokens_)[pos + k]);
    b.labels.push_back((*tokens_)[pos + context_]);
  }
  const std::vector<std::int32_t>* tokens_;
  std::size_t context_;
  std::uint64_t seed_;
  std::size_t split_;
};

// ---------------------------------------------------------------- kernels

// example-begin word_lm_kernel
/// z[b, 0] = the true word's logit, z[b, 1 + j] = sampled word j's; each
/// h[b] . w[row] + bias[row] - log Q[row]. A sampled word equal to b's label
/// (an accidental hit) gets a logit of -1e30, i.e. probability 0. One logit
/// per call, the batch rows of one candidate next to each other: a softmax
/// row is read from memory once a step, then from cache (on a GPU, by
/// neighbouring threads together), not once per batch row.
template <class T>
struct SampledLogits {
  const T* h;                      // rows x dim
  const T* w;                      // candidates x (dim + 1)
  const float* log_q;              // per candidate
  const px::index_t* sampled_row;  // per sampled word
  const px::index_t* label_row;    // per batch row
  T* z;                            // rows x (1 + sampled)
  std::size_t rows, dim, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t k = e / rows, b = e % rows;
    T* out = z + b * (1 + sampled) + k;
    const auto row = static_cast<std::size_t>(k == 0 ? label_row[b] : sampled_row[k - 1]);
    if (k > 0 && row == static_cast<std::size_t>(label_row[b])) {
      *out = T(-1e30);
      return;
    }
    const T* wr = w + row * (dim + 1);
    *out = dot(h + b * dim, wr, dim) + wr[dim] - static_cast<T>(log_q[row]);
  }
};
// example-end

/// The gradient of the logits as a candidates x rows matrix: d[r, b] =
/// dz[b, 1 + j] if candidate row r is sampled word j, else 0. The true
/// words' terms (dz[b, 0]) stay apart, so the sums below add the same terms
/// in the same order as a loop over the sampled words would. One element per call.
template <class T>
struct SampledGrad {
  const T* dz;                  // rows x (1 + sampled)
  const std::int32_t* column;  // per candidate: 1 + j, or 0
  T* d;                         // candidates x rows
  std::size_t rows, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t r = e / rows, b = e % rows;
    const auto col = static_cast<std::size_t>(column[r]);
    d[e] = col ? dz[b * (1 + sampled) + col] : T(0);
  }
};

/// The gradient of candidate row r: sum_b delta(r, b) [h_b, 1], where
/// delta(r, b) is d[r, b] (SampledGrad) plus dz[b, 0] if r is b's label. One row
/// per call, its sums held in registers a tile of `Cols` columns at a time.
template <class T, std::size_t Cols = 16>
struct CandidateGrad {
  const T* h;   // rows x dim
  const T* d;   // candidates x rows (SampledGrad)
  const T* dz;  // rows x (1 + sampled): column 0, the true words
  const px::index_t* label_row;
  T* g;  // candidates x (dim + 1)
  std::size_t rows, dim, sampled;
  PARALLAX_HOST_DEVICE T delta(std::size_t r, std::size_t b) const {
    return d[r * rows + b] + (static_cast<std::size_t>(label_row[b]) == r ? dz[b * (1 + sampled)] : T(0));
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const {
    T* gr = g + r * (dim + 1);
    std::size_t c0 = 0;
    for (; c0 + Cols <= dim; c0 += Cols) {
      T acc[Cols] = {};
      for (std::size_t b = 0; b < rows; ++b) {
        const T x = delta(r, b);
        const T* hb = h + b * dim + c0;
        for (std::size_t i = 0; i < Cols; ++i) acc[i] += x * hb[i];
      }
      for (std::size_t i = 0; i < Cols; ++i) gr[c0 + i] = acc[i];
    }
    for (; c0 < dim; ++c0) {
      T acc = T(0);
      for (std::size_t b = 0; b < rows; ++b) acc += delta(r, b) * h[b * dim + c0];
      gr[c0] = acc;
    }
    T bias = T(0);
    for (std::size_t b = 0; b < rows; ++b) bias += delta(r, b);
    gr[dim] = bias;
  }
};

/// dh[b, :] = dz[b, 0] w[label_b, :dim] + sum_r d[r, b] w[r, :dim]: a
/// matrix product. A call owns `Rows` batch rows x `Panel` columns of dh and
/// walks the candidate rows in memory order, `Block` at a time; within a
/// block it sums one tile of up to `Rows` x `Cols` at a time in registers.
/// The host takes 4 x 8 tiles (8 SSE registers of sums, each w fragment
/// loaded once for 4 batch rows), panels of 64 columns and blocks of 32
/// rows: 8 KiB of w, prefetched while the block before is summed, then read
/// from L1 by every tile. A GPU takes one element a thread, rows x dim
/// threads. Each element adds its terms in candidate order, the same sums
/// whatever the tiling.
template <class T, std::size_t Rows = 4, std::size_t Cols = 8, std::size_t Panel = 64, std::size_t Block = 32>
struct HiddenGrad {
  static_assert(Panel % Cols == 0, "a panel is whole tiles");
  const T* w;   // candidates x (dim + 1)
  const T* d;   // candidates x rows (SampledGrad)
  const T* dz;  // rows x (1 + sampled): column 0, the true words
  const px::index_t* label_row;
  T* dh;  // rows x dim
  std::size_t rows, dim, sampled, candidates;
  /// Multiply-adds a call does per candidate row.
  static constexpr std::size_t work = Rows * Panel;
  /// Calls that cover dh.
  static std::size_t calls(std::size_t rows, std::size_t dim) {
    return (rows + Rows - 1) / Rows * ((dim + Panel - 1) / Panel);
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t row_tiles = (rows + Rows - 1) / Rows;
    const std::size_t b0 = e % row_tiles * Rows, p0 = e / row_tiles * Panel;
    const std::size_t nb = rows - b0 < Rows ? rows - b0 : Rows, p1 = dim - p0 < Panel ? dim : p0 + Panel;
    for (std::size_t b = b0; b < b0 + nb; ++b) {  // the true words' terms come first
      const T t = dz[b * (1 + sampled)];
      const T* wl = w + static_cast<std::size_t>(label_row[b]) * (dim + 1);
      for (std::size_t c = p0; c < p1; ++c) dh[b * dim + c] = t * wl[c];
    }
    for (std::size_t r0 = 0; r0 < candidates; r0 += Block) {
      const std::size_t r1 = candidates - r0 < Block ? candidates : r0 + Block;
#if !defined(__CUDA_ARCH__) && defined(__GNUC__)
      // The tiles walk down the block's rows, a stride the hardware does
      // not prefetch: ask for the next block's part of the panel now.
      for (std::size_t r = r1; r < r1 + Block && r < candidates; ++r)
        for (std::size_t c = p0; c < p1; c += 64 / sizeof(T)) __builtin_prefetch(w + r * (dim + 1) + c);
#endif
      for (std::size_t c0 = p0; c0 < p1; c0 += Cols) {
        const std::size_t nc = p1 - c0 < Cols ? p1 - c0 : Cols;
        rows_tile<Rows>(nb, b0, c0, r0, r1, nc);
      }
    }
  }

 private:
  // A tile of nb <= R rows, with nb as a template argument: bounds the
  // compiler sees are unrolled, their sums held in registers.
  template <std::size_t R>
  PARALLAX_HOST_DEVICE void rows_tile(std::size_t nb, std::size_t b0, std::size_t c0, std::size_t r0, std::size_t r1,
                                      std::size_t nc) const {
    if constexpr (R > 1) {
      if (nb < R) return rows_tile<R - 1>(nb, b0, c0, r0, r1, nc);
    }
    nc == Cols ? tile<R>(b0, c0, r0, r1, Cols) : tile<R>(b0, c0, r0, r1, nc);
  }
  // Adds candidate rows [r0, r1) to dh's R x nc tile at (b0, c0).
  template <std::size_t R>
  PARALLAX_HOST_DEVICE void tile(std::size_t b0, std::size_t c0, std::size_t r0, std::size_t r1, std::size_t nc) const {
    T acc[R][Cols];
    for (std::size_t bi = 0; bi < R; ++bi)
      for (std::size_t i = 0; i < nc; ++i) acc[bi][i] = dh[(b0 + bi) * dim + c0 + i];
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dr = d + r * rows + b0;
      const T* wr = w + r * (dim + 1) + c0;
      for (std::size_t bi = 0; bi < R; ++bi)
        for (std::size_t i = 0; i < nc; ++i) acc[bi][i] += dr[bi] * wr[i];
    }
    for (std::size_t bi = 0; bi < R; ++bi)
      for (std::size_t i = 0; i < nc; ++i) dh[(b0 + bi) * dim + c0 + i] = acc[bi][i];
  }
};

template <class T>
struct FillValue {
  T* out;
  T value;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = value; }
};

// ---------------------------------------------------------------- the model

/// The variables and the per-step computation. Give the trainer
/// `emb, hidden.w, hidden.b, softmax`.
template <class Space>
class Model {
 public:
  using T = float;
  /// Kernels tile for registers on the host, for threads on a GPU.
  static constexpr bool host = std::is_same_v<Space, px::HostSpace>;

  // example-begin word_lm_variables
  Model(const px::Context& ctx, const Config& cfg)
      : emb(ctx, "emb", {cfg.vocab, cfg.dim}, px::init::Uniform{-0.1f, 0.1f, cfg.seed}),
        hidden(ctx, "hidden", cfg.context * cfg.dim, cfg.dim, Activation::tanh, cfg.seed),
        softmax(ctx, "softmax", {cfg.vocab, cfg.dim + 1}, px::init::Uniform{-0.05f, 0.05f, cfg.seed}),
        cfg_(cfg) {}
  // example-end

  const Config& config() const noexcept { return cfg_; }

  /// One training step on this rank's share of the batch; returns the mean
  /// sampled-softmax loss over this rank's rows. Collective (lookups, step).
  template <class Trainer>
  double train_step(Trainer& trainer, const Batch& batch, const Candidates& cand) {
    const std::size_t rows = batch.rows, dim = cfg_.dim, s = cand.sampled, width = 1 + s;
    const std::size_t n_ctx = rows * cfg_.context, n_cand = cand.ids.size();
    auto& ex = trainer.engine().exec();  // the trainer's stream: our kernels and its own run in order
    // example-begin word_lm_step
    // Inputs of this rank's rows, in the model's memory space.
    context_ids_.assign_from_host(batch.context.data(), n_ctx);
    candidate_ids_.assign_from_host(cand.ids.data(), n_cand);
    log_q_.assign_from_host(cand.log_q.data(), n_cand);
    sampled_row_.assign_from_host(cand.sampled_row.data(), s);
    label_row_.assign_from_host(cand.label_row.data(), rows);
    column_.assign_from_host(cand.column.data(), n_cand);

    // Forward: the embedding rows of the context words and the softmax rows
    // of the candidates (pulled from their owners under the hybrid, both
    // tables in one round), the hidden layer, the candidate logits.
    const auto looked_up = trainer.lookup({px::Lookup{emb, context_ids_}, px::Lookup{softmax, candidate_ids_}});
    const auto& x = looked_up[0];
    const auto& w = looked_up[1];
    const T* h = hidden.forward(ex, x.data, rows);
    logits_.resize_discard(rows * width);
    px::for_each(ex, rows * width,
                 SampledLogits<T>{h, w.data, log_q_.data(), sampled_row_.data(), label_row_.data(), logits_.data(), rows, dim, s},
                 px::Cost{dim});

    // Loss and its gradient: the true word is column 0 of every row.
    zeros_.resize_discard(rows);
    loss_.resize_discard(rows);
    hits_.resize_discard(rows);
    px::for_each(ex, rows, FillValue<std::int32_t>{zeros_.data(), 0});
    px::for_each(ex, rows,
                 SoftmaxCrossEntropy<T>{logits_.data(), zeros_.data(), loss_.data(), hits_.data(), width,
                                        T(1) / static_cast<T>(rows)},
                 px::Cost{width});

    // Backward: rows of the softmax table, written straight into the
    // variable's gradient (add_rows: no copy), the hidden layer, the context
    // words' embedding rows. Gradients are means over this rank's rows; the
    // trainer averages them over the ranks.
    const auto grad_w = softmax.grad().add_rows(n_cand);
    ex.copy(grad_w.ids, candidate_ids_.data(), n_cand * sizeof(px::index_t));
    // The sampled part of dz as a candidates x rows matrix, then two matrix
    // products over it: the softmax rows' gradient (a few heavy items: Cost
    // lets the host spread them over its OpenMP team all the same) and dh.
    grad_z_.resize_discard(n_cand * rows);
    px::for_each(ex, n_cand * rows, SampledGrad<T>{logits_.data(), column_.data(), grad_z_.data(), rows, s});
    px::for_each(ex, n_cand,
                 CandidateGrad<T>{h, grad_z_.data(), logits_.data(), label_row_.data(), grad_w.values.data, rows, dim, s},
                 px::Cost{rows * dim});
    // dh: on the host, 4 x 8 tiles summed in registers; on a GPU, one
    // element a thread. The same sums either way.
    using HG = std::conditional_t<host, HiddenGrad<T>, HiddenGrad<T, 1, 1, 1, 1024>>;
    px::for_each(ex, HG::calls(rows, dim),
                 HG{w.data, grad_z_.data(), logits_.data(), label_row_.data(), hidden.output_grad(), rows, dim, s, n_cand},
                 px::Cost{n_cand * HG::work});
    grad_x_.resize_discard(n_ctx * dim);
    hidden.backward(ex, x.data, rows, grad_x_.data());
    ex.synchronize();
    emb.grad().add(context_ids_.data(), grad_x_.data(), n_ctx);
    trainer.step();  // dense: all-reduce; sparse: push rows to their owners; then the optimizer
    // example-end
    return sum_to_host(loss_, rows) / static_cast<double>(rows);
  }

  px::Variable<px::Sparse, T, Space> emb;      ///< vocab x dim
  DenseLayer<Space, T> hidden;                 ///< (context * dim) -> dim, tanh
  px::Variable<px::Sparse, T, Space> softmax;  ///< vocab x (dim + 1), last column the bias

 private:
  Config cfg_;
  px::Buffer<px::index_t, Space> context_ids_, candidate_ids_, sampled_row_, label_row_;
  px::Buffer<float, Space> log_q_;
  px::Buffer<T, Space> logits_, loss_, hits_, grad_x_, grad_z_;
  px::Buffer<std::int32_t, Space> zeros_, column_;
};

/// Full-softmax cross-entropy of the model on `batch` (mean over its rows),
/// on the host from the fetched tables: the number a perplexity is made of.
/// `softmax_table` is trainer.fetch(softmax); emb rows come from `emb_rows`
/// (aligned to batch.context), the hidden layer from its fetched values.
inline double full_softmax_loss(const Config& cfg, const Batch& batch, const std::vector<float>& emb_rows,
                                const std::vector<float>& hidden_w, const std::vector<float>& hidden_b,
                                const std::vector<float>& softmax_table) {
  const std::size_t dim = cfg.dim, in = cfg.context * dim;
  double total = 0;
  std::vector<float> h(dim);
  std::vector<double> z(cfg.vocab);
  for (std::size_t b = 0; b < batch.rows; ++b) {
    const float* x = emb_rows.data() + b * in;
    for (std::size_t o = 0; o < dim; ++o) {
      float s = hidden_b[o];
      for (std::size_t i = 0; i < in; ++i) s += x[i] * hidden_w[i * dim + o];
      h[o] = std::tanh(s);
    }
    double top = -1e300;
    for (std::size_t v = 0; v < cfg.vocab; ++v) {
      const float* wr = softmax_table.data() + v * (dim + 1);
      z[v] = static_cast<double>(dot(h.data(), wr, dim) + wr[dim]);
      top = std::max(top, z[v]);
    }
    double sum = 0;
    for (std::size_t v = 0; v < cfg.vocab; ++v) sum += std::exp(z[v] - top);
    total += std::log(sum) + top - z[static_cast<std::size_t>(batch.labels[b])];
  }
  return batch.rows ? total / static_cast<double>(batch.rows) : 0.0;
}

}  // namespace examples::word_lm
