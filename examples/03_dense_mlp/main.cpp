// Example 03: a dense-only classifier (an MLP; every variable dense). Under
// --arch hybrid every gradient is all-reduced, exactly as plain data-parallel
// all-reduce does it: the hybrid must cost nothing here. --arch ps shards the
// dense variables instead (as TF-PS).
//
//   mpiexec -n 4 build/host/examples/03_dense_mlp --arch hybrid
//
// Data: points labelled by a fixed random teacher network (seeded, in memory).
// The run passes when held-out accuracy beats the majority class by --margin.
#include "common/async.hpp"
#include "common/backend.hpp"
#include "common/gemm.hpp"
#include "common/options.hpp"
#include "common/progress.hpp"
#include "common/synthetic.hpp"
#include "03_dense_mlp/model.hpp"

#include <parallax/parallax.hpp>

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace px = parallax;
namespace mlp = examples::dense_mlp;

namespace {

struct Args {
  examples::CommonOptions common;
  mlp::Config model;
  std::size_t eval_examples = 4096;
  double margin = 0.2;
};

const char* const about =
    "03_dense_mlp: an MLP classifier whose variables are all dense, trained with parallax. Prints loss,\n"
    "samples/s and bytes sent per step per rank; exits 0 when held-out accuracy beats the majority class\n"
    "by --margin.";

template <class Arch>
int train(px::Context& ctx, const Args& a) {
  using Space = examples::DefaultSpace;
  const auto& o = a.common;
  const examples::Shard shard(o, ctx);  // --batch examples per rank
  const examples::TeacherData data(a.model.inputs, a.model.classes, o.seed);

  mlp::Model<Space> model(ctx, a.model);
  px::Trainer<Arch, px::optim::Momentum, examples::DefaultEngine> trainer(ctx, o.trainer_options(),
                                                                          px::optim::Momentum{o.lr, 0.9f},
                                                                          model.variables());
  if (ctx.is_root()) {
    std::printf("architecture %s on %d ranks (%s space): every variable -> %s\n", Arch::name, ctx.size(),
                examples::space_name(), trainer.policy_of(model.layer1.w).c_str());
    std::fflush(stdout);
  }

  examples::Progress progress(trainer, shard.global, o.log_every, "samples", o.warmup);
  for (std::uint64_t step = 0; step < o.steps; ++step) {
    const mlp::Batch batch = examples::timed(examples::Part::input, [&] {
      return data.batch<mlp::Batch>(step * shard.global, shard.first, shard.batch);
    });
    progress.record(model.train_step(trainer, batch, o.overlapped()));
  }
  const examples::Summary s = progress.finish();

  // Held-out accuracy against the majority class.
  const px::BatchShare share = px::share_of(a.eval_examples, ctx);  // every rank evaluates its share
  // Held out: from indices training never reaches.
  const auto held = data.batch<mlp::Batch>(std::uint64_t{1} << 40, share.first, share.count);
  std::vector<double> sums(2 + a.model.classes, 0.0);  // loss, correct, count per class
  std::tie(sums[0], sums[1]) = model.evaluate(trainer, held);
  for (auto y : held.labels) sums[2 + static_cast<std::size_t>(y)] += 1;
  sums = ctx.sum(std::move(sums));
  const double n = static_cast<double>(a.eval_examples);
  const double accuracy = sums[1] / n, majority = *std::max_element(sums.begin() + 2, sums.end()) / n;
  if (ctx.is_root()) {
    std::printf("  held-out (%zu examples): loss %.4f, accuracy %.4f (majority class: %.4f)\n", a.eval_examples,
                sums[0] / n, accuracy, majority);
    std::printf("result: example=dense_mlp arch=%s ranks=%d final_loss=%.7f final_loss_hex=%a samples_per_s=%.1f bytes_per_step=%.0f "
                "bytes_per_step_max=%.0f %s accuracy=%.4f skipped_steps=%llu\n",
                Arch::name, s.ranks, s.final_loss, s.final_loss, s.samples_per_s, s.bytes_per_step, s.bytes_per_step_max,
                s.shares().c_str(), accuracy, static_cast<unsigned long long>(s.skipped_steps));
  }
  char why[200];
  std::snprintf(why, sizeof why, "check: held-out accuracy %.4f %s %.4f (majority class %.4f + margin %.2f)", accuracy,
                accuracy > majority + a.margin ? ">" : "<=", majority + a.margin, majority, a.margin);
  return examples::verdict(ctx, accuracy > majority + a.margin, why);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.common.steps = 300;
  a.common.batch = 1024;
  a.common.lr = 0.05f;
  a.common.log_every = 50;

  examples::po::options_description desc("options");
  examples::add_common_options(desc, a.common);
  desc.add_options()
    ("inputs", examples::po::value(&a.model.inputs)->default_value(a.model.inputs), "input features")
    ("hidden", examples::po::value(&a.model.hidden)->default_value(a.model.hidden), "width of the two hidden layers")
    ("classes", examples::po::value(&a.model.classes)->default_value(a.model.classes), "classes")
    ("eval-examples", examples::po::value(&a.eval_examples)->default_value(a.eval_examples),
     "held-out examples for the final check")
    ("margin", examples::po::value(&a.margin)->default_value(a.margin),
     "pass when held-out accuracy beats the majority class by this much");

  const auto cl = examples::parse_command_line(argc, argv, desc);
  px::Context ctx(argc, argv, cl.ok() ? a.common.context() : px::ContextOptions{});
  a.model.seed = a.common.seed;
  std::string problem = cl.ok() ? examples::check_common(a.common) : "";
  if (problem.empty() && cl.ok() && (a.model.inputs == 0 || a.model.hidden == 0 || a.model.classes < 2 || a.eval_examples == 0))
    problem = "--inputs, --hidden and --eval-examples must be at least 1, --classes at least 2";
  if (const int code = examples::report_command_line(cl, problem, ctx, about, desc); code >= 0) return code;
  examples::warn_about_blas(ctx);

  if (ctx.is_root()) {
    const auto& m = a.model;
    std::printf("03_dense_mlp: MLP %zu-%zu-%zu-%zu (%zu parameters), batch %zu samples per rank (%zu in all), %zu steps, "
                "lr %g, seed %llu; matrix products: %s\n",
                m.inputs, m.hidden, m.hidden, m.classes,
                (m.inputs + 1) * m.hidden + (m.hidden + 1) * m.hidden + (m.hidden + 1) * m.classes, a.common.batch,
                a.common.batch * static_cast<std::size_t>(ctx.size()), a.common.steps, static_cast<double>(a.common.lr),
                static_cast<unsigned long long>(a.common.seed),
                examples::gemm_description<examples::DefaultSpace>().c_str());
    std::fflush(stdout);
  }
  return examples::with_arch(a.common, [&](auto arch) { return train<decltype(arch)>(ctx, a); });
}
