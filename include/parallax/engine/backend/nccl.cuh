#pragma once
/// @file
/// backend::Nccl: raw operations over device memory with an NCCL
/// communicator built from the MPI job, for engine::Nccl. One GPU per rank.
/// nvcc and a CUDA configuration (PARALLAX_HAS_NCCL) only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_NCCL
#error "parallax/engine/backend/nccl.cuh needs nvcc and a PARALLAX_ENABLE_CUDA build (NCCL)"
#endif

#include <parallax/context.hpp>
#include <parallax/cuda/device.cuh>
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/memory.cuh>
#include <parallax/cuda/nccl_error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/detail/fault.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/backend/backend.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
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
    case DataType::bf16: return ncclBfloat16;
    case DataType::f16: return ncclFloat16;
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

namespace parallax::engine::backend {

/// Construction (collective): one GPU per rank is selected by its place among
/// the ranks of its NCCL node (nccl_node_on_host(): its host, unless ranks
/// set different NCCL_HOSTIDs; parallax::error if a node has more ranks than
/// the host has GPUs), rank 0 makes
/// the ncclUniqueId and MPI broadcasts it, and every rank joins with
/// ncclCommInitRankConfig on a non-blocking communicator (`blocking = 0`),
/// so that initialisation, like every later call, can be given up and
/// aborted at the deadline.
///
/// Every operation enqueues its NCCL work on exec()'s stream; test() polls
/// cudaStreamQuery (an exchange: its event) and ncclCommGetAsyncError. On an
/// NCCL or CUDA error the communicator is aborted (ncclCommAbort), the job is
/// marked failed, and the call throws parallax::nccl_error / cuda_error
/// naming the operation, the call number and the trainer step; at the
/// deadline the communicator is aborted too (give_up(); NCCL cannot withdraw
/// a point-to-point call) and the facade's diagnosis follows. The backend is
/// unusable afterwards.
///
/// Operations: allreduce, allgather, broadcast and reduce_scatter (equal
/// blocks) are NCCL collectives; reduce_scatter with unequal blocks is a
/// group of ncclReduce; alltoall, alltoallv and allgatherv are groups of
/// ncclSend/ncclRecv; sendrecv is a grouped ncclSend + ncclRecv; barrier
/// drains the stream, then an MPI barrier. NCCL has no tags: messages between
/// a pair arrive in the order enqueued. Buffers in host memory (the
/// library's small control messages) are copied through device scratch
/// buffers, except in a two-sided sendrecv, which needs device memory.
class Nccl {
 public:
  using space = CudaSpace;
  static constexpr const char* name = "nccl";

  /// A started operation: its NCCL work is enqueued; done once the stream
  /// (an exchange: its event) has passed it.
  struct Request {
    const char* op = "";
    int slot = -1;  // exchanges: the event recorded after their work
    bool barrier = false;
    MPI_Request mpi = MPI_REQUEST_NULL;  // barrier: the MPI barrier, once the stream drained
    void* back_to = nullptr;             // host buffer written through device scratch
    const void* back_from = nullptr;
    std::size_t back_bytes = 0;
  };

