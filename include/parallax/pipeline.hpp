#pragma once
/// @file
/// Pipeline (model) parallelism, combined with data parallelism: the model
/// is a chain of S stages, each stage's variables live only on the ranks
/// that run it, micro-batches flow forward through the stages and their
/// errors flow back, and each stage's replicas synchronise their gradients
/// with the stage's own Trainer (HyPar-Flow's hybrid; GPipe's and 1F1B's
/// schedules).
///
///     px::pipeline::Grid grid(ctx, stages);              // S x R ranks
///     MyStage part(grid.stage());                        // this rank's layers
///     px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(grid.replica_context(), opt, part.variables());
///     px::pipeline::Pipeline<float> pipe(grid, part.stage(),
///                                        px::pipeline::Schedule::one_f_one_b(stages, micro_batches));
///     for (...) { pipe.run(rows); trainer.step(); }
///
/// The user writes each stage as a px::pipeline::Stage: its input and
/// output widths and its forward and backward functions, which add the
/// gradients of its variables (accumulating over the micro-batches of the
/// step, in the schedule's order). parallax places the stages on the grid,
/// moves activations and errors between neighbours (pipeline/channel.hpp),
/// runs the schedule (pipeline/schedule.hpp), and measures it.

#include <parallax/context.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/pipeline/channel.hpp>
#include <parallax/pipeline/grid.hpp>
#include <parallax/pipeline/placement.hpp>
#include <parallax/pipeline/schedule.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::pipeline {

/// The part of the replica's batch a pass works on: rows [first, first +
/// rows) of the batch_rows rows the replica runs this step.
struct MicroBatch {
  int index = 0;
  std::size_t first = 0;
  std::size_t rows = 0;
  std::size_t batch_rows = 0;
};

/// One stage of the model, as the rank that runs it defines it. The
/// replicas of a stage must define it alike (name, widths, parameters).
///
/// forward(mb, in, out, saved) computes the stage on mb.rows examples: `in`
/// holds mb.rows x in_width values from the previous stage (null on the
/// first stage, which reads its own input, e.g. rows mb.first.. of its
/// batch), `out` receives mb.rows x out_width values for the next stage
/// (null on the last stage). It returns the micro-batch's loss on the last
/// stage (summed over its rows; other stages return 0), and keeps in `saved`
/// what its backward needs: the runner keeps `saved` and `in` per
/// micro-batch until that micro-batch's backward.
///
/// backward(mb, in, out_grad, in_grad, saved) adds the micro-batch's
/// gradients into the stage's variables and writes the gradient of the loss
/// with respect to `in` into `in_grad` (null on the first stage). out_grad is
/// the next stage's in_grad (null on the last stage, which starts from its
/// loss). For the replica's mean loss, a row's loss gradient carries the
/// factor 1 / mb.batch_rows; the Trainer's Reduction::mean then averages
/// the replicas.
///
/// In a memory space other than the host's (a Pipeline over a device engine:
/// engine::Nccl, engine::MpiStaged), `in`, `out`, `out_grad` and `in_grad`
/// point to that space's memory and `saved` is a Buffer there, so the
/// activations never leave the device; forward and backward return with
/// their results complete (synchronise the stream they ran on), since the
/// runner's engines send them on streams of their own.
template <class T, class Space = HostSpace>
struct Stage {
  /// What a stage keeps from a micro-batch's forward for its backward.
  using Saved = std::conditional_t<std::is_same_v<Space, HostSpace>, std::vector<T>, Buffer<T, Space>>;
  std::string name;
  std::size_t in_width = 0;    ///< values per example received (0 on the first stage)
  std::size_t out_width = 0;   ///< values per example sent (0 on the last stage)
  std::size_t parameters = 0;  ///< elements of the stage's variables (reported, compared across replicas)
  std::function<double(const MicroBatch&, const T* in, T* out, Saved& saved)> forward;
  std::function<void(const MicroBatch&, const T* in, const T* out_grad, T* in_grad, Saved& saved)> backward;
};

/// Settings of a Pipeline.
struct PipelineOptions {
  /// The deadline of every wait for a neighbour's message (timeout), and
  /// whether waits yield the core. PARALLAX_TIMEOUT_MS overrides the timeout.
  engine::Options engine;
};

