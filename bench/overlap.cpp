// Overlap of communication with compute (issue 22): a synthetic model of L
// dense layers whose backward pass is, per layer, a fixed amount of real
// arithmetic (calibrated once to take c microseconds) followed by writing
// that layer's g-byte gradient. Every layer is its own fusion bucket
// (RingOptions::bucket_bytes = g), so trainer.ready() after each layer lets
// bucket l's all-reduce run while layers l-1..0 compute.
//
// For each gradient size g it measures communication alone (step() with
// every gradient marked and no compute), then picks c so that compute is
// each of --ratios times that communication, and times, per point:
//   compute  the backward pass alone (no trainer call)
//   comm     step() alone (measured once per g)
//   last     step() of a trainer holding one g-byte variable: the last
//            bucket's all-reduce, which no compute can hide
//   overlap  backward with ready() per layer, overlap on (communication
//            thread), then step()
//   plain    backward, then step() (no ready())
//   caller   backward with ready() per layer, TrainerOptions::overlap off:
//            each bucket moves at once, in the caller
//   early    as overlap, with TrainerOptions::update_when_ready: each
//            bucket's optimizer update follows its all-reduce on the thread
//   early_caller  as caller, with update_when_ready
// Every step starts at a barrier; a step's time is the slowest rank's; a
// figure is the median over --rounds x --steps steps, the modes taking turns
// round by round. Rank 0 prints one `point ...` line per (g, c) and
// bench/run_overlap.sh tabulates them.
//
//   mpiexec -n 2 build/host/bench/bench_overlap [--layers 8] [--grad-kib 256,2048]
//       [--ratios 0.25,0.5,1,2,4] [--steps 8] [--rounds 3] [--compute arithmetic|sleep]
//
// --compute sleep is a diagnostic, not the benchmark: each layer sleeps for
// its compute time and leaves its gradient unwritten, so the communication
// thread has a core to itself (as beside a GPU kernel, which writes the
// gradients too). It tells whether ready() overlaps at all where a core is
// free.

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <string>
#include <vector>

namespace px = parallax;

namespace {

using Clock = std::chrono::steady_clock;
using Var = px::Variable<px::Dense, float, px::HostSpace>;
using Trainer = px::Trainer<px::arch::AllReduce, px::optim::Sgd>;

std::vector<double> parse_list(const char* s) {
  std::vector<double> out;
  std::string item;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(std::atof(item.c_str()));
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return out;
}

/// The backward pass's arithmetic: `reps` sweeps of a multiply-add over a
/// buffer that stays in the L1 cache. Its result feeds the gradients, so
/// the compiler cannot drop it.
class Compute {
 public:
  /// `sleeping`: the diagnostic --compute sleep, where a layer's "compute"
  /// sleeps for its time instead (reps are then microseconds), leaving the
  /// core to the communication thread as a GPU kernel would.
  explicit Compute(bool sleeping = false) : buf_(4096, 1.0f), sleeping_(sleeping) {}
  // Not inlined: every mode runs the same machine code for its compute (a
  // copy inlined into each mode's lambda ran up to 1.6x slower in one of
  // them, depending on where it landed).
  [[gnu::noinline]] void run(long reps) {
    if (sleeping_) {
      std::this_thread::sleep_for(std::chrono::microseconds(reps));
      return;
    }
    float* b = buf_.data();
    const std::size_t n = buf_.size();
    for (long r = 0; r < reps; ++r)
      for (std::size_t i = 0; i < n; ++i) b[i] = b[i] * 0.999f + 0.001f;
  }
  /// Writes a gradient from the buffer (part of a layer's backward). Not
  /// with --compute sleep: there the compute runs elsewhere (as on a GPU),
  /// and so do the writes of its gradients, which would take the core the
  /// diagnostic means to leave free.
  [[gnu::noinline]] void write(float* grad, std::size_t n) const {
    if (sleeping_) return;
    for (std::size_t i = 0; i < n; ++i) grad[i] = buf_[i & 4095] * 1e-3f;
  }
  /// Sweeps that take `us` microseconds on this rank while every rank runs
  /// them (the figure rank 0 measures, so every rank does the same work):
  /// the median of 7 timings, each of at least 20 ms once warmed up.
  long calibrate(double us, MPI_Comm comm) {
    if (sleeping_) return std::max(1L, static_cast<long>(us + 0.5));
    long reps = 64;
    for (;;) {  // sweeps that take 20 ms on rank 0 (every rank runs them, and agrees)
      MPI_Barrier(comm);
      const auto t0 = Clock::now();
      run(reps);
      int enough = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() >= 20000;
      MPI_Bcast(&enough, 1, MPI_INT, 0, comm);
      if (enough) break;
      reps *= 2;
    }
    std::vector<double> per_rep;
    for (int attempt = 0; attempt < 7; ++attempt) {
      MPI_Barrier(comm);
      const auto t0 = Clock::now();
      run(reps);
      per_rep.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                        static_cast<double>(reps));
    }
    std::sort(per_rep.begin(), per_rep.end());
    long out = std::max(1L, static_cast<long>(us / per_rep[per_rep.size() / 2] + 0.5));
    MPI_Bcast(&out, 1, MPI_LONG, 0, comm);
    return out;
  }

