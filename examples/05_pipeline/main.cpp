// Example 05: a deep residual MLP (32 blocks by default) trained
// data-parallel, pipeline-parallel, or both: --stages S cuts the model into
// S stages (balanced by parameter count, px::pipeline::place_layers) over
// ranks/S replicas; each stage's variables live only on its ranks and are
// all-reduced among its replicas by the stage's own Trainer; micro-batches
// flow through the stages by --schedule gpipe|1f1b.
//
//   mpiexec -n 4 build/host/examples/05_pipeline --stages 2 --micro-batches 4 --schedule 1f1b
//
// Data: points labelled by a fixed random teacher network (seeded); every
// step trains on unseen examples. The run passes when the loss falls below
// --pass-ratio of the first step's and the accuracy of the last steps (on
// their batches before each update: unseen examples) beats the majority
// class by --margin.
#include "common/backend.hpp"
#include "common/gemm.hpp"
#include "common/options.hpp"
#include "common/progress.hpp"
#include "common/synthetic.hpp"
#include "05_pipeline/model.hpp"

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace px = parallax;
namespace pp = px::pipeline;
namespace pm = examples::pipeline_mlp;

namespace {

struct Args {
  examples::CommonOptions common;
  pm::Config model;
  int stages = 1;
  int micro_batches = 4;
  std::string schedule = "1f1b";
  std::string placement = "params";
  double pass_ratio = 0.7;
  double margin = 0.1;
  std::size_t last_steps = 20;
  std::string pipeline_engine = "staged";  ///< CUDA twin: staged or nccl
};

/// Whether this build moves activations on the GPU (the CUDA twin).
constexpr bool kDeviceStages =
#if PARALLAX_HAS_CUDA && defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
    true;
#else
    false;
#endif

const char* const about =
    "05_pipeline: a deep residual MLP trained data-parallel (--stages 1), pipeline-parallel (--stages = ranks)\n"
    "or both, with GPipe or 1F1B micro-batches. Prints the placement of the layers, loss, accuracy, the\n"
    "activations held at once and the measured bubble; exits 0 when the model learned.";

/// Seconds of each layer's forward and backward pass on a micro-batch of
/// `rows` examples: every rank times every layer (each a one-layer stage of
/// its own, built for the measurement), and the ranks average the times so
/// that they all place the layers alike (pipeline::profile_layers).
std::vector<double> profile(const px::Context& ctx, const pm::Config& cfg, const examples::TeacherData& data,
                            std::size_t rows) {
  rows = std::max<std::size_t>(rows, 1);
  const auto batch = data.batch<pm::Batch>(std::uint64_t{1} << 41, 0, rows);
  using Space = examples::DefaultSpace;
  using Buf = px::Buffer<float, Space>;
  const Buf in = Buf::from_host(std::vector<float>(rows * cfg.width, 0.5f));
  const Buf grad = Buf::from_host(std::vector<float>(rows * cfg.width, 1e-3f));
  Buf out(rows * cfg.width);
  typename pp::Stage<float, Space>::Saved saved;
  const pp::MicroBatch mb{0, 0, rows, rows};
  std::vector<std::unique_ptr<pm::StageModel<Space>>> layers;
  std::vector<pp::Stage<float, Space>> stages;
  for (std::size_t l = 0; l < cfg.layers(); ++l) {
    layers.push_back(std::make_unique<pm::StageModel<Space>>(ctx, cfg, l, l + 1));
    layers.back()->set_batch(batch);
    stages.push_back(layers.back()->stage());
  }
  return pp::profile_layers(ctx, cfg.layers(), [&](std::size_t l) {
    const pp::Stage<float, Space>& st = stages[l];
    const bool head = l + 1 == cfg.layers();
    st.forward(mb, l == 0 ? nullptr : in.data(), head ? nullptr : out.data(), saved);
    st.backward(mb, l == 0 ? nullptr : in.data(), head ? nullptr : grad.data(), l == 0 ? nullptr : out.data(), saved);
  });
}

/// What carries the activations and errors between stages: engine::Mpi in
/// the host build; in the CUDA twin, with the stages' values on the GPU,
/// engine::MpiStaged (any placement, ranks may share a GPU) or engine::Nccl
/// (--pipeline-engine nccl: a GPU per rank, or an NCCL node per rank).
template <class F>
int with_pipeline_engine(const std::string& name, F&& f) {
#if PARALLAX_HAS_CUDA && defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
#if PARALLAX_HAS_NCCL
  if (name == "nccl") return f(static_cast<px::engine::Nccl*>(nullptr));
#endif
  (void)name;
  return f(static_cast<px::engine::MpiStaged*>(nullptr));
#else
  (void)name;
  return f(static_cast<px::engine::Mpi*>(nullptr));
#endif
}

template <class Arch, class PipeEngine>
int train(px::Context& ctx, const Args& a) {
  const auto& o = a.common;
  const pm::Config& cfg = a.model;
  pp::Grid grid(ctx, a.stages);
  const pp::Schedule schedule = pp::Schedule::make(pp::schedule_kind(a.schedule), a.stages, a.micro_batches);

  // --batch examples per rank: a replica runs stages x batch, the job ranks x batch.
  const std::size_t replica_rows = o.batch * static_cast<std::size_t>(grid.stages());
  const std::size_t global = replica_rows * static_cast<std::size_t>(grid.replicas());
  const examples::TeacherData data(cfg.inputs, cfg.classes, o.seed);

  // Layers balanced over the stages by their products' sizes (parameter
  // counts), or by their times in a short profiling run.
  std::vector<double> cost;
  std::vector<std::size_t> bytes;
  for (std::size_t l = 0; l < cfg.layers(); ++l) {
    cost.push_back(static_cast<double>(cfg.parameters(l)));
    bytes.push_back(cfg.parameters(l) * sizeof(float));
  }
  if (a.placement == "measured") cost = profile(ctx, cfg, data, replica_rows / static_cast<std::size_t>(a.micro_batches));
  const pp::Placement place = pp::place_layers(cost, bytes, schedule);
  if (ctx.is_root()) {
    std::printf("%d stages x %d replicas, %s with %d micro-batches, architecture %s, activations over engine %s\n%s",
                grid.stages(), grid.replicas(), schedule.name().c_str(), a.micro_batches, Arch::name, PipeEngine::name,
                place.describe().c_str());
    std::fflush(stdout);
  }

  const auto s = static_cast<std::size_t>(grid.stage());
  pm::StageModel<examples::DefaultSpace> model(grid.replica_context(), cfg, place.first_layer[s],
                                               place.first_layer[s + 1]);
  px::Trainer<Arch, px::optim::Momentum, examples::DefaultEngine> trainer(
      grid.replica_context(), o.trainer_options(), px::optim::Momentum{o.lr, 0.9f}, model.variables());
  model.set_exec(trainer.engine().exec());
  pp::Pipeline<float, PipeEngine> pipe(grid, model.stage(), schedule);

  double first_loss = 0, tail_loss = 0, tail_hits = 0, tail_rows = 0;
  std::vector<double> tail_classes(cfg.classes, 0.0);
  pp::RunStats last{};
  double bubble_sum = 0;
  std::size_t bubble_steps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    const auto batch = data.batch<pm::Batch>(step * global, static_cast<std::size_t>(grid.replica()) * replica_rows,
                                       replica_rows);
    model.set_batch(batch);
    last = pipe.run(batch.rows);
    trainer.step();
    const std::vector<double> sums = ctx.sum(std::vector<double>{last.loss, model.hits()});
    const double loss = sums[0] / static_cast<double>(global);
    if (step == 0) first_loss = loss;
    if (step >= o.warmup) {
      bubble_sum += pp::measured_bubble_fraction(grid, last);
      ++bubble_steps;
    }
    if (step + a.last_steps >= o.steps) {
      tail_loss += loss;
      tail_hits += sums[1];
      tail_rows += static_cast<double>(global);
      if (grid.last_stage() && grid.replica() == 0)
        for (std::uint64_t e = 0; e < global; ++e) {
          std::vector<float> x(cfg.inputs);
          tail_classes[static_cast<std::size_t>(data.make(step * global + e, x.data()))] += 1;
        }
    }
    if (ctx.is_root() && ((step + 1) % o.log_every == 0 || step == 0)) {
      std::printf("  step %llu: loss %.4f, accuracy %.4f\n", static_cast<unsigned long long>(step + 1), loss,
                  sums[1] / static_cast<double>(global));
      std::fflush(stdout);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::size_t tail = std::min<std::size_t>(a.last_steps, o.steps);
  tail_loss /= static_cast<double>(tail);
  const double accuracy = tail_hits / tail_rows;
  tail_classes = ctx.sum(std::move(tail_classes));
  const double majority = *std::max_element(tail_classes.begin(), tail_classes.end()) / tail_rows;
  const int peak = ctx.max(last.peak_in_flight);
  const double bubble = bubble_steps ? bubble_sum / static_cast<double>(bubble_steps) : 0.0;
  // Each stage's trainer skips a step whose gradient is not finite among its
  // replicas: the most any stage skipped.
  const auto skipped = static_cast<unsigned long long>(ctx.max(static_cast<double>(trainer.skipped_steps())));
  if (ctx.is_root())
    std::printf("result: example=pipeline stages=%d replicas=%d schedule=%s micro_batches=%d first_loss=%.4f "
                "final_loss=%.7f final_loss_hex=%a accuracy=%.4f majority=%.4f peak_in_flight=%d measured_bubble=%.3f "
                "predicted_bubble=%.3f samples_per_s=%.1f skipped_steps=%llu\n",
                grid.stages(), grid.replicas(), schedule.name().c_str(), a.micro_batches, first_loss, tail_loss,
                tail_loss, accuracy, majority, peak, bubble, place.predicted_bubble,
                static_cast<double>(global * o.steps) / seconds, skipped);
  const bool learned = tail_loss < a.pass_ratio * first_loss && accuracy > majority + a.margin;
  char why[240];
  std::snprintf(why, sizeof why,
                "check: loss of the last %zu steps %.4f %s %.2f x the first step's %.4f; their accuracy %.4f %s "
                "majority class %.4f + margin %.2f",
                tail, tail_loss, tail_loss < a.pass_ratio * first_loss ? "<" : ">=", a.pass_ratio, first_loss,
                accuracy, accuracy > majority + a.margin ? ">" : "<=", majority, a.margin);
  return examples::verdict(ctx, learned, why);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.common.steps = 200;
  a.common.batch = 64;
  a.common.lr = 0.02f;
  a.common.log_every = 25;

  examples::po::options_description desc("options");
  examples::add_common_options(desc, a.common);
  desc.add_options()
    ("stages", examples::po::value(&a.stages)->default_value(a.stages),
     "pipeline stages; the ranks / stages replicas each run all of them (1: data-parallel only)")
    ("micro-batches", examples::po::value(&a.micro_batches)->default_value(a.micro_batches),
     "micro-batches per step: a replica's batch (stages x --batch examples) is cut into this many")
    ("schedule", examples::po::value(&a.schedule)->default_value(a.schedule),
     "gpipe (all forwards, then all backwards) or 1f1b (one forward, one backward)")
    ("placement", examples::po::value(&a.placement)->default_value(a.placement),
     "how layers are balanced over the stages: params (their parameter counts) or measured (a short "
     "profiling run of each layer, averaged over the ranks)")
    ("inputs", examples::po::value(&a.model.inputs)->default_value(a.model.inputs), "input features")
    ("width", examples::po::value(&a.model.width)->default_value(a.model.width), "width of the residual blocks")
    ("blocks", examples::po::value(&a.model.blocks)->default_value(a.model.blocks), "residual blocks")
    ("classes", examples::po::value(&a.model.classes)->default_value(a.model.classes), "classes")
    ("pass-ratio", examples::po::value(&a.pass_ratio)->default_value(a.pass_ratio),
     "pass when the last steps' loss is below this fraction of the first step's")
    ("margin", examples::po::value(&a.margin)->default_value(a.margin),
     "and when their accuracy beats the majority class by this much");
  if (kDeviceStages)
    desc.add_options()("pipeline-engine", examples::po::value(&a.pipeline_engine)->default_value(a.pipeline_engine),
                       "what moves activations and errors between the stages on the GPU: staged (engine::MpiStaged, "
                       "any placement) or nccl (engine::Nccl, a GPU per rank)");

  const auto cl = examples::parse_command_line(argc, argv, desc);
  px::Context ctx(argc, argv, cl.ok() ? a.common.context() : px::ContextOptions{});
  a.model.seed = a.common.seed;
  std::string problem = cl.ok() ? examples::check_common(a.common) : "";
  if (problem.empty() && cl.ok()) {
    if (a.stages < 1 || ctx.size() % a.stages != 0)
      problem = "--stages must divide the rank count (" + std::to_string(ctx.size()) + "), got " +
                std::to_string(a.stages);
    else if (a.micro_batches < 1) problem = "--micro-batches must be at least 1";
    else if (a.schedule != "gpipe" && a.schedule != "1f1b") problem = "--schedule must be gpipe or 1f1b";
    else if (a.placement != "params" && a.placement != "measured")
      problem = "--placement must be params or measured";
    else if (a.model.inputs == 0 || a.model.width == 0 || a.model.classes < 2)
      problem = "--inputs and --width must be at least 1, --classes at least 2";
    else if (a.pipeline_engine != "staged" && !(PARALLAX_HAS_NCCL && a.pipeline_engine == "nccl"))
      problem = std::string("--pipeline-engine must be staged") + (PARALLAX_HAS_NCCL ? " or nccl" : "") + ", not '" +
                a.pipeline_engine + "'";
    else if (a.model.layers() < static_cast<std::size_t>(a.stages))
      problem = "the model's " + std::to_string(a.model.layers()) + " layers cannot fill " +
                std::to_string(a.stages) + " stages";
  }
  if (const int code = examples::report_command_line(cl, problem, ctx, about, desc); code >= 0) return code;
  examples::warn_about_blas(ctx);
  if (ctx.is_root()) {
    const auto& m = a.model;
    std::printf("05_pipeline: residual MLP %zu-(%zu x %zu blocks)-%zu, %zu layers, %zu parameters; batch %zu per rank "
                "(%zu in all), %zu steps, lr %g, seed %llu; %s space, matrix products: %s\n",
                m.inputs, m.width, m.blocks, m.classes, m.layers(), m.parameters(), a.common.batch,
                a.common.batch * static_cast<std::size_t>(ctx.size()), a.common.steps,
                static_cast<double>(a.common.lr), static_cast<unsigned long long>(a.common.seed), examples::space_name(),
                examples::gemm_description<examples::DefaultSpace>().c_str());
    std::fflush(stdout);
  }
  return px::with_arch(a.common.arch, [&](auto arch) {
    return with_pipeline_engine(a.pipeline_engine, [&](auto* engine) {
      return train<decltype(arch), std::remove_pointer_t<decltype(engine)>>(ctx, a);
    });
  });
}
