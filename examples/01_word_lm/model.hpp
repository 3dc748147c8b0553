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
/// Templated on the memory space: the matrix products are gemm() calls (a
/// BLAS on the host, cuBLAS on a GPU) and the other kernels
/// PARALLAX_HOST_DEVICE functors, so the same model trains on the host and
/// on a GPU.

#include "../common/gemm.hpp"
#include "../common/layers.hpp"
#include "../common/profile.hpp"
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

// The kernels are row kernels (px::for_each_rows): f(b, c) for row b and
// column c, a row a task with a loop along it on the host, an element a
// thread on a GPU.

/// [h, 1]: the hidden rows with a constant 1 appended, so that one product
/// with the softmax rows also adds their bias (their last column).
template <class T>
struct AppendOne {
  const T* h;  // rows x dim
  T* h1;       // rows x (dim + 1)
  std::size_t dim;
  PARALLAX_HOST_DEVICE void operator()(std::size_t b, std::size_t c) const {
    h1[b * (dim + 1) + c] = c < dim ? h[b * dim + c] : T(1);
  }
};

// example-begin word_lm_kernel
/// z[b, 0] = the true word's logit, z[b, 1 + j] = sampled word j's, read
/// from every candidate's logit all[b, r] = [h_b, 1] . w[r] (a matrix
/// product) less log Q[r]. A sampled word equal to b's label (an accidental
/// hit) gets a logit of -1e30, i.e. probability 0. A row kernel: f(b, k).
template <class T>
struct SampledLogits {
  const T* all;                    // rows x candidates
  const float* log_q;              // per candidate
  const px::index_t* sampled_row;  // per sampled word
  const px::index_t* label_row;    // per batch row
  T* z;                            // rows x (1 + sampled)
  std::size_t candidates, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t b, std::size_t k) const {
    const auto label = static_cast<std::size_t>(label_row[b]);
    const auto row = k == 0 ? label : static_cast<std::size_t>(sampled_row[k - 1]);
    z[b * (1 + sampled) + k] = k > 0 && row == label ? T(-1e30) : all[b * candidates + row] - static_cast<T>(log_q[row]);
  }
};
// example-end

/// The gradient of every candidate's logit, rows x candidates: d[b, r] =
/// dz[b, 1 + j] if candidate r is sampled word j (else 0), plus dz[b, 0] if
/// r is b's label. A row kernel: f(b, r).
template <class T>
struct CandidateLogitGrad {
  const T* dz;                   // rows x (1 + sampled)
  const std::int32_t* column;    // per candidate: 1 + j, or 0
  const px::index_t* label_row;  // per batch row
  T* d;                          // rows x candidates
  std::size_t candidates, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t b, std::size_t r) const {
    const T* zb = dz + b * (1 + sampled);
    const auto col = static_cast<std::size_t>(column[r]);
    const T term = col ? zb[col] : T(0);
    d[b * candidates + r] = static_cast<std::size_t>(label_row[b]) == r ? term + zb[0] : term;
  }
};

template <class T>
struct FillValue {
  T* out;
  T value;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = value; }
};

/// The sampled softmax's math, without its variable: the softmax rows come
/// from a lookup, their gradient goes into the table's gradient. Three
/// matrix products (gemm.hpp) over every candidate row, the true words'
/// and the sampled ones' alike; functors pick the rows' own logits out of
/// them and put their gradients back.
template <class Space, class T = float>
class SampledSoftmax {
 public:
  /// A step's candidates (Candidates), in Space.
  struct Inputs {
    const float* log_q;              ///< per candidate
    const px::index_t* sampled_row;  ///< per sampled word: its candidate row
    const px::index_t* label_row;    ///< per batch row: its label's candidate row
    const std::int32_t* column;      ///< per candidate: 1 + j if sampled word j, else 0
    std::size_t candidates, sampled;
  };

  /// The logits of each row's true word (column 0) and of the sampled words,
  /// rows x (1 + sampled), from the hidden rows h (rows x dim) and the
  /// candidates' softmax rows w (candidates x (dim + 1)). The caller's loss
  /// turns them into their gradient in place, for backward().
  T* logits(const px::Exec<Space>& ex, const T* h, const T* w, std::size_t rows, std::size_t dim, const Inputs& in) {
    rows_ = rows;
    dim_ = dim;
    h1_.resize_discard(rows * (dim + 1));
    all_.resize_discard(rows * in.candidates);
    z_.resize_discard(rows * (1 + in.sampled));
    if (rows == 0) return z_.data();
    px::for_each_rows(ex, rows, dim + 1, AppendOne<T>{h, h1_.data(), dim});
    // Every candidate's logit for every row: [h, 1] w^T.
    gemm(ex, Op::none, Op::transpose, rows, in.candidates, dim + 1, 1.0f, h1_.data(), dim + 1, w, dim + 1, 0.0f,
         all_.data(), in.candidates);
    px::for_each_rows(ex, rows, 1 + in.sampled,
                      SampledLogits<T>{all_.data(), in.log_q, in.sampled_row, in.label_row, z_.data(), in.candidates,
                                       in.sampled});
    return z_.data();
  }

