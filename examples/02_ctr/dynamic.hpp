#pragma once
/// @file
/// 02_ctr --dynamic: the click model on a stream whose key space grows, with
/// a DynamicVariable per categorical feature (docs/design.md, "Dynamic
/// tables"). Each example's ids are 64-bit hashes:
///
///   * a Zipf head (--dynamic-head-fraction of the ids): rank r of a pool that
///     starts at --dynamic-head ids and gains --dynamic-growth new ids every
///     step, so the popular ids stay and new ones keep arriving;
///   * a long tail (the rest): an id drawn for this example and feature
///     alone, seen once.
///
/// Every popular id has a hidden weight and the label is drawn from the
/// logistic of their sum and the dense features': the head is learnable, the
/// tail carries nothing to learn but takes rows (unless admission refuses). The tables hold --dynamic-capacity rows per rank in all (split
/// evenly over the features), evict by --dynamic-evict, admit by
/// --dynamic-admit; the progress lines add the tables' statistics and each
/// rank's resident memory against the tables' bytes (VmRSS, VmHWM).
/// Under --arch allreduce every rank holds a replica of every table
/// (AllGatherv), elsewhere its shard (DynamicPS). Host memory only: the CUDA
/// build refuses --dynamic.

#include "../common/backend.hpp"
#include "../common/layers.hpp"
#include "../common/options.hpp"
#include "../common/progress.hpp"
#include "../common/synthetic.hpp"
#include "model.hpp"

#include <parallax/parallax.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace examples::ctr::dynamic {

namespace px = parallax;

/// The --dynamic options.
struct Args {
  bool on = false;
  std::size_t features = 8;            ///< categorical features, a table each
  std::size_t capacity = 200000;       ///< rows per rank over all tables
  std::string evict = "lru";           ///< lru | lfu
  double evict_fraction = 0.01;        ///< of a full table's rows evicted at once
  std::string admit = "always";        ///< always | count-min | probability
  std::uint32_t sightings = 2;         ///< count-min: sightings before a key takes a row
  double probability = 0.5;            ///< probability: admission chance per sighting
  std::size_t head = 100000;           ///< head ids at step 0
  std::size_t growth = 1000;           ///< head ids added per step
  double head_fraction = 0.6;          ///< ids drawn from the head; the rest are seen once
  double zipf = 1.1;                   ///< the head's Zipf exponent
  /// Fixed tables instead (the baseline of docs/benchmarks.md, "02_ctr
  /// --dynamic against fixed tables"): a sparse Variable per feature of
  /// the dynamic tables' live rows over all ranks, each key hashed into it.
  bool fixed = false;
};

inline void add_options(po::options_description& desc, Args& a) {
  po::options_description d("--dynamic: 64-bit ids into dynamic tables (host build)");
  d.add_options()
    ("dynamic", po::bool_switch(&a.on), "train on a growing stream of 64-bit ids with a DynamicVariable per feature")
    ("dynamic-features", po::value(&a.features)->default_value(a.features), "categorical features (a table each)")
    ("dynamic-capacity", po::value(&a.capacity)->default_value(a.capacity),
     "rows per rank over all tables (each table holds its even share)")
    ("dynamic-evict", po::value(&a.evict)->default_value(a.evict), "eviction when a table is full: lru or lfu")
    ("dynamic-evict-fraction", po::value(&a.evict_fraction)->default_value(a.evict_fraction),
     "the fraction of a full table's rows evicted at once (the lowest at that moment)")
    ("dynamic-admit", po::value(&a.admit)->default_value(a.admit),
     "admission: always, count-min (a key takes a row at its --dynamic-sightings-th sighting) or probability")
    ("dynamic-sightings", po::value(&a.sightings)->default_value(a.sightings), "count-min admission's sightings")
    ("dynamic-probability", po::value(&a.probability)->default_value(a.probability),
     "probability admission's chance per sighting")
    ("dynamic-head", po::value(&a.head)->default_value(a.head), "the popular ids' pool at step 0 (per feature)")
    ("dynamic-growth", po::value(&a.growth)->default_value(a.growth), "new popular ids per step (per feature)")
    ("dynamic-head-fraction", po::value(&a.head_fraction)->default_value(a.head_fraction),
     "fraction of ids drawn from the popular pool; the rest are seen once")
    ("dynamic-zipf", po::value(&a.zipf)->default_value(a.zipf), "the popular pool's Zipf exponent (not 1)")
    ("dynamic-fixed", po::bool_switch(&a.fixed),
     "the same model and stream with fixed sparse tables of --dynamic-capacity x ranks rows in all, each key "
     "hashed into its table (key mod rows): the baseline of the dynamic tables' speed");
  desc.add(d);
}

