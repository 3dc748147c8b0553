#pragma once
/// @file
/// engine::Comm<Backend>: the public engine API, implemented once over a
/// backend that only starts and tests raw non-blocking operations. What
/// every call shares lives here: the call count and check_calls mode, byte
/// booking (docs/design.md, "Byte accounting"), the deadline of every wait
/// and the diagnosis the ranks share when one passes (detail/fault.hpp),
/// and an optional pacing hook for backends that slow calls between hosts
/// down (link::Emulated, tools/link: emulated links). engine::Mpi, engine::MpiStaged and
/// engine::Nccl are Comm over backend::Mpi, backend::MpiStaged and
/// backend::Nccl.
///
/// A backend B (a new one is one file; tests/engine/contract.cpp defines one):
/// * `using space`, `static constexpr const char* name`, `struct Request`
///   (a started operation; default-constructible and movable; the facade
///   reuses one for its blocking calls);
/// * `B(const Context&, MPI_Comm, const Options&, const backend::Site&, extra...)`:
///   the MPI communicator is the facade's own duplicate of the context's;
///   Options and Site are the facade's and outlive the backend;
/// * `Exec<space>& exec()`;
/// * starts, each filling a Request: `allreduce`, `reduce_scatter`,
///   `allgather`, `allgatherv`, `alltoall`, `alltoallv`, `broadcast`,
///   `barrier` and `sendrecv(x, send, scount, dst, recv, rcount, src, t, tag)`
///   (a negative peer leaves that side out), with the facade's arguments
///   after the Request;
/// * `bool test(Request&)`: progress; true once complete (buffers final);
///   throws backend::Failure if it cannot complete;
/// * `bool cancel(Request&) noexcept`: a point-to-point operation missed its
///   deadline; true if it was withdrawn and the backend stays usable;
/// * `const char* give_up() noexcept`: a collective missed its deadline (the
///   job ends); the backend releases what it must and returns a note for
///   the report ("" for none).
/// * optional, with supports<B, op_alltoallv_unsized>: `prepare`,
///   `send_bytes`, `probe`, `recv_probed` (see backend::Mpi), which also
///   give recv_sized().
/// * optional, the pacing hook (backend::paces_v<B>): `inter_host(sent,
///   received)`, told the inter-host bytes the facade books for each call,
///   and `completed()`, called after every wait, which may hold it back.

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/detail/ring.hpp>
#include <parallax/engine/backend/backend.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace parallax::engine {

/// An engine: the calls of the engine contract (engine::check) over
/// Backend's raw operations. Every call is started non-blocking and
/// completed by one wait that honours the deadline, so a missing peer
/// becomes a timeout_error instead of a hang.
///
/// Byte accounting: point-to-point messages and alltoallv are booked exactly,
/// per peer. Collectives are booked as the ring algorithm would move them
/// (allreduce: reduce-scatter + all-gather ring; reduce_scatter,
/// allgather(v): one ring pass), since that is what MPICH does for large
/// messages and what the cost table of docs/design.md assumes; every
/// backend books the same bytes for the same call.
template <class Backend>
class Comm {
 public:
  using space = typename Backend::space;
  static constexpr const char* name = Backend::name;
  /// A started point-to-point exchange; complete it with wait().
  using Exchange = typename Backend::Request;

