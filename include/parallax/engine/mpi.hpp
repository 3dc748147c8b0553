#pragma once
/// @file
/// engine::Mpi: collectives and point-to-point messages over host memory with
/// MPI: the engine facade (engine/comm.hpp) over backend::Mpi. Every call is
/// issued non-blocking and completed by one wait that honours the engine's
/// deadline, so a missing peer becomes a timeout_error instead of a hang.

#include <parallax/engine/backend/mpi.hpp>
#include <parallax/engine/comm.hpp>

namespace parallax::engine {

/// Host-memory engine over an MPI communicator (a duplicate of the
/// context's). Supports alltoallv_unsized, start_alltoallv and recv_sized.
using Mpi = Comm<backend::Mpi>;

}  // namespace parallax::engine
