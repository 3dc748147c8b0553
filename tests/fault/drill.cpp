// A fault drill (not a Catch2 test): trains a small model and makes one rank
// fail at a chosen or random step. run_drill.cmake runs it under mpiexec and
// checks the exit status, the messages and the time bound.
//
//   drill --mode kill|stop|stop-at-metric|skip|leave|exit0|bad-id|none --victim R --at-step S|random --steps K
//         [--timeout-ms T] [--check-calls] [--async S]
//
// kill: the victim raises SIGKILL; stop: SIGSTOP (a hung process); skip: the
// victim leaves out one step() and goes on to the next step;
// stop-at-metric: every rank sums a metric over the ranks (Context::sum)
// after each step, and the victim stops (SIGSTOP) just before it; leave: the
// victim leaves the loop before step S and returns from main (its trainer
// and Context end normally) while the others train on. Each rank prints
// how long after the fault's step began it finished or stopped. --async S
// trains asynchronously (arch::Async, staleness S) instead of arch::Hybrid.
#include <parallax/trainers.hpp>  // the common trainers, from parallax::trainers where built

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace px = parallax;

namespace {
std::chrono::steady_clock::time_point fault_began = std::chrono::steady_clock::now();
double since_fault() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - fault_began).count();
}
}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  std::string mode = "none";
  int victim = 1;
  long at_step = 3, steps = 8, timeout_ms = 60000;
  bool check_calls = false;
  int async = -2;  // --async S: train asynchronously (arch::Async) with staleness S
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--mode") mode = next();
    else if (a == "--victim") victim = std::atoi(next().c_str());
    else if (a == "--at-step") {
      const std::string s = next();
      if (s == "random") {
        long seed = static_cast<long>(std::chrono::steady_clock::now().time_since_epoch().count() % 100000);
        MPI_Bcast(&seed, 1, MPI_LONG, 0, MPI_COMM_WORLD);
        at_step = 2 + seed % 5;
      } else {
        at_step = std::atol(s.c_str());
      }
    } else if (a == "--steps") steps = std::atol(next().c_str());
    else if (a == "--timeout-ms") timeout_ms = std::atol(next().c_str());
    else if (a == "--check-calls") check_calls = true;
    else if (a == "--async") async = std::atoi(next().c_str());
  }
  std::fprintf(stderr, "drill: rank %d pid %d\n", ctx.rank(), static_cast<int>(getpid()));
  if (ctx.rank() == 0) std::fprintf(stderr, "drill: mode %s, victim rank %d, at step %ld\n", mode.c_str(), victim, at_step);

  try {
    px::Variable<px::Sparse, float> emb(ctx, "emb", {1000, 16}, px::init::Uniform{});
    px::Variable<px::Dense, float> w(ctx, "w", {16, 16}, px::init::Glorot{});
    px::TrainerOptions o;
    o.engine.timeout = std::chrono::milliseconds(timeout_ms);
    o.engine.check_calls = check_calls;
    o.async.staleness = async;
    auto drill = [&](auto arch) {
    px::Trainer<decltype(arch), px::optim::Adam> trainer(ctx, o, px::optim::Adam{}, emb, w);
    long done = 0;
    for (long s = 1; s <= steps; ++s) {
      if (s == at_step) fault_began = std::chrono::steady_clock::now();
      if (ctx.rank() == victim && s == at_step) {
        if (mode == "kill") std::raise(SIGKILL);
        if (mode == "stop") std::raise(SIGSTOP);
        if (mode == "exit0") {
          std::fprintf(stderr, "drill: rank %d exits with status 0 before step %ld\n", ctx.rank(), s);
          _exit(0);
        }
        if (mode == "leave") {
          std::fprintf(stderr, "drill: rank %d leaves the loop before step %ld\n", ctx.rank(), s);
          break;
        }
      }
      std::vector<px::index_t> ids;
      for (int i = 0; i < 32; ++i) ids.push_back((s * 131 + i * 17 + ctx.rank() * 7) % 1000);
      if (mode == "bad-id" && ctx.rank() == victim && s == at_step) ids[5] = 1000;  // one past the table
      auto rows = trainer.lookup(emb, ids);
      emb.grad().add(ids, std::vector<float>(rows.size(), 0.01f));
      for (auto& g : w.grad()) g = 0.01f;
      if (mode == "skip" && ctx.rank() == victim && s == at_step) continue;
      trainer.step();
      ++done;
      if (mode == "stop-at-metric") {
        if (ctx.rank() == victim && s == at_step) std::raise(SIGSTOP);
        (void)ctx.sum(1.0);
      }
    }
    std::fprintf(stderr, "drill: rank %d finished %ld steps, %.1f s after step %ld began\n", ctx.rank(), done,
                 since_fault(), at_step);
    };
    if (async >= -1) drill(px::arch::Async{});
    else drill(px::arch::Hybrid{});
  } catch (const px::timeout_error&) {
    std::fprintf(stderr, "drill: rank %d gave up %.1f s after step %ld began\n", ctx.rank(), since_fault(), at_step);
    return 3;  // parallax printed the diagnosis; ~Context ends the job (MPI_Abort)
  } catch (const std::exception& e) {
    // bad-id: the error every rank throws leaves main, as in a program that
    // catches nothing: Context's terminate handler prints it and ends the job.
    if (mode == "bad-id") throw;
    std::fprintf(stderr, "drill: rank %d stopped: %s\n", ctx.rank(), e.what());
    return 3;
  }
  return 0;
}