  /// Joins the context's ranks (collective: duplicates its communicator).
  /// `args` go to the backend (engine::MpiStaged: the pipeline chunk).
  template <class... Args>
  explicit Comm(const Context& ctx, Options options = {}, Args&&... args)
      : topology_(ctx.topology()),
        options_(options.from_environment()),
        comm_(ctx.comm()),
        fault_(ctx.comm()),
        backend_(ctx, comm_.get(), options_, site_, std::forward<Args>(args)...) {
    yield_ = options_.yield == Options::Yield::always ||
             (options_.yield == Options::Yield::automatic && topology_.oversubscribed());
    if constexpr (!backend::paces_v<Backend>)
      PARALLAX_EXPECTS(topology_.num_hosts() == 1 || options_.link.empty() || options_.link == "off", "engine::",
                       name, ": the link '", options_.link, "' (engine::Options::link, PARALLAX_LINK) is emulated by ",
                       "an engine over link::Emulated<backend> (tools/link, docs/cluster.md), not by this one");
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const noexcept { return topology_.rank(); }
  int size() const noexcept { return topology_.size(); }
  const Topology& topology() const noexcept { return topology_; }
  /// Whether waits give the core away between polls (Options::yield).
  bool yields() const noexcept { return yield_; }
  /// The engine's MPI communicator (a duplicate of the context's).
  MPI_Comm comm() const noexcept { return comm_.get(); }
  CommStats& stats() noexcept { return site_.stats; }
  const CommStats& stats() const noexcept { return site_.stats; }
  /// Where kernels and copies of this engine run.
  Exec<space>& exec() noexcept { return backend_.exec(); }
  const Options& options() const noexcept { return options_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }
  void set_check_calls(bool on) noexcept { options_.check_calls = on; }
  /// The trainer step the coming calls belong to (for failure reports).
  void set_step(std::int64_t step) noexcept { site_.step = step; }
  /// Engine calls made so far.
  std::int64_t calls() const noexcept { return site_.calls; }
  /// The backend, for what only it has (engine::Nccl: its NCCL communicator).
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

  /// recv = op over all ranks of send, `count` elements. send == recv is in place.
  void allreduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    begin("allreduce", count, t);
    book_ring(detail::ring::allreduce_sent(count, size(), rank()),
              detail::ring::allreduce_received(count, size(), rank()), t);
    run("allreduce", [&](Exchange& x) { backend_.allreduce(x, send, recv, count, t, op); });
  }

  /// Reduces `send` (sum of recv_counts elements) over all ranks; rank i gets
  /// block i (recv_counts[i] elements) in recv. Booked as a ring: every
  /// block but our own is sent, every block but our left neighbour's is
  /// received.
  void reduce_scatter(const void* send, void* recv, const std::size_t* recv_counts, DataType t, ReduceOp op) {
    begin("reduce_scatter", recv_counts[rank()], t);
    const int n = size(), me = rank();
    std::size_t total = 0;
    for (int j = 0; j < n; ++j) total += recv_counts[j];
    book_ring(n > 1 ? total - recv_counts[me] : 0, n > 1 ? total - recv_counts[detail::ring::mod(me - 1, n)] : 0, t);
    run("reduce_scatter", [&](Exchange& x) { backend_.reduce_scatter(x, send, recv, recv_counts, t, op); });
  }

  /// Every rank contributes `count` elements; recv holds size()*count, rank order.
  void allgather(const void* send, void* recv, std::size_t count, DataType t) {
    begin("allgather", count, t);
    const auto n = static_cast<std::size_t>(size());
    book_ring(n > 1 ? (n - 1) * count : 0, n > 1 ? (n - 1) * count : 0, t);
    run("allgather", [&](Exchange& x) { backend_.allgather(x, send, recv, count, t); });
  }

  /// Rank j contributes counts[j] elements, placed at recv + displs[j].
  /// Booked as a ring: every block but the right neighbour's is sent, every
  /// block but our own is received.
  void allgatherv(const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    begin("allgatherv", 0, t);
    const int n = size(), me = rank();
    PARALLAX_EXPECTS(counts[me] == count, "allgatherv: this rank sends ", count, " elements but counts[", me,
                     "] is ", counts[me]);
    std::size_t total = 0;
    for (int j = 0; j < n; ++j) total += counts[j];
    book_ring(n > 1 ? total - counts[detail::ring::mod(me + 1, n)] : 0, n > 1 ? total - count : 0, t);
    run("allgatherv", [&](Exchange& x) { backend_.allgatherv(x, send, count, recv, counts, displs, t); });
  }

