#pragma once
/// @file
/// backend::MpiStaged: raw operations over device memory through any MPI,
/// for engine::MpiStaged: device buffers are copied to page-locked host
/// buffers, moved by backend::Mpi's operations, and copied back. Works with
/// several ranks per GPU. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/engine/backend/mpi_staged.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/context.hpp>
#include <parallax/cuda/device.cuh>
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/memory.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/detail/half_reduce.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/backend/backend.hpp>
#include <parallax/engine/backend/mpi.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace parallax::engine::backend {

/// How each call moves data:
/// * allreduce and sendrecv (send, recv and started exchanges too) are
///   pipelined in chunks of chunk_bytes(): the device-to-host copy of chunk
///   k+1 runs while MPI moves chunk k, and the host-to-device copy of chunk k
///   while MPI moves chunk k+1. Both sides cut a message the same way, so a
///   receive must be posted for exactly the count its peer sends (the
///   library always does).
/// * the other collectives stage everything, start one backend::Mpi
///   operation on the staging buffers, and copy the results back once it
///   completes.
/// * buffers in host memory (the library's small control messages) are used
///   as they are; cudaPointerGetAttributes tells them apart, per call.
///
/// Staging buffers are cudaHostAlloc memory, allocated on first use, grown
/// on demand and kept for the backend's lifetime. Its stream is `exec()`:
/// copies are ordered after the work the caller issued on it, and an
/// operation's results are in place when test() says it is complete.
class MpiStaged {
 public:
  using space = CudaSpace;
  static constexpr const char* name = "mpi_staged";
  /// Default pipeline chunk: large enough for MPI to reach its bandwidth on
  /// one message, small enough that copies and transfers overlap.
  static constexpr std::size_t default_chunk_bytes = std::size_t{1} << 20;

  /// A started operation. Move-only: an exchange dropped before it completed
  /// keeps its staging memory (MPI may still write into it) rather than free it.
  class Request {
   public:
    Request() = default;
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    Request(Request&& o) noexcept { take(o); }
    Request& operator=(Request&& o) noexcept {
      if (this != &o) {
        abandon();
        take(o);
      }
      return *this;
    }
    ~Request() { abandon(); }

    enum class Kind { none, whole, allreduce, exchange };
    Kind kind = Kind::none;
    Mpi::Request inner;  // whole: the MPI operation on the staging buffers
    // whole: where the results go once MPI is done (blocks: only counts[r] at displs[r])
    void* back_to = nullptr;
    const void* back_from = nullptr;
    std::size_t back_bytes = 0, es = 0;
    const std::size_t *counts = nullptr, *displs = nullptr;
    // allreduce: chunk k of `chunks` (per elements each), `issued` started
    void* recv = nullptr;
    std::byte* work = nullptr;
    std::size_t count = 0, per = 1, chunks = 0, issued = 0, k = 0;
    DataType t = DataType::u8;
    ReduceOp op = ReduceOp::sum;
    bool staged = false;
    // exchange: a slot of the backend's
    MpiStaged* owner = nullptr;
    int slot = -1;

   private:
    void take(Request& o) noexcept {
      kind = o.kind;
      inner = std::move(o.inner);
      back_to = o.back_to;
      back_from = o.back_from;
      back_bytes = o.back_bytes;
      es = o.es;
      counts = o.counts;
      displs = o.displs;
      recv = o.recv;
      work = o.work;
      count = o.count;
      per = o.per;
      chunks = o.chunks;
      issued = o.issued;
      k = o.k;
      t = o.t;
      op = o.op;
      staged = o.staged;
      owner = std::exchange(o.owner, nullptr);
      slot = std::exchange(o.slot, -1);
      o.kind = Kind::none;
    }
    void abandon() noexcept {
      if (owner && slot >= 0) owner->abandon(slot);
      owner = nullptr;
      slot = -1;
    }
  };

  /// Selects this rank's GPU (local rank mod GPUs; ranks may share one).
  MpiStaged(const Context& ctx, MPI_Comm comm, const Options& options, const Site& site,
            std::size_t chunk_bytes = default_chunk_bytes)
      : mpi_(ctx, comm, options, site),
        comm_(comm),
        rank_(ctx.rank()),
        size_(ctx.size()),
        device_(select_device(local_rank_on_host(comm), DeviceSharing::shared, "engine::MpiStaged")),
        exec_(Exec<CudaSpace>::create()) {
    set_chunk_bytes(chunk_bytes);
  }
  MpiStaged(const MpiStaged&) = delete;
  MpiStaged& operator=(const MpiStaged&) = delete;
  ~MpiStaged() {
    // Exchanges never completed may still have MPI requests writing into
    // their staging memory: leak it rather than free it.
    for (auto& x : exchanges_)
      if (x && x->busy) {
        x->send.leak();
        x->recv.leak();
      }
  }

