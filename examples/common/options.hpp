#pragma once
/// @file
/// Command-line boilerplate shared by the examples: the options every example
/// takes (Boost.Program_options), parsing before MPI starts (the rank layout
/// is itself an option), and --help / error output from rank 0 only.

#include <parallax/parallax.hpp>

#include <boost/program_options.hpp>

#include <cstddef>
#include <cstdint>
#include <iostream>
#include <string>

namespace examples {

namespace po = boost::program_options;
namespace px = parallax;

/// Settings every example takes. Each example sets its own defaults before
/// add_common_options().
struct CommonOptions {
  std::string arch = "hybrid";  ///< a name of px::arch::all, or auto (the examples that plan: common/auto_arch.hpp)
  std::size_t steps = 200;
  std::size_t batch = 1024;  ///< examples per rank per step; the global batch is ranks x batch
  float lr = 0.1f;
  std::uint64_t seed = 1;
  int ranks_per_host = 0;  ///< 0: the real hosts
  std::size_t log_every = 20;
  std::size_t warmup = 1;  ///< first steps left out of samples/s
  int threads = 0;  ///< OpenMP and BLAS threads per rank (host build); 0: share the cores
  /// on: the backward pass marks each layer's gradient ready (Trainer::ready)
  /// as it finishes it, and the trainer's communication thread moves it while
  /// the layers below compute; update: the same, and each dense bucket is
  /// updated as soon as it is summed (TrainerOptions::update_when_ready);
  /// off: no ready() calls, TrainerOptions::overlap false (step() moves
  /// everything). The losses are the same bit for bit.
  std::string overlap = "on";
  std::string sync = "sync";  ///< sync | async (arch ps or hybrid through AsyncPS)
  int staleness = 4;          ///< --sync async: steps a rank may run ahead of the slowest (-1: unbounded)
  int slow_rank = -1;         ///< the straggler, or -1
  double slow_factor = 1;     ///< how much slower the straggler's compute is

  bool overlapped() const noexcept { return overlap == "on" || overlap == "update"; }
  /// `t` with TrainerOptions::overlap and update_when_ready set from --overlap.
  px::TrainerOptions trainer_options(px::TrainerOptions t = {}) const {
    t.overlap = overlapped();
    t.update_when_ready = overlap == "update";
    t.async.staleness = staleness;
    return t;
  }

  px::ContextOptions context() const {
    px::ContextOptions c;
    c.ranks_per_host = ranks_per_host;
    c.threads = threads;
    return c;
  }
};

/// --arch's help: every architecture of px::arch::all with its `about`.
inline std::string arch_help() {
  std::string h = "architecture:";
  px::arch::for_each(px::arch::all{}, [&](auto a) {
    h += std::string(h.back() == ':' ? " " : "; ") + decltype(a)::name + " (" + decltype(a)::about + ")";
  });
  return h + "; 01 and 02 also take auto (the one plan::Model predicts fastest for this job's hosts and PARALLAX_LINK)";
}

/// Adds --help and the common options to `desc`, with o's values as defaults.
inline void add_common_options(po::options_description& desc, CommonOptions& o) {
  desc.add_options()
    ("help,h", "print this help and exit")
    ("arch", po::value(&o.arch)->default_value(o.arch), arch_help().c_str())
    ("steps", po::value(&o.steps)->default_value(o.steps), "training steps")
    ("batch", po::value(&o.batch)->default_value(o.batch),
     "examples per rank per step, as in PyTorch's DistributedDataParallel: N ranks train on a global batch "
     "of N x batch (the same examples as one process given --batch N x batch)")
    ("lr", po::value(&o.lr)->default_value(o.lr), "learning rate")
    ("seed", po::value(&o.seed)->default_value(o.seed), "seed of the data and the initial values")
    ("ranks-per-host", po::value(&o.ranks_per_host)->default_value(o.ranks_per_host),
     "ranks that count as one host for byte accounting and local aggregation (0: the real hosts)")
    ("log-every", po::value(&o.log_every)->default_value(o.log_every), "steps between progress lines")
    ("warmup", po::value(&o.warmup)->default_value(o.warmup),
     "first steps left out of samples/s (they touch fresh buffers once)")
    ("threads", po::value(&o.threads)->default_value(o.threads),
     "threads per rank for the host's kernels and matrix products (OpenMP and BLAS; 0: the host's cores "
     "divided among its ranks)")
    ("overlap", po::value(&o.overlap)->default_value(o.overlap),
     "on: the backward pass marks each layer's gradient ready as it finishes it (trainer.ready) and the "
     "trainer's communication thread sends it while the layers below compute; update: the same, and each "
     "dense bucket is updated as soon as it is summed (TrainerOptions::update_when_ready); off: no ready() "
     "calls, the trainer moves every gradient in step(). The losses are bit-identical every way")
    ("sync", po::value(&o.sync)->default_value(o.sync),
     "sync: every step waits for every rank's gradients; async: sparse pushes land when they are made and no "
     "step waits for the others beyond --staleness (with --arch ps everything is asynchronous; with --arch "
     "hybrid the dense layers stay all-reduced, Persia's split). Host build; across hosts through MPI one-sided calls")
    ("staleness", po::value(&o.staleness)->default_value(o.staleness),
     "--sync async: steps a rank may complete beyond the slowest rank (0: lock step; -1: unbounded)")
    ("slow-rank", po::value(&o.slow_rank)->default_value(o.slow_rank),
     "make this rank a straggler (-1: none): it sleeps in its compute, see --slow-factor")
    ("slow-factor", po::value(&o.slow_factor)->default_value(o.slow_factor),
     "the straggler's compute takes this many times as long (it sleeps factor - 1 times each step's time outside parallax)");
}

/// The outcome of parsing, decided before MPI starts and reported after.
struct CommandLine {
  bool help = false;
  std::string error;  ///< empty if the command line is valid
  po::variables_map values;