  Nccl(const Context& ctx, MPI_Comm comm, const Options& options, const Site& site)
      : comm_(comm),
        options_(&options),
        site_(&site),
        rank_(ctx.rank()),
        size_(ctx.size()),
        device_(select_device(nccl_node_on_host(comm), DeviceSharing::exclusive, "engine::Nccl")),
        exec_(Exec<CudaSpace>::create()) {
    init_communicator();
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ~Nccl() {
    if (nccl_ == nullptr) return;
    if (detail::job_failed()) {
      (void)ncclCommAbort(nccl_);
      return;
    }
    // Finish, bounded, then destroy; abort if NCCL does not finish in time.
    (void)cudaStreamSynchronize(exec_.stream());
    ncclResult_t state = ncclCommFinalize(nccl_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until) {
      if (ncclCommGetAsyncError(nccl_, &state) != ncclSuccess) break;
      std::this_thread::yield();
    }
    if (state == ncclSuccess) (void)ncclCommDestroy(nccl_);
    else (void)ncclCommAbort(nccl_);
  }

  /// The stream all NCCL work of this backend is enqueued on.
  Exec<CudaSpace>& exec() noexcept { return exec_; }
  /// The NCCL communicator; null once aborted.
  ncclComm_t nccl_comm() const noexcept { return nccl_; }
  /// The CUDA device this rank uses.
  int device() const noexcept { return device_; }

  void allreduce(Request& x, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    open(x, "allreduce");
    const std::size_t bytes = count * size_of(t);
    const void* in = device_in(send, bytes);
    void* out = send == recv ? const_cast<void*>(in) : device_out(recv, bytes);
    if (count)
      check("allreduce", "ncclAllReduce",
            ncclAllReduce(in, out, count, detail::nccl_datatype(t), detail::nccl_op(op), nccl_, stream()));
    back(x, recv, out, bytes);
  }

  void reduce_scatter(Request& x, const void* send, void* recv, const std::size_t* recv_counts, DataType t,
                      ReduceOp op) {
    open(x, "reduce_scatter");
    const std::size_t es = size_of(t);
    std::size_t total = 0;
    bool equal = true;
    for (int j = 0; j < size_; ++j) {
      total += recv_counts[j];
      equal = equal && recv_counts[j] == recv_counts[0];
    }
    const std::byte* in = static_cast<const std::byte*>(device_in(send, total * es));
    void* out = device_out(recv, recv_counts[rank_] * es);
    const auto dt = detail::nccl_datatype(t);
    const auto rop = detail::nccl_op(op);
    if (total == 0) {
      // nothing to reduce
    } else if (equal) {
      check("reduce_scatter", "ncclReduceScatter", ncclReduceScatter(in, out, recv_counts[0], dt, rop, nccl_, stream()));
    } else {
      // Unequal blocks: block j is reduced onto rank j.
      group_start("reduce_scatter");
      std::size_t offset = 0;
      for (int j = 0; j < size_; ++j) {
        if (recv_counts[j] != 0)
          check("reduce_scatter", "ncclReduce",
                ncclReduce(in + offset * es, out, recv_counts[j], dt, rop, j, nccl_, stream()));
        offset += recv_counts[j];
      }
      group_end("reduce_scatter");
    }
    back(x, recv, out, recv_counts[rank_] * es);
  }

  void allgather(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    open(x, "allgather");
    const std::size_t es = size_of(t), out_bytes = static_cast<std::size_t>(size_) * count * es;
    const void* in = device_in(send, count * es);
    void* out = device_out(recv, out_bytes);
    if (count)
      check("allgather", "ncclAllGather", ncclAllGather(in, out, count, detail::nccl_datatype(t), nccl_, stream()));
    back(x, recv, out, out_bytes);
  }

  void allgatherv(Request& x, const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    open(x, "allgatherv");
    const std::size_t es = size_of(t), out_bytes = detail::layout_extent(counts, displs, size_) * es;
    const void* in = device_in(send, count * es);
    std::byte* out = static_cast<std::byte*>(device_out(recv, out_bytes));
    detail::copy_async(out + displs[rank_] * es, in, count * es, stream());
    const auto dt = detail::nccl_datatype(t);
    group_start("allgatherv");
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (count) check("allgatherv", "ncclSend", ncclSend(in, count, dt, p, nccl_, stream()));
      if (counts[p]) check("allgatherv", "ncclRecv", ncclRecv(out + displs[p] * es, counts[p], dt, p, nccl_, stream()));
    }
    group_end("allgatherv");
    back(x, recv, out, out_bytes);
  }