  /// The stream every copy of this backend runs on.
  Exec<CudaSpace>& exec() noexcept { return exec_; }
  /// The CUDA device this rank uses.
  int device() const noexcept { return device_; }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
  /// Sets the pipeline chunk (at least 8 bytes). Every rank must use the same
  /// value: it decides how point-to-point messages are cut.
  void set_chunk_bytes(std::size_t bytes) {
    PARALLAX_EXPECTS(bytes >= 8, "engine::MpiStaged: chunk_bytes must be at least 8, got ", bytes);
    chunk_bytes_ = bytes;
  }

  /// Pipelined in chunks, each reduced in place in pinned memory (or in
  /// recv when both buffers are host memory).
  void allreduce(Request& x, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    x.kind = Request::Kind::allreduce;
    x.recv = recv;
    x.count = count;
    x.t = t;
    x.op = op;
    x.k = x.issued = 0;
    x.es = size_of(t);
    x.per = chunk_elems(t);
    x.chunks = (count + x.per - 1) / x.per;
    x.staged = !is_host(send) || !is_host(recv);
    if (count == 0) return;
    const cudaStream_t s = exec_.stream();
    if (x.staged) {
      x.work = reduce_.reserve(count * x.es);
      while (events_.size() < x.chunks) events_.emplace_back();
      for (std::size_t k = 0; k < x.chunks; ++k) {
        const std::size_t b = k * x.per, n = std::min(x.per, count - b);
        detail::copy_async(x.work + b * x.es, static_cast<const std::byte*>(send) + b * x.es, n * x.es, s);
        events_[k].record(s);
      }
    } else {
      x.work = static_cast<std::byte*>(recv);
      if (send != recv) std::memcpy(recv, send, count * x.es);
    }
    requests_.assign(x.chunks, MPI_REQUEST_NULL);
  }

  void reduce_scatter(Request& x, const void* send, void* recv, const std::size_t* recv_counts, DataType t,
                      ReduceOp op) {
    const std::size_t es = size_of(t);
    std::size_t total = 0;
    for (int j = 0; j < size_; ++j) total += recv_counts[j];
    const void* in = stage_in(send, total * es, in_);
    void* out = stage_out(recv, recv_counts[rank_] * es, out_);
    mpi_.reduce_scatter(x.inner, in, out, recv_counts, t, op);
    back(x, recv, out, recv_counts[rank_] * es);
  }

  void allgather(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    const std::size_t es = size_of(t), out_bytes = static_cast<std::size_t>(size_) * count * es;
    const void* in = stage_in(send, count * es, in_);
    void* out = stage_out(recv, out_bytes, out_);
    mpi_.allgather(x.inner, in, out, count, t);
    back(x, recv, out, out_bytes);
  }

  void allgatherv(Request& x, const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    const std::size_t es = size_of(t), out_bytes = detail::layout_extent(counts, displs, size_) * es;
    const void* in = stage_in(send, count * es, in_);
    void* out = stage_out(recv, out_bytes, out_);
    mpi_.allgatherv(x.inner, in, count, out, counts, displs, t);
    back_blocks(x, recv, out, counts, displs, es);
  }

  void alltoall(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    const std::size_t bytes = static_cast<std::size_t>(size_) * count * size_of(t);
    const void* in = stage_in(send, bytes, in_);
    void* out = stage_out(recv, bytes, out_);
    mpi_.alltoall(x.inner, in, out, count, t);
    back(x, recv, out, bytes);
  }

  void alltoallv(Request& x, const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    const std::size_t es = size_of(t);
    const void* in = stage_in(send, detail::layout_extent(scounts, sdispls, size_) * es, in_);
    void* out = stage_out(recv, detail::layout_extent(rcounts, rdispls, size_) * es, out_);
    mpi_.alltoallv(x.inner, in, scounts, sdispls, out, rcounts, rdispls, t);
    back_blocks(x, recv, out, rcounts, rdispls, es);
  }

