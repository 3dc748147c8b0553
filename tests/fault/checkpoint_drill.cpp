// The kill-during-save drill (not a Catch2 test): one round of
// run_checkpoint_drill.cmake, which runs rounds 0, 1, ... under mpiexec on
// one checkpoint directory.
//
//   checkpoint_drill --dir D --round I [--seed S] [--check-only]
//
// Each round first checks what the rounds before it left: it restores every
// checkpoint list_checkpoints() lists (each must restore, at the step its
// name says), counts what the directory holds besides them, continues from
// the newest, saves, and then finds nothing in the directory that is not a
// listed checkpoint (the save removed every leftover). It prints
//   drill-check: round I: listed L, unrestorable U, unlisted before the save B, leftovers X
// Then (unless --check-only) it trains, saving after every step and keeping
// 2 checkpoints, so every save prunes one, until a rank is SIGKILLed at an
// instant the seed and the round choose:
//   0: rank 0 at the start of a prune;
//   1: another rank while rank 0 starts a prune (rank 0 goes on until the
//      launcher kills it);
//   2: rank 0 after removing some file of a pruned checkpoint;
//   3: a random rank at a random event of a save (begun, its rank file
//      written, manifest written, committed);
//   4: a random rank after a random delay.
// The events come from the library (PARALLAX_CHECKPOINT_EVENTS, defined for
// this program only). Before it dies the killer prints
//   drill-kill: round I: rank V killed at <where>
#include <parallax/parallax.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace px = parallax;
namespace fs = std::filesystem;