/// The first problem with the --dynamic options, or "".
inline std::string check(const Args& a) {
  if (!a.on) return "";
  if (!std::is_same_v<DefaultSpace, px::HostSpace>) return "--dynamic needs the host build (dynamic tables live in host memory)";
  if (a.features == 0 || a.features > features) return "--dynamic-features must be 1-" + std::to_string(features);
  if (a.capacity < a.features) return "--dynamic-capacity must be at least --dynamic-features (a row per table)";
  if (a.evict != "lru" && a.evict != "lfu") return "--dynamic-evict must be lru or lfu, not '" + a.evict + "'";
  if (!(a.evict_fraction > 0 && a.evict_fraction <= 1)) return "--dynamic-evict-fraction must be in (0, 1]";
  if (a.admit != "always" && a.admit != "count-min" && a.admit != "probability")
    return "--dynamic-admit must be always, count-min or probability, not '" + a.admit + "'";
  if (a.sightings == 0) return "--dynamic-sightings must be at least 1";
  if (!(a.probability > 0 && a.probability <= 1)) return "--dynamic-probability must be in (0, 1]";
  if (a.head == 0) return "--dynamic-head must be at least 1";
  if (!(a.head_fraction >= 0 && a.head_fraction <= 1)) return "--dynamic-head-fraction must be in [0, 1]";
  if (!(a.zipf > 0) || a.zipf == 1) return "--dynamic-zipf must be positive and not 1";
  return "";
}

/// The table options of one feature's table.
inline px::dynamic::Options table_options(const Args& a, std::size_t dim, std::uint64_t seed) {
  px::dynamic::Options o;
  o.capacity = std::max<std::size_t>(1, a.capacity / a.features);
  o.cols = dim;
  o.init = px::init::Uniform{-0.05f, 0.05f, seed};
  o.evict = a.evict == "lfu" ? px::dynamic::Evict::lfu : px::dynamic::Evict::lru;
  o.evict_fraction = a.evict_fraction;
  if (a.admit == "count-min") {
    px::dynamic::admit::CountMin cm;
    cm.sightings = a.sightings;
    o.admission = cm;
  } else if (a.admit == "probability") {
    o.admission = px::dynamic::admit::Probability{a.probability};
  }
  return o;
}

/// One rank's share of a step.
struct Batch {
  std::size_t rows = 0;
  std::vector<float> dense;                       ///< rows x dense_features
  std::vector<std::vector<std::uint64_t>> keys;   ///< per feature: rows ids
  std::vector<std::int32_t> labels;
};

/// The stream: example g of step s is a pure function of (seed, s, g), so
/// every rank count sees the same global batches.
class Stream {
 public:
  Stream(const Args& a, std::uint64_t seed) : a_(a), seed_(seed) {}