 private:
  std::vector<float> buf_;
  bool sleeping_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The slowest rank's time of `body`, in microseconds, after a barrier.
double timed_step(MPI_Comm comm, const std::function<void()>& body) {
  MPI_Barrier(comm);
  const auto t0 = Clock::now();
  body();
  double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, comm);
  return us;
}

/// L variables of g bytes each, with a trainer over them.
struct Model {
  std::vector<Var> layers;
  std::unique_ptr<Trainer> trainer;

  Model(const px::Context& ctx, const char* tag, std::size_t count, std::size_t floats, bool overlap,
        bool update_when_ready = false) {
    for (std::size_t l = 0; l < count; ++l)
      layers.emplace_back(ctx, std::string(tag) + "_layer" + std::to_string(l), px::Shape{floats, 1});
    px::TrainerOptions o;
    o.overlap = overlap;
    o.overlap_needs_spare_core = false;  // the thread itself, on any host
    o.update_when_ready = update_when_ready;
    o.ring.bucket_bytes = floats * sizeof(float);  // one bucket per layer
    px::Variables<Var>& all = layers;
    trainer = std::make_unique<Trainer>(ctx, o, px::optim::Sgd{1e-3f}, all);
  }
  /// The backward pass, last layer first; ready() after each layer if asked.
  void backward(Compute& compute, long reps, bool ready) {
    for (std::size_t l = layers.size(); l-- > 0;) {
      compute.run(reps);
      Var& v = layers[l];
      compute.write(v.grad().data(), v.shape().elements());
      if (ready) trainer->ready(v);
    }
  }
  /// Every gradient marked, nothing computed.
  void touch() {
    for (Var& v : layers) v.grad();
  }
};

}  // namespace