  /// From the logits' gradient (left in place of logits()), the candidates'
  /// rows' gradient g (candidates x (dim + 1), the bias last) and the hidden
  /// rows' dh (rows x dim). `w` as given to logits().
  void backward(const px::Exec<Space>& ex, const T* w, const Inputs& in, T* g, T* dh) {
    const std::size_t rows = rows_, dim = dim_, n = in.candidates;
    px::for_each_rows(ex, rows, n, CandidateLogitGrad<T>{z_.data(), in.column, in.label_row, all_.data(), n, in.sampled});
    // g = d^T [h, 1] (zero for no rows); dh = d w[:, :dim].
    gemm(ex, Op::transpose, Op::none, n, dim + 1, rows, 1.0f, all_.data(), n, h1_.data(), dim + 1, 0.0f, g, dim + 1);
    gemm(ex, Op::none, Op::none, rows, dim, n, 1.0f, all_.data(), n, w, dim + 1, 0.0f, dh, dim);
  }

 private:
  std::size_t rows_ = 0, dim_ = 0;
  px::Buffer<T, Space> h1_, all_, z_;  // all_: the candidates' logits, then their gradient d
};

// ---------------------------------------------------------------- the model

/// The variables and the per-step computation. Give the trainer
/// `emb, hidden.w, hidden.b, softmax`.
/// Stored: the tables' storage (float, or px::bf16 / px::fp16: rows looked
/// up and trained in float, stored in 16 bits, updates rounded
/// stochastically).
template <class Space, class Stored = float>
class Model {
 public:
  using T = float;

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
  /// parallax's calls are charged to Part::parallax of the current profile.
  /// With `overlap`, the backward pass marks each gradient ready as soon as
  /// it is final (Trainer::ready), so the trainer moves it while the rest
  /// of the backward pass computes; and given the next step's batch
  /// (`next`, `next_cand`), its lookups start while this batch computes
  /// (Trainer::prefetch) and the next train_step takes their rows, which
  /// equal a lookup's then, bit for bit.
  template <class Trainer>
  double train_step(Trainer& trainer, const Batch& batch, const Candidates& cand, bool overlap = false,
                    const Batch* next = nullptr, const Candidates* next_cand = nullptr) {
    const std::size_t rows = batch.rows, dim = cfg_.dim, s = cand.sampled, width = 1 + s;
    const std::size_t n_ctx = rows * cfg_.context, n_cand = cand.ids.size();
    auto& ex = trainer.engine().exec();  // the trainer's stream: our kernels and its own run in order
    // example-begin word_lm_step
    // Inputs of this rank's rows, in the model's memory space (the ids are
    // there already when the step before prefetched this batch).
    const bool prefetched = ahead_.held;
    if (prefetched) {
      check_prefetched(batch, cand);
      std::swap(context_ids_, ahead_.context_ids);
      std::swap(candidate_ids_, ahead_.candidate_ids);
    } else {
      context_ids_.assign_from_host(batch.context.data(), n_ctx);
      candidate_ids_.assign_from_host(cand.ids.data(), n_cand);
    }
    log_q_.assign_from_host(cand.log_q.data(), n_cand);
    sampled_row_.assign_from_host(cand.sampled_row.data(), s);
    label_row_.assign_from_host(cand.label_row.data(), rows);
    column_.assign_from_host(cand.column.data(), n_cand);
    const typename SampledSoftmax<Space>::Inputs in{log_q_.data(), sampled_row_.data(), label_row_.data(),
                                                    column_.data(), n_cand, s};

    // Forward: the embedding rows of the context words and the softmax rows
    // of the candidates (pulled from their owners under the hybrid, both
    // tables in one round), the hidden layer, the sampled logits.
    const auto looked_up = timed(ex, Part::parallax, [&] {
      if constexpr (Trainer::template can_prefetch<Table>)
        if (prefetched) return trainer.rows(ahead_.take());
      return trainer.lookup({px::Lookup{emb, context_ids_}, px::Lookup{softmax, candidate_ids_}});
    });
    // (Architectures whose lookups cannot run ahead, the asynchronous ones, look up each batch.)
    if constexpr (Trainer::template can_prefetch<Table>)
      if (overlap && next && next_cand) prefetch(trainer, *next, *next_cand);
    const auto& x = looked_up[0];
    const auto& w = looked_up[1];
    const T* h = hidden.forward(ex, x.data, rows);
    T* z = sampled_softmax_.logits(ex, h, w.data, rows, dim, in);

    // Loss and its gradient (in place of the logits): the true word is
    // column 0 of every row.
    zeros_.resize_discard(rows);
    loss_.resize_discard(rows);
    hits_.resize_discard(rows);
    px::for_each(ex, rows, FillValue<std::int32_t>{zeros_.data(), 0});
    px::for_each(ex, rows,
                 SoftmaxCrossEntropy<T>{z, zeros_.data(), loss_.data(), hits_.data(), width, T(1) / static_cast<T>(rows)},
                 px::Cost{width});

    // Backward: rows of the softmax table, written straight into the
    // variable's gradient (add_rows: no copy), the hidden layer, the context
    // words' embedding rows. Gradients are means over this rank's rows; the
    // trainer averages them over the ranks. Each is marked ready once final
    // (--overlap on): the trainer starts moving it while the rest computes.
    const auto grad_w = timed(ex, Part::parallax, [&] { return softmax.grad().add_rows(n_cand); });
    ex.copy(grad_w.ids, candidate_ids_.data(), n_cand * sizeof(px::index_t));
    sampled_softmax_.backward(ex, w.data, in, grad_w.values.data, hidden.output_grad());
    ready(trainer, overlap, softmax);
    grad_x_.resize_discard(n_ctx * dim);
    hidden.backward(ex, x.data, rows, grad_x_.data());
    ready(trainer, overlap, hidden.w, hidden.b);
    ex.synchronize();
    timed(ex, Part::parallax, [&] { emb.grad().add(context_ids_.data(), grad_x_.data(), n_ctx); });
    ready(trainer, overlap, emb);
    timed(ex, Part::parallax, [&] {
      trainer.step();  // dense: all-reduce; sparse: push rows to their owners; then the optimizer
    });
    // example-end
    return sum_to_host(loss_, rows) / static_cast<double>(rows);
  }