  /// Examples [first, first + count) of global batch `step` (held_out: of
  /// the held-out set, drawn at `step` but never trained on). Returns how
  /// many of its ids are seen once (the tail's).
  std::size_t batch(std::uint64_t step, std::size_t global, std::size_t first, std::size_t count, Batch& b,
             bool held_out = false) const {
    b.rows = count;
    b.dense.resize(count * dense_features);
    b.keys.assign(a_.features, std::vector<std::uint64_t>(count));
    b.labels.resize(count);
    const std::uint64_t pool = a_.head + a_.growth * step;
    std::size_t once = 0;
    for (std::size_t e = 0; e < count; ++e) {
      const std::uint64_t g = (held_out ? std::uint64_t{1} << 50 : 0) + step * global + first + e;
      double logit = -0.3;
      for (std::size_t j = 0; j < dense_features; ++j) {
        const float x = static_cast<float>(2 * uniform(hash(seed_, 0xd0, g, j)) - 1);
        b.dense[e * dense_features + j] = x;
        logit += 0.4 * (2 * uniform(hash(seed_, 0xd1, j)) - 1) * x;
      }
      for (std::size_t f = 0; f < a_.features; ++f) {
        if (uniform(hash(seed_, 0xd2, g, f)) < a_.head_fraction) {
          const std::uint64_t key = hash(seed_, 0xd3, f, zipf_rank(uniform(hash(seed_, 0xd4, g, f)), pool));
          b.keys[f][e] = key;
          logit += 1.5 * (2 * uniform(hash(seed_, 0xd6, key)) - 1);
        } else {
          b.keys[f][e] = hash(seed_, 0xd5, g, f);  // this example's alone: no signal to learn
          ++once;
        }
      }
      b.labels[e] = uniform(hash(seed_, 0xd7, g)) < 1 / (1 + std::exp(-logit)) ? 1 : 0;
    }
    return once;
  }
  /// The popular pool's size at `step`, per feature.
  std::uint64_t pool(std::uint64_t step) const { return a_.head + a_.growth * step; }

 private:
  /// Rank in [0, n) of a Zipf(s) draw by the inverse of the continuous CDF.
  std::uint64_t zipf_rank(double u, std::uint64_t n) const {
    const double s = a_.zipf, top = std::pow(static_cast<double>(n) + 1, 1 - s);
    const double x = std::pow(1 + u * (top - 1), 1 / (1 - s));
    return std::min<std::uint64_t>(n - 1, static_cast<std::uint64_t>(std::max(x, 1.0)) - 1);
  }

  Args a_;
  std::uint64_t seed_;
};

/// This process's resident memory now and at its peak (VmRSS, VmHWM), bytes.
inline std::pair<double, double> resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  double rss = 0, hwm = 0, kib = 0;
  while (in >> key) {
    if (key == "VmRSS:" && in >> kib) rss = kib * 1024;
    else if (key == "VmHWM:" && in >> kib) hwm = kib * 1024;
  }
  return {rss, hwm};
}

/// The model: a table per feature, the bottom and top MLPs. Tables are
/// DynamicVariables, or with V a fixed sparse Variable (--dynamic-fixed) of
/// the dynamic tables' live rows over all ranks, each key hashed into it.
template <class V = px::DynamicVariable<float>>
class ModelOf {
 public:
  using T = float;
  using Var = V;
  using Dense = DenseLayer<px::HostSpace, T>;
  static constexpr bool dynamic = px::dynamic::is_dynamic_v<V>;

  ModelOf(const px::Context& ctx, const Config& cfg, const Args& a)
      : bottom1(ctx, "bottom1", dense_features, cfg.bottom, Activation::relu, cfg.seed),
        bottom2(ctx, "bottom2", cfg.bottom, cfg.dim, Activation::relu, cfg.seed),
        top1(ctx, "top1", (a.features + 1) * cfg.dim, cfg.top, Activation::relu, cfg.seed),
        top2(ctx, "top2", cfg.top, 1, Activation::none, cfg.seed),
        mlp{bottom1.w, bottom1.b, bottom2.w, bottom2.b, top1.w, top1.b, top2.w, top2.b}, dim_(cfg.dim) {
    const auto o = table_options(a, cfg.dim, cfg.seed);
    rows_ = o.capacity * static_cast<std::size_t>(ctx.size());
    for (std::size_t f = 0; f < a.features; ++f) {
      const std::string name = std::string("dyn") + (f < 10 ? "0" : "") + std::to_string(f);
      if constexpr (dynamic) tables.emplace_back(ctx, name, o);
      else tables.emplace_back(ctx, name, px::Shape{rows_, cfg.dim}, o.init);
    }
  }

