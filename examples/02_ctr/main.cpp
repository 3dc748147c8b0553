// Example 02: a DLRM-style click-through-rate model: 26 categorical features,
// each with its own embedding table (sparse variables, power-law ids), 13
// dense features, bottom and top MLPs (dense variables), logistic loss.
// The synthetic data's --multi-hot largest features are bags of 1-100 ids
// (mean about 19), pooled by their mean: by the trainer (px::Bags, at the
// rows' owners with --pooling owner, whichever moves fewer bytes with auto)
// or, with --pooling local, by the model from a row per id.
//
//   mpiexec -n 2 build/host/examples/02_ctr --arch hybrid
//   mpiexec -n 4 build/host/examples/02_ctr --pooling owner
//   mpiexec -n 2 build/host/examples/02_ctr --data train.txt --max-records 1000000
//
// Default data: synthetic click logs with a planted signal (every id and dense
// feature has a hidden weight), so held-out accuracy must rise clearly above
// the majority-class rate. --data reads Criteo's TSV format (label, 13
// integer features, 26 hex categorical features; missing values allowed).
// The run passes when the held-out log loss is below --pass-ratio times that
// of the best constant prediction and the accuracy beats the majority class.
#include "common/auto_arch.hpp"
#include "common/async.hpp"
#include "common/backend.hpp"
#include "common/gemm.hpp"
#include "common/options.hpp"
#include "common/precision.hpp"
#include "common/progress.hpp"
#include "common/readers.hpp"
#include "common/synthetic.hpp"
#include "02_ctr/dynamic.hpp"
#include "02_ctr/model.hpp"

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <utility>
#include <tuple>
#include <vector>

namespace px = parallax;
namespace ctr = examples::ctr;

namespace {

struct Args {
  examples::CommonOptions common;
  ctr::Config model;
  std::size_t max_rows = 100000;
  std::string data;  // empty: synthetic
  std::size_t max_records = 0;
  double holdout = 0.1;
  std::size_t eval_examples = 4096;
  double pass_ratio = 0.95;
  std::string write_sample;  // write synthetic clicks as a Criteo file and exit
  std::size_t sample_records = 20000;
  std::size_t multi_hot = 4;  // synthetic data: multi-hot features
  std::string pooling = "auto";
  ctr::dynamic::Args dynamic;  // --dynamic: 02_ctr/dynamic.hpp
  examples::Precision precision;  // --table-type, --compress
};

const char* const about =
    "02_ctr: a DLRM-style click model (26 embedding tables as sparse variables, bottom and top MLPs as\n"
    "dense variables, logistic loss) trained with parallax. Prints loss, samples/s and bytes sent per\n"
    "step per rank; exits 0 when the held-out predictions beat a constant predictor.";

/// Where examples come from: synthetic (example g is a function of the seed
/// and g) or the records of a Criteo file (training records first, then the
/// held-out ones).
class Clicks {
 public:
  Clicks(const Args& a, std::vector<examples::CriteoRecord> records)
      : records_(std::move(records)), table_rows_(a.model.table_rows), multi_hot_(a.model.multi_hot),
        synthetic_(a.model.table_rows, ctr::dense_features, a.common.seed) {
    train_ = records_.size() - static_cast<std::size_t>(static_cast<double>(records_.size()) * a.holdout);
    synthetic_.set_multi_hot(multi_hot_);
  }
  bool synthetic() const noexcept { return records_.empty(); }

  /// Examples [first, first + count) of global batch `step`.
  void training(std::uint64_t step, std::size_t global_batch, std::size_t first, std::size_t count, ctr::Batch& b) const {
    b.multi_hot = multi_hot_;
    b.clear(count);
    for (std::size_t e = first; e < first + count; ++e) b.add(example(step * global_batch + e, false));
  }
  /// Held-out examples [first, first + count).
  void held_out(std::size_t first, std::size_t count, ctr::Batch& b) const {
    b.multi_hot = multi_hot_;
    b.clear(count);
    for (std::size_t e = first; e < first + count; ++e) b.add(example(e, true));
  }

