// Example 01: a word language model with LM1B's two large sparse tables (the
// input embedding and the sampled-softmax weights) and a dense hidden layer,
// trained data-parallel. Under --arch hybrid the tables are sharded over the
// ranks (each pulls and pushes only the rows its batch touches) and the dense
// layer is all-reduced.
//
//   mpiexec -n 4 build/host/examples/01_word_lm --arch hybrid --steps 200
//   mpiexec -n 2 build/host/examples/01_word_lm --corpus my.txt --vocab 50000
//
// Default data: a seeded synthetic corpus of Zipf-distributed words with
// learnable bigrams, made in memory. The run passes when the final training
// loss is below --pass-ratio times the untrained model's (step 1).
#include "common/auto_arch.hpp"
#include "common/async.hpp"
#include "common/backend.hpp"
#include "common/gemm.hpp"
#include "common/options.hpp"
#include "common/precision.hpp"
#include "common/progress.hpp"
#include "common/readers.hpp"
#include "common/synthetic.hpp"
#include "01_word_lm/model.hpp"

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace px = parallax;
namespace lm = examples::word_lm;

namespace {

struct Args {
  examples::CommonOptions common;
  lm::Config model;
  std::string corpus;            // empty: synthetic
  std::size_t tokens = 1000000;  // synthetic corpus length
  std::size_t eval_examples = 128;
  int partitions = 0;  // per sparse table; 0: planned from the ids of the first steps
  double pass_ratio = 0.8;
  examples::Precision precision;  // --table-type, --compress
};

const char* const about =
    "01_word_lm: a feed-forward word language model with an input embedding and a sampled-softmax\n"
    "output layer (both sparse variables, as in LM1B) and a dense tanh hidden layer, trained with\n"
    "parallax. Prints loss, samples/s and bytes sent per step per rank; exits 0 when it learned.";

/// Partition count for a sparse table: planned by parallax's load model from
/// ids this rank will look up in the first few steps (hot low word ids make
/// one partition per rank uneven), unless given.
int plan(const px::Context& ctx, std::size_t rows, const std::vector<px::index_t>& sample, int given) {
  if (given > 0) return given;
  examples::HostEngine planner(ctx);
  std::vector<int> candidates;
  for (int f = 1; f <= 256; f *= 2)
    if (static_cast<std::size_t>(f * ctx.size()) <= rows) candidates.push_back(f * ctx.size());
  return px::plan_partitions(planner, rows, sample, candidates, 0.05).partitions;
}

template <class Arch, class Stored>
int train_stored(px::Context& ctx, const Args& a, const std::vector<std::int32_t>& tokens) {
  using Space = examples::DefaultSpace;
  const auto& o = a.common;
  const lm::Config& cfg = a.model;
  // example-begin word_lm_shard
  // --batch words per rank: this rank's share of every global batch (ranks x
  // batch words) is examples [first, first + batch).
  const examples::Shard shard(o, ctx);
  // example-end
  const lm::Windows windows(tokens, cfg.context, o.seed);
  const examples::LogUniformSampler sampler(cfg.vocab);

  // Partitions of the two tables, from the ids of the first 4 steps.
  std::vector<px::index_t> emb_sample, softmax_sample;
  for (std::uint64_t s = 0; s < 4; ++s) {
    const lm::Batch b = windows.training(s, shard.global, shard.first, shard.batch);
    const lm::Candidates c = lm::make_candidates(sampler, cfg.sampled, o.seed, s, b);
    emb_sample.insert(emb_sample.end(), b.context.begin(), b.context.end());
    softmax_sample.insert(softmax_sample.end(), c.ids.begin(), c.ids.end());
  }

  // example-begin word_lm_trainer
  lm::Model<Space, Stored> model(ctx, cfg);
  px::TrainerOptions options = o.trainer_options();  // --overlap
  options.compress = a.precision.compression();      // --compress
  options.partitions["emb"] = plan(ctx, cfg.vocab, emb_sample, a.partitions);
  options.partitions["softmax"] = plan(ctx, cfg.vocab, softmax_sample, a.partitions);
  px::Trainer<Arch, px::optim::Adagrad, examples::DefaultEngine> trainer(
      ctx, options, px::optim::Adagrad{o.lr}, model.emb, model.hidden.w, model.hidden.b, model.softmax);
  // example-end
  if (ctx.is_root()) {
    std::printf("architecture %s on %d ranks (%s space): ", Arch::name, ctx.size(), examples::space_name());
    std::printf("emb -> %s, softmax -> %s, hidden -> %s; partitions emb %d, softmax %d%s\n",
                trainer.policy_of(model.emb).c_str(), trainer.policy_of(model.softmax).c_str(),
                trainer.policy_of(model.hidden.w).c_str(), options.partitions["emb"], options.partitions["softmax"],
                trainer.in_shared_memory(model.softmax) ? "; shards in shared memory (lookups read them)" : "");
    std::fflush(stdout);
  }

  // example-begin word_lm_loop
  examples::Progress progress(trainer, shard.global, o.log_every, "words", o.warmup);
  examples::Straggler straggler(o, ctx);  // --slow-rank, --slow-factor; each rank's own words/s
  auto inputs = [&](std::uint64_t step) {
    return examples::timed(examples::Part::input, [&] {
      lm::Batch b = windows.training(step, shard.global, shard.first, shard.batch);  // this rank's share
      lm::Candidates c = lm::make_candidates(sampler, cfg.sampled, o.seed, step, b);
      return std::make_pair(std::move(b), std::move(c));
    });
  };
  // --overlap on: the inputs a step ahead, so that the next batch's lookups
  // run while this one computes.
  std::optional<std::pair<lm::Batch, lm::Candidates>> next;
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    const auto [batch, cand] = next ? std::move(*next) : inputs(step);
    next.reset();
    if (o.overlapped() && step + 1 < o.steps) next = inputs(step + 1);
    straggler.begin();
    progress.record(model.train_step(trainer, batch, cand, o.overlapped(), next ? &next->first : nullptr,
                                     next ? &next->second : nullptr));
    straggler.end();  // --slow-rank sleeps here, as if its compute were slower
  }
  const examples::Summary s = progress.finish();
  // example-end
  examples::plan_check(ctx, s);
  const double others = straggler.report(ctx, trainer, "words");
  examples::print_table_bytes(ctx, trainer, a.precision, model.emb, model.softmax);

