#pragma once
/// @file
/// engine::Mpi: collectives and point-to-point messages over host memory with
/// MPI. Every call is issued non-blocking and completed by one wait that
/// honours the engine's deadline, so a missing peer becomes a timeout_error
/// instead of a hang.

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/link_emulation.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/detail/ring.hpp>
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
#include <string_view>
#include <thread>
#include <vector>

namespace parallax::engine {

/// Host-memory engine over an MPI communicator (a duplicate of the context's).
///
/// Byte accounting: point-to-point messages and alltoallv are booked exactly,
/// per peer. Collectives MPI runs itself are booked as the ring algorithm
/// would move them (allreduce: reduce-scatter + all-gather ring;
/// reduce_scatter, allgather(v): one ring pass), since that is what MPICH
/// does for large messages and what the cost table of docs/design.md assumes.
class Mpi {
  // The device-memory engines run their MPI side (and book their traffic)
  // through an Mpi they own, with its deadlines, fault reports and byte rules.
  friend class MpiStaged;
  friend class Nccl;

 public:
  using space = HostSpace;
  static constexpr const char* name = "mpi";

  /// A started point-to-point exchange; complete it with wait().
  class Exchange {
   public:
    Exchange() = default;

   private:
    friend class Mpi;
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };

  explicit Mpi(const Context& ctx, Options options = {})
      : topology_(ctx.topology()), options_(options.from_environment()), fault_(ctx.comm()) {
    yield_ = options_.yield == Options::Yield::always ||
             (options_.yield == Options::Yield::automatic && topology_.oversubscribed());
    PARALLAX_MPI_CHECK(MPI_Comm_dup(ctx.comm(), &comm_));
    PARALLAX_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    // Emulated links only matter between hosts; every rank parses the same text.
    const detail::LinkSpec link = detail::parse_link(options_.link);
    if (link.enabled() && topology_.num_hosts() > 1) link_.start(link, ctx.host_comm());
  }
  Mpi(const Mpi&) = delete;
  Mpi& operator=(const Mpi&) = delete;
  ~Mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL && !detail::job_failed()) MPI_Comm_free(&comm_);
  }

  int rank() const noexcept { return topology_.rank(); }
  int size() const noexcept { return topology_.size(); }
  const Topology& topology() const noexcept { return topology_; }
  /// Whether waits give the core away between polls (Options::yield).
  bool yields() const noexcept { return yield_; }
  MPI_Comm comm() const noexcept { return comm_; }
  CommStats& stats() noexcept { return stats_; }
  const CommStats& stats() const noexcept { return stats_; }
  Exec<HostSpace>& exec() noexcept { return exec_; }
  const Options& options() const noexcept { return options_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }
  void set_check_calls(bool on) noexcept { options_.check_calls = on; }
  /// The trainer step the coming calls belong to (for failure reports).
  void set_step(std::int64_t step) noexcept { step_ = step; }
  /// Engine calls made so far.
  std::int64_t calls() const noexcept { return calls_; }
  /// The emulated link between hosts (Options::link), disabled when off or
  /// when the job has one host.
  const detail::LinkSpec& link() const noexcept { return link_.spec(); }

  /// recv = op over all ranks of send, `count` elements. send == recv is in place.
  void allreduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    begin("allreduce", count, t);
    book_ring_allreduce(count, t);
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallreduce)(send == recv ? MPI_IN_PLACE : send, recv,
                                                      detail::to_mpi_count(count), detail::mpi_datatype(t),
                                                      detail::mpi_op(op), comm_, &r));
    complete(&r, 1, "allreduce");
  }

  /// Reduces `send` (sum of recv_counts elements) over all ranks; rank i gets
  /// block i (recv_counts[i] elements) in recv.
  void reduce_scatter(const void* send, void* recv, const std::size_t* recv_counts, DataType t, ReduceOp op) {
    begin("reduce_scatter", recv_counts[rank()], t);
    const int n = size();
    counts_.resize(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) counts_[j] = detail::to_mpi_count(recv_counts[j]);
    book_reduce_scatter(recv_counts, t);
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ireduce_scatter)(send, recv, counts_.data(), detail::mpi_datatype(t),
                                                           detail::mpi_op(op), comm_, &r));
    complete(&r, 1, "reduce_scatter");
  }

  /// Every rank contributes `count` elements; recv holds size()*count, rank order.
  void allgather(const void* send, void* recv, std::size_t count, DataType t) {
    begin("allgather", count, t);
    book_allgather(count, t);
    MPI_Request r;
    const auto c = detail::to_mpi_count(count);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallgather)(send, c, detail::mpi_datatype(t), recv, c,
                                                      detail::mpi_datatype(t), comm_, &r));
    complete(&r, 1, "allgather");
  }

  /// Rank j contributes counts[j] elements, placed at recv + displs[j].
  void allgatherv(const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    begin("allgatherv", 0, t);
    const int me = rank();
    PARALLAX_EXPECTS(counts[me] == count, "allgatherv: this rank sends ", count, " elements but counts[", me,
                     "] is ", counts[me]);
    fill_counts(counts, displs);
    book_allgatherv(count, counts, t);
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallgatherv)(send, detail::to_mpi_count(count), detail::mpi_datatype(t),
                                                       recv, counts_.data(), displs_.data(),
                                                       detail::mpi_datatype(t), comm_, &r));
    complete(&r, 1, "allgatherv");
  }

  /// Rank i sends block j (count elements at send + j*count) to rank j.
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) {
    begin("alltoall", count, t);
    book_alltoall(count, t);
    MPI_Request r;
    const auto c = detail::to_mpi_count(count);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ialltoall)(send, c, detail::mpi_datatype(t), recv, c,
                                                     detail::mpi_datatype(t), comm_, &r));
    complete(&r, 1, "alltoall");
  }

  /// Rank i sends scounts[j] elements at send + sdispls[j] to rank j and
  /// receives rcounts[j] elements from rank j at recv + rdispls[j].
  void alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    MPI_Request r = ialltoallv(send, scounts, sdispls, recv, rcounts, rdispls, t, counts_, displs_);
    complete(&r, 1, "alltoallv");
  }

  /// alltoallv() started and left in flight: the engine keeps it (and its
  /// counts) until wait_started(), which completes every started call in
  /// one wait, so that several tables' replies take one round of waiting.
  /// The buffers must stay untouched until then. Collective, in the same
  /// order on every rank.
  void start_alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                       const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    Started& op = started_.emplace_back();
    op.request = ialltoallv(send, scounts, sdispls, recv, rcounts, rdispls, t, op.counts, op.displs);
  }

  /// Completes every call start_alltoallv() left in flight, in one wait.
  void wait_started() {
    if (started_.empty()) return;
    requests_.clear();
    for (const Started& op : started_) requests_.push_back(op.request);
    complete(requests_.data(), static_cast<int>(requests_.size()), "alltoallv");
    started_.clear();  // MPI read the counts until now
  }

  /// alltoallv whose receivers do not know the sizes in advance: rank i sends
  /// sbytes[j] bytes at send + sdispls[j] to rank j, and learns what each
  /// rank j sends it from the message itself (MPI_Improbe), so no round of
  /// counts goes first. Once every size is known, `alloc(total)` returns
  /// room for all of them (a std::byte*); rank j's bytes land at
  /// rdispls[j], in rank order, and rbytes/rdispls are filled. Collective:
  /// every rank sends every rank one message (empty ones too).
  template <class Alloc>
  void alltoallv_unsized(const void* send, const std::size_t* sbytes, const std::size_t* sdispls,
                         std::size_t* rbytes, std::size_t* rdispls, Alloc&& alloc) {
    begin("alltoallv_unsized", 0, DataType::u8);
    const int n = size(), me = rank();
    const auto un = static_cast<std::size_t>(n);
    const auto* s = static_cast<const std::byte*>(send);
    requests_.assign(2 * un, MPI_REQUEST_NULL);
    messages_.assign(un, MPI_MESSAGE_NULL);  // stays null until the source's message is matched
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(s + sdispls[p], detail::to_mpi_count(sbytes[p]), MPI_BYTE, p,
                                                   unsized_tag, comm_, &requests_[static_cast<std::size_t>(p)]));
    }
    // Each peer's message, matched (so that no later message takes its
    // place) and measured.
    rbytes[me] = sbytes[me];
    int pending = n - 1;
    const bool matched = poll([&] {
      for (int p = 0; p < n; ++p) {
        const auto up = static_cast<std::size_t>(p);
        if (p == me || messages_[up] != MPI_MESSAGE_NULL) continue;
        int found = 0;
        MPI_Status st;
        MPI_Message m = MPI_MESSAGE_NULL;  // MPI leaves it undefined when nothing is found
        const int status = MPI_Improbe(p, unsized_tag, comm_, &found, &m, &st);
        if (status != MPI_SUCCESS)
          fail("alltoallv_unsized", detail::concat("lost a peer (", detail::mpi_error_string(status), ")"));
        if (!found) continue;
        messages_[up] = m;
        MPI_Count got = 0;
        PARALLAX_MPI_CHECK(MPI_Get_elements_x(&st, MPI_BYTE, &got));
        rbytes[p] = static_cast<std::size_t>(got);
        --pending;
      }
      return pending == 0;
    });
    if (!matched) fail("alltoallv_unsized", detail::concat("gave up after ", options_.timeout.count(), " ms"));
    std::size_t total = 0;
    for (std::size_t p = 0; p < un; ++p) {
      rdispls[p] = total;
      total += rbytes[p];
    }
    auto* r = static_cast<std::byte*>(static_cast<void*>(alloc(total)));
    if (sbytes[me]) std::memcpy(r + rdispls[me], s + sdispls[me], sbytes[me]);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const auto up = static_cast<std::size_t>(p);
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Imrecv)(r + rdispls[up], detail::to_mpi_count(rbytes[up]), MPI_BYTE,
                                                    &messages_[up], &requests_[un + up]));
    }
    book_alltoallv(sbytes, rbytes, DataType::u8);
    complete(requests_.data(), 2 * n, "alltoallv_unsized");
  }

  /// Copies `count` elements of root's buf to every rank's buf.
  void broadcast(void* buf, std::size_t count, DataType t, int root) {
    begin("broadcast", count, t);
    book_broadcast(count, t, root);
    MPI_Request r;
    PARALLAX_MPI_CHECK(
        PARALLAX_MPI_C(MPI_Ibcast)(buf, detail::to_mpi_count(count), detail::mpi_datatype(t), root, comm_, &r));
    complete(&r, 1, "broadcast");
  }

  void barrier() {
    begin("barrier", 0, DataType::u8);
    stats_.add_call();
    MPI_Request r;
    PARALLAX_MPI_CHECK(MPI_Ibarrier(comm_, &r));
    complete(&r, 1, "barrier");
  }

  void send(const void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    ++calls_;
    book_point_to_point(peer, count * size_of(t), -1, 0);
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(buf, detail::to_mpi_count(count), detail::mpi_datatype(t), peer,
                                                 tag, comm_, &r));
    complete(&r, 1, "send");
  }

  void recv(void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    ++calls_;
    book_point_to_point(-1, 0, peer, count * size_of(t));
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Irecv)(buf, detail::to_mpi_count(count), detail::mpi_datatype(t), peer,
                                                 tag, comm_, &r));
    complete(&r, 1, "recv");
  }

  /// Starts sending `scount` elements to `dst` while receiving `rcount` from
  /// `src`. Messages between one pair with one tag arrive in the order sent.
  Exchange start_sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                          int src, DataType t, int tag = 0) {
    Exchange x;
    ++calls_;
    book_point_to_point(dst, scount * size_of(t), src, rcount * size_of(t));
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Irecv)(recvbuf, detail::to_mpi_count(rcount), detail::mpi_datatype(t),
                                                 src, tag, comm_, &x.requests_[0]));
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(sendbuf, detail::to_mpi_count(scount), detail::mpi_datatype(t),
                                                 dst, tag, comm_, &x.requests_[1]));
    return x;
  }
  void wait(Exchange& x) { complete(x.requests_, 2, "sendrecv"); }

  void sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount, int src,
                DataType t, int tag = 0) {
    auto x = start_sendrecv(sendbuf, scount, dst, recvbuf, rcount, src, t, tag);
    wait(x);
  }

 private:
  /// Counts a collective call and, in check_calls mode, verifies that every
  /// rank is making the same one.
  void begin(const char* op, std::size_t count, DataType t) {
    ++calls_;
    if (options_.check_calls) check_call(op, count, t);
  }

  /// Starts an alltoallv (counts in elements of t), converting the counts
  /// into `counts` and `displs` (sends, then receives), which MPI reads until
  /// the returned request completes.
  MPI_Request ialltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                         const std::size_t* rcounts, const std::size_t* rdispls, DataType t,
                         std::vector<detail::mpi_count>& counts, std::vector<detail::mpi_displ>& displs) {
    begin("alltoallv", 0, t);
    const int n = size();
    const auto un = static_cast<std::size_t>(n);
    counts.resize(2 * un);
    displs.resize(2 * un);
    for (std::size_t p = 0; p < un; ++p) {
      counts[p] = detail::to_mpi_count(scounts[p]);
      displs[p] = static_cast<detail::mpi_displ>(sdispls[p]);
      counts[un + p] = detail::to_mpi_count(rcounts[p]);
      displs[un + p] = static_cast<detail::mpi_displ>(rdispls[p]);
    }
    book_alltoallv(scounts, rcounts, t);
    MPI_Request r;
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ialltoallv)(send, counts.data(), displs.data(), detail::mpi_datatype(t), recv,
                                                      counts.data() + n, displs.data() + n, detail::mpi_datatype(t),
                                                      comm_, &r));
    return r;
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

  /// Waits for the requests (wait_for), then, with emulated links, until
  /// the inter-host bytes booked since the last completion could have
  /// crossed them.
  void complete(MPI_Request* requests, int n, const char* op) {
    wait_for(requests, n, op);
    if (link_.enabled() && (link_sent_ || link_received_)) {
      link_.hold(link_start_, link_sent_, link_received_);
      link_sent_ = link_received_ = 0;
    }
  }

  /// Waits for the requests, polling against the deadline when one is set.
  /// A collective that times out or fails ends in a diagnosis shared by the
  /// ranks (detail/fault.hpp); a point-to-point one is withdrawn and reported.
  void wait_for(MPI_Request* requests, int n, const char* op) {
    const bool point_to_point =
        std::string_view(op) == "send" || std::string_view(op) == "recv" || std::string_view(op) == "sendrecv";
    if (options_.timeout.count() <= 0) {
      const int status = MPI_Waitall(n, requests, MPI_STATUSES_IGNORE);
      if (status != MPI_SUCCESS) fail(op, detail::concat("lost a peer (", detail::mpi_error_string(status), ")"));
      return;
    }
    const bool done = poll([&] {
      int all = 0;
      const int status = MPI_Testall(n, requests, &all, MPI_STATUSES_IGNORE);
      if (status != MPI_SUCCESS) fail(op, detail::concat("lost a peer (", detail::mpi_error_string(status), ")"));
      return all != 0;
    });
    if (done) return;
    const std::string waited = detail::concat("gave up after ", options_.timeout.count(), " ms");
    if (point_to_point) {
      // A point-to-point request can be withdrawn; the engine stays usable.
      for (int i = 0; i < n; ++i) {
        if (requests[i] == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&requests[i]);
        MPI_Request_free(&requests[i]);
      }
      const auto& label = stats_.current();
      throw timeout_error(detail::concat("parallax: rank ", rank(), " ", waited, " in ", op, " (variable '",
                                         label.first, "', policy ", label.second.empty() ? "-" : label.second,
                                         "); its peer did not send or receive"));
    }
    fail(op, waited);
  }

  /// A collective cannot complete: compare notes with the other ranks, mark
  /// the job failed (Context then aborts it) and throw the diagnosis.
  [[noreturn]] void fail(const char* op, const std::string& cause) {
    detail::job_failed() = true;
    const auto mine = detail::Position::make(step_, calls_, op, stats_.current());
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
  /// type) and throws on every rank, naming the first rank that differs.
  void check_call(const char* op, std::size_t count, DataType t) {
    struct Record {
      detail::Position where;
      std::uint64_t count;
      std::uint64_t type;
    };
    Record mine{detail::Position::make(step_, calls_, op, stats_.current()), count,
                static_cast<std::uint64_t>(t)};
    std::vector<Record> all(static_cast<std::size_t>(size()));
    MPI_Request r;
    PARALLAX_MPI_CHECK(MPI_Iallgather(&mine, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, comm_, &r));
    complete(&r, 1, "check_calls");
    for (int p = 0; p < size(); ++p) {
      const Record& o = all[static_cast<std::size_t>(p)];
      if (o.where.same_call(all[0].where) && std::strncmp(o.where.variable, all[0].where.variable, sizeof(o.where.variable)) == 0 &&
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
    stats_.add_sent(bytes, topology_.same_host(peer));
    if (!topology_.same_host(peer)) note_link(link_sent_, bytes);
  }
  void book_recv(int peer, std::size_t bytes) {
    stats_.add_received(bytes, topology_.same_host(peer));
    if (!topology_.same_host(peer)) note_link(link_received_, bytes);
  }
  /// Emulated links: the inter-host bytes of the calls in flight, held back
  /// when they complete; the clock starts with the first of them.
  void note_link(std::uint64_t& pending, std::size_t bytes) {
    if (!link_.enabled() || bytes == 0) return;
    if (link_sent_ == 0 && link_received_ == 0) link_start_ = std::chrono::steady_clock::now();
    pending += bytes;
  }
  /// A ring collective: sends go to the right neighbour, receipts come from the left.
  void book_ring(std::size_t sent_elems, std::size_t recv_elems, DataType t) {
    const int n = size(), me = rank();
    stats_.add_call();
    if (n <= 1) return;
    book_send(detail::ring::mod(me + 1, n), sent_elems * size_of(t));
    book_recv(detail::ring::mod(me - 1, n), recv_elems * size_of(t));
  }
  void book_ring_allreduce(std::size_t count, DataType t) {
    book_ring(detail::ring::allreduce_sent(count, size(), rank()),
              detail::ring::allreduce_received(count, size(), rank()), t);
  }
  // One helper per operation, shared with engine::MpiStaged and engine::Nccl,
  // so every engine books the same bytes for the same call
  // (docs/design.md, "Byte accounting").
  /// Ring model: every block but our own is sent, every block but our left
  /// neighbour's is received.
  void book_reduce_scatter(const std::size_t* recv_counts, DataType t) {
    const int n = size(), me = rank();
    std::size_t total = 0;
    for (int j = 0; j < n; ++j) total += recv_counts[j];
    book_ring(n > 1 ? total - recv_counts[me] : 0, n > 1 ? total - recv_counts[detail::ring::mod(me - 1, n)] : 0, t);
  }
  void book_allgather(std::size_t count, DataType t) {
    const auto n = static_cast<std::size_t>(size());
    book_ring(n > 1 ? (n - 1) * count : 0, n > 1 ? (n - 1) * count : 0, t);
  }
  /// Ring model: every block but the right neighbour's is sent, every block
  /// but our own is received.
  void book_allgatherv(std::size_t count, const std::size_t* counts, DataType t) {
    const int n = size(), me = rank();
    std::size_t total = 0;
    for (int j = 0; j < n; ++j) total += counts[j];
    book_ring(n > 1 ? total - counts[detail::ring::mod(me + 1, n)] : 0, n > 1 ? total - count : 0, t);
  }
  void book_alltoall(std::size_t count, DataType t) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      book_send(p, count * size_of(t));
      book_recv(p, count * size_of(t));
    }
    stats_.add_call();
  }
  void book_alltoallv(const std::size_t* scounts, const std::size_t* rcounts, DataType t) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      book_send(p, scounts[p] * size_of(t));
      book_recv(p, rcounts[p] * size_of(t));
    }
    stats_.add_call();
  }
  void book_broadcast(std::size_t count, DataType t, int root) {
    if (rank() == root) {
      for (int p = 0; p < size(); ++p)
        if (p != root) book_send(p, count * size_of(t));
    } else {
      book_recv(root, count * size_of(t));
    }
    stats_.add_call();
  }
  /// A send to `dst` and/or a receive from `src` (a negative peer: none).
  void book_point_to_point(int dst, std::size_t sent_bytes, int src, std::size_t recv_bytes) {
    if (dst >= 0) book_send(dst, sent_bytes);
    if (src >= 0) book_recv(src, recv_bytes);
    stats_.add_call();
  }
  void fill_counts(const std::size_t* counts, const std::size_t* displs) {
    const auto n = static_cast<std::size_t>(size());
    counts_.resize(n);
    displs_.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      counts_[j] = detail::to_mpi_count(counts[j]);
      displs_[j] = static_cast<detail::mpi_displ>(displs[j]);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  Topology topology_;
  bool yield_ = false;  // give the core away between polls (Options::yield)
  Options options_;
  detail::FaultChannel fault_;
  std::int64_t step_ = -1;
  std::int64_t calls_ = 0;
  CommStats stats_;
  Exec<HostSpace> exec_;
  std::vector<detail::mpi_count> counts_;
  std::vector<detail::mpi_displ> displs_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Message> messages_;
  struct Started {  // a start_alltoallv() in flight, with the counts MPI reads until it completes
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<detail::mpi_count> counts;
    std::vector<detail::mpi_displ> displs;
  };
  std::deque<Started> started_;
  detail::LinkEmulator link_;
  std::uint64_t link_sent_ = 0, link_received_ = 0;  // inter-host bytes since the last completion
  std::chrono::steady_clock::time_point link_start_;
  // The tag of alltoallv_unsized's messages, apart from those of send/recv
  // (small tags) and the fault channel (7117, 7118).
  static constexpr int unsized_tag = 7119;
};

template <>
struct supports<Mpi, op_sendrecv> : std::true_type {};
template <>
struct supports<Mpi, op_alltoallv> : std::true_type {};
template <>
struct supports<Mpi, op_allreduce> : std::true_type {};
template <>
struct supports<Mpi, op_alltoallv_unsized> : std::true_type {};
template <>
struct supports<Mpi, op_start_alltoallv> : std::true_type {};

}  // namespace parallax::engine