 private:
  /// Example g, in a buffer reused from one example to the next (no heap
  /// allocation per synthetic record).
  const examples::ClickExample& example(std::uint64_t g, bool held_out) const {
    if (synthetic()) {
      synthetic_.make(held_out ? (std::uint64_t{1} << 40) + g : g, scratch_);  // held-out indices are never trained on
    } else {
      const std::size_t hold = records_.size() - train_;
      scratch_ = ctr::to_example(records_[held_out ? train_ + g % hold : g % train_], table_rows_);
    }
    return scratch_;
  }

  std::vector<examples::CriteoRecord> records_;
  std::vector<std::size_t> table_rows_;
  std::vector<bool> multi_hot_;
  mutable examples::ClickExample scratch_;
  examples::SyntheticClicks synthetic_;
  std::size_t train_ = 0;
};

/// Writes `n` synthetic click examples in Criteo's TSV format (a file to try
/// --data with): dense x as the integer round(e^(x + 1.5)), ids as 32-bit hex
/// values, 3% of the features missing.
void write_sample(const std::string& path, std::size_t n, const Args& a) {
  const examples::SyntheticClicks clicks(a.model.table_rows, ctr::dense_features, a.common.seed);  // one-hot, as Criteo
  std::ofstream out(path, std::ios::binary);
  if (!out) throw px::error("cannot write --write-sample " + path);
  examples::ClickExample e;
  auto missing = [&](std::uint64_t i, std::uint64_t field) {
    return examples::uniform(examples::hash(a.common.seed, 0x3155, i, field)) < 0.03;
  };
  for (std::uint64_t i = 0; i < n; ++i) {
    clicks.make(i, e);
    out << e.label;
    for (std::size_t j = 0; j < ctr::dense_features; ++j) {
      out << '\t';
      if (!missing(i, j)) out << std::llround(std::exp(static_cast<double>(e.dense[j]) + 1.5));
    }
    for (std::size_t f = 0; f < ctr::features; ++f) {
      out << '\t';
      if (missing(i, 100 + f)) continue;
      char hex[9];
      std::snprintf(hex, sizeof hex, "%08x",
                    static_cast<unsigned>(examples::mix64((std::uint64_t{f} << 32) | static_cast<std::uint64_t>(e.ids[f]))));
      out << hex;
    }
    out << '\n';
  }
  if (!out) throw px::error("writing " + path + " failed");
}

/// --arch auto: each table's distinct rows per step on this rank, over the
/// first 4 steps, and the MLPs' shapes, to examples::choose_arch.
std::string choose_arch(const px::Context& ctx, const Args& a, const Clicks& clicks) {
  const examples::Shard shard(a.common, ctx);
  const ctr::Config& m = a.model;
  std::vector<double> touched(ctr::features, 0.0);
  ctr::Batch batch;
  for (std::uint64_t s = 0; s < 4; ++s) {
    clicks.training(s, shard.global, shard.first, shard.batch, batch);
    for (std::size_t f = 0; f < ctr::features; ++f) {
      std::vector<px::index_t> ids = batch.ids[f];
      std::sort(ids.begin(), ids.end());
      touched[f] += static_cast<double>(std::unique(ids.begin(), ids.end()) - ids.begin()) / 4;
    }
  }
  std::vector<px::plan::Variable> vars;
  for (std::size_t f = 0; f < ctr::features; ++f)
    vars.push_back(px::plan::Variable::sparse_of("table" + std::to_string(f), m.table_rows[f], m.dim, touched[f]));
  const std::size_t shapes[4][2] = {{ctr::dense_features, m.bottom}, {m.bottom, m.dim},
                                    {(ctr::features + 1) * m.dim, m.top}, {m.top, 1}};
  for (const auto& s : shapes) {
    vars.push_back(px::plan::Variable::dense_of("w", s[0], s[1]));
    vars.push_back(px::plan::Variable::dense_of("b", 1, s[1]));
  }
  return examples::choose_arch(ctx, vars);
}

template <class Arch, class Stored = float>
int train(px::Context& ctx, const Args& a, const Clicks& clicks) {
  using Space = examples::DefaultSpace;
  const auto& o = a.common;
  const examples::Shard shard(o, ctx);  // --batch examples per rank

  // example-begin ctr_trainer
  ctr::Model<Space, Stored> model(ctx, a.model);
  px::TrainerOptions options = o.trainer_options();
  options.compress = a.precision.compression();
  // 34 variables in two collections: the 26 tables, then the MLPs' 8.
  px::Trainer<Arch, px::optim::Adagrad, examples::DefaultEngine> trainer(ctx, options,
                                                                         px::optim::Adagrad{o.lr}, model.tables,
                                                                         model.mlp);
  // example-end
  if (ctx.is_root()) {
    std::printf("architecture %s on %d ranks (%s space): tables -> %s, MLPs -> %s%s\n", Arch::name, ctx.size(),
                examples::space_name(), trainer.policy_of(model.tables[0]).c_str(),
                trainer.policy_of(model.top1.w).c_str(),
                trainer.in_shared_memory(model.tables[0]) ? "; shards in shared memory (lookups read them)" : "");
    std::fflush(stdout);
  }

  examples::Progress progress(trainer, shard.global, o.log_every, "samples", o.warmup);
  examples::Straggler straggler(o, ctx);  // --slow-rank, --slow-factor; each rank's own samples/s
  // Batches are made one ahead on another thread (the same records: an
  // example is a function of the seed and its index), so that samples/s
  // measures training; waiting for one counts as making batches. Only that
  // thread uses `clicks` until the loop ends.
  ctr::Batch made;
  std::future<void> making;
  auto start = [&](std::uint64_t s) {
    if (s < o.steps)
      making = std::async(std::launch::async, [&, s] { clicks.training(s, shard.global, shard.first, shard.batch, made); });
  };
  auto take = [&](std::uint64_t s, ctr::Batch& out) {  // batch s, which `making` makes
    examples::timed(examples::Part::input, [&] { making.get(); });
    std::swap(out, made);
    start(s + 1);
  };
  start(0);
  // --overlap on: the inputs a step ahead, so that the next batch's lookup
  // runs while this one computes.
  ctr::Batch batch, next;
  bool have_next = false;
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    if (have_next) std::swap(batch, next);
    else take(step, batch);
    have_next = o.overlapped() && step + 1 < o.steps;
    if (have_next) take(step + 1, next);
    straggler.begin();
    progress.record(model.train_step(trainer, batch, o.overlapped(), have_next ? &next : nullptr));
    straggler.end();
  }
  const examples::Summary s = progress.finish();
  examples::print_table_bytes(ctx, trainer, a.precision, model.tables);
  examples::plan_check(ctx, s);
  const double others = straggler.report(ctx, trainer, "samples");