  void broadcast(Request& x, void* buf, std::size_t count, DataType t, int root) {
    const std::size_t bytes = count * size_of(t);
    void* at = buf;
    if (!is_host(buf)) {
      at = out_.reserve(bytes);
      if (rank_ == root) {
        detail::copy_async(at, buf, bytes, exec_.stream());
        exec_.synchronize();
      }
    }
    mpi_.broadcast(x.inner, at, count, t, root);
    back(x, rank_ == root ? at : buf, at, bytes);
  }

  /// After this rank's stream is idle.
  void barrier(Request& x) {
    exec_.synchronize();
    mpi_.barrier(x.inner);
    back(x, nullptr, nullptr, 0);
  }

  /// Chunked both ways; sends of earlier exchanges go out first, so chunks
  /// to one peer leave in the order their receives were posted.
  void sendrecv(Request& x, const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                int src, DataType t, int tag) {
    for (auto& other : exchanges_)
      if (other && other->busy) post_sends(*other, other->send_chunks);
    const int slot = acquire();
    Staged& e = *exchanges_[static_cast<std::size_t>(slot)];
    const std::size_t es = size_of(t), per = chunk_elems(t);
    if (dst < 0) scount = 0;
    if (src < 0) rcount = 0;
    e.t = t;
    e.per = per;
    e.dst = dst;
    e.src = src;
    e.tag = tag;
    e.scount = scount;
    e.rcount = rcount;
    e.send_chunks = (scount + per - 1) / per;
    e.recv_chunks = (rcount + per - 1) / per;
    e.sends_posted = 0;
    e.k = 0;
    e.recv_target = static_cast<std::byte*>(recvbuf);
    e.send_staged = scount && !is_host(sendbuf);
    e.recv_staged = rcount && !is_host(recvbuf);
    e.send_from = e.send_staged ? e.send.reserve(scount * es) : static_cast<const std::byte*>(sendbuf);
    e.recv_into = e.recv_staged ? e.recv.reserve(rcount * es) : static_cast<std::byte*>(recvbuf);
    e.requests.assign(e.recv_chunks + e.send_chunks, MPI_REQUEST_NULL);
    e.busy = true;
    x = Request();
    x.kind = Request::Kind::exchange;
    x.owner = this;
    x.slot = slot;

    const cudaStream_t s = exec_.stream();
    if (e.send_staged) {
      while (e.ready.size() < e.send_chunks) e.ready.emplace_back();
      for (std::size_t k = 0; k < e.send_chunks; ++k) {
        const std::size_t b = k * per, n = std::min(per, scount - b);
        detail::copy_async(e.send.data() + b * es, static_cast<const std::byte*>(sendbuf) + b * es, n * es, s);
        e.ready[k].record(s);
      }
    }
    for (std::size_t k = 0; k < e.recv_chunks; ++k) {
      const std::size_t b = k * per, n = std::min(per, rcount - b);
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Irecv)(e.recv_into + b * es, detail::to_mpi_count(n),
                                                   detail::mpi_type_for(t), src, tag, comm_, &e.requests[k]));
    }
    post_sends(e, std::min<std::size_t>(1, e.send_chunks));  // the first chunk leaves now
  }

  bool test(Request& x) {
    switch (x.kind) {
      case Request::Kind::none: return true;
      case Request::Kind::whole:
        if (!mpi_.test(x.inner)) return false;
        unstage(x);
        break;
      case Request::Kind::allreduce:
        if (!progress_allreduce(x)) return false;
        break;
      case Request::Kind::exchange:
        if (!progress_exchange(*exchanges_[static_cast<std::size_t>(x.slot)])) return false;
        exchanges_[static_cast<std::size_t>(x.slot)]->busy = false;
        x.owner = nullptr;
        x.slot = -1;
        break;
    }
    x.kind = Request::Kind::none;
    return true;
  }

  /// Withdraws an exchange (its staging memory is leaked: MPI may still
  /// write into it); the backend stays usable.
  bool cancel(Request& x) noexcept {
    if (x.kind == Request::Kind::exchange && x.slot >= 0) withdraw(*exchanges_[static_cast<std::size_t>(x.slot)]);
    else if (x.kind == Request::Kind::whole) mpi_.cancel(x.inner);
    x.owner = nullptr;
    x.slot = -1;
    x.kind = Request::Kind::none;
    return true;
  }

  const char* give_up() noexcept { return ""; }

 private:
  /// The state of one exchange, kept for reuse (its pinned buffers and
  /// events stay allocated).
  struct Staged {
    bool busy = false;
    DataType t = DataType::u8;
    std::size_t per = 1, scount = 0, rcount = 0;
    std::size_t send_chunks = 0, recv_chunks = 0, sends_posted = 0, k = 0;
    int dst = 0, src = 0, tag = 0;
    bool send_staged = false, recv_staged = false;
    const std::byte* send_from = nullptr;  // pinned copy, or the caller's host buffer
    std::byte* recv_into = nullptr;        // pinned landing area, or the caller's host buffer
    std::byte* recv_target = nullptr;      // the caller's receive buffer
    detail::PinnedBuffer send, recv;
    std::vector<detail::CudaEvent> ready;  // send chunk k copied to pinned memory
    std::vector<MPI_Request> requests;     // receives [0, recv_chunks), then sends
  };

  static bool is_host(const void* p) { return detail::memory_kind(p) == detail::MemoryKind::host; }
  std::size_t chunk_elems(DataType t) const { return std::max<std::size_t>(1, chunk_bytes_ / size_of(t)); }

  /// MPI's test of one request, a failure reported as Failure.
  static bool done(MPI_Request* r, int n = 1) {
    int all = 0;
    const int status = MPI_Testall(n, r, &all, MPI_STATUSES_IGNORE);
    if (status != MPI_SUCCESS) throw Failure{detail::concat("lost a peer (", detail::mpi_error_string(status), ")")};
    return all != 0;
  }

  /// Chunk k is started once its copy to pinned memory is done, and the
  /// next one too if its copy is already done (two in flight); chunk k's
  /// result goes back once it is reduced.
  bool progress_allreduce(Request& x) {
    const std::size_t es = x.es;
    auto issue = [&](std::size_t k) {
      if (x.staged) events_[k].synchronize();
      const std::size_t b = k * x.per, n = std::min(x.per, x.count - b);
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallreduce)(MPI_IN_PLACE, x.work + b * es, detail::to_mpi_count(n),
                                                        detail::mpi_type_for(x.t), detail::mpi_op_for(x.t, x.op), comm_,
                                                        &requests_[k]));
    };
    for (; x.k < x.chunks; ++x.k) {
      const std::size_t k = x.k;
      if (x.issued == k) issue(x.issued++);
      if (x.issued == k + 1 && x.issued < x.chunks && (!x.staged || events_[x.issued].done())) issue(x.issued++);
      if (!done(&requests_[k])) return false;
      if (x.staged) {
        const std::size_t b = k * x.per, n = std::min(x.per, x.count - b);
        detail::copy_async(static_cast<std::byte*>(x.recv) + b * es, x.work + b * es, n * es, exec_.stream());
      }
    }
    if (x.staged && x.chunks) exec_.synchronize();
    return true;
  }

  /// Our chunk k leaves before we wait for theirs, and any later chunk whose
  /// copy is done goes too: copies overlap the transfers.
  bool progress_exchange(Staged& e) {
    const std::size_t es = size_of(e.t);
    for (; e.k < e.recv_chunks; ++e.k) {
      const std::size_t k = e.k;
      post_sends(e, std::min(k + 1, e.send_chunks));
      while (e.sends_posted < e.send_chunks && (!e.send_staged || e.ready[e.sends_posted].done()))
        post_sends(e, e.sends_posted + 1);
      if (!done(&e.requests[k])) return false;
      if (e.recv_staged) {
        const std::size_t b = k * e.per, n = std::min(e.per, e.rcount - b);
        detail::copy_async(e.recv_target + b * es, e.recv_into + b * es, n * es, exec_.stream());
      }
    }
    post_sends(e, e.send_chunks);
    if (e.send_chunks && !done(e.requests.data() + e.recv_chunks, static_cast<int>(e.send_chunks))) return false;
    if (e.recv_staged) exec_.synchronize();
    return true;
  }

  /// The buffer MPI should read `bytes` of `p` from: p itself in host
  /// memory, else a pinned copy (the stream is synchronised).
  const void* stage_in(const void* p, std::size_t bytes, detail::PinnedBuffer& pin) {
    if (is_host(p)) return p;
    std::byte* at = pin.reserve(bytes);
    detail::copy_async(at, p, bytes, exec_.stream());
    exec_.synchronize();
    return at;
  }
  /// The buffer MPI should write `bytes` for `p` into: p itself in host
  /// memory, else pinned memory copied to p once MPI is done.
  void* stage_out(void* p, std::size_t bytes, detail::PinnedBuffer& pin) {
    if (is_host(p)) return p;
    return pin.reserve(bytes);
  }
  void back(Request& x, void* to, const void* from, std::size_t bytes) {
    x.kind = Request::Kind::whole;
    x.back_to = to;
    x.back_from = from;
    x.back_bytes = bytes;
    x.counts = x.displs = nullptr;
  }
  /// back() for a v-collective: only the blocks MPI wrote (counts[r]
  /// elements at displs[r]), so gaps between them keep what `to` held.
  void back_blocks(Request& x, void* to, const void* from, const std::size_t* counts, const std::size_t* displs,
                   std::size_t es) {
    back(x, to, from, 0);
    x.counts = counts;
    x.displs = displs;
    x.es = es;
  }
  void unstage(Request& x) {
    if (x.back_to == x.back_from) return;
    if (x.counts) {
      for (int r = 0; r < size_; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        if (x.counts[ur])
          detail::copy_async(static_cast<std::byte*>(x.back_to) + x.displs[ur] * x.es,
                             static_cast<const std::byte*>(x.back_from) + x.displs[ur] * x.es, x.counts[ur] * x.es,
                             exec_.stream());
      }
    } else if (x.back_bytes) {
      detail::copy_async(x.back_to, x.back_from, x.back_bytes, exec_.stream());
    } else {
      return;
    }
    exec_.synchronize();
  }

  /// Posts the sends of chunks [sends_posted, upto), each once its copy to
  /// pinned memory has finished.
  void post_sends(Staged& e, std::size_t upto) {
    const std::size_t es = size_of(e.t);
    for (; e.sends_posted < upto; ++e.sends_posted) {
      const std::size_t k = e.sends_posted, b = k * e.per, n = std::min(e.per, e.scount - b);
      if (e.send_staged) e.ready[k].synchronize();
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(e.send_from + b * es, detail::to_mpi_count(n),
                                                   detail::mpi_type_for(e.t), e.dst, e.tag, comm_,
                                                   &e.requests[e.recv_chunks + k]));
    }
  }

  /// A free exchange slot (one whose earlier requests have all completed).
  int acquire() {
    for (std::size_t i = 0; i < exchanges_.size(); ++i)
      if (!exchanges_[i]->busy) return static_cast<int>(i);
    exchanges_.push_back(std::make_unique<Staged>());
    return static_cast<int>(exchanges_.size() - 1);
  }

  /// Cancels what is left of an exchange after a failure; its staging
  /// memory is leaked, since MPI may still write into it.
  void withdraw(Staged& e) noexcept {
    for (auto& r : e.requests) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    e.send.leak();
    e.recv.leak();
    e.busy = false;
  }

  /// A Request dropped before it completed: if its requests are all done the
  /// slot is free again; otherwise it stays busy (never reused) so MPI can
  /// finish writing into memory nobody else will use.
  void abandon(int slot) noexcept {
    Staged& e = *exchanges_[static_cast<std::size_t>(slot)];
    // Unsent chunks are never posted: the peer's receive then meets the
    // deadline, as with any rank that stops half-way.
    if (e.sends_posted < e.send_chunks) e.send_chunks = e.sends_posted;
    int all = 0;
    if (MPI_Testall(static_cast<int>(e.recv_chunks + e.sends_posted), e.requests.data(), &all,
                    MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
        all)
      e.busy = false;
  }

  Mpi mpi_;  // the MPI operations of the whole-staged calls
  MPI_Comm comm_;
  int rank_, size_;
  int device_ = 0;
  Exec<CudaSpace> exec_;
  std::size_t chunk_bytes_ = default_chunk_bytes;
  detail::PinnedBuffer in_, out_, reduce_;
  std::vector<detail::CudaEvent> events_;  // allreduce: chunk k staged
  std::vector<MPI_Request> requests_;      // allreduce: chunk k's reduction
  std::vector<std::unique_ptr<Staged>> exchanges_;
};

}  // namespace parallax::engine::backend

namespace parallax::engine {

template <>
struct supports<backend::MpiStaged, op_sendrecv> : std::true_type {};
template <>
struct supports<backend::MpiStaged, op_alltoallv> : std::true_type {};
template <>
struct supports<backend::MpiStaged, op_allreduce> : std::true_type {};

}  // namespace parallax::engine
