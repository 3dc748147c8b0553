#pragma once
/// @file
/// The click-through-rate model of example 02, shared with
/// bench/end_to_end.cpp: DLRM-style (Naumov et al., 2019) on the Criteo
/// layout, with the dot-product interaction replaced by concatenation.
///
///   13 dense features --bottom MLP (dense)--> 16 ─┐
///   26 categorical ids --one embedding table each (sparse)--> 26 x 16 ─┴─ concat
///   concat --top MLP (dense)--> 1 logit --logistic loss
///
/// Each table is its own sparse variable, sized per feature; ids are
/// power-law. A step looks all 26 tables up in one batched lookup, and the
/// trainer pushes their gradient rows in one route. Multi-hot features
/// (Config::multi_hot) hold a bag of ids per example, pooled by their mean:
/// by the trainer (one lookup of px::Bags for them all, bag_gradients()
/// back), or, with Config::pool_by_hand, here, from a row per id of the
/// batched lookup, each id's row getting its bag's gradient over its length. Templated on the memory
/// space; the MLPs' products are gemm() calls (common/layers.hpp).

#include "../common/layers.hpp"
#include "../common/profile.hpp"
#include "../common/readers.hpp"
#include "../common/synthetic.hpp"

#include <parallax/parallax.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace examples::ctr {

namespace px = parallax;

/// Categorical features (embedding tables), as in Criteo.
inline constexpr std::size_t features = CriteoRecord::categorical_features;
/// Dense features, as in Criteo.
inline constexpr std::size_t dense_features = CriteoRecord::dense_features;

/// Rows of each table of Criteo's Kaggle set (distinct values per feature),
/// capped at `cap` rows: the tables range from a few rows to the cap.
inline std::vector<std::size_t> criteo_table_rows(std::size_t cap) {
  static constexpr std::array<std::size_t, features> kaggle = {
      1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
      27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572};
  std::vector<std::size_t> rows;
  for (std::size_t r : kaggle) rows.push_back(std::max<std::size_t>(2, std::min(r + 1, cap)));  // + the "missing" row
  return rows;
}

/// Sizes of the model.
struct Config {
  std::vector<std::size_t> table_rows = criteo_table_rows(100000);
  std::size_t dim = 16;         ///< embedding width (and bottom MLP output)
  std::size_t bottom = 64;      ///< bottom MLP hidden width
  std::size_t top = 64;         ///< top MLP hidden width
  std::uint64_t seed = 1;
  std::vector<bool> multi_hot = std::vector<bool>(features, false);  ///< per feature: a bag of ids
  /// Multi-hot features: look up a row per id and pool them here (else the
  /// trainer pools, at `pooling`; policies that cannot pool always pool here).
  bool pool_by_hand = false;
  px::Pooling pooling = px::Pooling::automatic;
};

/// The `count` features with the most rows (the first on ties), marked: the
/// multi-hot ones.
inline std::vector<bool> largest_features(const std::vector<std::size_t>& table_rows, std::size_t count) {
  std::vector<std::size_t> order(table_rows.size());
  for (std::size_t f = 0; f < order.size(); ++f) order[f] = f;
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return table_rows[a] > table_rows[b]; });
  std::vector<bool> marked(table_rows.size(), false);
  for (std::size_t i = 0; i < std::min(count, order.size()); ++i) marked[order[i]] = true;
  return marked;
}

/// One rank's share of a step: `rows` examples.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> dense;                                  ///< rows x dense_features
  /// Per feature: rows ids, or a multi-hot feature's bags one after another.
  std::array<std::vector<px::index_t>, features> ids;
  /// Per multi-hot feature: rows + 1 offsets into its ids (else empty).
  std::array<std::vector<px::index_t>, features> offsets;
  std::vector<std::int32_t> labels;                          ///< rows
  std::vector<bool> multi_hot;  ///< which features add() takes bags of (empty: none)

  void clear(std::size_t n) {
    rows = 0;
    dense.clear();
    dense.reserve(n * dense_features);
    for (std::size_t f = 0; f < features; ++f) {
      ids[f].clear();
      ids[f].reserve(n);
      offsets[f].clear();
      if (multi(f)) offsets[f].reserve(n + 1), offsets[f].push_back(0);
    }
    labels.clear();
    labels.reserve(n);
  }
  void add(const ClickExample& e) {
    ++rows;
    dense.insert(dense.end(), e.dense.begin(), e.dense.end());
    std::size_t m = 0;
    for (std::size_t f = 0; f < features; ++f) {
      if (!multi(f)) {
        ids[f].push_back(e.ids[f]);
        continue;
      }
      const auto from = e.bag_ids.begin() + static_cast<std::ptrdiff_t>(m ? e.bag_ends[m - 1] : 0);
      ids[f].insert(ids[f].end(), from, e.bag_ids.begin() + static_cast<std::ptrdiff_t>(e.bag_ends[m++]));
      offsets[f].push_back(static_cast<px::index_t>(ids[f].size()));
    }
    labels.push_back(e.label);
  }
  bool multi(std::size_t f) const { return !multi_hot.empty() && multi_hot[f]; }
};