  // Held-out log loss and accuracy, against the best constant prediction.
  std::vector<double> sums(3, 0.0);  // loss, correct, positives
  const px::BatchShare share = px::share_of(a.eval_examples, ctx);  // every rank evaluates its share
  clicks.held_out(share.first, share.count, batch);
  std::tie(sums[0], sums[1]) = model.evaluate(trainer, batch);
  for (auto y : batch.labels) sums[2] += y;
  sums = ctx.sum(std::move(sums));
  const double n = static_cast<double>(a.eval_examples);
  const double loss = sums[0] / n, accuracy = sums[1] / n, p = sums[2] / n;
  const double constant_loss = (p <= 0 || p >= 1) ? 0.0 : -(p * std::log(p) + (1 - p) * std::log(1 - p));
  const double majority = std::max(p, 1 - p);
  if (ctx.is_root()) {
    std::printf("  held-out (%zu examples): log loss %.4f (constant prediction: %.4f), accuracy %.4f (majority class: "
                "%.4f)\n",
                a.eval_examples, loss, constant_loss, accuracy, majority);
    std::printf("result: example=ctr arch=%s ranks=%d final_loss=%.7f final_loss_hex=%a samples_per_s=%.1f bytes_per_step=%.0f "
                "bytes_per_step_max=%.0f %s heldout_loss=%.6f accuracy=%.4f others_samples_per_s=%.1f skipped_steps=%llu\n",
                Arch::name, s.ranks, s.final_loss, s.final_loss, s.samples_per_s, s.bytes_per_step, s.bytes_per_step_max,
                s.shares().c_str(), loss, accuracy, others, static_cast<unsigned long long>(s.skipped_steps));
  }
  const bool passed = std::isfinite(loss) && loss < a.pass_ratio * constant_loss && accuracy > majority;
  char why[240];
  std::snprintf(why, sizeof why,
                "check: held-out log loss %.4f %s %.4f (%.2f x constant prediction) and accuracy %.4f %s %.4f (majority)",
                loss, loss < a.pass_ratio * constant_loss ? "<" : ">=", a.pass_ratio * constant_loss, a.pass_ratio,
                accuracy, accuracy > majority ? ">" : "<=", majority);
  return examples::verdict(ctx, passed, why);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.common.steps = 300;
  a.common.batch = 2048;  // DLRM trains on thousands of samples per GPU
  a.common.lr = 0.2f;
  a.common.log_every = 50;