  void alltoall(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    open(x, "alltoall");
    const std::size_t es = size_of(t), bytes = static_cast<std::size_t>(size_) * count * es;
    const std::byte* in = static_cast<const std::byte*>(device_in(send, bytes));
    std::byte* out = static_cast<std::byte*>(device_out(recv, bytes));
    const std::size_t block = count * es;
    detail::copy_async(out + static_cast<std::size_t>(rank_) * block, in + static_cast<std::size_t>(rank_) * block,
                       block, stream());
    if (count) {
      const auto dt = detail::nccl_datatype(t);
      group_start("alltoall");
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        const std::size_t at = static_cast<std::size_t>(p) * block;
        check("alltoall", "ncclSend", ncclSend(in + at, count, dt, p, nccl_, stream()));
        check("alltoall", "ncclRecv", ncclRecv(out + at, count, dt, p, nccl_, stream()));
      }
      group_end("alltoall");
    }
    back(x, recv, out, bytes);
  }

  void alltoallv(Request& x, const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    open(x, "alltoallv");
    const std::size_t es = size_of(t);
    const std::size_t in_bytes = detail::layout_extent(scounts, sdispls, size_) * es;
    const std::size_t out_bytes = detail::layout_extent(rcounts, rdispls, size_) * es;
    const std::byte* in = static_cast<const std::byte*>(device_in(send, in_bytes));
    std::byte* out = static_cast<std::byte*>(device_out(recv, out_bytes));
    PARALLAX_EXPECTS(scounts[rank_] == rcounts[rank_], "alltoallv: rank ", rank_, " sends itself ", scounts[rank_],
                     " elements but receives ", rcounts[rank_]);
    detail::copy_async(out + rdispls[rank_] * es, in + sdispls[rank_] * es, scounts[rank_] * es, stream());
    const auto dt = detail::nccl_datatype(t);
    group_start("alltoallv");
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (scounts[p]) check("alltoallv", "ncclSend", ncclSend(in + sdispls[p] * es, scounts[p], dt, p, nccl_, stream()));
      if (rcounts[p]) check("alltoallv", "ncclRecv", ncclRecv(out + rdispls[p] * es, rcounts[p], dt, p, nccl_, stream()));
    }
    group_end("alltoallv");
    back(x, recv, out, out_bytes);
  }

  void broadcast(Request& x, void* buf, std::size_t count, DataType t, int root) {
    open(x, "broadcast");
    const std::size_t bytes = count * size_of(t);
    void* at = const_cast<void*>(device_in(buf, rank_ == root ? bytes : 0, bytes));
    if (count)
      check("broadcast", "ncclBroadcast", ncclBroadcast(at, at, count, detail::nccl_datatype(t), root, nccl_, stream()));
    if (rank_ != root) back(x, buf, at, bytes);
  }

  /// Once this rank's NCCL work has finished, an MPI barrier.
  void barrier(Request& x) {
    open(x, "barrier");
    x.barrier = true;
  }

  /// One NCCL group of ncclSend + ncclRecv (a negative peer leaves that side
  /// out). `tag` is ignored: NCCL messages between a pair arrive in the
  /// order enqueued. A two-sided call needs device (or managed) memory; a
  /// one-sided one may use host memory (through scratch, so it must
  /// complete before the next call).
  void sendrecv(Request& x, const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                int src, DataType t, int /*tag*/) {
    open(x, "sendrecv");
    if (dst < 0) scount = 0;
    if (src < 0) rcount = 0;
    const bool host_send = scount && detail::memory_kind(sendbuf) == detail::MemoryKind::host;
    const bool host_recv = rcount && detail::memory_kind(recvbuf) == detail::MemoryKind::host;
    PARALLAX_EXPECTS(!(host_send || host_recv) || dst < 0 || src < 0,
                     "engine::Nccl::start_sendrecv needs device buffers; use send()/recv() for host memory");
    const std::size_t es = size_of(t);
    const void* in = device_in(sendbuf, scount * es);
    void* out = device_out(recvbuf, rcount * es);
    const auto dt = detail::nccl_datatype(t);
    group_start("sendrecv");
    if (scount) check("sendrecv", "ncclSend", ncclSend(in, scount, dt, dst, nccl_, stream()));
    if (rcount) check("sendrecv", "ncclRecv", ncclRecv(out, rcount, dt, src, nccl_, stream()));
    group_end("sendrecv");
    back(x, recvbuf, out, rcount * es);
    x.slot = acquire_event();
    events_[static_cast<std::size_t>(x.slot)].first.record(stream());
  }

  bool test(Request& x) {
    const cudaEvent_t event = x.slot >= 0 ? events_[static_cast<std::size_t>(x.slot)].first.get() : nullptr;
    const cudaError_t q = event ? cudaEventQuery(event) : cudaStreamQuery(stream());
    if (q == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(nccl_, &async);
      if (r != ncclSuccess) check(x.op, "ncclCommGetAsyncError", r);
      if (async != ncclSuccess && async != ncclInProgress) check(x.op, "(asynchronous NCCL error)", async);
      return false;
    }
    if (q != cudaSuccess) {
      release(x);
      abort_communicator();
      detail::throw_cuda_error(q, event ? "cudaEventQuery(event)" : "cudaStreamQuery(stream)", __FILE__, __LINE__,
                               detail::concat("rank ", rank_, " waiting in ", site_->where(x.op),
                                              "; NCCL communicator aborted"));
    }
    if (x.barrier) {
      if (x.mpi == MPI_REQUEST_NULL) PARALLAX_MPI_CHECK(MPI_Ibarrier(comm_, &x.mpi));
      int done = 0;
      const int status = MPI_Test(&x.mpi, &done, MPI_STATUS_IGNORE);
      if (status != MPI_SUCCESS) throw Failure{detail::concat("lost a peer (", detail::mpi_error_string(status), ")")};
      if (!done) return false;
      x.barrier = false;
    }
    release(x);
    if (x.back_to != x.back_from && x.back_bytes) {
      detail::copy_async(x.back_to, x.back_from, x.back_bytes, stream());
      exec_.synchronize();
    }
    return true;
  }

  /// NCCL cannot withdraw a call: the communicator goes (give_up()).
  bool cancel(Request& x) noexcept {
    release(x);
    return false;
  }

  /// Aborts the communicator: nothing can be assumed about work in flight.
  const char* give_up() noexcept {
    abort_communicator();
    return "NCCL communicator aborted";
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
    if (rank_ == 0) boot.status = static_cast<int>(ncclGetUniqueId(&boot.id));
    PARALLAX_MPI_CHECK(MPI_Bcast(&boot, sizeof(Boot), MPI_BYTE, 0, comm_));
    if (boot.status != ncclSuccess)
      detail::throw_nccl_error(static_cast<ncclResult_t>(boot.status), nullptr,
                               "ncclGetUniqueId(&id) on rank 0 (engine::Nccl construction)", __FILE__, __LINE__);

    std::string problem;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t status = ncclCommInitRankConfig(&nccl_, size_, boot.id, rank_, &config);
    if (status == ncclInProgress) {
      const auto deadline = clock::now() + options_->timeout;
      const bool bounded = options_->timeout.count() > 0;
      while (status == ncclInProgress) {
        if (ncclCommGetAsyncError(nccl_, &status) != ncclSuccess) break;
        if (bounded && clock::now() > deadline) {
          problem = detail::concat("rank ", rank_, " gave up after ", options_->timeout.count(),
                                   " ms waiting for the other ranks in ncclCommInitRankConfig");
          break;
        }
        std::this_thread::yield();
      }
    }
    if (problem.empty() && status != ncclSuccess)
      problem = detail::concat("rank ", rank_, ": ncclCommInitRankConfig failed: ", ncclGetErrorString(status),
                               last_error_text());
    if (!problem.empty() && nccl_ != nullptr) {
      (void)ncclCommAbort(nccl_);
      nccl_ = nullptr;
    }
    // Agree: the lowest failing rank's verdict, on every rank.
    int mine = problem.empty() ? size_ : rank_, first = size_;
    PARALLAX_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_));
    if (first == size_) return;
    if (nccl_ != nullptr) {
      (void)ncclCommAbort(nccl_);
      nccl_ = nullptr;
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

  /// A new operation: throws if an earlier failure aborted the communicator.
  void open(Request& x, const char* op) {
    if (nccl_ == nullptr)
      throw error(detail::concat("parallax: engine::Nccl cannot run ", op, " on rank ", rank_,
                                 ": its communicator was aborted after an earlier failure"));
    x = Request();
    x.op = op;
  }
  static void back(Request& x, void* to, const void* from, std::size_t bytes) {
    x.back_to = to;
    x.back_from = from;
    x.back_bytes = bytes;
  }

  /// Marks the job failed and aborts the communicator.
  void abort_communicator() noexcept {
    detail::job_failed() = true;
    if (nccl_ != nullptr) (void)ncclCommAbort(nccl_);
    nccl_ = nullptr;
  }

  /// Checks an enqueue call's result. ncclInProgress (non-blocking
  /// communicator) is polled until it settles; an error aborts and throws.
  void check(const char* op, const char* call, ncclResult_t status) {
    if (status == ncclInProgress) status = settle();
    if (status == ncclSuccess) return;
    const std::string last = last_error_text(nccl_);
    abort_communicator();
    throw nccl_error("NCCL", static_cast<int>(status),
                     detail::concat(ncclGetErrorString(status), last, "; rank ", rank_, " in ", site_->where(op),
                                    "; communicator aborted"),
                     call, __FILE__, __LINE__);
  }

  /// Polls ncclCommGetAsyncError until the communicator leaves
  /// ncclInProgress; at the deadline, aborts and reports a Failure.
  ncclResult_t settle() {
    const auto deadline = clock::now() + options_->timeout;
    const bool bounded = options_->timeout.count() > 0;
    ncclResult_t state = ncclInProgress;
    for (std::uint32_t spins = 0; state == ncclInProgress; ++spins) {
      const ncclResult_t r = ncclCommGetAsyncError(nccl_, &state);
      if (r != ncclSuccess) return r;
      if (bounded && (spins & 63u) == 0 && clock::now() > deadline) {
        abort_communicator();
        throw Failure{detail::concat("gave up after ", options_->timeout.count(), " ms (NCCL communicator aborted)")};
      }
      if (state == ncclInProgress) std::this_thread::yield();
    }
    return state;
  }

  void group_start(const char* op) { check(op, "ncclGroupStart", ncclGroupStart()); }
  void group_end(const char* op) { check(op, "ncclGroupEnd", ncclGroupEnd()); }

  /// A device pointer holding `bytes` of `p`: p itself unless it is host
  /// memory, which is copied into device scratch (`copy` bytes of it; the
  /// scratch is `bytes` long).
  const void* device_in(const void* p, std::size_t copy) { return device_in(p, copy, copy); }
  const void* device_in(const void* p, std::size_t copy, std::size_t bytes) {
    if (bytes == 0 || detail::memory_kind(p) != detail::MemoryKind::host) return p;
    in_.resize_discard(bytes);
    detail::copy_async(in_.data(), p, copy, stream());
    return in_.data();
  }
  /// A device pointer to write `bytes` for `p` into: p itself unless it is
  /// host memory (then device scratch that test() copies back).
  void* device_out(void* p, std::size_t bytes) {
    if (bytes == 0 || detail::memory_kind(p) != detail::MemoryKind::host) return p;
    out_.resize_discard(bytes);
    return out_.data();
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
  void release(Request& x) noexcept {
    if (x.slot >= 0) events_[static_cast<std::size_t>(x.slot)].second = false;
    x.slot = -1;
  }

  MPI_Comm comm_;
  const Options* options_;
  const Site* site_;
  int rank_, size_;
  int device_ = 0;
  Exec<CudaSpace> exec_;
  ncclComm_t nccl_ = nullptr;
  Buffer<std::byte, CudaSpace> in_, out_;                   // device scratch for host buffers
  std::vector<std::pair<detail::CudaEvent, bool>> events_;  // exchanges: (event, in use)
};

}  // namespace parallax::engine::backend

namespace parallax::engine {

template <>
struct supports<backend::Nccl, op_sendrecv> : std::true_type {};
template <>
struct supports<backend::Nccl, op_alltoallv> : std::true_type {};
template <>
struct supports<backend::Nccl, op_allreduce> : std::true_type {};

}  // namespace parallax::engine
