// End-to-end benchmarks of issue 5: whole training steps of the three host
// examples' models (examples/0N_*/model.hpp, the same code the examples run)
// under each architecture, at the rank count the binary is launched with.
//
//   mpiexec -n 4 build/host/bench/bench_end_to_end --benchmark_format=json
//   bench/run_end_to_end.sh      # 1..4 ranks, table + plot into docs/
//
// Per benchmark `<model>/<arch>`: time per step (the slowest rank's, through
// the shared harness), samples_per_s, and the bytes one rank sends per step
// from the trainer's CommStats (exact): bytes_per_step (mean over the ranks)
// and bytes_per_step_max (the busiest rank); and where the timed steps' time
// went (examples/common/profile.hpp, mean over the ranks): gemm_share (the
// model's matrix products) and parallax_share (lookups, adding gradients,
// trainer.step(), waiting for peers included); the rest is the model's other
// kernels. Input batches are made outside the timed region (data loading is
// not what is measured). After the timed loop every rank checks that its
// loss is finite, reported as `wrong`.
//
// Shapes, small (a global batch split over the ranks; divisible by 1, 2, 3
// and 4) and realistic (a batch per rank, as data-parallel jobs train):
//  * word_lm: LM1B-like sparse tables scaled down: vocabulary 200,000, width
//    256, 8192 sampled classes per step (LM1B's count), context 2, global
//    batch 24, Adagrad. The softmax rows of a step (8192 + labels) dwarf the
//    batch.
//  * word_lm_1024: the demo's model (vocabulary 800,000, width 128, 8192
//    sampled, context 2) at 1,024 words per rank (LM1B trains on 2,560 a GPU).
//  * ctr: 26 tables (Criteo's cardinalities capped at 100,000 rows), width 16,
//    global batch 240, Adagrad; ctr_2048: 2,048 samples per rank.
//  * dense_mlp: MLP 32-512-512-10 (0.29M parameters), global batch 240,
//    Momentum; dense_mlp_1024: 1,024 samples per rank.
#include "common/harness.hpp"

#include "../examples/01_word_lm/model.hpp"
#include "../examples/common/profile.hpp"
#include "../examples/02_ctr/model.hpp"
#include "../examples/03_dense_mlp/model.hpp"

#include <parallax/parallax.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;
namespace lm = examples::word_lm;
namespace ctr = examples::ctr;
namespace mlp = examples::dense_mlp;

