#pragma once
/// @file
/// Every setting of a Trainer: the common ones every synchronizer receives
/// (policy::Common), and the built-in policies' own, kept in their folders
/// (policy/*/options.hpp) and carried here. Every field has a working default;
/// TrainerOptions::resolve() is where the environment is read.

#include <parallax/context.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/policy/async_ps/options.hpp>
#include <parallax/policy/ring_allreduce/options.hpp>
#include <parallax/policy/sharded_ps/options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <type_traits>

namespace parallax {

/// How the ranks' gradients are combined.
enum class Reduction {
  mean,  ///< sum over ranks divided by the rank count: with equal local batches
         ///< and per-rank mean losses, the gradient of the global batch's mean loss
  sum,   ///< plain sum over ranks (for gradients already scaled by the global batch)
};

/// What a step does when a gradient holds NaN or an infinity (see
/// TrainerOptions::on_non_finite).
enum class NonFinite {
  /// skip where the step can be skipped (every architecture), ignore under
  /// TrainerOptions::update_when_ready, which updates before the step has
  /// seen every gradient. TrainerOptions::resolve() decides.
  automatic,
  /// The step is skipped on every rank: nothing is applied, and the
  /// variables, their optimizer state (Adam's step count too), steps() and
  /// the learning-rate schedule stay as if it had not been taken.
  /// Trainer::skipped_steps() counts it, Trainer::skipped_why() says why.
  skip,
  /// The step fails on every rank with a parallax::error naming the rank,
  /// the variable, where, and the step; nothing is applied.
  fail,
  /// Nothing looks: NaN and infinities are summed and applied like any value.
  ignore,
};

constexpr const char* to_string(NonFinite n) noexcept {
  switch (n) {
    case NonFinite::automatic: return "automatic";
    case NonFinite::skip: return "skip";
    case NonFinite::fail: return "fail";
    case NonFinite::ignore: return "ignore";
  }
  return "?";
}

/// When and where a Trainer saves on its own (during step()).
struct CheckpointOptions {
  /// Directory of the checkpoints (on a file system every rank sees). Empty:
  /// no automatic saves.
  std::string dir;
  /// Save after every this many steps (0: not by step count).
  std::uint64_t every_steps = 0;
  /// Save when this many seconds passed since the last save (0: not by time).
  /// Rank 0's clock decides; the decision travels with the step's agreement.
  double every_seconds = 0;
  /// Complete checkpoints kept; older ones are removed after a save (each
  /// leaves the listed names in one rename before its files are deleted).
  int keep_last = 3;
};

/// What a trainer's exchanges put on the wire for float gradients
/// (TrainerOptions::compress): their own 32 bits, or 16 (bf16: float's
/// range, 8 significant bits; fp16: 11 significant bits, largest 65504).
/// Sums are taken in float and rounded to 16 bits at each combination.
enum class Compression : std::uint8_t { none, bf16, fp16 };

namespace policy {
/// The settings of a Trainer that every synchronizer receives (a policy's
/// own settings come beside them: policy::ring::Options, sharded::Options,
/// async::Options; policy/policy.hpp, "own_options"). TrainerOptions
/// derives from it, so users write these fields on their TrainerOptions.
struct Common {
  Reduction reduction = Reduction::mean;
  /// Partition count per variable name, for the policies that partition a
  /// variable (ShardedPS, AsyncPS), overriding sharded.partitions.
  std::map<std::string, int> partitions;
  /// Apply the optimizer to a variable as soon as its gradient is summed
  /// after Trainer::ready() (a RingAllReduce fusion bucket's all-reduce), on
  /// the communication thread or in the caller, instead of in step(): the
  /// update then overlaps the rest of the backward pass too, as PyTorch's
  /// optimizer-in-backward does. The same arithmetic on the same sums, so
  /// the model is the same bit for bit; what changes is when: a variable's
  /// value may change, and its gradient be zeroed for the next step, at any
  /// moment between ready() and the end of step(), so the backward pass
  /// must not read either after marking it ready. Other
  /// policies' variables are updated in step(). Needs clip_norm 0 and
  /// on_non_finite ignore or automatic (both others need every gradient
  /// before any update); set the
  /// learning rate before a step's first ready(). A step that fails after
  /// such an update (a bad id, a failed collective) leaves the model part
  /// way through it: the trainer then refuses work until restore().
  bool update_when_ready = false;
  /// Float gradients travel in 16 bits (bf16 or fp16) when set: dense ones
  /// all-reduced by RingAllReduce (half the bytes, each sum rounded to 16
  /// bits) and sparse rows pushed to their ShardedPS owners (rounded where
  /// they leave, summed in float at the owner). docs/design.md, "Half
  /// precision". PARALLAX_COMPRESS=none|bf16|fp16 sets it for a job when it
  /// is none (resolve()).
  Compression compress = Compression::none;
};
}  // namespace policy

/// Whether this host's hardware threads cover every local rank's OpenMP
/// team and one more thread each: the core a trainer's communication
/// thread needs of its own (TrainerOptions::overlap_needs_spare_core), and
/// lends to the update phase (policy::Helper).
inline bool spare_core_per_rank(const Context& ctx) {
  const long hardware = static_cast<long>(std::thread::hardware_concurrency());
  return hardware >= static_cast<long>(ctx.topology().local_size()) * (ctx.threads() + 1);
}

/// Settings of a Trainer: the common ones every synchronizer receives
/// (policy::Common), each built-in policy's own (`ring`, `sharded`,
/// `async`), and the trainer's.
struct TrainerOptions : policy::Common {
  RingOptions ring;        ///< RingAllReduce: algorithm, segments, fusion buckets
  ShardedOptions sharded;  ///< ShardedPS: default partition count, local aggregation, groups
  engine::Options engine;  ///< deadline of every collective
  CheckpointOptions checkpoint;  ///< automatic saves during step()
  AsyncOptions async;            ///< AsyncPS: the staleness bound
  /// The learning rate of step s is the base rate (the optimizer's `lr`, or
  /// Trainer::set_learning_rate) times schedule(s), s counting from 1: see
  /// optim/schedule.hpp. Empty: the base rate throughout.
  std::function<double(std::uint64_t)> schedule;
  /// When positive, each step scales every gradient by min(1, clip_norm /
  /// norm), where norm is the global L2 norm of the step's gradient as
  /// applied (every variable, dense and sparse, summed over the ranks):
  /// PyTorch's clip_grad_norm_. One small all-reduce a step.
  /// Trainer::gradient_norm() reports the norm; a norm that is not finite
  /// is handled as on_non_finite says.
  double clip_norm = 0;
  /// When set, every phase of every step (and the user's time between the
  /// trainer's calls) is recorded and written, when the trainer is
  /// destroyed, as a Chrome trace to this path by rank 0 (chrome://tracing,
  /// Perfetto: a track per rank). PARALLAX_TIMELINE=<path> sets it for a
  /// job (resolve()). Off (empty), a phase costs one test of a flag.
  std::string timeline;
  /// Where Trainer::ready() starts moving gradients while the user
  /// computes: on a communication thread of the trainer's (needs MPI at
  /// MPI_THREAD_SERIALIZED, which Context(argc, argv) asks for). Off, or
  /// without that level, ready() moves them at once, in the caller: the
  /// same results, nothing overlapped.
  bool overlap = true;
  /// With overlap on, the communication thread runs only where it has a
  /// core of its own: a device space (the user's kernels run on the GPU),
  /// or a host whose hardware threads cover every local rank's OpenMP team
  /// and one more thread each. Elsewhere ready() moves each gradient at
  /// once, in the caller, while it is still in cache: on a host without a
  /// spare core a thread sharing the rank's core hides nothing, and the
  /// caller's way runs as fast as the plain step without a second thread
  /// (docs/benchmarks.md, "Overlap of communication with compute"). Where
  /// the thread runs on a host, step() also shares the dense updates with
  /// it (Trainer::shares_update()). False: the thread runs, and shares the
  /// updates, wherever MPI allows it, and where it has no core of its own
  /// an automatic engine yields in its waits (engine::Options::yield).
  /// Trainer::overlapping() says which was chosen.
  bool overlap_needs_spare_core = true;
  /// What a step does when a gradient holds NaN or an infinity (NonFinite).
  /// Unless it is ignore, each rank looks through the gradients it gave
  /// before the step's exchange (one read of them; the verdict rides on the
  /// step's agreement, so no message is added), and with clip_norm the
  /// global norm is checked as well, which also catches sums that overflowed.
  /// Asynchronous training has no agreement: a rank skips (or fails) its own
  /// step alone and pushes nothing. update_when_ready updates a variable
  /// before the step sees every gradient, so it needs ignore (automatic
  /// resolves to it there).
  NonFinite on_non_finite = NonFinite::automatic;