/// What one run() did on this rank.
struct RunStats {
  double loss = 0;              ///< the sum of forward()'s returns (the last stage's losses)
  int peak_in_flight = 0;       ///< most micro-batches held between their forward and backward
  std::size_t peak_kept_bytes = 0;  ///< most bytes of inputs and `saved` held at once
  double busy_s = 0;            ///< seconds in forward() and backward()
  double wall_s = 0;            ///< seconds in run()
  std::uint64_t sent_bytes = 0, received_bytes = 0;  ///< activations and errors moved
  /// This rank's idle share of the run: 1 - busy / wall.
  double bubble_fraction() const { return wall_s > 0 ? 1.0 - busy_s / wall_s : 0.0; }
};

/// Runs one stage of a pipeline: the schedule's passes for this rank's
/// stage, with their messages. Set up once (collective over the world); each
/// run() is one step's forward and backward passes over the replica's batch.
///
/// @tparam T the element type of activations and errors (float, double)
/// @tparam Engine what carries them between stages, and where they live:
///   engine::Mpi (host memory), or a device engine (engine::Nccl,
///   engine::MpiStaged) for stages whose activations stay on the GPU
template <class T, class Engine = engine::Mpi>
class Pipeline {
 public:
  using space = typename Engine::space;
  using StageType = Stage<T, space>;

  /// Checks, on every rank alike and before any pass, that the ranks agree
  /// on the schedule and element type, that each stage's replicas define it
  /// alike, and that each stage's output width is the next stage's input
  /// width; every rank throws parallax::error naming the first problem.
  /// Collective over the world.
  Pipeline(const Grid& grid, StageType stage, Schedule schedule, PipelineOptions options = {})
      : grid_(&grid), stage_(std::move(stage)), schedule_(std::move(schedule)), channels_(grid, options.engine) {
    agree();
  }

  /// Runs this stage's passes over the replica's batch of `batch_rows` rows,
  /// cut into the schedule's micro-batches (as equal as can be; the first
  /// ones get the extra rows). Every rank of one replica passes the same
  /// rows. Returns once this stage's passes are done and its messages
  /// delivered; the gradients are then in the stage's variables, for its
  /// Trainer's step().
  RunStats run(std::size_t batch_rows) {
    using clock = std::chrono::steady_clock;
    const auto begin = clock::now();
    const int M = schedule_.micro_batches();
    const bool first = grid_->first_stage(), last = grid_->last_stage();
    const std::size_t in_w = stage_.in_width, out_w = stage_.out_width;
    const std::uint64_t sent0 = channels_.sent_bytes(), received0 = channels_.received_bytes();
    channels_.check_rows(batch_rows);
    inputs_.clear();
    saved_.clear();
    inputs_.resize(static_cast<std::size_t>(M));
    saved_.resize(static_cast<std::size_t>(M));
    RunStats stats;
    int in_flight = 0;
    std::size_t kept = 0;
    auto timed = [&](auto&& f) {
      const auto t0 = clock::now();
      f();
      stats.busy_s += std::chrono::duration<double>(clock::now() - t0).count();
    };
    for (const Action& a : schedule_.actions(grid_->stage())) {
      const MicroBatch mb = micro_batch(batch_rows, M, a.micro);
      auto& in = inputs_[static_cast<std::size_t>(a.micro)];
      auto& saved = saved_[static_cast<std::size_t>(a.micro)];
      if (a.pass == Pass::forward) {
        in = reuse(spare_inputs_);
        saved = reuse(spare_saved_);
        if (!first) {
          sized(in, mb.rows * in_w);
          channels_.recv(Pass::forward, a.micro, in.data(), in.size(), data_type_of_v<T>);
        }
        zeros(out_, last ? 0 : mb.rows * out_w);
        timed([&] { stats.loss += stage_.forward(mb, first ? nullptr : in.data(), last ? nullptr : out_.data(), saved); });
        if (!last) channels_.send(Pass::forward, a.micro, out_.data(), out_.size(), data_type_of_v<T>);
        ++in_flight;
        kept += (in.size() + saved.size()) * sizeof(T);
        stats.peak_in_flight = std::max(stats.peak_in_flight, in_flight);
        stats.peak_kept_bytes = std::max(stats.peak_kept_bytes, kept);
      } else {
        if (!last) {
          sized(out_grad_, mb.rows * out_w);
          channels_.recv(Pass::backward, a.micro, out_grad_.data(), out_grad_.size(), data_type_of_v<T>);
        }
        zeros(in_grad_, first ? 0 : mb.rows * in_w);
        const std::size_t held = (in.size() + saved.size()) * sizeof(T);
        timed([&] {
          stage_.backward(mb, first ? nullptr : in.data(), last ? nullptr : out_grad_.data(),
                          first ? nullptr : in_grad_.data(), saved);
        });
        if (!first) channels_.send(Pass::backward, a.micro, in_grad_.data(), in_grad_.size(), data_type_of_v<T>);
        --in_flight;
        kept -= held;
        spare_inputs_.push_back(std::move(in));
        spare_saved_.push_back(std::move(saved));
        in = Vec();
        saved = Vec();
      }
    }
    channels_.flush();
    stats.sent_bytes = channels_.sent_bytes() - sent0;
    stats.received_bytes = channels_.received_bytes() - received0;
    stats.wall_s = std::chrono::duration<double>(clock::now() - begin).count();
    return stats;
  }

