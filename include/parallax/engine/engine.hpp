#pragma once
/// @file
/// What every engine shares: the algorithm choice, the options, the
/// capability trait, and the contract an engine type must meet
/// (`engine::check<E>()`). An engine moves untyped bytes (pointer + count +
/// DataType) between the ranks of one communicator and books them in its
/// CommStats. Counts and displacements are in elements. Byte accounting rules
/// are in docs/design.md ("Byte accounting").

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

namespace parallax::engine {

/// How a policy runs a collective it could do several ways.
enum class Algorithm {
  automatic,     ///< the policy picks by size, rank count and hosts (see the policy's docs)
  ring,          ///< parallax's own ring over point-to-point messages
  native,        ///< the engine's own collective (MPI_Iallreduce, ncclAllReduce)
  hierarchical,  ///< the ring inside each host, then between hosts, then inside each host (RingAllReduce)
};

constexpr const char* to_string(Algorithm a) noexcept {
  switch (a) {
    case Algorithm::automatic: return "automatic";
    case Algorithm::ring: return "ring";
    case Algorithm::native: return "native";
    case Algorithm::hierarchical: return "hierarchical";
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
  /// the core its peer needs to send, for a whole scheduler slice, and for
  /// a Trainer whose communication thread has no core of its own (it
  /// shares the rank's with the user's thread); no otherwise (a core per
  /// thread: spinning answers soonest).
  enum class Yield { automatic, always, never } yield = Yield::automatic;
  /// Emulated links between hosts, for an engine over link::Emulated<B>
  /// (tools/link; tests and benchmarks): "10Gbit/s,20us" holds back every
  /// call that moves bytes between hosts until a link of that bandwidth and
  /// latency, shared by the host's ranks, could have carried them
  /// (docs/cluster.md, "Emulated links"). Empty or "off": none. Other
  /// engines refuse a link when the job has more than one host.
  std::string link;

  /// This with the environment's overrides applied (PARALLAX_TIMEOUT_MS,
  /// PARALLAX_CHECK_CALLS=1, PARALLAX_YIELD=0|1, PARALLAX_LINK).
  Options from_environment() const {
    Options o = *this;
    o.timeout = detail::timeout_from_environment(o.timeout);
    if (const char* c = std::getenv("PARALLAX_CHECK_CALLS")) o.check_calls = std::atoi(c) != 0;
    if (const char* y = std::getenv("PARALLAX_YIELD")) o.yield = std::atoi(y) != 0 ? Yield::always : Yield::never;
    if (const char* l = std::getenv("PARALLAX_LINK")) o.link = l;
    return o;
  }
  std::chrono::milliseconds grace_period() const {
    if (grace.count() > 0) return grace;
    return detail::grace_for(timeout);
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

// ---------------------------------------------------------------- the contract

namespace contract {
// One detector per member that parallax's trainer and policies call, with
// the argument types they pass.
template <class E>
E& e();
template <class T>
T v();
using csize = const std::size_t*;

template <class E, class = void> struct space : std::false_type {};
template <class E> struct space<E, std::enable_if_t<is_space_v<typename E::space>>> : std::true_type {};
#define PARALLAX_ENGINE_MEMBER(trait, expr)                        \
  template <class E, class = void>                                 \
  struct trait : std::false_type {};                               \
  template <class E>                                               \
  struct trait<E, std::void_t<decltype(expr)>> : std::true_type {};
PARALLAX_ENGINE_MEMBER(construct, E(v<const Context&>(), v<Options>()))
PARALLAX_ENGINE_MEMBER(ranks, static_cast<int>(e<const E>().rank() + e<const E>().size()))
PARALLAX_ENGINE_MEMBER(topology, static_cast<const Topology&>(e<const E>().topology()))
PARALLAX_ENGINE_MEMBER(stats, static_cast<CommStats&>(e<E>().stats()))
PARALLAX_ENGINE_MEMBER(exec, static_cast<Exec<typename E::space>&>(e<E>().exec()))
PARALLAX_ENGINE_MEMBER(set_step, e<E>().set_step(std::int64_t{}))
PARALLAX_ENGINE_MEMBER(allreduce, e<E>().allreduce(v<const void*>(), v<void*>(), std::size_t{}, DataType{}, ReduceOp{}))
PARALLAX_ENGINE_MEMBER(allgather, e<E>().allgather(v<const void*>(), v<void*>(), std::size_t{}, DataType{}))
PARALLAX_ENGINE_MEMBER(allgatherv, e<E>().allgatherv(v<const void*>(), std::size_t{}, v<void*>(), csize{}, csize{},
                                                     DataType{}))
PARALLAX_ENGINE_MEMBER(alltoall, e<E>().alltoall(v<const void*>(), v<void*>(), std::size_t{}, DataType{}))
PARALLAX_ENGINE_MEMBER(alltoallv, e<E>().alltoallv(v<const void*>(), csize{}, csize{}, v<void*>(), csize{}, csize{},
                                                   DataType{}))
PARALLAX_ENGINE_MEMBER(broadcast, e<E>().broadcast(v<void*>(), std::size_t{}, DataType{}, int{}))
PARALLAX_ENGINE_MEMBER(sendrecv, e<E>().sendrecv(v<const void*>(), std::size_t{}, int{}, v<void*>(), std::size_t{},
                                                 int{}, DataType{}))
PARALLAX_ENGINE_MEMBER(start_sendrecv,
                       e<E>().wait(e<decltype(e<E>().start_sendrecv(v<const void*>(), std::size_t{}, int{}, v<void*>(),
                                                                      std::size_t{}, int{}, DataType{}))>()))
PARALLAX_ENGINE_MEMBER(alltoallv_unsized,
                       e<E>().alltoallv_unsized(v<const void*>(), csize{}, csize{}, v<std::size_t*>(),
                                                v<std::size_t*>(), v<std::byte* (*)(std::size_t)>()))
PARALLAX_ENGINE_MEMBER(start_alltoallv, (e<E>().start_alltoallv(v<const void*>(), csize{}, csize{}, v<void*>(), csize{},
                                                                csize{}, DataType{}),
                                         e<E>().wait_started()))
#undef PARALLAX_ENGINE_MEMBER
}  // namespace contract

/// True when E has every member parallax calls on an engine (see check()).
template <class E>
inline constexpr bool is_engine_v =
    contract::space<E>::value && contract::construct<E>::value && contract::ranks<E>::value &&
    contract::topology<E>::value && contract::stats<E>::value && contract::exec<E>::value &&
    contract::set_step<E>::value && contract::allreduce<E>::value && contract::allgather<E>::value &&
    contract::allgatherv<E>::value && contract::alltoall<E>::value && contract::alltoallv<E>::value &&
    contract::broadcast<E>::value && contract::sendrecv<E>::value && contract::start_sendrecv<E>::value &&
    (!supports_v<E, op_alltoallv_unsized> || contract::alltoallv_unsized<E>::value) &&
    (!supports_v<E, op_start_alltoallv> || contract::start_alltoallv<E>::value);

/// The engine contract, checked member by member: each one E lacks is a
/// compile error that names it. These are exactly the calls parallax's
/// trainer and policies make (engine::Comm implements them once over a
/// backend, engine/comm.hpp).
/// Returns true, so it can sit in a static_assert or a constexpr variable.
template <class E>
constexpr bool check() {
  static_assert(contract::space<E>::value,
                "parallax engine: needs `using space = HostSpace;` or `CudaSpace`: where its buffers live");
  static_assert(contract::construct<E>::value,
                "parallax engine: needs a constructor E(const Context&, engine::Options)");
  static_assert(contract::ranks<E>::value, "parallax engine: needs `int rank() const` and `int size() const`");
  static_assert(contract::topology<E>::value, "parallax engine: needs `const Topology& topology() const`");
  static_assert(contract::stats<E>::value, "parallax engine: needs `CommStats& stats()` (every call books its bytes)");
  static_assert(contract::exec<E>::value, "parallax engine: needs `Exec<space>& exec()` (where kernels run)");
  static_assert(contract::set_step<E>::value,
                "parallax engine: needs `void set_step(std::int64_t)` (the step fault reports name)");
  static_assert(contract::allreduce<E>::value,
                "parallax engine: needs `allreduce(const void* send, void* recv, size_t count, DataType, ReduceOp)`");
  static_assert(contract::allgather<E>::value,
                "parallax engine: needs `allgather(const void* send, void* recv, size_t count, DataType)`");
  static_assert(contract::allgatherv<E>::value,
                "parallax engine: needs `allgatherv(const void* send, size_t count, void* recv, const size_t* counts, "
                "const size_t* displs, DataType)`");
  static_assert(contract::alltoall<E>::value,
                "parallax engine: needs `alltoall(const void* send, void* recv, size_t count, DataType)`");
  static_assert(contract::alltoallv<E>::value,
                "parallax engine: needs `alltoallv(const void* send, const size_t* scounts, const size_t* sdispls, "
                "void* recv, const size_t* rcounts, const size_t* rdispls, DataType)`");
  static_assert(contract::broadcast<E>::value,
                "parallax engine: needs `broadcast(void* buf, size_t count, DataType, int root)`");
  static_assert(contract::sendrecv<E>::value,
                "parallax engine: needs `sendrecv(const void* send, size_t scount, int dst, void* recv, size_t rcount, "
                "int src, DataType)`");
  static_assert(contract::start_sendrecv<E>::value,
                "parallax engine: needs `X start_sendrecv(...)` (sendrecv's arguments) and `void wait(X&)`");
  static_assert(!supports_v<E, op_alltoallv_unsized> || contract::alltoallv_unsized<E>::value,
                "parallax engine: supports<E, op_alltoallv_unsized> says yes, but alltoallv_unsized(send, sbytes, "
                "sdispls, rbytes, rdispls, allocate) is missing");
  static_assert(!supports_v<E, op_start_alltoallv> || contract::start_alltoallv<E>::value,
                "parallax engine: supports<E, op_start_alltoallv> says yes, but start_alltoallv(...) (alltoallv's "
                "arguments) or wait_started() is missing");
  return true;
}

}  // namespace parallax::engine