  /// Rank i sends block j (count elements at send + j*count) to rank j.
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) {
    begin("alltoall", count, t);
    book_pairs([&](int) { return count; }, [&](int) { return count; }, t);
    run("alltoall", [&](Exchange& x) { backend_.alltoall(x, send, recv, count, t); });
  }

  /// Rank i sends scounts[j] elements at send + sdispls[j] to rank j and
  /// receives rcounts[j] elements from rank j at recv + rdispls[j].
  void alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    begin("alltoallv", 0, t);
    book_alltoallv(scounts, rcounts, t);
    run("alltoallv", [&](Exchange& x) { backend_.alltoallv(x, send, scounts, sdispls, recv, rcounts, rdispls, t); });
  }

  /// alltoallv() started and left in flight: the engine keeps it (and its
  /// counts) until wait_started(), which completes every started call in
  /// one wait, so that several tables' replies take one round of waiting.
  /// The buffers must stay untouched until then. Collective, in the same
  /// order on every rank. Backends with supports<B, op_start_alltoallv>.
  void start_alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                       const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    static_assert(supports_v<Backend, op_start_alltoallv>, "this engine's backend cannot leave alltoallvs in flight");
    begin("alltoallv", 0, t);
    book_alltoallv(scounts, rcounts, t);
    Exchange& x = started_.emplace_back();
    start("alltoallv", [&] { backend_.alltoallv(x, send, scounts, sdispls, recv, rcounts, rdispls, t); });
  }

  /// Completes every call start_alltoallv() left in flight, in one wait.
  void wait_started() {
    if (started_.empty()) return;
    finish(
        "alltoallv", false,
        [&] {
          bool all = true;
          for (Exchange& x : started_) all = backend_.test(x) && all;
          return all;
        },
        [] { return false; });
    started_.clear();  // the backend read the counts until now
  }

  /// alltoallv whose receivers do not know the sizes in advance: rank i sends
  /// sbytes[j] bytes at send + sdispls[j] to rank j, and learns what each
  /// rank j sends it from the message itself, so no round of counts goes
  /// first. Once every size is known, `alloc(total)` returns room for all of
  /// them (a std::byte*); rank j's bytes land at rdispls[j], in rank order,
  /// and rbytes/rdispls are filled. Collective: every rank sends every rank
  /// one message (empty ones too). Backends with
  /// supports<B, op_alltoallv_unsized>.
  template <class Alloc>
  void alltoallv_unsized(const void* send, const std::size_t* sbytes, const std::size_t* sdispls,
                         std::size_t* rbytes, std::size_t* rdispls, Alloc&& alloc) {
    static_assert(supports_v<Backend, op_alltoallv_unsized>, "this engine's backend has no alltoallv_unsized");
    const char* op = "alltoallv_unsized";
    begin(op, 0, DataType::u8);
    const int n = size(), me = rank();
    const auto un = static_cast<std::size_t>(n);
    const auto* s = static_cast<const std::byte*>(send);
    Exchange& x = call_;
    start(op, [&] {
      backend_.prepare(x, un, un);
      for (int p = 0; p < n; ++p)
        if (p != me) backend_.send_bytes(x, static_cast<std::size_t>(p), s + sdispls[p], sbytes[p], p, unsized_tag);
    });
    // Each peer's message, matched (so that no later message takes its
    // place) and measured.
    rbytes[me] = sbytes[me];
    finish(
        op, false,
        [&] {
          bool all = true;
          for (int p = 0; p < n; ++p)
            if (p != me) all = backend_.probe(x, static_cast<std::size_t>(p), p, unsized_tag, rbytes[p]) && all;
          return all;
        },
        [] { return false; });
    std::size_t total = 0;
    for (std::size_t p = 0; p < un; ++p) {
      rdispls[p] = total;
      total += rbytes[p];
    }
    auto* r = static_cast<std::byte*>(static_cast<void*>(alloc(total)));
    if (sbytes[me]) std::memcpy(r + rdispls[me], s + sdispls[me], sbytes[me]);
    start(op, [&] {
      for (int p = 0; p < n; ++p)
        if (p != me) backend_.recv_probed(x, static_cast<std::size_t>(p), r + rdispls[p], rbytes[p]);
    });
    book_alltoallv(sbytes, rbytes, DataType::u8);
    complete(x, op, false);
  }

  /// Copies `count` elements of root's buf to every rank's buf.
  void broadcast(void* buf, std::size_t count, DataType t, int root) {
    begin("broadcast", count, t);
    if (rank() == root) {
      for (int p = 0; p < size(); ++p)
        if (p != root) book_send(p, count * size_of(t));
    } else {
      book_recv(root, count * size_of(t));
    }
    site_.stats.add_call();
    run("broadcast", [&](Exchange& x) { backend_.broadcast(x, buf, count, t, root); });
  }

  /// Waits until every rank has called barrier() (and this rank's work on
  /// exec() is done).
  void barrier() {
    begin("barrier", 0, DataType::u8);
    site_.stats.add_call();
    run("barrier", [&](Exchange& x) { backend_.barrier(x); });
  }

  /// Sends `count` elements to `peer` with `tag`.
  void send(const void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    ++site_.calls;
    book_point_to_point(peer, count * size_of(t), -1, 0);
    start("send", [&] { backend_.sendrecv(call_, buf, count, peer, nullptr, 0, -1, t, tag); });
    complete(call_, "send", true);
  }

  /// Receives `count` elements from `peer` with `tag`.
  void recv(void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    ++site_.calls;
    book_point_to_point(-1, 0, peer, count * size_of(t));
    start("recv", [&] { backend_.sendrecv(call_, nullptr, 0, -1, buf, count, peer, t, tag); });
    complete(call_, "recv", true);
  }

  /// Receives the next message from `peer` with `tag`, whatever its length:
  /// once it has arrived, `room(count)` returns where its `count` elements
  /// of t go. Returns the count. Backends with supports<B, op_alltoallv_unsized>.
  template <class Room>
  std::size_t recv_sized(DataType t, int peer, int tag, Room&& room) {
    static_assert(supports_v<Backend, op_alltoallv_unsized>, "this engine's backend cannot measure a message");
    ++site_.calls;
    std::size_t bytes = 0;
    start("recv", [&] { backend_.prepare(call_, 0, 1); });
    finish("recv", true, [&] { return backend_.probe(call_, 0, peer, tag, bytes); }, [] { return true; });
    void* into = room(bytes / size_of(t));
    book_point_to_point(-1, 0, peer, bytes);
    start("recv", [&] { backend_.recv_probed(call_, 0, into, bytes); });
    complete(call_, "recv", true);
    return bytes / size_of(t);
  }

  /// Starts sending `scount` elements to `dst` while receiving `rcount` from
  /// `src` (a negative peer leaves that side out). Messages between one pair
  /// with one tag arrive in the order started.
  Exchange start_sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                          int src, DataType t, int tag = 0) {
    Exchange x;
    ++site_.calls;
    book_point_to_point(dst, scount * size_of(t), src, rcount * size_of(t));
    start("sendrecv", [&] { backend_.sendrecv(x, sendbuf, scount, dst, recvbuf, rcount, src, t, tag); });
    return x;
  }
  /// Completes an exchange: the received elements are in the receive buffer.
  /// A missed deadline withdraws it and throws timeout_error.
  void wait(Exchange& x) { complete(x, "sendrecv", true); }
  /// Whether an exchange has completed (then wait() returns at once).
  bool done(Exchange& x) {
    try {
      return backend_.test(x);
    } catch (const backend::Failure& f) {
      fail("sendrecv", f.cause);
    }
  }

  void sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount, int src,
                DataType t, int tag = 0) {
    auto x = start_sendrecv(sendbuf, scount, dst, recvbuf, rcount, src, t, tag);
    wait(x);
  }

 private:
  /// The facade's own duplicate of the context's communicator.
  class Duplicate {
   public:
    explicit Duplicate(MPI_Comm parent) {
      PARALLAX_MPI_CHECK(MPI_Comm_dup(parent, &comm_));
      PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    }
    Duplicate(const Duplicate&) = delete;
    Duplicate& operator=(const Duplicate&) = delete;
    ~Duplicate() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized && comm_ != MPI_COMM_NULL && !detail::job_failed()) MPI_Comm_free(&comm_);
    }
    MPI_Comm get() const noexcept { return comm_; }

   private:
    MPI_Comm comm_ = MPI_COMM_NULL;
  };

  /// Counts a collective call and, in check_calls mode, verifies that every
  /// rank is making the same one.
  void begin(const char* op, std::size_t count, DataType t) {
    ++site_.calls;
    if (options_.check_calls) check_call(op, count, t);
  }

  /// Runs a backend start; a Failure becomes the shared diagnosis.
  template <class Start>
  void start(const char* op, Start&& go) {
    try {
      go();
    } catch (const backend::Failure& f) {
      fail(op, f.cause);
    }
  }
  /// A blocking collective: start it in the reused request, then complete it.
  template <class Start>
  void run(const char* op, Start&& go) {
    start(op, [&] { go(call_); });
    complete(call_, op, false);
  }

  /// Calls `step` until it returns true (then returns true) or the deadline
  /// passes (false; never without a timeout), giving the core away between
  /// calls when the engine yields.
  template <class Step>
  bool poll(Step&& step) {
    const bool timed = options_.timeout.count() > 0;
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (std::uint32_t spins = 0;; ++spins) {
      if (step()) return true;
      if (timed && (spins & 63u) == 0 && std::chrono::steady_clock::now() > deadline) return false;
      if (yield_) std::this_thread::yield();  // let the peer we wait for run
    }
  }

  /// Waits for `x` (then a pacing backend's completed()).
  void complete(Exchange& x, const char* op, bool point_to_point) {
    finish(op, point_to_point, [&] { return backend_.test(x); }, [&] { return backend_.cancel(x); });
  }

  /// Polls `ready` against the deadline. A collective that times out or
  /// fails ends in a diagnosis shared by the ranks (fail()); a point-to-point
  /// one is withdrawn (`cancel`, true when the backend could) and reported.
  template <class Ready, class Cancel>
  void finish(const char* op, bool point_to_point, Ready&& ready, Cancel&& cancel) {
    bool done = false;
    try {
      done = poll(ready);
    } catch (const backend::Failure& f) {
      fail(op, f.cause);
    }
    if (!done) {
      const std::string waited = detail::concat("gave up after ", options_.timeout.count(), " ms");
      if (point_to_point && cancel()) {
        const auto& label = site_.stats.current();
        throw timeout_error(detail::concat("parallax: rank ", rank(), " ", waited, " in ", op, " (variable '",
                                           label.first, "', policy ", label.second.empty() ? "-" : label.second,
                                           "); its peer did not send or receive"));
      }
      const std::string note = backend_.give_up();
      fail(op, note.empty() ? waited : detail::concat(waited, " (", note, ")"));
    }
    if constexpr (backend::paces_v<Backend>) backend_.completed();
  }

  /// A collective cannot complete: compare notes with the other ranks, mark
  /// the job failed (Context then aborts it) and throw the diagnosis.
  [[noreturn]] void fail(const char* op, const std::string& cause) {
    detail::job_failed() = true;
    const auto mine = site_.position(op);
    const auto heard = fault_.exchange(mine, options_.grace_period());
    const std::string report = detail::diagnose(rank(), mine, heard, cause, topology_.rank_host_names());
    // Printed here as well as thrown: the job is about to end, and the
    // operator must see every rank's view even if the exception is swallowed.
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    fault_.settle(heard, options_.grace_period());
    throw timeout_error(report);
  }

  /// check_calls mode: all-gathers (call number, operation, variable, count,
  /// type) over the facade's communicator and throws on every rank, naming
  /// the first rank that differs.
  void check_call(const char* op, std::size_t count, DataType t) {
    struct Record {
      detail::Position where;
      std::uint64_t count;
      std::uint64_t type;
    };
    Record mine{site_.position(op), count, static_cast<std::uint64_t>(t)};
    std::vector<Record> all(static_cast<std::size_t>(size()));
    MPI_Request r;
    PARALLAX_MPI_CHECK(
        MPI_Iallgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, comm_.get(), &r));
    finish(
        "check_calls", false,
        [&] {
          int done = 0;
          const int status = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
          if (status != MPI_SUCCESS)
            throw backend::Failure{detail::concat("lost a peer (", detail::mpi_error_string(status), ")")};
          return done != 0;
        },
        [] { return false; });
    for (int p = 0; p < size(); ++p) {
      const Record& o = all[static_cast<std::size_t>(p)];
      if (o.where.same_call(all[0].where) &&
          std::strncmp(o.where.variable, all[0].where.variable, sizeof(o.where.variable)) == 0 &&
          o.count == all[0].count && o.type == all[0].type)
        continue;
      auto text = [](const Record& x) {
        return detail::concat(x.where.describe(), " with ", x.count, " elements of ",
                              to_string(static_cast<DataType>(x.type)));
      };
      throw error(detail::concat("parallax: ranks make different collective calls: rank 0 calls ", text(all[0]),
                                 " but rank ", p, " calls ", text(o)));
    }
  }

  void book_send(int peer, std::size_t bytes) {
    site_.stats.add_sent(bytes, topology_.same_host(peer));
    if constexpr (backend::paces_v<Backend>)
      if (!topology_.same_host(peer)) backend_.inter_host(bytes, 0);
  }
  void book_recv(int peer, std::size_t bytes) {
    site_.stats.add_received(bytes, topology_.same_host(peer));
    if constexpr (backend::paces_v<Backend>)
      if (!topology_.same_host(peer)) backend_.inter_host(0, bytes);
  }
  /// A ring collective: sends go to the right neighbour, receipts come from the left.
  void book_ring(std::size_t sent_elems, std::size_t recv_elems, DataType t) {
    const int n = size(), me = rank();
    site_.stats.add_call();
    if (n <= 1) return;
    book_send(detail::ring::mod(me + 1, n), sent_elems * size_of(t));
    book_recv(detail::ring::mod(me - 1, n), recv_elems * size_of(t));
  }
  /// Every other rank p: sent(p) elements to it, received(p) from it.
  template <class Sent, class Received>
  void book_pairs(Sent&& sent, Received&& received, DataType t) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      book_send(p, sent(p) * size_of(t));
      book_recv(p, received(p) * size_of(t));
    }
    site_.stats.add_call();
  }
  void book_alltoallv(const std::size_t* scounts, const std::size_t* rcounts, DataType t) {
    book_pairs([&](int p) { return scounts[p]; }, [&](int p) { return rcounts[p]; }, t);
  }
  /// A send to `dst` and/or a receive from `src` (a negative peer: none).
  void book_point_to_point(int dst, std::size_t sent_bytes, int src, std::size_t recv_bytes) {
    if (dst >= 0) book_send(dst, sent_bytes);
    if (src >= 0) book_recv(src, recv_bytes);
    site_.stats.add_call();
  }

  Topology topology_;
  Options options_;
  bool yield_ = false;  // give the core away between polls (Options::yield)
  Duplicate comm_;
  detail::FaultChannel fault_;
  backend::Site site_;  // step, calls, statistics
  Backend backend_;
  Exchange call_;                // the blocking calls' request, reused
  std::deque<Exchange> started_;  // start_alltoallv() in flight
  // The tag of alltoallv_unsized's messages, apart from those of send/recv
  // (small tags) and the fault channel (7117, 7118).
  static constexpr int unsized_tag = 7119;
};

/// An engine supports what its backend supports.
template <class Backend, class Op>
struct supports<Comm<Backend>, Op> : supports<Backend, Op> {};

}  // namespace parallax::engine