namespace {

// The kill, armed after the check.
struct Plan {
  int trigger = -1;        // the rank whose event kills
  int victim = -1;         // the rank that dies
  std::string event;       // at this event's ...
  int occurrence = 0;      // ... occurrence-th time, counted from arming
  int delay_ms = -1;       // or after this delay (on the victim)
  int round = 0;
};
Plan plan;
std::vector<int> pids;
bool armed = false;
int seen = 0;
int my_rank = 0;

void kill_victim(const std::string& where) {
  std::fprintf(stderr, "drill-kill: round %d: rank %d killed at %s\n", plan.round, plan.victim, where.c_str());
  std::fflush(stderr);
  if (plan.victim == my_rank) std::raise(SIGKILL);
  ::kill(pids[static_cast<std::size_t>(plan.victim)], SIGKILL);
  plan.trigger = -1;  // once; this rank goes on until the launcher ends it
}

void on_event(const char* event) {
  if (!armed || plan.trigger != my_rank || plan.event != event) return;
  if (++seen == plan.occurrence) kill_victim(std::string(event) + " #" + std::to_string(seen));
}

Plan choose(int round, unsigned seed, int ranks) {
  std::mt19937 rng(seed * 1000003u + static_cast<unsigned>(round));
  auto below = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  Plan p;
  p.round = round;
  switch (round % 5) {
    case 0:
      p = Plan{0, 0, "prune:begin", 1 + below(3), -1, round};
      break;
    case 1:
      p = Plan{0, ranks > 1 ? 1 + below(ranks - 1) : 0, "prune:begin", 1 + below(3), -1, round};
      break;
    case 2:
      p = Plan{0, 0, "remove:file", 1 + below(3 + ranks), -1, round};
      break;
    case 3: {
      static const char* const events[] = {"save:begin", "save:rank-file", "save:manifest", "save:committed"};
      const std::string event = events[below(4)];
      const int victim = below(ranks);
      const bool rank0_only = event == "save:manifest" || event == "save:committed";
      p = Plan{rank0_only ? 0 : victim, victim, event, 1 + below(3), -1, round};
      break;
    }
    default:
      p.victim = below(ranks);
      p.delay_ms = 20 + below(400);
      break;
  }
  return p;
}

/// A small model: two sparse tables of different widths (two groups) and a
/// dense weight, so a checkpoint has a file per rank with several variables.
struct Model {
  px::Variable<px::Sparse, float> a, b;
  px::Variable<px::Dense, float> w;
  px::Trainer<px::arch::Hybrid, px::optim::Adam> trainer;
  Model(px::Context& ctx, px::TrainerOptions o)
      : a(ctx, "a", {4000, 16}, px::init::Uniform{-0.1f, 0.1f, 1}), b(ctx, "b", {1000, 8}, px::init::Uniform{-0.1f, 0.1f, 2}),
        w(ctx, "w", {32, 32}, px::init::Glorot{3}), trainer(ctx, std::move(o), px::optim::Adam{1e-3f}, a, b, w) {}
  void step(px::Context& ctx) {
    const auto s = static_cast<px::index_t>(trainer.steps());
    std::vector<px::index_t> ia, ib;
    for (px::index_t i = 0; i < 64; ++i) {
      ia.push_back((s * 131 + i * 17 + ctx.rank() * 7) % 4000);
      ib.push_back((s * 31 + i * 13 + ctx.rank() * 3) % 1000);
    }
    trainer.lookup(a, ia);
    trainer.lookup(b, ib);
    a.grad().add(ia, std::vector<float>(ia.size() * 16, 0.01f));
    b.grad().add(ib, std::vector<float>(ib.size() * 8, 0.02f));
    for (auto& g : w.grad()) g = 0.01f;
    trainer.step();
  }
};

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  std::string dir;
  int round = 0;
  unsigned seed = 1;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") dir = next();
    else if (a == "--round") round = std::atoi(next().c_str());
    else if (a == "--seed") seed = static_cast<unsigned>(std::atol(next().c_str()));
    else if (a == "--check-only") check_only = true;
  }
  if (dir.empty()) {
    std::fprintf(stderr, "checkpoint_drill: --dir is required\n");
    return 2;
  }
  my_rank = ctx.rank();
  pids.resize(static_cast<std::size_t>(ctx.size()));
  const int pid = static_cast<int>(getpid());
  MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, ctx.comm());
  px::detail::checkpoint_hook() = on_event;

  px::TrainerOptions o;
  o.checkpoint.dir = dir;
  o.checkpoint.keep_last = 2;
  Model model(ctx, o);

  // The check: every listed checkpoint restores; a save leaves nothing else.
  std::vector<px::CheckpointInfo> listed = px::list_checkpoints(dir);
  int unrestorable = 0;
  for (const auto& c : listed) {
    std::string why;
    try {
      model.trainer.restore(c.path);
      if (model.trainer.steps() != c.step) why = "restored step " + std::to_string(model.trainer.steps());
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty()) {
      ++unrestorable;
      if (ctx.rank() == 0) std::fprintf(stderr, "drill-check: %s does not restore: %s\n", c.path.c_str(), why.c_str());
    }
  }
  // What the directory holds that is not listed.
  auto unlisted = [&] {
    std::vector<std::string> out;
    const auto now = px::list_checkpoints(dir);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      bool is_listed = false;
      for (const auto& c : now) is_listed = is_listed || fs::equivalent(c.path, entry.path(), ec);
      if (!is_listed) out.push_back(entry.path().string());
    }
    return out;
  };
  const std::size_t before = ctx.rank() == 0 ? unlisted().size() : 0;
  Model fresh(ctx, o);  // a trainer that no failed restore touched
  fresh.trainer.restore_latest(dir);
  fresh.trainer.save();
  if (ctx.rank() == 0) {
    const auto left = unlisted();
    for (const auto& path : left) std::fprintf(stderr, "drill-check: leftover after a save: %s\n", path.c_str());
    std::fprintf(stderr, "drill-check: round %d: listed %zu, unrestorable %d, unlisted before the save %zu, leftovers %zu\n",
                 round, listed.size(), unrestorable, before, left.size());
    std::fflush(stderr);
  }
  if (check_only) return 0;

  // Train until the kill.
  plan = choose(round, seed, ctx.size());
  px::TrainerOptions saving = o;
  saving.checkpoint.every_steps = 1;
  Model train(ctx, saving);
  train.trainer.restore_latest(dir);
  MPI_Barrier(ctx.comm());
  armed = true;
  if (plan.delay_ms >= 0 && plan.victim == ctx.rank()) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(plan.delay_ms));
      kill_victim("a delay of " + std::to_string(plan.delay_ms) + " ms");
    }).detach();
  }
  for (int s = 0; s < 200; ++s) train.step(ctx);
  if (ctx.rank() == 0) std::fprintf(stderr, "drill: round %d ended without a kill\n", round);
  return 0;
}
