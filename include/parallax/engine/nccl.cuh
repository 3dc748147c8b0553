#pragma once
/// @file
/// engine::Nccl: the engine API over device memory with NCCL: the facade
/// (engine/comm.hpp) over backend::Nccl, whose communicator is built from
/// the MPI job (construction, operations and failures are told there). One
/// GPU per rank. nvcc and a CUDA configuration (PARALLAX_HAS_NCCL) only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_NCCL
#error "parallax/engine/nccl.cuh needs nvcc and a PARALLAX_ENABLE_CUDA build (NCCL)"
#endif

#include <parallax/engine/backend/nccl.cuh>
#include <parallax/engine/comm.hpp>

#include <nccl.h>

namespace parallax::engine {

/// Device-memory engine over NCCL. Every call enqueues its NCCL work on
/// exec()'s stream and waits for it against Options::timeout; at the
/// deadline the NCCL communicator is aborted and the ranks' diagnosis
/// follows (the engine is unusable afterwards). A call books exactly what
/// engine::Mpi books for it.
class Nccl : public Comm<backend::Nccl> {
 public:
  /// Nccl(ctx, options = {}): joins the context's ranks (collective):
  /// selects this rank's GPU and builds the NCCL communicator, within the
  /// deadline.
  using Comm::Comm;

  /// The NCCL communicator; null once aborted.
  ncclComm_t nccl_comm() const noexcept { return backend().nccl_comm(); }
  /// The CUDA device this rank uses.
  int device() const noexcept { return backend().device(); }
};

template <class Op>
struct supports<Nccl, Op> : supports<backend::Nccl, Op> {};

}  // namespace parallax::engine