  bool ok() const noexcept { return !help && error.empty(); }
};

/// Parses argv against `desc` without printing anything.
inline CommandLine parse_command_line(int argc, char** argv, const po::options_description& desc) {
  CommandLine cl;
  try {
    po::store(po::parse_command_line(argc, argv, desc), cl.values);
    cl.help = cl.values.count("help") > 0;
    po::notify(cl.values);
  } catch (const std::exception& e) {
    cl.error = e.what();
  }
  return cl;
}

/// Checks the common options (architecture name, counts at least 1); `auto`
/// is an architecture where the example plans (`plans`). Returns the
/// problem, or "".
inline std::string check_common(const CommonOptions& o, bool plans = false) {
  const bool named = px::arch::has(px::arch::all{}, o.arch);
  if (!named && !(plans && o.arch == "auto"))
    return "--arch must be " + px::arch::names(px::arch::all{}, plans ? ", " : " or ") +
           std::string(plans ? " or auto" : "") + ", not '" + o.arch + "'";
  if (o.steps == 0) return "--steps must be at least 1";
  if (o.log_every == 0) return "--log-every must be at least 1";
  if (o.batch == 0) return "--batch must be at least 1 (examples per rank per step)";
  if (o.overlap != "on" && o.overlap != "off" && o.overlap != "update")
    return "--overlap must be on, off or update, not '" + o.overlap + "'";
  if (o.sync != "sync" && o.sync != "async") return "--sync must be sync or async, not '" + o.sync + "'";
  bool async_form = false;
  px::arch::for_each(px::arch::all_async{},
                     [&](auto a) { async_form = async_form || o.arch == decltype(a)::synchronous::name; });
  if (o.sync == "async" && named && !async_form)
    return "--sync async needs a parameter server: --arch " + px::arch::async_names() + ", not " + o.arch;
  if (o.staleness < -1) return "--staleness must be >= 0, or -1 for unbounded";
  if (o.slow_factor < 1) return "--slow-factor must be at least 1";
  return "";
}

/// This rank's share of every global batch: examples [first, first + batch)
/// of the ranks x batch a step trains on.
struct Shard {
  std::size_t batch, first, global;
  Shard(const CommonOptions& o, const px::Context& ctx)
      : batch(o.batch),
        first(static_cast<std::size_t>(ctx.rank()) * o.batch),
        global(static_cast<std::size_t>(ctx.size()) * o.batch) {}
};

/// After the Context exists: prints the help or the error (rank 0 only) and
/// returns the exit code to leave with, or -1 to go on.
inline int report_command_line(const CommandLine& cl, const std::string& problem, const px::Context& ctx,
                               const char* about, const po::options_description& desc) {
  if (cl.help) {
    if (ctx.is_root()) std::cout << about << "\n\n" << desc << "\n";
    return 0;
  }
  const std::string& e = cl.error.empty() ? problem : cl.error;
  if (!e.empty()) {
    if (ctx.is_root()) std::cerr << "error: " << e << "\n(see --help)\n";
    return 2;
  }
  return -1;
}

}  // namespace examples