  examples::po::options_description desc("options");
  examples::add_common_options(desc, a.common);
  desc.add_options()
    ("dim", examples::po::value(&a.model.dim)->default_value(a.model.dim), "embedding width")
    ("max-rows", examples::po::value(&a.max_rows)->default_value(a.max_rows),
     "rows of the largest tables (each table has Criteo's distinct-value count of its feature, capped here)")
    ("data", examples::po::value(&a.data), "train on this Criteo TSV file instead of synthetic data")
    ("max-records", examples::po::value(&a.max_records)->default_value(a.max_records),
     "with --data: read at most this many lines (0: all)")
    ("holdout", examples::po::value(&a.holdout)->default_value(a.holdout), "with --data: fraction held out")
    ("eval-examples", examples::po::value(&a.eval_examples)->default_value(a.eval_examples),
     "held-out examples for the final check")
    ("pass-ratio", examples::po::value(&a.pass_ratio)->default_value(a.pass_ratio),
     "pass when the held-out log loss is below this times a constant predictor's")
    ("write-sample", examples::po::value(&a.write_sample),
     "write --sample-records synthetic examples to this file in Criteo's format, and exit")
    ("sample-records", examples::po::value(&a.sample_records)->default_value(a.sample_records),
     "records for --write-sample")
    ("multi-hot", examples::po::value(&a.multi_hot)->default_value(a.multi_hot),
     "synthetic data: this many features (those with the most rows) are bags of 1-100 ids, pooled by their mean")
    ("pooling", examples::po::value(&a.pooling)->default_value(a.pooling),
     "multi-hot features: owner (the trainer pools at the rows' owners), local (a row per id, pooled by the model) "
     "or auto (the trainer pools wherever fewer bytes move)");
  examples::add_precision_options(desc, a.precision);

  ctr::dynamic::add_options(desc, a.dynamic);

  const auto cl = examples::parse_command_line(argc, argv, desc);
  px::Context ctx(argc, argv, cl.ok() ? a.common.context() : px::ContextOptions{});
  a.model.seed = a.common.seed;
  a.model.table_rows = ctr::criteo_table_rows(a.max_rows);
  a.model.pool_by_hand = a.pooling == "local";
  a.model.pooling = a.pooling == "owner" ? px::Pooling::owner : px::Pooling::automatic;