  /// Micro-batch m of M over a batch of `rows` rows.
  static MicroBatch micro_batch(std::size_t rows, int M, int m) {
    const auto n = static_cast<std::size_t>(M), i = static_cast<std::size_t>(m);
    const std::size_t base = rows / n, extra = rows % n;
    return MicroBatch{m, i * base + std::min(i, extra), base + (i < extra ? 1 : 0), rows};
  }

  const Grid& grid() const noexcept { return *grid_; }
  const Stage<T>& stage() const noexcept { return stage_; }
  const Schedule& schedule() const noexcept { return schedule_; }

 private:
  /// What a rank says about its part of the pipeline, compared by every rank.
  struct Record {
    std::int32_t stage, schedule_stages, micro_batches, element_size, has_forward, has_backward;
    std::uint64_t schedule_hash, in_width, out_width, parameters;
    char schedule[24];
    char name[48];
  };

  static std::uint64_t fnv1a(const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
  }

  void agree() {
    Record mine{};
    mine.stage = grid_->stage();
    mine.schedule_stages = schedule_.stages();
    mine.micro_batches = schedule_.micro_batches();
    mine.element_size = static_cast<std::int32_t>(sizeof(T));
    mine.has_forward = stage_.forward ? 1 : 0;
    mine.has_backward = stage_.backward ? 1 : 0;
    mine.schedule_hash = fnv1a(schedule_.describe());
    mine.in_width = stage_.in_width;
    mine.out_width = stage_.out_width;
    mine.parameters = stage_.parameters;
    std::strncpy(mine.schedule, schedule_.name().c_str(), sizeof(mine.schedule) - 1);
    std::strncpy(mine.name, stage_.name.c_str(), sizeof(mine.name) - 1);
    const int size = grid_->world().size();
    std::vector<Record> all(static_cast<std::size_t>(size));
    PARALLAX_MPI_CHECK(MPI_Allgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE,
                                     grid_->world().comm()));
    auto who = [&](int r) { return grid_->describe_rank(r); };
    auto shape = [](const Record& x) {
      return detail::concat("'", x.name, "' (", x.in_width, " -> ", x.out_width, " values per example, ", x.parameters,
                            " parameters)");
    };
    const int S = grid_->stages();
    for (int r = 0; r < size; ++r) {
      const Record& x = all[static_cast<std::size_t>(r)];
      PARALLAX_EXPECTS(x.schedule_stages == S, "pipeline: ", who(r), " runs a schedule of ", x.schedule_stages,
                       " stages on a grid of ", S);
      PARALLAX_EXPECTS(x.element_size == all[0].element_size, "pipeline: ", who(r), " moves elements of ",
                       x.element_size, " bytes, ", who(0), " of ", all[0].element_size);
      PARALLAX_EXPECTS(x.micro_batches == all[0].micro_batches && x.schedule_hash == all[0].schedule_hash,
                       "pipeline: the ranks run different schedules: ", who(0), " runs ", all[0].schedule, " with ",
                       all[0].micro_batches, " micro-batches, ", who(r), " ", x.schedule, " with ", x.micro_batches);
      PARALLAX_EXPECTS(x.has_forward && x.has_backward, "pipeline: stage ", x.stage, " '", x.name, "' on ", who(r),
                       " has no ", x.has_forward ? "backward" : "forward", " function");
    }
    PARALLAX_EXPECTS(2 * all[0].micro_batches + 1 <= 32767, "pipeline: at most 16383 micro-batches, got ",
                     all[0].micro_batches);
    for (int r = S; r < size; ++r) {
      const Record& x = all[static_cast<std::size_t>(r)];
      const Record& ref = all[static_cast<std::size_t>(r % S)];
      PARALLAX_EXPECTS(std::strncmp(x.name, ref.name, sizeof(x.name)) == 0 && x.in_width == ref.in_width &&
                           x.out_width == ref.out_width && x.parameters == ref.parameters,
                       "pipeline: stage ", x.stage, " is defined differently on its replicas: ", who(r % S),
                       " defines ", shape(ref), ", ", who(r), " defines ", shape(x));
    }
    PARALLAX_EXPECTS(all[0].in_width == 0, "pipeline: the first stage ", shape(all[0]),
                     " receives nothing (it reads its own input): its in_width must be 0");
    PARALLAX_EXPECTS(all[static_cast<std::size_t>(S - 1)].out_width == 0, "pipeline: the last stage ",
                     shape(all[static_cast<std::size_t>(S - 1)]),
                     " sends nothing (it ends in the loss): its out_width must be 0");
    for (int s = 0; s + 1 < S; ++s) {
      const Record& a = all[static_cast<std::size_t>(s)];
      const Record& b = all[static_cast<std::size_t>(s) + 1];
      PARALLAX_EXPECTS(a.out_width > 0 && a.out_width == b.in_width, "pipeline: stage ", s, " ", shape(a), " sends ",
                       a.out_width, " values per example but stage ", s + 1, " ", shape(b), " expects ", b.in_width);
    }
  }

  using Vec = typename StageType::Saved;  // values in the engine's space
  /// v holds n values (their contents undefined).
  static void sized(Vec& v, std::size_t n) {
    if constexpr (std::is_same_v<space, HostSpace>) v.resize(n);
    else v.resize_discard(n);
  }
  /// An empty buffer, with the memory of one a finished micro-batch left in
  /// `spare` where there is one: a micro-batch's input and saved values are
  /// given up after its backward (so 1F1B holds at most S of them), and the
  /// next forward takes their memory instead of allocating (on a device,
  /// a cudaMalloc and cudaFree a micro-batch).
  static Vec reuse(std::vector<Vec>& spare) {
    if (spare.empty()) return Vec();
    Vec v = std::move(spare.back());
    spare.pop_back();
    v.clear();
    return v;
  }
  /// v holds n zeros.
  static void zeros(Vec& v, std::size_t n) {
    if constexpr (std::is_same_v<space, HostSpace>) {
      v.assign(n, T(0));
    } else {
      v.resize_discard(n);
      v.zero();
    }
  }

  const Grid* grid_;
  StageType stage_;
  Schedule schedule_;
  Channels<Engine> channels_;
  std::vector<Vec> inputs_, saved_;  // per micro-batch, from its forward to its backward
  std::vector<Vec> spare_inputs_, spare_saved_;  // given up by finished micro-batches (reuse())
  Vec out_, out_grad_, in_grad_;
};

/// The pipeline's measured bubble fraction over every rank of the grid:
/// 1 - (sum of busy seconds) / (sum of run() seconds). Collective over the
/// world.
inline double measured_bubble_fraction(const Grid& grid, const RunStats& stats) {
  const std::vector<double> sums = grid.world().sum(std::vector<double>{stats.busy_s, stats.wall_s});
  return sums[1] > 0 ? 1.0 - sums[0] / sums[1] : 0.0;
}

}  // namespace parallax::pipeline
