#pragma once
/// @file
/// What a backend and the engine facade (engine::Comm, engine/comm.hpp)
/// share. A backend only starts and tests raw operations; the facade does
/// everything the calls have in common (call checks, byte booking,
/// deadlines and diagnosis, emulated links). The contract a backend meets
/// is written out in engine/comm.hpp.

#include <parallax/comm_stats.hpp>
#include <parallax/detail/fault.hpp>

#include <cstdint>
#include <string>

namespace parallax::engine::backend {

/// Thrown by a backend whose operation cannot complete (a peer is gone, the
/// transport failed, or, for a backend that waits inside a start, the
/// deadline passed): the facade turns it into its diagnosis, which compares
/// notes with the other ranks (a collective) or withdraws the call (a
/// point-to-point one). `cause` completes "rank r <cause> in <op>".
struct Failure {
  std::string cause;
};

/// The facade's account of the calls so far: the trainer step, the number of
/// calls (this one included) and the statistics whose label names the
/// variable. A backend reads it to say where it failed.
struct Site {
  std::int64_t step = -1;
  std::int64_t calls = 0;
  CommStats stats;

  detail::Position position(const char* op) const { return detail::Position::make(step, calls, op, stats.current()); }
  /// "op #call (variable 'w') at step s".
  std::string where(const char* op) const { return position(op).describe(); }
};

}  // namespace parallax::engine::backend
