#pragma once
/// @file
/// engine::MpiStaged: the engine interface of engine::Mpi for device memory,
/// through any MPI: device buffers are copied to page-locked host buffers,
/// moved by MPI, and copied back. Works with several ranks per GPU. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/engine/mpi_staged.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/cuda/device.cuh>
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/memory.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace parallax::engine {

/// Device-memory engine over MPI, staging through pinned host memory.
///
/// Its MPI side is an engine::Mpi it owns: the same communicator handling,
/// deadlines, fault diagnosis, check_calls mode and byte accounting (a call
/// books exactly what engine::Mpi books for it). Its stream is `exec()`:
/// copies to and from the staging buffers are ordered after the work the
/// caller issued on that stream, and every call has finished, results in
/// place, when it returns.
///
/// How each call moves data:
/// * allreduce and start_sendrecv/wait are pipelined in chunks of
///   chunk_bytes(): the device-to-host copy of chunk k+1 runs while MPI moves
///   chunk k, and the host-to-device copy of chunk k while MPI moves chunk
///   k+1. Both sides cut a message the same way, so a receive must be posted
///   for exactly the count its peer sends (the library always does).
/// * the other collectives and send/recv stage everything, make one
///   engine::Mpi call on the staging buffers, and copy the results back.
/// * buffers in host memory (the library's small control messages) are used
///   as they are; cudaPointerGetAttributes tells them apart, per call.
///
/// Staging buffers are cudaHostAlloc memory, allocated on first use, grown
/// on demand and kept for the engine's lifetime.
class MpiStaged {
 public:
  using space = CudaSpace;
  static constexpr const char* name = "mpi_staged";
  /// Default pipeline chunk: large enough for MPI to reach its bandwidth on
  /// one message, small enough that copies and transfers overlap.
  static constexpr std::size_t default_chunk_bytes = std::size_t{1} << 20;

  /// A started point-to-point exchange; complete it with wait(). Move-only.
  /// An exchange dropped without wait() keeps its staging memory (MPI may
  /// still write into it) rather than free it.
  class Exchange {
   public:
    Exchange() = default;
    Exchange(const Exchange&) = delete;
    Exchange& operator=(const Exchange&) = delete;
    Exchange(Exchange&& o) noexcept : owner_(std::exchange(o.owner_, nullptr)), slot_(std::exchange(o.slot_, -1)) {}
    Exchange& operator=(Exchange&& o) noexcept {
      if (this != &o) {
        abandon();
        owner_ = std::exchange(o.owner_, nullptr);
        slot_ = std::exchange(o.slot_, -1);
      }
      return *this;
    }
    ~Exchange() { abandon(); }

   private:
    friend class MpiStaged;
    Exchange(MpiStaged* owner, int slot) : owner_(owner), slot_(slot) {}
    void abandon() noexcept {
      if (owner_ && slot_ >= 0) owner_->abandon(slot_);
      owner_ = nullptr;
      slot_ = -1;
    }
    MpiStaged* owner_ = nullptr;
    int slot_ = -1;
  };

  /// Joins the context's ranks (collective: duplicates its communicator) and
  /// selects this rank's GPU (local rank mod GPUs; ranks may share one).
  /// @param ctx         the job
  /// @param options     deadline and check_calls, as for engine::Mpi
  /// @param chunk_bytes pipeline chunk of allreduce and sendrecv
  explicit MpiStaged(const Context& ctx, Options options = {}, std::size_t chunk_bytes = default_chunk_bytes)
      : mpi_(ctx, options),
        device_(select_device(local_rank_on_host(mpi_.comm()), DeviceSharing::shared, "engine::MpiStaged")),
        exec_(Exec<CudaSpace>::create()) {
    set_chunk_bytes(chunk_bytes);
  }
  MpiStaged(const MpiStaged&) = delete;
  MpiStaged& operator=(const MpiStaged&) = delete;
  ~MpiStaged() {
    // Exchanges never waited for may still have MPI requests writing into
    // their staging memory: leak it rather than free it.
    for (auto& x : exchanges_)
      if (x && x->busy) {
        x->send.leak();
        x->recv.leak();
      }
  }

  int rank() const noexcept { return mpi_.rank(); }
  int size() const noexcept { return mpi_.size(); }
  const Topology& topology() const noexcept { return mpi_.topology(); }
  MPI_Comm comm() const noexcept { return mpi_.comm(); }
  CommStats& stats() noexcept { return mpi_.stats(); }
  const CommStats& stats() const noexcept { return mpi_.stats(); }
  /// The stream every copy of this engine runs on.
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
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }
  /// Sets the pipeline chunk (at least 8 bytes). Every rank must use the same
  /// value: it decides how point-to-point messages are cut.
  void set_chunk_bytes(std::size_t bytes) {
    PARALLAX_EXPECTS(bytes >= 8, "engine::MpiStaged: chunk_bytes must be at least 8, got ", bytes);
    chunk_bytes_ = bytes;
  }

  /// recv = op over all ranks of send, `count` elements; send == recv is in
  /// place. Pipelined in chunks.
  void allreduce(const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    mpi_.begin("allreduce", count, t);
    mpi_.book_ring_allreduce(count, t);
    if (count == 0) return;
    const std::size_t es = size_of(t), per = chunk_elems(t), chunks = (count + per - 1) / per;
    const bool staged = !is_host(send) || !is_host(recv);
    const cudaStream_t s = exec_.stream();
    std::byte* work;  // reduced in place, chunk by chunk
    if (staged) {
      work = reduce_.reserve(count * es);
      grow_events(chunks);
      for (std::size_t k = 0; k < chunks; ++k) {
        const std::size_t b = k * per, n = std::min(per, count - b);
        detail::copy_async(work + b * es, static_cast<const std::byte*>(send) + b * es, n * es, s);
        events_[k].record(s);
      }
    } else {
      work = static_cast<std::byte*>(recv);
      if (send != recv) std::memcpy(recv, send, count * es);
    }
    requests_.assign(chunks, MPI_REQUEST_NULL);
    std::size_t issued = 0;
    auto issue = [&](std::size_t k) {
      if (staged) events_[k].synchronize();
      const std::size_t b = k * per, n = std::min(per, count - b);
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallreduce)(MPI_IN_PLACE, work + b * es, detail::to_mpi_count(n),
                                                        detail::mpi_datatype(t), detail::mpi_op(op), mpi_.comm(),
                                                        &requests_[k]));
    };
    for (std::size_t k = 0; k < chunks; ++k) {
      if (issued == k) issue(issued++);
      // Start the next chunk too if its copy is already done: two in flight.
      if (issued == k + 1 && issued < chunks && (!staged || events_[issued].done())) issue(issued++);
      mpi_.complete(&requests_[k], 1, "allreduce");
      if (staged) {
        const std::size_t b = k * per, n = std::min(per, count - b);
        detail::copy_async(static_cast<std::byte*>(recv) + b * es, work + b * es, n * es, s);
      }
    }
    if (staged) exec_.synchronize();
  }

  /// Reduces `send` (sum of recv_counts elements) over all ranks; rank i gets
  /// block i in recv. Staged whole.
  void reduce_scatter(const void* send, void* recv, const std::size_t* recv_counts, DataType t, ReduceOp op) {
    const std::size_t es = size_of(t);
    std::size_t total = 0;
    for (int j = 0; j < size(); ++j) total += recv_counts[j];
    const void* in = stage_in(send, total * es, in_);
    void* out = stage_out(recv, recv_counts[rank()] * es, out_);
    mpi_.reduce_scatter(in, out, recv_counts, t, op);
    unstage(recv, out, recv_counts[rank()] * es);
  }

  /// Every rank contributes `count` elements; recv holds size()*count, rank order.
  void allgather(const void* send, void* recv, std::size_t count, DataType t) {
    const std::size_t es = size_of(t), out_bytes = static_cast<std::size_t>(size()) * count * es;
    const void* in = stage_in(send, count * es, in_);
    void* out = stage_out(recv, out_bytes, out_);
    mpi_.allgather(in, out, count, t);
    unstage(recv, out, out_bytes);
  }

  /// Rank j contributes counts[j] elements, placed at recv + displs[j].
  void allgatherv(const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    const std::size_t es = size_of(t), out_bytes = detail::layout_extent(counts, displs, size()) * es;
    const void* in = stage_in(send, count * es, in_);
    void* out = stage_out(recv, out_bytes, out_);
    mpi_.allgatherv(in, count, out, counts, displs, t);
    unstage_blocks(recv, out, counts, displs, es);
  }

  /// Rank i sends block j (count elements at send + j*count) to rank j.
  void alltoall(const void* send, void* recv, std::size_t count, DataType t) {
    const std::size_t bytes = static_cast<std::size_t>(size()) * count * size_of(t);
    const void* in = stage_in(send, bytes, in_);
    void* out = stage_out(recv, bytes, out_);
    mpi_.alltoall(in, out, count, t);
    unstage(recv, out, bytes);
  }

  /// Rank i sends scounts[j] elements at send + sdispls[j] to rank j and
  /// receives rcounts[j] elements from rank j at recv + rdispls[j].
  void alltoallv(const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    const std::size_t es = size_of(t);
    const std::size_t in_bytes = detail::layout_extent(scounts, sdispls, size()) * es;
    const std::size_t out_bytes = detail::layout_extent(rcounts, rdispls, size()) * es;
    const void* in = stage_in(send, in_bytes, in_);
    void* out = stage_out(recv, out_bytes, out_);
    mpi_.alltoallv(in, scounts, sdispls, out, rcounts, rdispls, t);
    unstage_blocks(recv, out, rcounts, rdispls, es);
  }

  /// Copies `count` elements of root's buf to every rank's buf.
  void broadcast(void* buf, std::size_t count, DataType t, int root) {
    const std::size_t bytes = count * size_of(t);
    void* at = buf;
    if (!is_host(buf)) {
      at = out_.reserve(bytes);
      if (rank() == root) {
        detail::copy_async(at, buf, bytes, exec_.stream());
        exec_.synchronize();
      }
    }
    mpi_.broadcast(at, count, t, root);
    if (rank() != root) unstage(buf, at, bytes);
  }

  /// Waits until every rank has called barrier() (and this rank's stream is idle).
  void barrier() {
    exec_.synchronize();
    mpi_.barrier();
  }

  /// Sends `count` elements to `peer` (staged whole).
  void send(const void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    const void* in = stage_in(buf, count * size_of(t), in_);
    mpi_.send(in, count, t, peer, tag);
  }

  /// Receives `count` elements from `peer` (staged whole).
  void recv(void* buf, std::size_t count, DataType t, int peer, int tag = 0) {
    void* out = stage_out(buf, count * size_of(t), out_);
    mpi_.recv(out, count, t, peer, tag);
    unstage(buf, out, count * size_of(t));
  }

  /// Starts sending `scount` elements to `dst` while receiving `rcount` from
  /// `src`, in chunks of chunk_bytes(). `rcount` must equal the count `src`
  /// sends. Messages between one pair with one tag arrive in the order
  /// started. Complete with wait().
  Exchange start_sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                          int src, DataType t, int tag = 0) {
    ++mpi_.calls_;
    mpi_.book_point_to_point(dst, scount * size_of(t), src, rcount * size_of(t));
    // Sends of earlier exchanges go out first, so chunks to one peer leave in
    // the order their receives were posted.
    for (auto& other : exchanges_)
      if (other && other->busy) post_sends(*other, other->send_chunks);

    const int slot = acquire();
    Staged& x = *exchanges_[static_cast<std::size_t>(slot)];
    const std::size_t es = size_of(t), per = chunk_elems(t);
    x.t = t;
    x.per = per;
    x.dst = dst;
    x.src = src;
    x.tag = tag;
    x.scount = scount;
    x.rcount = rcount;
    x.send_chunks = (scount + per - 1) / per;
    x.recv_chunks = (rcount + per - 1) / per;
    x.sends_posted = 0;
    x.recv_target = static_cast<std::byte*>(recvbuf);
    x.send_staged = !is_host(sendbuf);
    x.recv_staged = !is_host(recvbuf);
    x.send_from = x.send_staged ? x.send.reserve(scount * es) : static_cast<const std::byte*>(sendbuf);
    x.recv_into = x.recv_staged ? x.recv.reserve(rcount * es) : static_cast<std::byte*>(recvbuf);
    x.requests.assign(x.recv_chunks + x.send_chunks, MPI_REQUEST_NULL);
    x.busy = true;

    const cudaStream_t s = exec_.stream();
    if (x.send_staged) {
      while (x.ready.size() < x.send_chunks) x.ready.emplace_back();
      for (std::size_t k = 0; k < x.send_chunks; ++k) {
        const std::size_t b = k * per, n = std::min(per, scount - b);
        detail::copy_async(x.send.data() + b * es, static_cast<const std::byte*>(sendbuf) + b * es, n * es, s);
        x.ready[k].record(s);
      }
    }
    for (std::size_t k = 0; k < x.recv_chunks; ++k) {
      const std::size_t b = k * per, n = std::min(per, rcount - b);
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Irecv)(x.recv_into + b * es, detail::to_mpi_count(n),
                                                   detail::mpi_datatype(t), src, tag, mpi_.comm(),
                                                   &x.requests[k]));
    }
    post_sends(x, std::min<std::size_t>(1, x.send_chunks));  // the first chunk leaves now
    return Exchange(this, slot);
  }

  /// Completes an exchange: the received elements are in the receive buffer.
  /// A missed deadline withdraws the exchange and throws timeout_error, as
  /// engine::Mpi does for point-to-point calls.
  void wait(Exchange& ex) {
    PARALLAX_EXPECTS(ex.owner_ == this && ex.slot_ >= 0, "engine::MpiStaged::wait: not a started exchange of this engine");
    const int slot = std::exchange(ex.slot_, -1);
    ex.owner_ = nullptr;
    Staged& x = *exchanges_[static_cast<std::size_t>(slot)];
    const std::size_t es = size_of(x.t);
    const cudaStream_t s = exec_.stream();
    try {
      for (std::size_t k = 0; k < x.recv_chunks; ++k) {
        // Our chunk k leaves before we wait for theirs, and any later chunk
        // whose copy is done goes too: copies overlap the transfers.
        post_sends(x, std::min(k + 1, x.send_chunks));
        while (x.sends_posted < x.send_chunks && (!x.send_staged || x.ready[x.sends_posted].done()))
          post_sends(x, x.sends_posted + 1);
        mpi_.complete(&x.requests[k], 1, "sendrecv");
        if (x.recv_staged) {
          const std::size_t b = k * x.per, n = std::min(x.per, x.rcount - b);
          detail::copy_async(x.recv_target + b * es, x.recv_into + b * es, n * es, s);
        }
      }
      post_sends(x, x.send_chunks);
      if (x.send_chunks) mpi_.complete(x.requests.data() + x.recv_chunks, static_cast<int>(x.send_chunks), "sendrecv");
      if (x.recv_staged) exec_.synchronize();
    } catch (...) {
      withdraw(x);
      throw;
    }
    x.busy = false;
  }

  /// start_sendrecv then wait.
  void sendrecv(const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount, int src,
                DataType t, int tag = 0) {
    auto x = start_sendrecv(sendbuf, scount, dst, recvbuf, rcount, src, t, tag);
    wait(x);
  }

 private:
  /// The engine-side state of one exchange, kept for reuse (its pinned
  /// buffers and events stay allocated).
  struct Staged {
    bool busy = false;
    DataType t = DataType::u8;
    std::size_t per = 1, scount = 0, rcount = 0;
    std::size_t send_chunks = 0, recv_chunks = 0, sends_posted = 0;
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

  void grow_events(std::size_t n) {
    while (events_.size() < n) events_.emplace_back();
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
  /// memory, else pinned memory that unstage() copies to p.
  void* stage_out(void* p, std::size_t bytes, detail::PinnedBuffer& pin) {
    if (is_host(p)) return p;
    return pin.reserve(bytes);
  }
  void unstage(void* p, const void* from, std::size_t bytes) {
    if (p == from || bytes == 0) return;
    detail::copy_async(p, from, bytes, exec_.stream());
    exec_.synchronize();
  }
  /// unstage() for a v-collective: only the blocks MPI wrote (counts[r]
  /// elements at displs[r]), so gaps between them keep what p held.
  void unstage_blocks(void* p, const void* from, const std::size_t* counts, const std::size_t* displs,
                      std::size_t es) {
    if (p == from) return;
    for (int r = 0; r < size(); ++r) {
      const auto ur = static_cast<std::size_t>(r);
      if (counts[ur])
        detail::copy_async(static_cast<std::byte*>(p) + displs[ur] * es,
                           static_cast<const std::byte*>(from) + displs[ur] * es, counts[ur] * es, exec_.stream());
    }
    exec_.synchronize();
  }

  /// Posts the sends of chunks [sends_posted, upto), each once its copy to
  /// pinned memory has finished.
  void post_sends(Staged& x, std::size_t upto) {
    const std::size_t es = size_of(x.t);
    for (; x.sends_posted < upto; ++x.sends_posted) {
      const std::size_t k = x.sends_posted, b = k * x.per, n = std::min(x.per, x.scount - b);
      if (x.send_staged) x.ready[k].synchronize();
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(x.send_from + b * es, detail::to_mpi_count(n),
                                                   detail::mpi_datatype(x.t), x.dst, x.tag, mpi_.comm(),
                                                   &x.requests[x.recv_chunks + k]));
    }
  }

  /// A free exchange slot (one whose earlier requests have all completed).
  int acquire() {
    for (std::size_t i = 0; i < exchanges_.size(); ++i) {
      Staged& x = *exchanges_[i];
      if (!x.busy) return static_cast<int>(i);
    }
    exchanges_.push_back(std::make_unique<Staged>());
    return static_cast<int>(exchanges_.size() - 1);
  }

  /// Cancels what is left of an exchange after a failure; its staging
  /// memory is leaked, since MPI may still write into it.
  void withdraw(Staged& x) noexcept {
    for (auto& r : x.requests) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    x.send.leak();
    x.recv.leak();
    x.busy = false;
  }

  /// An Exchange destroyed without wait(): if its requests are all done the
  /// slot is free again; otherwise it stays busy (never reused) so MPI can
  /// finish writing into memory nobody else will use.
  void abandon(int slot) noexcept {
    Staged& x = *exchanges_[static_cast<std::size_t>(slot)];
    if (x.sends_posted < x.send_chunks) {
      // Unsent chunks are never posted: the peer's receive then meets the
      // deadline, as with any rank that stops half-way.
      x.send_chunks = x.sends_posted;
    }
    int done = 0;
    if (MPI_Testall(static_cast<int>(x.recv_chunks + x.sends_posted), x.requests.data(), &done,
                    MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
        done)
      x.busy = false;
  }

  Mpi mpi_;
  int device_ = 0;
  Exec<CudaSpace> exec_;
  std::size_t chunk_bytes_ = default_chunk_bytes;
  detail::PinnedBuffer in_, out_, reduce_;
  std::vector<detail::CudaEvent> events_;  // allreduce: chunk k staged
  std::vector<MPI_Request> requests_;      // allreduce: chunk k's reduction
  std::vector<std::unique_ptr<Staged>> exchanges_;
};

template <>
struct supports<MpiStaged, op_sendrecv> : std::true_type {};
template <>
struct supports<MpiStaged, op_alltoallv> : std::true_type {};
template <>
struct supports<MpiStaged, op_allreduce> : std::true_type {};

}  // namespace parallax::engine