int main(int argc, char** argv) {
  px::ContextOptions co;
  co.threads = 1;  // one thread per rank computes; the communication thread is the other
  px::Context ctx(argc, argv, co);
  std::size_t layers = 8;
  std::vector<double> grad_kib = {256, 2048};
  std::vector<double> ratios = {0.25, 0.5, 1, 2, 4};
  int steps = 8, rounds = 3;
  bool sleeping = false;
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) -> const char* {
      const std::size_t n = std::strlen(name);
      if (std::strncmp(argv[i], name, n) == 0 && argv[i][n] == '=') return argv[i] + n + 1;
      if (std::strcmp(argv[i], name) == 0 && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    if (const char* v = arg("--layers")) layers = static_cast<std::size_t>(std::atol(v));
    else if (const char* v2 = arg("--grad-kib")) grad_kib = parse_list(v2);
    else if (const char* v3 = arg("--ratios")) ratios = parse_list(v3);
    else if (const char* v4 = arg("--steps")) steps = std::atoi(v4);
    else if (const char* v5 = arg("--rounds")) rounds = std::atoi(v5);
    else if (const char* v6 = arg("--compute")) {
      if (std::strcmp(v6, "arithmetic") == 0) sleeping = false;
      else if (std::strcmp(v6, "sleep") == 0) sleeping = true;
      else {
        if (ctx.is_root()) std::fprintf(stderr, "bench_overlap: --compute is arithmetic or sleep, not %s\n", v6);
        return 2;
      }
    }
    else {
      if (ctx.is_root()) std::fprintf(stderr, "bench_overlap: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (layers == 0 || steps < 1 || rounds < 1 || grad_kib.empty() || ratios.empty()) {
    if (ctx.is_root()) std::fprintf(stderr, "bench_overlap: --layers, --steps, --rounds and the lists must be positive\n");
    return 2;
  }
  const MPI_Comm comm = ctx.comm();
  const char* async = std::getenv("MPIR_CVAR_ASYNC_PROGRESS");
  if (ctx.is_root()) {
    std::printf("bench_overlap: %d ranks, %zu layers, compute: %s, MPIR_CVAR_ASYNC_PROGRESS=%s, communication thread: %s\n",
                ctx.size(), layers, sleeping ? "sleep" : "arithmetic", async ? async : "(unset)",
                ctx.serialized_threads() ? "available" : "unavailable");
    std::fflush(stdout);
  }
  Compute compute(sleeping);
  for (double kib : grad_kib) {
    const std::size_t floats = static_cast<std::size_t>(kib * 1024 / sizeof(float));
    Model threaded(ctx, "t", layers, floats, true);
    Model caller(ctx, "c", layers, floats, false);
    Model early(ctx, "e", layers, floats, true, true);
    Model early_caller(ctx, "ec", layers, floats, false, true);
    Model last(ctx, "last", 1, floats, true);
    // Communication alone, and the last bucket's alone.
    std::vector<double> comm_us, last_us;
    for (int s = 0; s < 2 + rounds * steps; ++s) {  // the first two touch fresh buffers
      threaded.touch();
      const double a = timed_step(comm, [&] { threaded.trainer->step(); });
      last.touch();
      const double b = timed_step(comm, [&] { last.trainer->step(); });
      if (s >= 2) comm_us.push_back(a), last_us.push_back(b);
    }
    const double comm_alone = median(comm_us), last_bucket = median(last_us);
    for (double ratio : ratios) {
      const double target_us = ratio * comm_alone / static_cast<double>(layers);
      const long reps = compute.calibrate(target_us, comm);
      enum Mode { compute_only, overlap, plain, in_caller, early_thread, early_in_caller, modes };
      // One timed step: the backward pass (ready() per layer if asked), then step().
      auto backward_and_step = [&](Model& model, bool ready) {
        return timed_step(comm, [&] {
          model.backward(compute, reps, ready);
          model.trainer->step();
        });
      };
      std::vector<double> times[modes];
      for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
        for (int k = 0; k < modes; ++k) {
          const int m = (k + r) % modes;  // each mode goes first in some round
          for (int s = 0; s < steps; ++s) {
            double us = 0;
            switch (m) {
              case compute_only:
                us = timed_step(comm, [&] { threaded.backward(compute, reps, false); });
                threaded.trainer->step();  // untimed: clears the gradients
                break;
              case overlap: us = backward_and_step(threaded, true); break;
              case plain: us = backward_and_step(threaded, false); break;
              case in_caller: us = backward_and_step(caller, true); break;
              case early_thread: us = backward_and_step(early, true); break;
              case early_in_caller: us = backward_and_step(early_caller, true); break;
            }
            if (r > 0) times[m].push_back(us);
          }
        }
      }
      if (ctx.is_root()) {
        const double c = median(times[compute_only]), o = median(times[overlap]), p = median(times[plain]),
                     q = median(times[in_caller]), e = median(times[early_thread]),
                     ec = median(times[early_in_caller]);
        const double bound = std::max(c, comm_alone) + last_bucket;
        const double bar = 1.2 * std::max(c, comm_alone) + last_bucket;
        std::printf("point grad_kib=%g layers=%zu ratio=%g compute_us=%.1f comm_us=%.1f last_us=%.1f overlap_us=%.1f "
                    "plain_us=%.1f caller_us=%.1f early_us=%.1f early_caller_us=%.1f bound_us=%.1f bar_us=%.1f "
                    "async=%s compute=%s\n",
                    kib, layers, ratio, c, comm_alone, last_bucket, o, p, q, e, ec, bound, bar, async ? async : "0",
                    sleeping ? "sleep" : "arithmetic");
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