  // Perplexity with the full softmax on held-out words, split over the ranks.
  double perplexity = 0;
  if (a.eval_examples) {
    const px::BatchShare share = px::share_of(a.eval_examples, ctx);  // every rank evaluates its share
    const lm::Batch held = windows.held_out(share.first, share.count);
    const auto rows = trainer.lookup(model.emb, held.context);
    std::vector<float> emb_rows(rows.size());
    px::space_traits<Space>::copy_to_host(emb_rows.data(), rows.data, rows.size() * sizeof(float));
    const std::vector<float> table = trainer.fetch(model.softmax);
    const double loss = ctx.sum(lm::full_softmax_loss(cfg, held, emb_rows, model.hidden.w.value().to_host(),
                                                      model.hidden.b.value().to_host(), table) *
                                static_cast<double>(held.rows));
    perplexity = std::exp(loss / static_cast<double>(a.eval_examples));
    if (ctx.is_root())
      std::printf("  held-out perplexity (full softmax over %zu words, %zu examples): %.1f (a uniform guess: %zu)\n",
                  cfg.vocab, a.eval_examples, perplexity, cfg.vocab);
  }
  if (ctx.is_root()) {
    std::printf("result: example=word_lm arch=%s ranks=%d final_loss=%.7f final_loss_hex=%a samples_per_s=%.1f bytes_per_step=%.0f "
                "bytes_per_step_max=%.0f %s perplexity=%.2f others_samples_per_s=%.1f skipped_steps=%llu\n",
                Arch::name, s.ranks, s.final_loss, s.final_loss, s.samples_per_s, s.bytes_per_step, s.bytes_per_step_max,
                s.shares().c_str(), perplexity, others, static_cast<unsigned long long>(s.skipped_steps));
  }
  const double threshold = a.pass_ratio * s.first_loss;
  char why[200];
  std::snprintf(why, sizeof why, "check: final loss %.4f %s threshold %.4f (%.2f x the step-1 loss %.4f)", s.final_loss,
                s.final_loss < threshold ? "<" : ">=", threshold, a.pass_ratio, s.first_loss);
  return examples::verdict(ctx, std::isfinite(s.final_loss) && s.final_loss < threshold, why);
}

/// --arch auto: the tables' distinct rows per step on this rank, over the
/// first 4 steps' ids (as the partition planner samples them), and the
/// model's shapes, to examples::choose_arch.
std::string choose_arch(const px::Context& ctx, const Args& a, const std::vector<std::int32_t>& tokens) {
  const lm::Config& cfg = a.model;
  const examples::Shard shard(a.common, ctx);
  const lm::Windows windows(tokens, cfg.context, a.common.seed);
  const examples::LogUniformSampler sampler(cfg.vocab);
  double emb = 0, softmax = 0;
  for (std::uint64_t s = 0; s < 4; ++s) {
    const lm::Batch b = windows.training(s, shard.global, shard.first, shard.batch);
    const lm::Candidates c = lm::make_candidates(sampler, cfg.sampled, a.common.seed, s, b);
    std::vector<px::index_t> ids(b.context.begin(), b.context.end());
    std::sort(ids.begin(), ids.end());
    emb += static_cast<double>(std::unique(ids.begin(), ids.end()) - ids.begin()) / 4;
    softmax += static_cast<double>(c.ids.size()) / 4;  // distinct already
  }
  return examples::choose_arch(
      ctx, {px::plan::Variable::sparse_of("emb", cfg.vocab, cfg.dim, emb),
            px::plan::Variable::dense_of("hidden_w", cfg.context * cfg.dim, cfg.dim),
            px::plan::Variable::dense_of("hidden_b", 1, cfg.dim),
            px::plan::Variable::sparse_of("softmax", cfg.vocab, cfg.dim + 1, softmax)});
}

}  // namespace