namespace {

using Space = px::HostSpace;

constexpr std::uint64_t kSeed = 1;

/// A model's batch: `global` split over the ranks (the small shapes), or
/// `per_rank` on every rank.
struct BatchShape {
  std::size_t global = 0, per_rank = 0;
  std::size_t local(const pb::Session& s) const { return per_rank ? per_rank : global / static_cast<std::size_t>(s.size()); }
  std::size_t total(const pb::Session& s) const { return local(s) * static_cast<std::size_t>(s.size()); }
};

lm::Config word_lm_config(bool demo) {
  lm::Config c;
  c.vocab = demo ? 800000 : 200000;
  c.dim = demo ? 128 : 256;
  c.context = 2;
  c.sampled = 8192;
  c.seed = kSeed;
  return c;
}
// Small global batches, divisible by 1, 2, 3 and 4 ranks; realistic ones per rank.
constexpr std::size_t kWordLmBatch = 24, kCtrBatch = 240, kMlpBatch = 240;

/// Counters every end-to-end benchmark reports. `sent` is what this rank
/// sent over `steps` steps; `loss` its last local loss; `profile` the timed
/// steps' parts, `seconds` their time on this rank.
void report(benchmark::State& st, pb::Session& s, std::size_t global_batch, std::uint64_t sent, std::uint64_t steps,
            double loss, const examples::StepProfile& profile, double seconds) {
  using C = benchmark::Counter;
  MPI_Comm comm = s.context().comm();
  double per_step[2] = {static_cast<double>(sent) / static_cast<double>(steps), 0};
  per_step[1] = per_step[0];
  MPI_Allreduce(MPI_IN_PLACE, &per_step[0], 1, MPI_DOUBLE, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, &per_step[1], 1, MPI_DOUBLE, MPI_MAX, comm);
  double shares[2] = {profile.seconds(examples::Part::gemm) / seconds / s.size(),
                      profile.seconds(examples::Part::parallax) / seconds / s.size()};
  MPI_Allreduce(MPI_IN_PLACE, shares, 2, MPI_DOUBLE, MPI_SUM, comm);
  st.counters["gemm_share"] = C(shares[0]);
  st.counters["parallax_share"] = C(shares[1]);
  st.counters["samples_per_s"] = C(static_cast<double>(global_batch), C::kIsIterationInvariantRate);
  st.counters["steps_per_s"] = C(1.0, C::kIsIterationInvariantRate);
  st.counters["bytes_per_step"] = C(per_step[0] / s.size(), C::kDefaults, C::OneK::kIs1024);
  st.counters["bytes_per_step_max"] = C(per_step[1], C::kDefaults, C::OneK::kIs1024);
  st.counters["global_batch"] = C(static_cast<double>(global_batch));
  st.counters["ranks"] = C(static_cast<double>(s.size()));
  pb::set_wrong(st, std::isfinite(loss) ? 0 : 1, comm);
}

/// Runs `warmup` + timed steps of `step(batch)`, with `make(step, batch)`
/// untimed before each, and reports; the timed steps are profiled.
template <class Trainer, class Batch, class Make, class Step>
void run_steps(benchmark::State& st, pb::Session& s, Trainer& trainer, std::size_t global_batch, Make make, Step step) {
  constexpr std::uint64_t warmup = 2;
  Batch batch;
  std::uint64_t n = 0;
  double loss = 0, seconds = 0;
  examples::StepProfile profile;
  const std::uint64_t sent0 = trainer.stats().total().sent();
  pb::timed_loop(
      st, s.context().comm(), static_cast<int>(warmup), [&] { make(n, batch); },
      [&] {
        if (n++ < warmup) {
          loss = step(batch);
          return;
        }
        const examples::StepProfile::Scope scope(profile);
        const double t0 = MPI_Wtime();
        loss = step(batch);
        seconds += MPI_Wtime() - t0;
      });
  report(st, s, global_batch, trainer.stats().total().sent() - sent0, n, loss, profile, seconds);
}

// ---------------------------------------------------------------- word_lm

template <std::size_t Global, std::size_t PerRank = 0>
struct WordLm {
static constexpr BatchShape shape{Global, PerRank};
template <class Arch>
static void run(benchmark::State& st, pb::Session& s) {
  px::Context& ctx = s.context();
  constexpr bool demo = PerRank > 0;  // the realistic shape trains the demo's model
  const lm::Config cfg = word_lm_config(demo);
  static const std::vector<std::int32_t> tokens = examples::SyntheticCorpus{cfg.vocab, 2000000, 1.0, 0.5, kSeed}.make();
  const lm::Windows windows(tokens, cfg.context, kSeed);
  const examples::LogUniformSampler sampler(cfg.vocab);
  const std::size_t local = shape.local(s), global = shape.total(s);
  const std::size_t first = local * static_cast<std::size_t>(s.rank());

  lm::Model<Space> model(ctx, cfg);
  px::TrainerOptions options;
  // As the example plans it: hot low word ids spread over 32 partitions per rank.
  options.partitions["emb"] = options.partitions["softmax"] = 32 * s.size();
  px::Trainer<Arch, px::optim::Adagrad> trainer(ctx, options, px::optim::Adagrad{0.5f}, model.emb, model.hidden.w,
                                                model.hidden.b, model.softmax);
  struct Input {
    lm::Batch batch;
    lm::Candidates cand;
  };
  run_steps<decltype(trainer), Input>(
      st, s, trainer, global,
      [&](std::uint64_t step, Input& in) {
        in.batch = windows.training(step, global, first, local);
        in.cand = lm::make_candidates(sampler, cfg.sampled, kSeed, step, in.batch);
      },
      [&](const Input& in) { return model.train_step(trainer, in.batch, in.cand); });
}
};

// ---------------------------------------------------------------- ctr

template <std::size_t Global, std::size_t PerRank = 0>
struct ClickModel {
static constexpr BatchShape shape{Global, PerRank};
template <class Arch>
static void run(benchmark::State& st, pb::Session& s) {
  px::Context& ctx = s.context();
  ctr::Config cfg;
  cfg.table_rows = ctr::criteo_table_rows(100000);
  cfg.seed = kSeed;
  const examples::SyntheticClicks clicks(cfg.table_rows, ctr::dense_features, kSeed);
  const std::size_t local = shape.local(s), global = shape.total(s);
  const std::size_t first = local * static_cast<std::size_t>(s.rank());

  ctr::Model<Space> model(ctx, cfg);
  px::Trainer<Arch, px::optim::Adagrad> trainer(ctx, px::optim::Adagrad{0.2f}, model.tables, model.mlp);
  run_steps<decltype(trainer), ctr::Batch>(
      st, s, trainer, global,
      [&](std::uint64_t step, ctr::Batch& b) {
        b.clear(local);
        examples::ClickExample e;
        for (std::size_t i = first; i < first + local; ++i) {
          clicks.make(step * global + i, e);
          b.add(e);
        }
      },
      [&](const ctr::Batch& b) { return model.train_step(trainer, b); });
}
};

// ---------------------------------------------------------------- dense_mlp

template <std::size_t Global, std::size_t PerRank = 0>
struct DenseMlp {
static constexpr BatchShape shape{Global, PerRank};
template <class Arch>
static void run(benchmark::State& st, pb::Session& s) {
  px::Context& ctx = s.context();
  mlp::Config cfg;
  cfg.hidden = 512;
  cfg.seed = kSeed;
  const examples::TeacherData data(cfg.inputs, cfg.classes, kSeed);
  const std::size_t local = shape.local(s), global = shape.total(s);
  const std::size_t first = local * static_cast<std::size_t>(s.rank());

  mlp::Model<Space> model(ctx, cfg);
  px::Trainer<Arch, px::optim::Momentum> trainer(ctx, px::optim::Momentum{0.05f, 0.9f}, model.variables());
  run_steps<decltype(trainer), mlp::Batch>(
      st, s, trainer, global,
      [&](std::uint64_t step, mlp::Batch& b) {
        b.rows = local;
        b.x.resize(local * cfg.inputs);
        b.labels.resize(local);
        for (std::size_t i = 0; i < local; ++i)
          b.labels[i] = data.make(step * global + first + i, b.x.data() + i * cfg.inputs);
      },
      [&](const mlp::Batch& b) { return model.train_step(trainer, b); });
}
};

/// Registers `<model>/<arch>` for the three architectures, one after the
/// other (from the session's rotation(): hybrid, allreduce, ps at 0;
/// allreduce, ps, hybrid at 1; ...), each with a fixed step count (the same
/// on every rank).
template <class Model>
void add(pb::Session& s, const std::string& model, std::int64_t steps) {
  const auto iterations = std::max<std::int64_t>(1, std::llround(static_cast<double>(steps) * s.policy().scale));
  auto one = [&](auto arch) {
    using Arch = decltype(arch);
    s.add(model + "/" + Arch::name, 0, [&s](benchmark::State& st) { Model::template run<Arch>(st, s); })
        ->Iterations(iterations);
  };
  for (int i = 0; i < 3; ++i) {
    switch ((i + s.rotation()) % 3) {
      case 0: one(px::arch::Hybrid{}); break;
      case 1: one(px::arch::AllReduce{}); break;
      default: one(px::arch::PS{}); break;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  pb::Session s(argc, argv);
  for (std::size_t b : {kWordLmBatch, kCtrBatch, kMlpBatch}) {
    if (b % static_cast<std::size_t>(s.size()) != 0) {
      if (s.rank() == 0) std::fprintf(stderr, "bench_end_to_end: the global batches (24, 240) need 1, 2, 3, 4, 6 or 8 ranks\n");
      return 1;
    }
  }
  const bool slow = s.oversubscribed();  // collectives cost scheduler slices: fewer steps
  add<WordLm<kWordLmBatch>>(s, "word_lm", slow ? 10 : 20);
  add<ClickModel<kCtrBatch>>(s, "ctr", slow ? 10 : 30);
  add<DenseMlp<kMlpBatch>>(s, "dense_mlp", slow ? 20 : 50);
  add<WordLm<0, 1024>>(s, "word_lm_1024", slow ? 6 : 10);
  add<ClickModel<0, 2048>>(s, "ctr_2048", slow ? 10 : 20);
  add<DenseMlp<0, 1024>>(s, "dense_mlp_1024", slow ? 10 : 20);
  return s.run();
}