/// A Criteo record as a model input: dense x -> log(1 + max(x, 0)) (DLRM's
/// transform), a categorical value -> a row of its table by hashing (row 0
/// is "missing").
inline ClickExample to_example(const CriteoRecord& r, const std::vector<std::size_t>& table_rows) {
  ClickExample e;
  e.dense.resize(dense_features);
  e.ids.resize(features);
  for (std::size_t j = 0; j < dense_features; ++j)
    e.dense[j] = r.dense_missing[j] ? 0.f : static_cast<float>(std::log1p(static_cast<double>(std::max<std::int64_t>(r.dense[j], 0))));
  for (std::size_t f = 0; f < features; ++f) {
    const std::size_t rows = table_rows[f];
    e.ids[f] = r.categorical_missing[f] || rows < 2
                   ? 0
                   : static_cast<px::index_t>(1 + mix64(r.categorical[f]) % (rows - 1));
  }
  e.label = r.label;
  return e;
}

// ---------------------------------------------------------------- kernels

// The concatenation and its gradient, every block in one kernel: a row
// kernel (px::for_each_rows) over (r count + k, c), block k of row r a task
// on the host, an element a thread on a GPU. One kernel instead of one per
// block: on the host, one OpenMP team instead of 27.

/// cat[r, k dim + c] = blocks[k][r, c]: count blocks of rows x dim side by side.
template <class T>
struct ConcatBlocks {
  const T* const* blocks;  // count pointers, in the model's space
  T* cat;                  // rows x (count dim)
  std::size_t count, dim;
  PARALLAX_HOST_DEVICE void operator()(std::size_t rk, std::size_t c) const {
    cat[rk * dim + c] = blocks[rk % count][rk / count * dim + c];
  }
};

/// blocks[k][r, c] = cat[r, k dim + c]: the gradient of each block back out.
template <class T>
struct SplitBlocks {
  const T* cat;
  T* const* blocks;
  std::size_t count, dim;
  PARALLAX_HOST_DEVICE void operator()(std::size_t rk, std::size_t c) const {
    blocks[rk % count][rk / count * dim + c] = cat[rk * dim + c];
  }
};

/// out[b, c] = the mean of rows[k, c] over k in [offsets[b], offsets[b + 1]):
/// a bag's rows pooled by hand (0 for an empty bag).
template <class T>
struct MeanPool {
  const T* rows;
  const px::index_t* offsets;
  T* out;
  std::size_t dim;
  PARALLAX_HOST_DEVICE void operator()(std::size_t b, std::size_t c) const {
    const auto from = static_cast<std::size_t>(offsets[b]), to = static_cast<std::size_t>(offsets[b + 1]);
    T sum = 0;
    for (std::size_t k = from; k < to; ++k) sum += rows[k * dim + c];
    out[b * dim + c] = to > from ? sum / static_cast<T>(to - from) : T(0);
  }
};

/// grad[k, c] = pooled[bag[k], c] / its length: the mean's gradient, a row per id.
template <class T>
struct MeanScatter {
  const T* pooled;
  const px::index_t* offsets;
  const px::index_t* bag;  // bag of each id
  T* grad;
  std::size_t dim;
  PARALLAX_HOST_DEVICE void operator()(std::size_t k, std::size_t c) const {
    const auto b = static_cast<std::size_t>(bag[k]);
    grad[k * dim + c] = pooled[b * dim + c] / static_cast<T>(offsets[b + 1] - offsets[b]);
  }
};

// ---------------------------------------------------------------- the model

/// The variables and the per-step computation. The trainer takes the two
/// collections: `tables`, then `mlp`. The tables store Stored (float, or
/// px::bf16 / px::fp16: rows looked up and trained in float, stored in 16
/// bits, updates rounded stochastically).
template <class Space, class Stored = float>
class Model {
 public:
  using T = float;
  using Table = px::Variable<px::Sparse, Stored, Space>;
  using Dense = typename DenseLayer<Space, T>::Var;