  /// One training step on this rank's share; returns its mean loss. Collective.
  template <class Trainer>
  double train_step(Trainer& trainer, const Batch& batch) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows, width = (tables.size() + 1) * dim_;
    forward(trainer, batch);
    top2.backward(ex, top1.output(), rows, top1.output_grad());
    grad_concat_.resize(rows * width);
    top1.backward(ex, concat_.data(), rows, grad_concat_.data());
    grad_rows_.resize(tables.size() * rows * dim_);
    std::vector<T*> targets{bottom2.output_grad()};
    for (std::size_t f = 0; f < tables.size(); ++f) targets.push_back(grad_rows_.data() + f * rows * dim_);
    px::for_each_rows(ex, rows * (tables.size() + 1), dim_,
                      SplitBlocks<T>{grad_concat_.data(), targets.data(), tables.size() + 1, dim_});
    for (std::size_t f = 0; f < tables.size(); ++f) {
      if constexpr (dynamic) tables[f].grad().add(batch.keys[f].data(), grad_rows_.data() + f * rows * dim_, rows);
      else tables[f].grad().add(ids_[f].data(), grad_rows_.data() + f * rows * dim_, rows);
    }
    bottom2.backward(ex, bottom1.output(), rows, bottom1.output_grad());
    bottom1.backward(ex, batch.dense.data(), rows, nullptr);
    ex.synchronize();
    timed(ex, Part::parallax, [&] { trainer.step(); });
    return rows ? sum(loss_) / static_cast<double>(rows) : 0.0;
  }

  /// Sums of losses and of correct predictions over this rank's share of a
  /// held-out batch (its new ids get rows: a lookup inserts). Collective.
  template <class Trainer>
  std::pair<double, double> evaluate(Trainer& trainer, const Batch& batch) {
    forward(trainer, batch);
    return {sum(loss_), sum(hits_)};
  }

  std::vector<Var> tables;  ///< "dyn00".., one per feature
  Dense bottom1, bottom2, top1, top2;
  px::Variables<typename Dense::Var> mlp;

 private:
  template <class Trainer>
  void forward(Trainer& trainer, const Batch& batch) {
    auto& ex = trainer.engine().exec();
    const std::size_t rows = batch.rows, width = (tables.size() + 1) * dim_;
    const T* b = bottom2.forward(ex, bottom1.forward(ex, batch.dense.data(), rows), rows);
    std::vector<px::Lookup<Var>> lookups;  // every table in one batched lookup
    ids_.resize(tables.size());
    for (std::size_t f = 0; f < tables.size(); ++f) {
      if constexpr (dynamic) {
        lookups.emplace_back(tables[f], reinterpret_cast<const px::index_t*>(batch.keys[f].data()), rows);
      } else {
        ids_[f].resize(rows);
        for (std::size_t i = 0; i < rows; ++i) ids_[f][i] = static_cast<px::index_t>(batch.keys[f][i] % rows_);
        lookups.emplace_back(tables[f], ids_[f].data(), rows);
      }
    }
    const auto looked_up = timed(ex, Part::parallax, [&] { return trainer.lookup(lookups); });
    std::vector<const T*> sources{b};
    for (const auto& r : looked_up) sources.push_back(r.data);
    concat_.resize(rows * width);
    px::for_each_rows(ex, rows * (tables.size() + 1), dim_,
                      ConcatBlocks<T>{sources.data(), concat_.data(), tables.size() + 1, dim_});
    const T* z = top2.forward(ex, top1.forward(ex, concat_.data(), rows), rows);
    loss_.resize(rows);
    hits_.resize(rows);
    if (rows)
      px::for_each(ex, rows, LogisticLoss<T>{z, top2.output_grad(), batch.labels.data(), loss_.data(), hits_.data(),
                                             T(1) / static_cast<T>(rows)});
    ex.synchronize();
  }
  static double sum(const std::vector<T>& v) {
    double s = 0;
    for (T x : v) s += x;
    return s;
  }

  std::size_t dim_;
  std::size_t rows_ = 0;                       // a fixed table's rows
  std::vector<std::vector<px::index_t>> ids_;  // a fixed table's ids: the keys mod rows_
  std::vector<T> concat_, grad_concat_, grad_rows_, loss_, hits_;
};
using Model = ModelOf<>;

/// The synchronizer of the tables: DynamicPS's shards, or under --arch
/// allreduce AllGatherv's replicas.
template <class Trainer>
auto& tables_sync(Trainer& trainer) {
  return trainer.template synchronizer<px::policy_for_t<typename Trainer::arch, Model::Var>>();
}