/// train_stored() with the tables stored as --table-type says.
template <class Arch>
int train(px::Context& ctx, const Args& a, const std::vector<std::int32_t>& tokens) {
  return examples::with_table_type<Arch>(
      a.precision, [&](auto stored) { return train_stored<Arch, decltype(stored)>(ctx, a, tokens); });
}

int main(int argc, char** argv) {
  Args a;
  a.common.steps = 200;
  a.common.batch = 1024;  // LM1B trains on 128 x 20 = 2,560 words per GPU
  a.common.lr = 0.5f;
  a.common.log_every = 50;

  examples::po::options_description desc("options");
  examples::add_common_options(desc, a.common);
  desc.add_options()
    ("vocab", examples::po::value(&a.model.vocab)->default_value(a.model.vocab),
     "vocabulary: rows of the embedding and softmax tables (with --corpus: the most frequent words kept)")
    ("dim", examples::po::value(&a.model.dim)->default_value(a.model.dim), "embedding and hidden width")
    ("context", examples::po::value(&a.model.context)->default_value(a.model.context), "words of context")
    ("sampled", examples::po::value(&a.model.sampled)->default_value(a.model.sampled),
     "sampled softmax candidates per step (LM1B: 8192)")
    ("tokens", examples::po::value(&a.tokens)->default_value(a.tokens), "length of the synthetic corpus")
    ("corpus", examples::po::value(&a.corpus), "train on this text file (whitespace-separated words) instead")
    ("eval-examples", examples::po::value(&a.eval_examples)->default_value(a.eval_examples),
     "held-out words for the full-softmax perplexity at the end (0: skip)")
    ("partitions", examples::po::value(&a.partitions)->default_value(a.partitions),
     "partitions of each sparse table (0: planned from the first steps' ids)")
    ("pass-ratio", examples::po::value(&a.pass_ratio)->default_value(a.pass_ratio),
     "pass when the final loss is below this times the step-1 loss");
  examples::add_precision_options(desc, a.precision);

  // example-begin word_lm_context
  // Parse first (the rank layout is an option), then start MPI through parallax.
  const auto cl = examples::parse_command_line(argc, argv, desc);
  px::Context ctx(argc, argv, cl.ok() ? a.common.context() : px::ContextOptions{});
  // example-end
  a.model.seed = a.common.seed;

  std::vector<std::int32_t> tokens;
  std::string problem = cl.ok() ? examples::check_common(a.common, true) : "";
  if (cl.ok() && problem.empty()) {
    if (a.corpus.empty()) {
      tokens = examples::SyntheticCorpus{a.model.vocab, a.tokens, 1.0, 0.5, a.common.seed}.make();
    } else {
      std::ifstream in(a.corpus, std::ios::binary);
      if (!in) {
        problem = "cannot open --corpus " + a.corpus;
      } else {
        try {
          auto corpus = examples::read_corpus(in, a.model.vocab);
          a.model.vocab = corpus.vocab.size();
          tokens = std::move(corpus.tokens);
        } catch (const std::exception& e) {
          problem = a.corpus + ": " + e.what();
        }
      }
    }
    if (problem.empty() && a.model.sampled >= a.model.vocab)
      problem = "--sampled " + std::to_string(a.model.sampled) + " must be less than the vocabulary (" +
                std::to_string(a.model.vocab) + ")";
    if (problem.empty() && (a.model.dim == 0 || a.model.context == 0 || a.model.sampled == 0))
      problem = "--dim, --context and --sampled must be at least 1";
    if (problem.empty()) problem = examples::check_precision(a.precision);
  }
  if (const int code = examples::report_command_line(cl, problem, ctx, about, desc); code >= 0) return code;
  examples::warn_about_blas(ctx);

  if (ctx.is_root()) {
    std::printf("01_word_lm: vocab %zu, dim %zu, context %zu, %zu sampled classes/step, batch %zu words per rank "
                "(%zu in all), %zu steps, lr %g, seed %llu; data: %s (%zu words); matrix products: %s\n",
                a.model.vocab, a.model.dim, a.model.context, a.model.sampled, a.common.batch,
                a.common.batch * static_cast<std::size_t>(ctx.size()), a.common.steps, static_cast<double>(a.common.lr),
                static_cast<unsigned long long>(a.common.seed), a.corpus.empty() ? "synthetic Zipf corpus" : a.corpus.c_str(),
                tokens.size(), examples::gemm_description<examples::DefaultSpace>().c_str());
    std::fflush(stdout);
  }
  // example-begin word_lm_arch
  // --arch hybrid|allreduce|ps|auto (and --sync sync|async) picks the trainer's architecture type.
  examples::CommonOptions common = a.common;
  if (common.arch == "auto") common.arch = choose_arch(ctx, a, tokens);
  return examples::with_arch(common, [&](auto arch) { return train<decltype(arch)>(ctx, a, tokens); });
  // example-end
}