  std::vector<examples::CriteoRecord> records;
  std::string problem = cl.ok() ? examples::check_common(a.common, true) : "";
  if (cl.ok() && problem.empty()) {
    if (a.max_rows < 2 || a.model.dim == 0) problem = "--max-rows must be at least 2 and --dim at least 1";
    else if (a.multi_hot > ctr::features) problem = "--multi-hot must be at most " + std::to_string(ctr::features);
    else if (a.pooling != "owner" && a.pooling != "local" && a.pooling != "auto")
      problem = "--pooling must be owner, local or auto, not '" + a.pooling + "'";
    else if (a.eval_examples == 0) problem = "--eval-examples must be at least 1";
    else if (!examples::check_precision(a.precision).empty()) problem = examples::check_precision(a.precision);
    else if (!a.data.empty()) {
      std::ifstream in(a.data, std::ios::binary);
      if (!in) {
        problem = "cannot open --data " + a.data;
      } else {
        try {
          records = examples::read_criteo(in, a.max_records);
        } catch (const std::exception& e) {
          problem = a.data + ": " + e.what();
        }
        if (problem.empty() && (records.size() < 2 || !(a.holdout > 0 && a.holdout < 1) ||
                                static_cast<double>(records.size()) * a.holdout < 1))
          problem = "--data " + a.data + " holds " + std::to_string(records.size()) +
                    " records: too few to hold out --holdout " + std::to_string(a.holdout) + " of them";
      }
    }
  }
  if (cl.ok() && problem.empty()) problem = ctr::dynamic::check(a.dynamic);
  if (cl.ok() && problem.empty() && a.dynamic.on && !a.data.empty())
    problem = "--dynamic trains on its own stream of ids; leave out --data";
  if (const int code = examples::report_command_line(cl, problem, ctx, about, desc); code >= 0) return code;
  examples::warn_about_blas(ctx);
  if (a.dynamic.on) return ctr::dynamic::run(ctx, a.common, a.model, a.dynamic, a.eval_examples, a.pass_ratio);
  // Criteo's records hold one value per feature: multi-hot is synthetic only.
  a.model.multi_hot = ctr::largest_features(a.model.table_rows, a.data.empty() ? a.multi_hot : 0);
  if (!a.write_sample.empty()) {
    if (ctx.is_root()) {
      write_sample(a.write_sample, a.sample_records, a);
      std::printf("wrote %zu synthetic records in Criteo's format to %s\n", a.sample_records, a.write_sample.c_str());
    }
    return 0;
  }

  std::size_t table_total = 0;
  for (auto r : a.model.table_rows) table_total += r;
  if (ctx.is_root()) {
    std::printf("02_ctr: %zu tables (%zu rows in all, largest %zu) of width %zu, MLPs %zu-%zu-%zu and %zu-%zu-1, batch "
                "%zu samples per rank (%zu in all), %zu steps, lr %g, seed %llu; data: %s; multi-hot features: %zu (pooling %s); "
                "matrix products: %s\n",
                ctr::features, table_total, a.max_rows, a.model.dim, ctr::dense_features, a.model.bottom, a.model.dim,
                (ctr::features + 1) * a.model.dim, a.model.top, a.common.batch,
                a.common.batch * static_cast<std::size_t>(ctx.size()), a.common.steps, static_cast<double>(a.common.lr),
                static_cast<unsigned long long>(a.common.seed),
                a.data.empty() ? "synthetic clicks with a planted signal" : a.data.c_str(),
                static_cast<std::size_t>(std::count(a.model.multi_hot.begin(), a.model.multi_hot.end(), true)),
                a.pooling.c_str(), examples::gemm_description<examples::DefaultSpace>().c_str());
    std::fflush(stdout);
  }
  const Clicks clicks(a, std::move(records));
  examples::CommonOptions common = a.common;
  if (common.arch == "auto") common.arch = choose_arch(ctx, a, clicks);
  return examples::with_arch(common, [&](auto arch) {
    return examples::with_table_type<decltype(arch)>(
        a.precision, [&](auto stored) { return train<decltype(arch), decltype(stored)>(ctx, a, clicks); });
  });
}