  /// The settings of a built-in policy kept here: `ring`, `sharded` or
  /// `async`, by type (what a policy tag's `options` list names).
  template <class Own>
  const Own& own() const noexcept {
    static_assert(detail::is_any_of_v<Own, RingOptions, ShardedOptions, AsyncOptions>,
                  "TrainerOptions carries the settings of RingAllReduce, ShardedPS and AsyncPS only");
    if constexpr (std::is_same_v<Own, RingOptions>) return ring;
    else if constexpr (std::is_same_v<Own, ShardedOptions>) return sharded;
    else return async;
  }

  /// These options as a Trainer over `Space` on `ctx` runs them: the one
  /// place that reads the environment for a trainer (docs/tutorial.md,
  /// "Environment variables"; engine::Options::from_environment() reads the
  /// engine's, in the engine), and that settles what depends on the job.
  ///
  /// * `timeline`: PARALLAX_TIMELINE=<path> when empty;
  /// * `sharded.shared_memory`: off with PARALLAX_SHARED_SHARDS=0;
  /// * `sharded.early_rows`: off with PARALLAX_EARLY_ROWS=0;
  /// * `overlap`: whether the communication thread runs (MPI at
  ///   MPI_THREAD_SERIALIZED and, with overlap_needs_spare_core on a host
  ///   space, a spare core: see there);
  /// * `engine.yield`: always where that thread has no core of its own and
  ///   the engine's yield is automatic (docs/benchmarks.md, "Overlap of
  ///   communication with compute");
  /// * `on_non_finite`: automatic becomes skip, or ignore with
  ///   update_when_ready.
  template <class Space = HostSpace>
  TrainerOptions resolve(const Context& ctx) const {
    TrainerOptions o = *this;
    if (o.timeline.empty())
      if (const char* env = std::getenv("PARALLAX_TIMELINE")) o.timeline = env;
    if (const char* env = std::getenv("PARALLAX_SHARED_SHARDS"))
      o.sharded.shared_memory = o.sharded.shared_memory && std::atoi(env) != 0;
    if (const char* env = std::getenv("PARALLAX_EARLY_ROWS"))
      o.sharded.early_rows = o.sharded.early_rows && std::atoi(env) != 0;
    const char* route = std::getenv("PARALLAX_ASYNC_ROUTE");
    if (route != nullptr && o.async.route == AsyncOptions::Route::automatic) {
      const std::string r = route;
      PARALLAX_EXPECTS(r == "rma" || r == "shared_memory" || r == "automatic",
                       "PARALLAX_ASYNC_ROUTE must be rma, shared_memory or automatic, not '", r, "'");
      o.async.route = r == "rma" ? AsyncOptions::Route::rma
                      : r == "shared_memory" ? AsyncOptions::Route::shared_memory : AsyncOptions::Route::automatic;
    }
    // A communication thread needs MPI_THREAD_SERIALIZED; on a host it waits
    // for a core of its own unless told not to (overlap_needs_spare_core).
    const bool spare_core = spare_core_per_rank(ctx);
    o.overlap = overlap && ctx.serialized_threads() &&
                (!overlap_needs_spare_core || !std::is_same_v<Space, HostSpace> || spare_core);
    if (o.overlap && !spare_core && o.engine.yield == engine::Options::Yield::automatic)
      o.engine.yield = engine::Options::Yield::always;
    if (const char* env = std::getenv("PARALLAX_COMPRESS"); env != nullptr && o.compress == Compression::none) {
      const std::string c = env;
      PARALLAX_EXPECTS(c == "none" || c == "bf16" || c == "fp16", "PARALLAX_COMPRESS must be none, bf16 or fp16, not '",
                       c, "'");
      o.compress = c == "bf16" ? Compression::bf16 : c == "fp16" ? Compression::fp16 : Compression::none;
    }
    if (o.on_non_finite == NonFinite::automatic)
      o.on_non_finite = update_when_ready ? NonFinite::ignore : NonFinite::skip;
    return o;
  }
};

}  // namespace parallax
