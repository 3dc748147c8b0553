#pragma once
/// @file
/// engine::Nccl: the engine interface of engine::Mpi for device memory, over
/// an NCCL communicator built from the MPI job. One GPU per rank. nvcc and a
/// CUDA configuration (PARALLAX_HAS_NCCL) only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_NCCL
#error "parallax/engine/nccl.cuh needs nvcc and a PARALLAX_ENABLE_CUDA build (NCCL)"
#endif

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/cuda/device.cuh>
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/memory.cuh>
#include <parallax/cuda/nccl_error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace parallax::detail {

/// NCCL's datatype for a parallax DataType.
inline ncclDataType_t nccl_datatype(DataType t) {
  switch (t) {
    case DataType::f32: return ncclFloat32;
    case DataType::f64: return ncclFloat64;
    case DataType::i32: return ncclInt32;
    case DataType::i64: return ncclInt64;
    case DataType::u8: return ncclUint8;
  }
  return ncclUint8;
}

/// NCCL's reduction for a parallax ReduceOp.
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace parallax::detail

namespace parallax::engine {

/// Device-memory engine over NCCL.
///
/// Construction (collective): one GPU per rank is selected by local rank
/// (parallax::error if a host runs more ranks than it has GPUs), rank 0 makes
/// the ncclUniqueId and MPI broadcasts it, and every rank joins with
/// ncclCommInitRankConfig on a non-blocking communicator (`blocking = 0`),
/// so that initialisation, like every later call, can be given up and
/// aborted at the deadline.
///
/// Every call enqueues its NCCL work on exec()'s stream and then waits for
/// it: cudaStreamQuery and ncclCommGetAsyncError are polled against
/// Options::timeout. On an NCCL or CUDA error, or at the deadline, the
/// communicator is aborted (ncclCommAbort), the job is marked failed, and
/// the call throws: parallax::nccl_error / cuda_error for an error,
/// parallax::timeout_error (after the ranks compare notes, as engine::Mpi
/// does) for the deadline; each names the operation, the call number and the
/// trainer step. The engine is unusable afterwards.
///
/// The MPI side (bootstrap, fault reports, check_calls, barrier) and the byte
/// accounting are those of an engine::Mpi the engine owns: a call books
/// exactly what engine::Mpi books for it.
///
/// Operations: allreduce, allgather, broadcast and reduce_scatter (equal
/// blocks) are NCCL collectives; reduce_scatter with unequal blocks is a
/// group of ncclReduce; alltoall, alltoallv and allgatherv are groups of
/// ncclSend/ncclRecv; start_sendrecv is a grouped ncclSend + ncclRecv.
/// NCCL has no tags: messages between a pair arrive in the order enqueued.
/// Buffers in host memory (the library's small control messages) are copied
/// through device scratch buffers; start_sendrecv needs device memory.
class Nccl {
 public:
  using space = CudaSpace;
  static constexpr const char* name = "nccl";

  /// A started point-to-point exchange; complete it with wait().
  class Exchange {
   public:
    Exchange() = default;

   private:
    friend class Nccl;
    int slot_ = -1;  // event recorded after the exchange's NCCL work
  };

