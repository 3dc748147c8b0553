// A pipeline fault drill (not a Catch2 test): S = ranks stages, one
// replica, each stage a trivial pass; the victim stage raises SIGSTOP (a
// hung process) at a chosen step. Its neighbours wait for its messages
// until the deadline, name it, and the job ends. run_drill.cmake checks
// the status, the message and the time bound.
//
//   pipeline_drill --victim R --at-step S --steps K --timeout-ms T [--schedule gpipe|1f1b]
#include <parallax/parallax.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace px = parallax;
namespace pp = px::pipeline;

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  int victim = 1;
  long at_step = 3, steps = 8, timeout_ms = 60000;
  std::string schedule = "1f1b";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--victim") victim = std::atoi(v.c_str());
    else if (a == "--at-step") at_step = std::atol(v.c_str());
    else if (a == "--steps") steps = std::atol(v.c_str());
    else if (a == "--timeout-ms") timeout_ms = std::atol(v.c_str());
    else if (a == "--schedule") schedule = v;
  }
  if (ctx.rank() == 0)
    std::fprintf(stderr, "pipeline drill: %d stages, victim rank %d stops at step %ld\n", ctx.size(), victim, at_step);
  pp::Grid grid(ctx, ctx.size());
  constexpr std::size_t width = 8;
  pp::Stage<float> st;
  st.name = "pass";
  st.in_width = grid.first_stage() ? 0 : width;
  st.out_width = grid.last_stage() ? 0 : width;
  st.forward = [&](const pp::MicroBatch& mb, const float*, float* out, std::vector<float>&) {
    if (out) std::fill(out, out + mb.rows * width, 1.f);
    return 0.0;
  };
  st.backward = [&](const pp::MicroBatch& mb, const float*, const float*, float* in_grad, std::vector<float>&) {
    if (in_grad) std::fill(in_grad, in_grad + mb.rows * width, 1.f);
  };
  pp::PipelineOptions options;
  options.engine.timeout = std::chrono::milliseconds(timeout_ms);
  pp::Pipeline<float> pipe(grid, st, pp::Schedule::make(pp::schedule_kind(schedule), grid.stages(), 4), options);
  const auto t0 = std::chrono::steady_clock::now();
  for (long s = 1; s <= steps; ++s) {
    if (s == at_step && ctx.rank() == victim) std::raise(SIGSTOP);
    pipe.run(16);
  }
  std::fprintf(stderr, "pipeline drill: rank %d finished %ld steps in %.1f s\n", ctx.rank(), steps,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}