  px::Variable<px::Sparse, Stored, Space> emb;      ///< vocab x dim
  DenseLayer<Space, T> hidden;                      ///< (context * dim) -> dim, tanh
  px::Variable<px::Sparse, Stored, Space> softmax;  ///< vocab x (dim + 1), last column the bias

 private:
  using Table = px::Variable<px::Sparse, Stored, Space>;
  /// The next batch's lookups in flight: its ids (kept until its step
  /// swaps them in) and a host copy to check that step is given that batch.
  struct Ahead {
    bool held = false;
    px::Prefetched<Table> lookups;
    px::Buffer<px::index_t, Space> context_ids, candidate_ids;
    std::vector<px::index_t> context_host, candidate_host;
    px::Prefetched<Table>& take() {
      held = false;
      return lookups;
    }
  };

  template <class Trainer>
  void prefetch(Trainer& trainer, const Batch& next, const Candidates& next_cand) {
    auto& ex = trainer.engine().exec();
    ahead_.context_ids.assign_from_host(next.context.data(), next.context.size());
    ahead_.candidate_ids.assign_from_host(next_cand.ids.data(), next_cand.ids.size());
    ahead_.context_host = next.context;
    ahead_.candidate_host = next_cand.ids;
    ahead_.lookups = timed(ex, Part::parallax, [&] {
      return trainer.prefetch({px::Lookup{emb, ahead_.context_ids}, px::Lookup{softmax, ahead_.candidate_ids}});
    });
    ahead_.held = true;
  }
  void check_prefetched(const Batch& batch, const Candidates& cand) const {
    if (batch.context != ahead_.context_host || cand.ids != ahead_.candidate_host)
      throw std::invalid_argument("word_lm::Model::train_step: this batch is not the `next` batch the step before "
                                  "prefetched");
  }

  Config cfg_;
  // After the tables and cfg_: 16-bit tables round their updates
  // stochastically, seeded (runs stay bit-identical).
  bool rounding_set_ = round_stochastically();
  bool round_stochastically() {
    if constexpr (px::is_half_v<Stored>) {
      emb.set_rounding({px::Rounding::stochastic, cfg_.seed});
      softmax.set_rounding({px::Rounding::stochastic, cfg_.seed + 1});
    }
    return px::is_half_v<Stored>;
  }
  Ahead ahead_;
  SampledSoftmax<Space, T> sampled_softmax_;
  px::Buffer<px::index_t, Space> context_ids_, candidate_ids_, sampled_row_, label_row_;
  px::Buffer<float, Space> log_q_;
  px::Buffer<T, Space> loss_, hits_, grad_x_;
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