/// Prints (rank 0) the tables' statistics summed over them and the ranks
/// (a replica's, which every rank holds alike, under AllGatherv), and each
/// rank's resident memory against its tables' bytes. Collective.
template <class Trainer>
void print_tables(Trainer& trainer, Model& model, std::uint64_t step, double baseline_rss) {
  auto& sync = tables_sync(trainer);
  px::dynamic::Stats t;
  double table_bytes = 0;
  for (auto& v : model.tables) {
    const px::policy::DynamicStats s = sync.stats(v);
    t.size += s.total.size;
    t.capacity += s.total.capacity;
    t.lookups += s.total.lookups;
    t.hits += s.total.hits;
    t.inserts += s.total.inserts;
    t.evictions += s.total.evictions;
    t.admissions_refused += s.total.admissions_refused;
    table_bytes += static_cast<double>(sync.table(v).bytes());
  }
  const auto [rss, hwm] = resident_bytes();
  const auto& ctx = trainer.context();
  const double max_rss = ctx.max(rss), max_hwm = ctx.max(hwm), max_tables = ctx.max(table_bytes);
  const double max_grown = ctx.max(hwm - baseline_rss);
  if (ctx.is_root()) {
    std::printf("  tables at step %llu: size %llu of %llu, inserts %llu, evictions %llu, admissions refused %llu, "
                "hit rate %.4f; per rank (largest): tables %s, VmRSS %s, VmHWM %s, VmHWM - before the model %s "
                "(%.3f x the tables)\n",
                static_cast<unsigned long long>(step), static_cast<unsigned long long>(t.size),
                static_cast<unsigned long long>(t.capacity), static_cast<unsigned long long>(t.inserts),
                static_cast<unsigned long long>(t.evictions), static_cast<unsigned long long>(t.admissions_refused),
                t.hit_rate(), format_bytes(max_tables).c_str(), format_bytes(max_rss).c_str(),
                format_bytes(max_hwm).c_str(), format_bytes(max_grown).c_str(),
                max_tables > 0 ? max_grown / max_tables : 0.0);
    std::fflush(stdout);
  }
}

