#pragma once
/// @file
/// What a backend and the engine facade (engine::Comm, engine/comm.hpp)
/// share. A backend only starts and tests raw operations; the facade does
/// everything the calls have in common (call checks, byte booking,
/// deadlines and diagnosis, the optional pacing hook). The contract a backend meets
/// is written out in engine/comm.hpp.

#include <parallax/comm_stats.hpp>
#include <parallax/detail/fault.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

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

/// Whether backend B paces calls between hosts (the facade's optional hook:
/// `inter_host(sent, received)` for the inter-host bytes it books, then
/// `completed()` after each wait; link::Emulated, tools/link, has it).
template <class B, class = void>
struct paces : std::false_type {};
template <class B>
struct paces<B, std::void_t<decltype(std::declval<B&>().inter_host(std::size_t{}, std::size_t{})),
                            decltype(std::declval<B&>().completed())>> : std::true_type {};
template <class B>
inline constexpr bool paces_v = paces<B>::value;

}  // namespace parallax::engine::backend
