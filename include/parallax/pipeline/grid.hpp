#pragma once
/// @file
/// The pipeline's grid of ranks: S stages x R replicas over the job's
/// world (S x R ranks). World rank r runs stage r % S of replica r / S, so a
/// replica's stages are consecutive ranks (neighbours exchange activations
/// every micro-batch, on one host where the ranks of a host are consecutive)
/// and a stage's replicas are S ranks apart (they meet once a step, in the
/// stage's gradient exchange). Each stage's replicas share a Context over a
/// communicator of their own: the stage's Trainer runs over it, so its
/// variables are synchronised among those replicas by their usual policies.

#include <parallax/context.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

namespace parallax::pipeline {

/// Where this rank sits among S stages x R replicas. Set up once
/// (collective over the world); immutable.
class Grid {
 public:
  /// Splits `world` into `stages` stages. Collective over world. Every rank
  /// must pass the same stage count, and the world size must be a multiple
  /// of it; otherwise every rank throws parallax::error naming the problem,
  /// before anything else happens. `replica_options` configure the replica
  /// groups' Contexts (threads: the world's, unless set).
  Grid(const Context& world, int stages, ContextOptions replica_options = {}) : world_(&world) {
    const int size = world.size();
    std::vector<int> asked(static_cast<std::size_t>(size));
    PARALLAX_MPI_CHECK(MPI_Allgather(&stages, 1, MPI_INT, asked.data(), 1, MPI_INT, world.comm()));
    for (int r = 1; r < size; ++r)
      PARALLAX_EXPECTS(asked[static_cast<std::size_t>(r)] == asked[0],
                       "pipeline::Grid: the ranks ask for different stage counts: rank 0 for ", asked[0], ", rank ", r,
                       " for ", asked[static_cast<std::size_t>(r)]);
    PARALLAX_EXPECTS(stages >= 1, "pipeline::Grid: the stage count must be at least 1, got ", stages);
    PARALLAX_EXPECTS(size % stages == 0, "pipeline::Grid: ", size, " ranks cannot hold ", stages,
                     " stages: the world size must be a multiple of the stage count (stages x replicas ranks)");
    stages_ = stages;
    replicas_ = size / stages;
    stage_ = world.rank() % stages;
    replica_ = world.rank() / stages;
    MPI_Comm group = MPI_COMM_NULL;
    PARALLAX_MPI_CHECK(MPI_Comm_split(world.comm(), stage_, replica_, &group));
    if (replica_options.threads == 0) replica_options.threads = world.threads();
    replica_options.abort_on_uncaught_exception = false;  // the world's Context decides
    try {
      replica_context_ = std::make_unique<Context>(group, replica_options);
    } catch (...) {
      MPI_Comm_free(&group);
      throw;
    }
    MPI_Comm_free(&group);  // the Context holds its own duplicate
  }

  Grid(const Grid&) = delete;
  Grid& operator=(const Grid&) = delete;

  int stages() const noexcept { return stages_; }
  int replicas() const noexcept { return replicas_; }
  /// This rank's stage (0 first) and replica.
  int stage() const noexcept { return stage_; }
  int replica() const noexcept { return replica_; }
  bool first_stage() const noexcept { return stage_ == 0; }
  bool last_stage() const noexcept { return stage_ == stages_ - 1; }
  /// The world rank that runs `stage` of `replica`.
  int rank_of(int stage, int replica) const noexcept { return replica * stages_ + stage; }
  /// This rank's neighbours in its replica's pipeline (-1: none).
  int previous_rank() const noexcept { return first_stage() ? -1 : rank_of(stage_ - 1, replica_); }
  int next_rank() const noexcept { return last_stage() ? -1 : rank_of(stage_ + 1, replica_); }
  /// "rank 3 (stage 1, replica 1)".
  std::string describe_rank(int world_rank) const {
    return detail::concat("rank ", world_rank, " (stage ", world_rank % stages_, ", replica ", world_rank / stages_,
                          ")");
  }

  const Context& world() const noexcept { return *world_; }
  /// The replicas of this rank's stage (rank = replica): give it to the
  /// stage's Trainer.
  const Context& replica_context() const noexcept { return *replica_context_; }

 private:
  const Context* world_;
  int stages_ = 1, replicas_ = 1, stage_ = 0, replica_ = 0;
  std::unique_ptr<Context> replica_context_;
};

}  // namespace parallax::pipeline