  /// Joins the context's ranks: selects this rank's GPU and builds the NCCL
  /// communicator. Collective.
  /// @param ctx     the job
  /// @param options deadline (also of the communicator's initialisation) and
  ///                check_calls, as for engine::Mpi
  explicit Nccl(const Context& ctx, Options options = {})
      : mpi_(ctx, options),
        device_(select_device(local_rank_on_host(mpi_.comm()), DeviceSharing::exclusive, "engine::Nccl")),
        exec_(Exec<CudaSpace>::create()) {
    init_communicator();
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ~Nccl() {
    if (comm_ == nullptr) return;
    if (detail::job_failed()) {
      (void)ncclCommAbort(comm_);
      return;
    }
    // Finish, bounded, then destroy; abort if NCCL does not finish in time.
    (void)cudaStreamSynchronize(exec_.stream());
    ncclResult_t state = ncclCommFinalize(comm_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      std::this_thread::yield();
    }
    if (state == ncclSuccess) (void)ncclCommDestroy(comm_);
    else (void)ncclCommAbort(comm_);
  }

  int rank() const noexcept { return mpi_.rank(); }
  int size() const noexcept { return mpi_.size(); }
  const Topology& topology() const noexcept { return mpi_.topology(); }
  /// The MPI communicator beside the NCCL one (bootstrap, fault reports).
  MPI_Comm comm() const noexcept { return mpi_.comm(); }
  /// The NCCL communicator; null once aborted.
  ncclComm_t nccl_comm() const noexcept { return comm_; }
  CommStats& stats() noexcept { return mpi_.stats(); }
  const CommStats& stats() const noexcept { return mpi_.stats(); }
  /// The stream all NCCL work of this engine is enqueued on.
  Exec<CudaSpace>& exec() noexcept { return exec_; }
  const Options& options() const noexcept { return mpi_.options(); }
  void set_timeout(std::chrono::milliseconds t) noexcept { mpi_.set_timeout(t); }
  void set_check_calls(bool on) noexcept { mpi_.set_check_calls(on); }
  /// The trainer step the coming calls belong to (for failure reports).
  void set_step(std::int64_t step) noexcept { mpi_.set_step(step); }
  /// Engine calls made so far.
  std::int64_t calls() const noexcept { return mpi_.calls(); }
  /// The CUDA device this rank uses.
  int device() const noexcept { return device_; }

  /// recv = op over all ranks of send, `count` elements. send == recv is in place.
  void allreduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    start("allreduce", count, t);
    mpi_.book_ring_allreduce(count, t);
    const std::size_t bytes = count * size_of(t);
    const void* in = device_in(send, bytes);
    void* out = send == recv ? const_cast<void*>(in) : device_out(recv, bytes);
    if (count)
      check("allreduce", "ncclAllReduce",
            ncclAllReduce(in, out, count, detail::nccl_datatype(t), detail::nccl_op(op), comm_, stream()));
    finish("allreduce");
    host_out(recv, out, bytes);
  }

  /// Reduces `send` (sum of recv_counts elements) over all ranks; rank i gets
  /// block i (recv_counts[i] elements) in recv.
  void reduce_scatter(const void* send, void* recv, const std::size_t* recv_counts, DataType t, ReduceOp op) {
    const int n = size(), me = rank();
    start("reduce_scatter", recv_counts[me], t);
    mpi_.book_reduce_scatter(recv_counts, t);
    const std::size_t es = size_of(t);
    std::size_t total = 0;
    bool equal = true;
    for (int j = 0; j < n; ++j) {
      total += recv_counts[j];
      equal = equal && recv_counts[j] == recv_counts[0];
    }
    const std::byte* in = static_cast<const std::byte*>(device_in(send, total * es));
    void* out = device_out(recv, recv_counts[me] * es);
    const auto dt = detail::nccl_datatype(t);
    const auto rop = detail::nccl_op(op);
    if (total == 0) {
      // nothing to reduce
    } else if (equal) {
      check("reduce_scatter", "ncclReduceScatter", ncclReduceScatter(in, out, recv_counts[0], dt, rop, comm_, stream()));
    } else {
      // Unequal blocks: block j is reduced onto rank j.
      group_start("reduce_scatter");
      std::size_t offset = 0;
      for (int j = 0; j < n; ++j) {
        if (recv_counts[j] != 0)
          check("reduce_scatter", "ncclReduce",
                ncclReduce(in + offset * es, out, recv_counts[j], dt, rop, j, comm_, stream()));
        offset += recv_counts[j];
      }
      group_end("reduce_scatter");
    }
    finish("reduce_scatter");
    host_out(recv, out, recv_counts[me] * es);
  }

  /// Every rank contributes `count` elements; recv holds size()*count, rank order.
  void allgather(const void* send, void* recv, std::size_t count, DataType t) {
    start("allgather", count, t);
    mpi_.book_allgather(count, t);
    const std::size_t es = size_of(t), out_bytes = static_cast<std::size_t>(size()) * count * es;
    const void* in = device_in(send, count * es);
    void* out = device_out(recv, out_bytes);
    if (count)
      check("allgather", "ncclAllGather",
            ncclAllGather(in, out, count, detail::nccl_datatype(t), comm_, stream()));
    finish("allgather");
    host_out(recv, out, out_bytes);
  }

