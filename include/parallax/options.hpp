#pragma once
/// @file
/// Every setting of a Trainer, with the settings of the built-in policies it
/// carries to them. Every field has a working default;
/// TrainerOptions::resolve() is where the environment is read.

#include <parallax/context.hpp>
#include <parallax/engine/engine.hpp>

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

/// Settings of RingAllReduce. The defaults follow docs/benchmarks.md,
/// "Collectives".
struct RingOptions {
  /// ring, native (the engine's all-reduce), hierarchical, or automatic:
  /// native with one rank, below `native_below_bytes`, on an oversubscribed
  /// host (see `adapt_to_oversubscription`) and for engines over device
  /// memory (NCCL, MpiStaged); otherwise hierarchical where there is more
  /// than one host and every host runs the same number (> 1) of ranks, the
  /// flat ring elsewhere. hierarchical (Horovod's
  /// HOROVOD_HIERARCHICAL_ALLREDUCE): a reduce-scatter inside each host, a
  /// ring all-reduce of each local rank's 1/L share between the hosts, an
  /// all-gather inside each host (docs/design.md, "Hierarchical
  /// all-reduce"); forced, it runs wherever every host has the same number
  /// of ranks and falls back to the flat ring where they differ. ring forces
  /// the flat ring (hierarchical off); RingAllReducer::hierarchical() says
  /// which ring runs.
  engine::Algorithm algorithm = engine::Algorithm::automatic;
  /// Buffers smaller than this go to the engine's all-reduce under automatic:
  /// 4 KiB is the smallest size the ring has been benchmarked at
  /// (docs/benchmarks.md, "Collectives"), and nothing below it speaks for it.
  std::size_t native_below_bytes = std::size_t{4} << 10;
  /// The ring moves each chunk in segments of at most this many bytes, two
  /// in flight, so a segment is reduced while the next one travels and
  /// landing and packing buffers stay in cache. Ignored on an oversubscribed
  /// host (see `adapt_to_oversubscription`).
  std::size_t segment_bytes = std::size_t{128} << 10;
  /// Tensor fusion: consecutive gradients are packed into buckets of at most
  /// this many bytes (a larger gradient is reduced in place, alone).
  std::size_t bucket_bytes = std::size_t{32} << 20;
  /// When a host runs more ranks than it has hardware threads, waiting ranks
  /// take turns on the cores and every wait for a descheduled neighbour costs
  /// a scheduler time slice. Then automatic picks the engine's all-reduce
  /// (fewer dependent steps than the ring's 2(N-1)), and the ring, if forced,
  /// sends each chunk whole instead of in segments. False: behave as on a
  /// host with a core per rank (tests use it to exercise segments).
  bool adapt_to_oversubscription = true;
};

/// Settings of ShardedPS.
struct ShardedOptions {
  /// Partitions per sharded variable; 0 means one per rank.
  int partitions = 0;
  /// Sum the sparse gradients of the ranks on one host before they cross to
  /// another host (needs more than one host with several ranks; see Context).
  bool local_aggregation = true;
  /// When every rank runs on one machine (host-memory engine), keep each
  /// shard in an MPI shared-memory window and let a lookup read its rows
  /// straight from their owners' shards: no owner gathers them, no reply
  /// carries them, and they land in the caller's order. The environment
  /// variable PARALLAX_SHARED_SHARDS=0 turns it off (for comparisons; read by
  /// TrainerOptions::resolve()).
  bool shared_memory = true;
  /// Store and exchange the sparse variables of one element type and width
  /// as one group (one shard buffer, one key space): a batched lookup then
  /// makes one sort pass, route and reply per group, and a step one push
  /// and one optimizer update per group, whatever the number of tables.
  /// Rows, errors, bytes and checkpoints stay per variable, and so does
  /// each variable's partitioning.
  bool group_tables = true;
  /// Trainer::ready(): push every group's gradient rows in one route once
  /// the last group is ready, instead of a route per group as each one is:
  /// a round trip a step per group fewer (what costs over TCP between
  /// hosts), but an early group's rows no longer travel while the layers
  /// below compute. Turn it off for a model whose backward pass computes
  /// long between its groups' ready() calls.
  bool push_together = true;
};

/// Settings of asynchronous training (the AsyncPS policy, arch::Async and
/// arch::AsyncHybrid; see async.hpp). Synchronous policies ignore them.
struct AsyncOptions {
  /// Stale synchronous parallel: a rank starts a step only while it has
  /// completed at most this many steps more than the slowest rank. 0: every
  /// rank waits for every other at every step; -1: unbounded.
  int staleness = 4;
  /// How ranks reach the shards and clocks (docs/async.md, "Two routes").
  enum class Route {
    automatic,      ///< shared memory where every rank maps it (one machine), else rma
    shared_memory,  ///< loads and stores in an MPI-3 shared-memory window (one machine only)
    rma,            ///< MPI one-sided calls: works across hosts; PARALLAX_ASYNC_ROUTE=rma forces it
  };
  Route route = Route::automatic;
};

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

/// Settings of a Trainer. Every synchronizer it creates reads its own part
/// (`ring`, `sharded`, `partitions`).
struct TrainerOptions {
  Reduction reduction = Reduction::mean;
  RingOptions ring;        ///< RingAllReduce: algorithm, segments, fusion buckets
  ShardedOptions sharded;  ///< ShardedPS: default partition count, local aggregation, groups
  /// Partition count per variable name, overriding sharded.partitions.
  std::map<std::string, int> partitions;
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
  /// (docs/benchmarks.md, "Overlap of communication with compute"). False:
  /// the thread runs wherever MPI allows it, and where it has no core of
  /// its own an automatic engine yields in its waits (engine::Options::
  /// yield). Trainer::overlapping() says which was chosen.
  bool overlap_needs_spare_core = true;
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
  /// Float gradients travel in 16 bits (bf16 or fp16) when set: dense ones
  /// all-reduced by RingAllReduce (half the bytes, each sum rounded to 16
  /// bits) and sparse rows pushed to their ShardedPS owners (rounded where
  /// they leave, summed in float at the owner). docs/design.md, "Half
  /// precision". PARALLAX_COMPRESS=none|bf16|fp16 sets it for a job when it
  /// is none (resolve()).
  Compression compress = Compression::none;

  /// These options as a Trainer over `Space` on `ctx` runs them: the one
  /// place that reads the environment for a trainer (docs/tutorial.md,
  /// "Environment variables"; engine::Options::from_environment() reads the
  /// engine's, in the engine), and that settles what depends on the job.
  ///
  /// * `timeline`: PARALLAX_TIMELINE=<path> when empty;
  /// * `sharded.shared_memory`: off with PARALLAX_SHARED_SHARDS=0;
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
    const long hardware = static_cast<long>(std::thread::hardware_concurrency());
    const bool spare_core = hardware >= static_cast<long>(ctx.topology().local_size()) * (ctx.threads() + 1);
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
