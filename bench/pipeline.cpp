// Pipeline bubble (issue 26): synthetic balanced stages, one per rank
// (S = ranks, one replica), each forward pass taking --forward-ms and each
// backward --backward-ms, and activations of --rows x --width floats per
// micro-batch between neighbours. For each micro-batch count M and
// schedule, it runs --steps steps, each starting at a barrier, and reports
// the measured bubble fraction, 1 - sum(busy) / sum(run time) over the
// ranks (pipeline::measured_bubble_fraction), as the median over the steps,
// beside GPipe's (S - 1) / (M + S - 1), and the largest number of
// micro-batches any rank held between their forward and backward passes.
// The schedules take turns step by step.
//
//   mpiexec -n 2 build/host/bench/bench_pipeline [--micro 4,8] [--steps 20]
//       [--forward-ms 10] [--backward-ms 20] [--compute spin|sleep]
//
// --compute spin keeps the core busy for a pass's time (a CPU stage; each
// rank needs a core of its own, or waiting ranks stretch it); sleep frees
// the core (as beside a GPU kernel), so only the pipeline's own overheads
// and messages add to the bubble.

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace px = parallax;
namespace pp = px::pipeline;

namespace {

struct Settings {
  std::vector<int> micro = {4, 8};
  int steps = 20;
  double forward_ms = 10, backward_ms = 20;
  std::size_t rows = 16, width = 1024;
  bool spin = true;
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

void work(double ms, bool spin) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  if (!spin) {
    std::this_thread::sleep_until(until);
    return;
  }
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < until)
    for (int i = 0; i < 200; ++i) sink = sink + 1e-9 * i;
}

pp::Stage<float> synthetic_stage(const pp::Grid& g, const Settings& s) {
  pp::Stage<float> st;
  st.name = "synthetic";
  st.in_width = g.first_stage() ? 0 : s.width;
  st.out_width = g.last_stage() ? 0 : s.width;
  st.forward = [&s](const pp::MicroBatch& mb, const float* in, float* out, std::vector<float>&) {
    work(s.forward_ms, s.spin);
    if (out)
      for (std::size_t k = 0; k < mb.rows * s.width; ++k) out[k] = in ? in[k] + 1.f : 1.f;
    return 0.0;
  };
  st.backward = [&s](const pp::MicroBatch& mb, const float*, const float* out_grad, float* in_grad,
                     std::vector<float>&) {
    work(s.backward_ms, s.spin);
    if (in_grad)
      for (std::size_t k = 0; k < mb.rows * s.width; ++k) in_grad[k] = out_grad ? out_grad[k] : 1.f;
  };
  return st;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  Settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--micro") s.micro = parse_list(v);
    else if (k == "--steps") s.steps = std::atoi(v);
    else if (k == "--forward-ms") s.forward_ms = std::atof(v);
    else if (k == "--backward-ms") s.backward_ms = std::atof(v);
    else if (k == "--rows") s.rows = static_cast<std::size_t>(std::atol(v));
    else if (k == "--width") s.width = static_cast<std::size_t>(std::atol(v));
    else if (k == "--compute") s.spin = std::strcmp(v, "sleep") != 0;
    else {
      if (ctx.is_root()) std::fprintf(stderr, "bench_pipeline: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  const int S = ctx.size();
  pp::Grid grid(ctx, S);
  if (ctx.is_root())
    std::printf("bench_pipeline: %d stages x 1 replica, forward %.1f ms, backward %.1f ms, compute %s, "
                "activations %zu x %zu floats per micro-batch, %d steps per point\n",
                S, s.forward_ms, s.backward_ms, s.spin ? "spin" : "sleep", s.rows, s.width, s.steps);
  for (int M : s.micro) {
    const pp::ScheduleKind kinds[] = {pp::ScheduleKind::gpipe, pp::ScheduleKind::one_f_one_b};
    std::vector<std::unique_ptr<pp::Pipeline<float>>> pipes;
    for (auto k : kinds)
      pipes.push_back(std::make_unique<pp::Pipeline<float>>(grid, synthetic_stage(grid, s), pp::Schedule::make(k, S, M)));
    std::vector<double> bubble[2], wall[2];
    int peak[2] = {0, 0};
    for (int step = -1; step < s.steps; ++step)  // step -1: warm-up, not counted
      for (int k = 0; k < 2; ++k) {
        MPI_Barrier(ctx.comm());
        const pp::RunStats r = pipes[static_cast<std::size_t>(k)]->run(s.rows * static_cast<std::size_t>(M));
        const double b = pp::measured_bubble_fraction(grid, r);
        const double w = ctx.max(r.wall_s);
        peak[k] = std::max(peak[k], ctx.max(r.peak_in_flight));
        if (step < 0) continue;
        bubble[k].push_back(b);
        wall[k].push_back(w);
      }
    const double formula = pp::gpipe_bubble_fraction(S, M);
    if (ctx.is_root())
      for (int k = 0; k < 2; ++k) {
        const double m = median(bubble[k]);
        std::printf("point schedule=%s S=%d M=%d bubble=%.4f formula=%.4f ratio=%.3f step_ms=%.2f ideal_ms=%.2f "
                    "peak_in_flight=%d\n",
                    pp::to_string(kinds[k]), S, M, m, formula, m / formula, 1e3 * median(wall[k]),
                    (M + S - 1) * (s.forward_ms + s.backward_ms), peak[k]);
      }
  }
  return 0;
}