  /// Rank j contributes counts[j] elements, placed at recv + displs[j].
  void allgatherv(const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    const int n = size(), me = rank();
    start("allgatherv", 0, t);
    PARALLAX_EXPECTS(counts[me] == count, "allgatherv: this rank sends ", count, " elements but counts[", me,
                     "] is ", counts[me]);
    mpi_.book_allgatherv(count, counts, t);
    const std::size_t es = size_of(t), out_bytes = detail::layout_extent(counts, displs, n) * es;
    const void* in = device_in(send, count * es);
    std::byte* out = static_cast<std::byte*>(device_out(recv, out_bytes));
    detail::copy_async(out + displs[me] * es, in, count * es, stream());
    const auto dt = detail::nccl_datatype(t);
    group_start("allgatherv");
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (count) check("allgatherv", "ncclSend", ncclSend(in, count, dt, p, comm_, stream()));
      if (counts[p]) check("allgatherv", "ncclRecv", ncclRecv(out + displs[p] * es, counts[p], dt, p, comm_, stream()));
    }
    group_end("allgatherv");
    finish("allgatherv");
    host_out(recv, out, out_bytes);
  }

  /// Rank i sends block j (count elements at send + j*count) to rank j.
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) {
    const int n = size(), me = rank();
    start("alltoall", count, t);
    mpi_.book_alltoall(count, t);
    const std::size_t es = size_of(t), bytes = static_cast<std::size_t>(n) * count * es;
    const std::byte* in = static_cast<const std::byte*>(device_in(send, bytes));
    std::byte* out = static_cast<std::byte*>(device_out(recv, bytes));
    const std::size_t block = count * es;
    detail::copy_async(out + static_cast<std::size_t>(me) * block, in + static_cast<std::size_t>(me) * block, block,
                       stream());
    if (count) {
      const auto dt = detail::nccl_datatype(t);
      group_start("alltoall");
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        const std::size_t at = static_cast<std::size_t>(p) * block;
        check("alltoall", "ncclSend", ncclSend(in + at, count, dt, p, comm_, stream()));
        check("alltoall", "ncclRecv", ncclRecv(out + at, count, dt, p, comm_, stream()));
      }
      group_end("alltoall");
    }
    finish("alltoall");
    host_out(recv, out, bytes);
  }

  /// Rank i sends scounts[j] elements at send + sdispls[j] to rank j and
  /// receives rcounts[j] elements from rank j at recv + rdispls[j].
  void alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    const int n = size(), me = rank();
    start("alltoallv", 0, t);
    mpi_.book_alltoallv(scounts, rcounts, t);
    const std::size_t es = size_of(t);
    const std::size_t in_bytes = detail::layout_extent(scounts, sdispls, n) * es;
    const std::size_t out_bytes = detail::layout_extent(rcounts, rdispls, n) * es;
    const std::byte* in = static_cast<const std::byte*>(device_in(send, in_bytes));
    std::byte* out = static_cast<std::byte*>(device_out(recv, out_bytes));
    PARALLAX_EXPECTS(scounts[me] == rcounts[me], "alltoallv: rank ", me, " sends itself ", scounts[me],
                     " elements but receives ", rcounts[me]);
    detail::copy_async(out + rdispls[me] * es, in + sdispls[me] * es, scounts[me] * es, stream());
    const auto dt = detail::nccl_datatype(t);
    group_start("alltoallv");
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (scounts[p]) check("alltoallv", "ncclSend", ncclSend(in + sdispls[p] * es, scounts[p], dt, p, comm_, stream()));
      if (rcounts[p]) check("alltoallv", "ncclRecv", ncclRecv(out + rdispls[p] * es, rcounts[p], dt, p, comm_, stream()));
    }
    group_end("alltoallv");
    finish("alltoallv");
    host_out(recv, out, out_bytes);
  }

  /// Copies `count` elements of root's buf to every rank's buf.
  void broadcast(void* buf, std::size_t count, DataType t, int root) {
    start("broadcast", count, t);
    mpi_.book_broadcast(count, t, root);
    const std::size_t bytes = count * size_of(t);
    void* at = const_cast<void*>(device_in(buf, rank() == root ? bytes : 0, bytes));
    if (count)
      check("broadcast", "ncclBroadcast",
            ncclBroadcast(at, at, count, detail::nccl_datatype(t), root, comm_, stream()));
    finish("broadcast");
    if (rank() != root) host_out(buf, at, bytes);
  }

  /// Waits until every rank has called barrier() and this rank's NCCL work
  /// has finished (an engine::Mpi barrier after the stream drains).
  void barrier() {
    usable("barrier");
    finish("barrier");
    mpi_.barrier();
  }

  /// Sends `count` elements to `peer`. `tag` is ignored (NCCL has none).
  void send(const void* buf, std::size_t count, DataType t, int peer, int /*tag*/ = 0) {
    usable("send");
    ++mpi_.calls_;
    mpi_.book_point_to_point(peer, count * size_of(t), -1, 0);
    const void* in = device_in(buf, count * size_of(t));
    if (count) check("send", "ncclSend", ncclSend(in, count, detail::nccl_datatype(t), peer, comm_, stream()));
    finish("send");
  }

  /// Receives `count` elements from `peer`. `tag` is ignored (NCCL has none).
  void recv(void* buf, std::size_t count, DataType t, int peer, int /*tag*/ = 0) {
    usable("recv");
    ++mpi_.calls_;
    mpi_.book_point_to_point(-1, 0, peer, count * size_of(t));
    void* out = device_out(buf, count * size_of(t));
    if (count) check("recv", "ncclRecv", ncclRecv(out, count, detail::nccl_datatype(t), peer, comm_, stream()));
    finish("recv");
    host_out(buf, out, count * size_of(t));
  }

  /// Enqueues sending `scount` elements to `dst` and receiving `rcount` from
  /// `src` (one NCCL group) and returns; wait() completes it. Both buffers
  /// must be device (or managed) memory. `tag` is ignored: NCCL messages
  /// between a pair arrive in the order enqueued.
  Exchange start_sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                          int src, DataType t, int /*tag*/ = 0) {
    usable("sendrecv");
    PARALLAX_EXPECTS((scount == 0 || detail::memory_kind(sendbuf) != detail::MemoryKind::host) &&
                         (rcount == 0 || detail::memory_kind(recvbuf) != detail::MemoryKind::host),
                     "engine::Nccl::start_sendrecv needs device buffers; use send()/recv() for host memory");
    ++mpi_.calls_;
    mpi_.book_point_to_point(dst, scount * size_of(t), src, rcount * size_of(t));
    const auto dt = detail::nccl_datatype(t);
    group_start("sendrecv");
    if (scount) check("sendrecv", "ncclSend", ncclSend(sendbuf, scount, dt, dst, comm_, stream()));
    if (rcount) check("sendrecv", "ncclRecv", ncclRecv(recvbuf, rcount, dt, src, comm_, stream()));
    group_end("sendrecv");
    Exchange x;
    x.slot_ = acquire_event();
    events_[static_cast<std::size_t>(x.slot_)].first.record(stream());
    return x;
  }

  /// Completes an exchange: its received elements are in the receive buffer.
  void wait(Exchange& x) {
    PARALLAX_EXPECTS(x.slot_ >= 0, "engine::Nccl::wait: not a started exchange");
    const auto slot = static_cast<std::size_t>(std::exchange(x.slot_, -1));
    try {
      finish("sendrecv", events_[slot].first.get());
    } catch (...) {
      events_[slot].second = false;
      throw;
    }
    events_[slot].second = false;
  }

  /// start_sendrecv then wait.
  void sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount, int src,
                DataType t, int tag = 0) {
    auto x = start_sendrecv(sendbuf, scount, dst, recvbuf, rcount, src, t, tag);
    wait(x);
  }

 private:
  cudaStream_t stream() const noexcept { return exec_.stream(); }

  /// Rank 0's ncclUniqueId, broadcast with MPI, then a non-blocking
  /// ncclCommInitRankConfig polled against the deadline. Every rank learns
  /// whether every rank succeeded, and all throw together if one did not.
  void init_communicator() {
    struct Boot {
      int status;
      ncclUniqueId id;
    } boot{};
    if (rank() == 0) boot.status = static_cast<int>(ncclGetUniqueId(&boot.id));
    PARALLAX_MPI_CHECK(MPI_Bcast(&boot, sizeof(Boot), MPI_BYTE, 0, mpi_.comm()));
    if (boot.status != ncclSuccess)
      detail::throw_nccl_error(static_cast<ncclResult_t>(boot.status), nullptr,
                               "ncclGetUniqueId(&id) on rank 0 (engine::Nccl construction)", __FILE__, __LINE__);

    std::string problem;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t status = ncclCommInitRankConfig(&comm_, size(), boot.id, rank(), &config);
    if (status == ncclInProgress) {
      const auto deadline = clock::now() + mpi_.options().timeout;
      const bool bounded = mpi_.options().timeout.count() > 0;
      while (status == ncclInProgress) {
        if (ncclCommGetAsyncError(comm_, &status) != ncclSuccess) break;
        if (bounded && clock::now() > deadline) {
          problem = detail::concat("rank ", rank(), " gave up after ", mpi_.options().timeout.count(),
                                   " ms waiting for the other ranks in ncclCommInitRankConfig");
          break;
        }
        std::this_thread::yield();
      }
    }
    if (problem.empty() && status != ncclSuccess)
      problem = detail::concat("rank ", rank(), ": ncclCommInitRankConfig failed: ", ncclGetErrorString(status),
                               last_error_text());
    if (!problem.empty() && comm_ != nullptr) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    // Agree: the lowest failing rank's verdict, on every rank.
    int mine = problem.empty() ? size() : rank(), first = size();
    PARALLAX_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, mpi_.comm()));
    if (first == size()) return;
    if (comm_ != nullptr) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    if (!problem.empty()) throw error(detail::concat("parallax: engine::Nccl could not be built: ", problem));
    throw error(detail::concat("parallax: engine::Nccl could not be built: rank ", first,
                               " failed to join the NCCL communicator (see its report)"));
  }

  using clock = std::chrono::steady_clock;

  static std::string last_error_text(ncclComm_t comm = nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last == nullptr || *last == '\0') return {};
    return detail::concat(" (", last, ")");
  }

  /// Throws if an earlier failure aborted the communicator.
  void usable(const char* op) const {
    if (comm_ == nullptr)
      throw error(detail::concat("parallax: engine::Nccl cannot run ", op, " on rank ", rank(),
                                 ": its communicator was aborted after an earlier failure"));
  }

  /// A collective's bookkeeping: the call count and check_calls (engine::Mpi's).
  void start(const char* op, std::size_t count, DataType t) {
    usable(op);
    mpi_.begin(op, count, t);
  }

  /// Where "op #call at step s" sits in messages.
  std::string where(const char* op) const {
    return detail::Position::make(step(), mpi_.calls(), op, mpi_.stats().current()).describe();
  }
  std::int64_t step() const noexcept { return mpi_.step_; }

  /// Aborts the communicator and marks the job failed: after an NCCL error
  /// or a missed deadline nothing can be assumed about work in flight.
  void abort_communicator() noexcept {
    detail::job_failed() = true;
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  /// Checks an enqueue call's result. ncclInProgress (non-blocking
  /// communicator) is polled until it settles; an error aborts and throws.
  void check(const char* op, const char* call, ncclResult_t status) {
    if (status == ncclInProgress) status = settle(op);
    if (status == ncclSuccess) return;
    const std::string last = last_error_text(comm_);
    abort_communicator();
    throw nccl_error("NCCL", static_cast<int>(status),
                     detail::concat(ncclGetErrorString(status), last, "; rank ", rank(), " in ", where(op),
                                    "; communicator aborted"),
                     call, __FILE__, __LINE__);
  }

  /// Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress
  /// or the deadline passes.
  ncclResult_t settle(const char* op) {
    const auto deadline = clock::now() + mpi_.options().timeout;
    const bool bounded = mpi_.options().timeout.count() > 0;
    ncclResult_t state = ncclInProgress;
    for (std::uint32_t spins = 0; state == ncclInProgress; ++spins) {
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return r;
      if (bounded && (spins & 63u) == 0 && clock::now() > deadline) timed_out(op);
      if (state == ncclInProgress) std::this_thread::yield();
    }
    return state;
  }

  void group_start(const char* op) { check(op, "ncclGroupStart", ncclGroupStart()); }
  void group_end(const char* op) { check(op, "ncclGroupEnd", ncclGroupEnd()); }

  /// Waits until the stream (or `event`) has passed this call's work,
  /// polling for NCCL's asynchronous errors and the deadline.
  void finish(const char* op, cudaEvent_t event = nullptr) {
    const auto deadline = clock::now() + mpi_.options().timeout;
    const bool bounded = mpi_.options().timeout.count() > 0;
    for (std::uint32_t spins = 0;; ++spins) {
      const cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(stream());
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        abort_communicator();
        detail::throw_cuda_error(q, event ? "cudaEventQuery(event)" : "cudaStreamQuery(stream)", __FILE__, __LINE__,
                                 detail::concat("rank ", rank(), " waiting in ", where(op), "; NCCL communicator aborted"));
      }
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &async);
      if (r != ncclSuccess) check(op, "ncclCommGetAsyncError", r);
      if (async != ncclSuccess && async != ncclInProgress) check(op, "(asynchronous NCCL error)", async);
      if (bounded && (spins & 63u) == 0 && clock::now() > deadline) timed_out(op);
      std::this_thread::yield();
    }
  }

  /// The deadline passed: abort NCCL, then let the MPI side compare notes
  /// with the other ranks and throw timeout_error with the diagnosis.
  [[noreturn]] void timed_out(const char* op) {
    abort_communicator();
    mpi_.fail(op, detail::concat("gave up after ", mpi_.options().timeout.count(),
                                 " ms (NCCL communicator aborted)"));
  }

  /// A device pointer holding `bytes` of `p`: p itself unless it is host
  /// memory, which is copied into device scratch (`copy` bytes of it; the
  /// scratch is `bytes` long).
  const void* device_in(const void* p, std::size_t copy) { return device_in(p, copy, copy); }
  const void* device_in(const void* p, std::size_t copy, std::size_t bytes) {
    if (detail::memory_kind(p) != detail::MemoryKind::host) return p;
    in_.resize_discard(bytes);
    detail::copy_async(in_.data(), p, copy, stream());
    return in_.data();
  }
  /// A device pointer to write `bytes` for `p` into: p itself unless it is
  /// host memory (then device scratch that host_out copies back).
  void* device_out(void* p, std::size_t bytes) {
    if (detail::memory_kind(p) != detail::MemoryKind::host) return p;
    out_.resize_discard(bytes);
    return out_.data();
  }
  void host_out(void* p, const void* from, std::size_t bytes) {
    if (p == from || bytes == 0) return;
    detail::copy_async(p, from, bytes, stream());
    exec_.synchronize();
  }

  int acquire_event() {
    for (std::size_t i = 0; i < events_.size(); ++i)
      if (!events_[i].second) {
        events_[i].second = true;
        return static_cast<int>(i);
      }
    events_.emplace_back(detail::CudaEvent{}, true);
    return static_cast<int>(events_.size() - 1);
  }

  Mpi mpi_;
  int device_ = 0;
  Exec<CudaSpace> exec_;
  ncclComm_t comm_ = nullptr;
  Buffer<std::byte, CudaSpace> in_, out_;                 // device scratch for host buffers
  std::vector<std::pair<detail::CudaEvent, bool>> events_;  // exchanges: (event, in use)
};

template <>
struct supports<Nccl, op_sendrecv> : std::true_type {};
template <>
struct supports<Nccl, op_alltoallv> : std::true_type {};
template <>
struct supports<Nccl, op_allreduce> : std::true_type {};

}  // namespace parallax::engine