/// Trains the --dynamic model under Arch (a synchronous architecture), then
/// checks held-out predictions against a constant one. Collective; returns
/// the exit code.
template <class Arch, class Model = ModelOf<>>
int train(px::Context& ctx, const CommonOptions& o, const Config& cfg, const Args& a, std::size_t eval_examples,
          double pass_ratio) {
  const double before = resident_bytes().first;  // the process before the tables exist
  const std::size_t global = o.batch * static_cast<std::size_t>(ctx.size());
  const std::size_t first = o.batch * static_cast<std::size_t>(ctx.rank());
  Model model(ctx, cfg, a);
  px::TrainerOptions to = o.trainer_options();
  to.overlap = false;  // the model marks no gradient ready
  to.update_when_ready = false;
  px::Trainer<Arch, px::optim::Adagrad, HostEngine> trainer(ctx, to, px::optim::Adagrad{o.lr}, model.tables,
                                                                 model.mlp);
  if (!Model::dynamic && ctx.is_root()) {
    std::printf("02_ctr --dynamic --dynamic-fixed: %zu fixed sparse tables of %zu rows (the keys mod rows), width "
                "%zu; architecture %s on %d ranks, batch %zu per rank, %zu steps\n",
                model.tables.size(), model.tables[0].shape().rows, cfg.dim, Arch::name, ctx.size(), o.batch, o.steps);
    std::fflush(stdout);
  }
  if constexpr (Model::dynamic) if (ctx.is_root()) {
    const auto& t = tables_sync(trainer).table(model.tables[0]);
    std::printf("02_ctr --dynamic: %zu dynamic tables of %zu rows per rank each (%s a rank for them all, %zu bytes a "
                "row), width %zu, eviction %s, admission %s; stream: %.0f%% of ids from a Zipf(%.2f) pool of %zu + %zu "
                "per step, the rest seen once; architecture %s on %d ranks, batch %zu per rank, %zu steps\n",
                model.tables.size(), t.capacity(), format_bytes(static_cast<double>(t.bytes() * model.tables.size())).c_str(),
                t.bytes() / std::max<std::size_t>(t.capacity(), 1), cfg.dim, a.evict.c_str(), a.admit.c_str(),
                100 * a.head_fraction, a.zipf, a.head, a.growth, Arch::name, ctx.size(), o.batch, o.steps);
    std::fflush(stdout);
  }
  const Stream stream(a, o.seed);
  Progress progress(trainer, global, o.log_every, "samples", o.warmup);
  Batch batch;
  double once = 0;  // ids seen once, on this rank
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    timed(trainer.engine().exec(), Part::input,
          [&] { once += static_cast<double>(stream.batch(step, global, first, o.batch, batch)); });
    progress.record(model.train_step(trainer, batch));
    const std::uint64_t done = step + 1;
    if constexpr (Model::dynamic)
      if (done == 1 || done % std::max<std::size_t>(o.log_every, 1) == 0 || done == o.steps)
        print_tables(trainer, model, done, before);
  }
  const Summary s = progress.finish();
  once = ctx.sum(once);
  if (ctx.is_root())
    std::printf("  stream: %.0f ids seen once and popular pools of %llu ids per feature: %.0f to %.0f distinct keys\n",
                once, static_cast<unsigned long long>(stream.pool(o.steps - 1)), once,
                once + static_cast<double>(stream.pool(o.steps - 1) * a.features));

  const px::BatchShare share = px::share_of(eval_examples, ctx);
  stream.batch(o.steps, eval_examples, share.first, share.count, batch, true);
  std::vector<double> sums(3, 0.0);  // loss, correct, positives
  std::tie(sums[0], sums[1]) = model.evaluate(trainer, batch);
  for (auto y : batch.labels) sums[2] += y;
  sums = ctx.sum(std::move(sums));
  const double n = static_cast<double>(eval_examples);
  const double loss = sums[0] / n, accuracy = sums[1] / n, p = sums[2] / n;
  const double constant_loss = (p <= 0 || p >= 1) ? 0.0 : -(p * std::log(p) + (1 - p) * std::log(1 - p));
  if (ctx.is_root()) {
    std::printf("  held-out (%zu examples): log loss %.4f (constant prediction: %.4f), accuracy %.4f\n", eval_examples,
                loss, constant_loss, accuracy);
    std::printf("result: example=ctr_dynamic arch=%s ranks=%d final_loss=%.7f final_loss_hex=%a samples_per_s=%.1f "
                "heldout_loss=%.6f accuracy=%.4f\n",
                Arch::name, s.ranks, s.final_loss, s.final_loss, s.samples_per_s, loss, accuracy);
  }
  const bool passed = std::isfinite(loss) && loss < pass_ratio * constant_loss;
  char why[200];
  std::snprintf(why, sizeof why, "check: held-out log loss %.4f %s %.4f (%.2f x constant prediction)", loss,
                passed ? "<" : ">=", pass_ratio * constant_loss, pass_ratio);
  return verdict(ctx, passed, why);
}

/// train() under --arch: an architecture of px::arch::all: hybrid or ps
/// (DynamicPS shards the tables) or allreduce (AllGatherv replicates them on
/// every rank); the asynchronous architectures take no dynamic variables. A template so
/// that the CUDA build, which refuses --dynamic, never instantiates it.
template <class Space = DefaultSpace>
int run(px::Context& ctx, const CommonOptions& o, const Config& cfg, const Args& a, std::size_t eval_examples,
        double pass_ratio) {
  if constexpr (!std::is_same_v<Space, px::HostSpace>) {
    throw px::error("--dynamic needs the host build (dynamic tables live in host memory)");
  } else {
  if (o.sync != "sync") throw px::error("--dynamic trains synchronously: --sync async takes no dynamic variables");
  // auto plans no dynamic tables: the hybrid serves them.
  return px::with_arch(o.arch == "auto" ? std::string(px::arch::Hybrid::name) : o.arch, [&](auto arch) {
    using Arch = decltype(arch);
    if (a.fixed) return train<Arch, ModelOf<px::Variable<px::Sparse, float>>>(ctx, o, cfg, a, eval_examples, pass_ratio);
    return train<Arch>(ctx, o, cfg, a, eval_examples, pass_ratio);
  });
  }
}

}  // namespace examples::ctr::dynamic
