#pragma once
/// @file
/// engine::MpiStaged: the engine API over device memory through any MPI:
/// the facade (engine/comm.hpp) over backend::MpiStaged, which stages device
/// buffers through pinned host memory (how each call moves data is told
/// there). Works with several ranks per GPU. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/engine/mpi_staged.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/engine/backend/mpi_staged.cuh>
#include <parallax/engine/comm.hpp>

#include <cstddef>

namespace parallax::engine {

/// Device-memory engine over MPI, staging through pinned host memory. Its
/// stream is `exec()`: copies to and from the staging buffers are ordered
/// after the work the caller issued on that stream, and every call has
/// finished, results in place, when it returns. A call books exactly what
/// engine::Mpi books for it.
class MpiStaged : public Comm<backend::MpiStaged> {
 public:
  /// MpiStaged(ctx, options = {}, chunk_bytes = default_chunk_bytes): joins
  /// the context's ranks (collective) and selects this rank's GPU (local
  /// rank mod GPUs; ranks may share one).
  using Comm::Comm;
  static constexpr std::size_t default_chunk_bytes = backend::MpiStaged::default_chunk_bytes;

  /// The CUDA device this rank uses.
  int device() const noexcept { return backend().device(); }
  /// The pipeline chunk of allreduce and point-to-point messages.
  std::size_t chunk_bytes() const noexcept { return backend().chunk_bytes(); }
  /// Sets the pipeline chunk (at least 8 bytes). Every rank must use the same
  /// value: it decides how point-to-point messages are cut.
  void set_chunk_bytes(std::size_t bytes) { backend().set_chunk_bytes(bytes); }
};

template <class Op>
struct supports<MpiStaged, Op> : supports<backend::MpiStaged, Op> {};

}  // namespace parallax::engine
