#pragma once
/// @file
/// What every engine shares: the algorithm choice, the capability trait, and
/// the options. An engine moves untyped bytes (pointer + count + DataType)
/// between the ranks of one communicator and books them in its CommStats.
///
/// The static interface every engine provides (see engine::Mpi):
///
///     using space = ...;                       // where its buffers live
///     int rank() const; int size() const;
///     const Topology& topology() const;
///     CommStats& stats();
///     Exec<space>& exec();
///     void allreduce(const void* send, void* recv, size_t count, DataType, ReduceOp);
///     void reduce_scatter(const void* send, void* recv, const size_t* recv_counts, DataType, ReduceOp);
///     void allgather(const void* send, void* recv, size_t count, DataType);
///     void allgatherv(const void* send, size_t count, void* recv, const size_t* counts, const size_t* displs, DataType);
///     void alltoall(const void* send, void* recv, size_t count, DataType);
///     void alltoallv(const void* send, const size_t* scounts, const size_t* sdispls,
///                    void* recv, const size_t* rcounts, const size_t* rdispls, DataType);
///     void broadcast(void* buf, size_t count, DataType, int root);
///     void barrier();
///     void send(const void*, size_t, DataType, int peer); void recv(void*, size_t, DataType, int peer);
///     Exchange start_sendrecv(const void* s, size_t sc, int dst, void* r, size_t rc, int src, DataType);
///     void wait(Exchange&);
///
/// Counts are elements; displacements are elements. Byte accounting rules are
/// in docs/design.md ("Byte accounting").

#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <type_traits>

namespace parallax::engine {

/// How a policy runs a collective it could do several ways.
enum class Algorithm {
  automatic,  ///< the policy picks by size and rank count (see the policy's docs)
  ring,       ///< parallax's own ring over point-to-point messages
  native,     ///< the engine's own collective (MPI_Iallreduce, ncclAllReduce)
};

constexpr const char* to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::automatic: return "automatic";
    case Algorithm::ring: return "ring";
    case Algorithm::native: return "native";
  }
  return "?";
}

/// Settings common to the engines. The environment can override them (for
/// jobs launched by scripts): PARALLAX_TIMEOUT_MS, PARALLAX_CHECK_CALLS=1.
struct Options {
  /// How long any single engine call may wait for its peers before the ranks
  /// that gave up compare notes and throw parallax::timeout_error naming the
  /// rank that did not arrive. Zero waits forever.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// How long a rank that gave up listens for the others' reports. Zero:
  /// a fifth of the timeout, between 1 and 10 seconds.
  std::chrono::milliseconds grace{0};
  /// Before every collective, check that all ranks make the same call (same
  /// operation, variable, element count and type) and name the first rank
  /// that does not. One extra small all-gather per call: a debugging aid.
  bool check_calls = false;
  /// Whether a rank waiting for its peers gives its core away between polls
  /// (std::this_thread::yield). automatic: yes on a host that runs more
  /// ranks than it has hardware threads, where a spinning rank would hold
  /// the core its peer needs to send, for a whole scheduler slice; no
  /// otherwise (a core per rank: spinning answers soonest).
  enum class Yield { automatic, always, never } yield = Yield::automatic;

  /// This with the environment's overrides applied (PARALLAX_TIMEOUT_MS,
  /// PARALLAX_CHECK_CALLS=1, PARALLAX_YIELD=0|1).
  Options from_environment() const {
    Options o = *this;
    if (const char* t = std::getenv("PARALLAX_TIMEOUT_MS")) o.timeout = std::chrono::milliseconds(std::atoll(t));
    if (const char* c = std::getenv("PARALLAX_CHECK_CALLS")) o.check_calls = std::atoi(c) != 0;
    if (const char* y = std::getenv("PARALLAX_YIELD")) o.yield = std::atoi(y) != 0 ? Yield::always : Yield::never;
    return o;
  }
  std::chrono::milliseconds grace_period() const {
    if (grace.count() > 0) return grace;
    return std::clamp(timeout / 5, std::chrono::milliseconds(1000), std::chrono::milliseconds(10000));
  }
};

/// Operations an engine may or may not have natively.
struct op_sendrecv {};
struct op_alltoallv {};
struct op_allreduce {};
/// alltoallv_unsized(): an alltoallv whose receivers learn the sizes from the messages.
struct op_alltoallv_unsized {};
/// start_alltoallv() / wait_started(): alltoallvs left in flight and completed in one wait.
struct op_start_alltoallv {};

/// `supports_v<Engine, Op>`: the engine implements Op itself. Specialised by
/// each engine beside its definition (Aluminum's IsOpSupported).
template <class Engine, class Op>
struct supports : std::false_type {};
template <class Engine, class Op>
inline constexpr bool supports_v = supports<Engine, Op>::value;

/// The space an engine's buffers live in.
template <class Engine>
using space_of_t = typename Engine::space;

}  // namespace parallax::engine