  Model(const px::Context& ctx, const Config& cfg)
      : tables(make_tables(ctx, cfg)),
        bottom1(ctx, "bottom1", dense_features, cfg.bottom, Activation::relu, cfg.seed),
        bottom2(ctx, "bottom2", cfg.bottom, cfg.dim, Activation::relu, cfg.seed),
        top1(ctx, "top1", (features + 1) * cfg.dim, cfg.top, Activation::relu, cfg.seed),
        top2(ctx, "top2", cfg.top, 1, Activation::none, cfg.seed),
        mlp{bottom1.w, bottom1.b, bottom2.w, bottom2.b, top1.w, top1.b, top2.w, top2.b},
        cfg_(cfg) {}

  const Config& config() const noexcept { return cfg_; }

  /// Forward pass on this rank's share of a batch: logits into logits_,
  /// losses and hits into loss_, hits_. Collective (one batched lookup, or
  /// the rows of the one the step before prefetched). Given the next
  /// batch, starts its lookup (Trainer::prefetch) once this one's rows are in.
  template <class Trainer>
  void forward(Trainer& trainer, const Batch& batch, const Batch* next = nullptr) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows, dim = cfg_.dim, width = (features + 1) * dim;
    dense_in_.assign_from_host(batch.dense.data(), batch.dense.size());
    labels_.assign_from_host(batch.labels.data(), rows);
    concat_.resize_discard(rows * width);
    const T* b = bottom2.forward(ex, bottom1.forward(ex, dense_in_.data(), rows), rows);
    // Every table's rows in one batched lookup: one round for all 26 tables.
    const bool prefetched = ahead_.held;
    if (prefetched) {
      if (batch.ids != ahead_.ids_host)
        throw std::invalid_argument("ctr::Model: this batch is not the `next` batch the step before prefetched");
      std::swap(ids_, ahead_.ids);  // its ids are on the device already
    }
    constexpr bool pools = trains_bags<Trainer>();
    lookups_.clear();
    bags_.clear();
    for (std::size_t f = 0; f < features; ++f) {
      const std::size_t n = batch.ids[f].size();
      if (!prefetched) ids_[f].assign_from_host(batch.ids[f].data(), n);
      if (!batch.multi(f)) continue;
      offsets_[f].assign_from_host(batch.offsets[f].data(), rows + 1);
      if (pools && !cfg_.pool_by_hand)
        bags_.push_back(px::Bags<Table>(tables[f], offsets_[f], ids_[f], px::Combiner::mean).pooled_at(cfg_.pooling));
    }
    for (std::size_t f = 0; f < features; ++f)
      if (looked_up_plainly<Trainer>(batch, f)) lookups_.emplace_back(tables[f], ids_[f]);
    const std::size_t bags_ahead = prefetched ? ahead_.bags : 0;
    const auto looked_up = timed(ex, Part::parallax, [&] {
      if constexpr (Trainer::template can_prefetch<Table>)
        if (prefetched) return trainer.rows(ahead_.take());
      return trainer.lookup(lookups_);
    });
    // The pooled bags: the prefetch's last blocks, or looked up now.
    std::vector<typename Trainer::template RowsOf<Table>> pooled(looked_up.end() - static_cast<std::ptrdiff_t>(bags_ahead),
                                                                 looked_up.end());
    if constexpr (pools)
      if (!bags_.empty() && !bags_ahead)
        pooled = timed(ex, Part::parallax, [&] { return trainer.lookup(bags_.data(), bags_.size()); });
    // (Architectures whose lookups cannot run ahead, the asynchronous ones, look up each batch.)
    if constexpr (Trainer::template can_prefetch<Table>)
      if (next) prefetch(trainer, *next);
    // The concatenation: the bottom MLP's output, then each table's rows
    // (a multi-hot table's: its bags pooled, by the trainer or here).
    std::vector<const T*> sources{b};
    pooled_.resize_discard(features * rows * dim);
    for (std::size_t f = 0, plain = 0, bag = 0; f < features; ++f) {
      if (!batch.multi(f)) {
        sources.push_back(looked_up[plain++].data);
      } else if (looked_up_plainly<Trainer>(batch, f)) {
        T* out = pooled_.data() + f * rows * dim;
        px::for_each_rows(ex, rows, dim, MeanPool<T>{looked_up[plain++].data, offsets_[f].data(), out, dim});
        sources.push_back(out);
      } else {
        sources.push_back(pooled[bag++].data);
      }
    }
    sources_.assign_from_host(sources.data(), features + 1);
    px::for_each_rows(ex, rows * (features + 1), dim, ConcatBlocks<T>{sources_.data(), concat_.data(), features + 1, dim});
    const T* z = top2.forward(ex, top1.forward(ex, concat_.data(), rows), rows);
    loss_.resize_discard(rows);
    hits_.resize_discard(rows);
    if (rows)
      px::for_each(ex, rows, LogisticLoss<T>{z, top2.output_grad(), labels_.data(), loss_.data(), hits_.data(),
                                             T(1) / static_cast<T>(rows)});
    ex.synchronize();
  }

  /// One training step; returns this rank's mean loss. Collective. With
  /// `overlap`, the backward pass marks each layer's gradient ready as soon
  /// as it has written it (Trainer::ready), and the tables' once their rows
  /// are added, so the trainer moves them while the layers below compute;
  /// and given the next step's batch (`next`), its lookup starts while this
  /// batch computes (Trainer::prefetch), its rows taken by the next step.
  template <class Trainer>
  double train_step(Trainer& trainer, const Batch& batch, bool overlap = false, const Batch* next = nullptr) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows, dim = cfg_.dim, width = (features + 1) * dim;
    forward(trainer, batch, overlap ? next : nullptr);
    // forward() left d(loss)/d(logit) in top2's output gradient.
    top2.backward(ex, top1.output(), rows, top1.output_grad());
    ready(trainer, overlap, top2.w, top2.b);
    grad_concat_.resize_discard(rows * width);
    top1.backward(ex, concat_.data(), rows, grad_concat_.data());
    ready(trainer, overlap, top1.w, top1.b);
    // The concatenation's gradient split: the bottom MLP's, then each table's rows.
    grad_rows_.resize_discard(features * rows * dim);
    std::vector<T*> targets{bottom2.output_grad()};
    for (std::size_t f = 0; f < features; ++f) targets.push_back(grad_rows_.data() + f * rows * dim);
    targets_.assign_from_host(targets.data(), features + 1);
    px::for_each_rows(ex, rows * (features + 1), dim, SplitBlocks<T>{grad_concat_.data(), targets_.data(), features + 1, dim});
    ex.synchronize();
    // The tables' gradient rows are final: add them, and (overlap) their
    // push starts while the bottom MLP computes.
    timed(ex, Part::parallax, [&] {
      std::vector<px::BagGradient<Table>> bag_grads;
      for (std::size_t f = 0; f < features; ++f) {
        T* g = grad_rows_.data() + f * rows * dim;
        if (!batch.multi(f)) {
          tables[f].grad().add(ids_[f].data(), g, rows);
        } else if (looked_up_plainly<Trainer>(batch, f)) {  // a row per id: its bag's gradient over the length
          const std::size_t n = batch.ids[f].size();
          bag_of_.resize(n);
          for (std::size_t i = 0; i < rows; ++i)
            std::fill(bag_of_.begin() + batch.offsets[f][i], bag_of_.begin() + batch.offsets[f][i + 1],
                      static_cast<px::index_t>(i));
          bag_of_dev_.assign_from_host(bag_of_.data(), n);
          grad_ids_.resize_discard(n * dim);
          px::for_each_rows(ex, n, dim, MeanScatter<T>{g, offsets_[f].data(), bag_of_dev_.data(), grad_ids_.data(), dim});
          ex.synchronize();
          tables[f].grad().add(ids_[f].data(), grad_ids_.data(), n);
        } else {
          bag_grads.emplace_back(tables[f], g, rows);
        }
      }
      if constexpr (trains_bags<Trainer>())
        if (!bag_grads.empty()) trainer.bag_gradients(bag_grads);
    });
    ready(trainer, overlap, tables);
    bottom2.backward(ex, bottom1.output(), rows, bottom1.output_grad());
    ready(trainer, overlap, bottom2.w, bottom2.b);
    bottom1.backward(ex, dense_in_.data(), rows, nullptr);
    ready(trainer, overlap, bottom1.w, bottom1.b);
    ex.synchronize();
    timed(ex, Part::parallax, [&] { trainer.step(); });
    return rows ? sum_to_host(loss_, rows) / static_cast<double>(rows) : 0.0;
  }

  /// Sum of losses and of correct predictions over this rank's share of a
  /// held-out batch (forward only). Collective.
  template <class Trainer>
  std::pair<double, double> evaluate(Trainer& trainer, const Batch& batch) {
    forward(trainer, batch);
    return {sum_to_host(loss_, batch.rows), sum_to_host(hits_, batch.rows)};
  }

  /// Whether the trainer pools this model's bags (its tables' policy can).
  template <class Trainer>
  static constexpr bool trains_bags() {
    return px::policy::looks_up_bags_v<px::policy_for_t<typename Trainer::arch, Table>, Table,
                                       typename Trainer::engine_type, typename Trainer::optimizer>;
  }

  px::Variables<Table> tables;  ///< "emb00".."emb25", one per categorical feature
  DenseLayer<Space, T> bottom1, bottom2, top1, top2;
  /// Handles to the MLPs' variables (bottom first, weight before bias).
  px::Variables<Dense> mlp;

 private:
  static px::Variables<Table> make_tables(const px::Context& ctx, const Config& cfg) {
    px::Variables<Table> out;
    for (std::size_t f = 0; f < features; ++f)
      out.emplace_back(ctx, std::string("emb") + (f < 10 ? "0" : "") + std::to_string(f),
                       px::Shape{cfg.table_rows.at(f), cfg.dim}, px::init::Uniform{-0.05f, 0.05f, cfg.seed});
    if constexpr (px::is_half_v<Stored>)
      for (auto& t : out) t.set_rounding({px::Rounding::stochastic, cfg.seed});
    return out;
  }

  /// The next batch's lookup in flight: its ids (kept until its step swaps
  /// them in) and a host copy to check that step is given that batch.
  struct Ahead {
    bool held = false;
    std::size_t bags = 0;  // the requests of bags among its lookups (its last blocks)
    px::Prefetched<Table> lookups;
    std::array<px::Buffer<px::index_t, Space>, features> offsets;  // the bags' offsets
    std::array<px::Buffer<px::index_t, Space>, features> ids;
    std::array<std::vector<px::index_t>, features> ids_host;
    px::Prefetched<Table>& take() {
      held = false;
      return lookups;
    }
  };

  /// Whether feature f's ids go into the batched lookup of rows (one-hot,
  /// or multi-hot pooled here).
  template <class Trainer>
  bool looked_up_plainly(const Batch& batch, std::size_t f) const {
    return !batch.multi(f) || cfg_.pool_by_hand || !trains_bags<Trainer>();
  }

  /// Starts the next batch's lookup: its rows, and its bags where the
  /// trainer pools them ahead (ShardedPS: routed to their owners now,
  /// pooled when the next step takes them).
  template <class Trainer>
  void prefetch(Trainer& trainer, const Batch& next) {
    std::vector<px::Lookup<Table>> batch;
    std::vector<px::Bags<Table>> bags;
    for (std::size_t f = 0; f < features; ++f) {
      ahead_.ids[f].assign_from_host(next.ids[f].data(), next.ids[f].size());
      if (looked_up_plainly<Trainer>(next, f)) {
        batch.emplace_back(tables[f], ahead_.ids[f]);
      } else if constexpr (Trainer::template can_prefetch_bags<Table>) {
        ahead_.offsets[f].assign_from_host(next.offsets[f].data(), next.offsets[f].size());
        bags.push_back(px::Bags<Table>(tables[f], ahead_.offsets[f], ahead_.ids[f], px::Combiner::mean).pooled_at(cfg_.pooling));
      }
    }
    ahead_.ids_host = next.ids;
    ahead_.bags = bags.size();
    ahead_.lookups = timed(trainer.engine().exec(), Part::parallax, [&] {
      if constexpr (Trainer::template can_prefetch_bags<Table>) return trainer.prefetch(batch, bags);
      return trainer.prefetch(batch);
    });
    ahead_.held = true;
  }

  Config cfg_;
  Ahead ahead_;
  px::Buffer<T, Space> dense_in_, concat_, grad_concat_, grad_rows_, loss_, hits_, pooled_, grad_ids_;
  px::Buffer<std::int32_t, Space> labels_;
  px::Buffer<const T*, Space> sources_;
  px::Buffer<T*, Space> targets_;
  std::array<px::Buffer<px::index_t, Space>, features> ids_, offsets_;
  std::vector<px::Lookup<Table>> lookups_;
  std::vector<px::Bags<Table>> bags_;
  std::vector<px::index_t> bag_of_;
  px::Buffer<px::index_t, Space> bag_of_dev_;
};

}  // namespace examples::ctr
