// A training job for the real-host drills (not a Catch2 test): tests/cluster/run.sh
// launches it across scripts/cluster.sh's hosts, cuts their links, kills
// their ranks, and checks what it prints.
//
//   cluster_job --steps N [--arch hybrid|allreduce|ps] [--dir D --save-every K]
//               [--restore D] [--step-ms M] [--timeout-ms T]
//
// Every step trains one global batch of 48 samples (divisible by 1-4 ranks):
// rank r of N takes samples [48r/N, 48(r+1)/N), so any rank count trains the
// same model up to float reassociation. --dir saves a checkpoint every K
// steps (TrainerOptions::checkpoint); --restore continues from the newest
// complete checkpoint under D, on whatever rank count this job has. --step-ms
// sleeps that long in each step's compute, so a drill can act mid-training.
// Rank 0 prints "result: steps=S final_loss=<x> final_loss_hex=<a> model=<a>"
// (model: the sum of every value, as a hex float) and each rank "job: rank R
// (HOST) finished"; a rank that gives up prints "job: rank R (HOST) gave up".
#include <parallax/trainers.hpp>  // the common trainers, from parallax::trainers where built

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace px = parallax;

namespace {

constexpr int kGlobalBatch = 48;
constexpr int kRows = 4096;
constexpr int kWidth = 16;

// Sample i of step s: two ids and a target, the same for every rank count.
px::index_t id_of(long s, int i, int k) { return static_cast<px::index_t>((s * 7919 + i * 104729 + k * 31) % kRows); }
float target_of(long s, int i) { return static_cast<float>((s + i) % 5) / 5.0f; }

template <class Arch>
int train(px::Context& ctx, long steps, const std::string& dir, long save_every, const std::string& restore,
          long step_ms, long timeout_ms) {
  px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kWidth}, px::init::Uniform{-0.1f, 0.1f, 7});
  px::Variable<px::Dense, float> w(ctx, "w", {kWidth, 1}, px::init::Constant{0.05});
  px::TrainerOptions o;
  o.reduction = px::Reduction::sum;  // gradients below are scaled by the global batch
  o.engine.timeout = std::chrono::milliseconds(timeout_ms);
  o.checkpoint.dir = dir;
  o.checkpoint.every_steps = static_cast<std::uint64_t>(save_every);
  px::Trainer<Arch, px::optim::Adagrad> trainer(ctx, o, px::optim::Adagrad{0.1f}, emb, w);
  long first = 1;
  if (!restore.empty()) {
    const auto latest = px::latest_checkpoint(restore);
    PARALLAX_EXPECTS(latest.has_value(), "--restore ", restore, ": no complete checkpoint there");
    trainer.restore(latest->path);
    first = static_cast<long>(latest->step) + 1;
    if (ctx.is_root()) std::printf("job: restored step %llu on %d ranks\n", static_cast<unsigned long long>(latest->step), ctx.size());
  }
  const int n = ctx.size(), r = ctx.rank();
  const int begin = kGlobalBatch * r / n, end = kGlobalBatch * (r + 1) / n;
  double loss = 0;
  for (long s = first; s <= steps; ++s) {
    std::vector<px::index_t> ids;
    for (int i = begin; i < end; ++i)
      for (int k = 0; k < 2; ++k) ids.push_back(id_of(s, i, k));
    auto x = trainer.lookup(emb, ids.data(), ids.size());
    const float* wv = w.value().data();
    std::vector<float> d_rows(ids.size() * kWidth, 0.0f);
    double local = 0;
    for (int i = begin; i < end; ++i) {
      const std::size_t j = static_cast<std::size_t>(i - begin) * 2;
      float y = 0;
      for (int k = 0; k < 2; ++k)
        for (int c = 0; c < kWidth; ++c) y += x.data[(j + k) * kWidth + c] * wv[c];
      const float err = y - target_of(s, i);
      local += static_cast<double>(err) * err / kGlobalBatch;
      for (int k = 0; k < 2; ++k)
        for (int c = 0; c < kWidth; ++c) {
          w.grad()[c] += 2 * err * x.data[(j + k) * kWidth + c] / kGlobalBatch;
          d_rows[(j + k) * kWidth + c] = 2 * err * wv[c] / kGlobalBatch;
        }
    }
    emb.grad().add(ids.data(), d_rows.data(), ids.size());
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
    trainer.step();
    loss = ctx.sum(local);
  }
  double model = 0;
  for (float v : w.value()) model += v;
  std::vector<px::index_t> all(kRows);
  for (int i = 0; i < kRows; ++i) all[static_cast<std::size_t>(i)] = i;
  auto rows = trainer.lookup(emb, all.data(), all.size());
  for (std::size_t i = 0; i < all.size() * kWidth; ++i) model += rows.data[i];
  if (ctx.is_root())
    std::printf("result: steps=%ld ranks=%d final_loss=%.9g final_loss_hex=%a model=%a\n", steps, n, loss, loss, model);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  long steps = 20, save_every = 0, step_ms = 0, timeout_ms = 60000;
  std::string arch = "hybrid", dir, restore;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--steps") steps = std::atol(next().c_str());
    else if (a == "--arch") arch = next();
    else if (a == "--dir") dir = next();
    else if (a == "--save-every") save_every = std::atol(next().c_str());
    else if (a == "--restore") restore = next();
    else if (a == "--step-ms") step_ms = std::atol(next().c_str());
    else if (a == "--timeout-ms") timeout_ms = std::atol(next().c_str());
    else {
      std::fprintf(stderr, "cluster_job: unknown option '%s'\n", a.c_str());
      return 2;
    }
  }
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "job: rank %d (%s) pid %d\n", ctx.rank(), host, static_cast<int>(getpid()));
  int status = 0;
  try {
    status = px::with_arch(arch, [&](auto a) {
      return train<decltype(a)>(ctx, steps, dir, save_every, restore, step_ms, timeout_ms);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "job: rank %d (%s) gave up: %s\n", ctx.rank(), host, e.what());
    return 3;  // ~Context ends the job (MPI_Abort, or its own exit if the launcher is out of reach)
  }
  std::fprintf(stderr, "job: rank %d (%s) finished\n", ctx.rank(), host);
  return status;
}
