// The engine contract (contract.hpp) over the host backends: engine::Mpi, and
// a backend defined here and nowhere else, built from MPI point-to-point
// messages only: a new engine backend is one file, and the facade
// (engine::Comm) gives it the whole engine API, byte booking, deadlines and
// check_calls mode without a change to the library.
#include "support.hpp"

#include <parallax/engine/comm.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <algorithm>
#include <functional>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace engine = px::engine;
using px::DataType;
using px::ReduceOp;

/// Every collective as point-to-point messages between all pairs (no MPI
/// collective at all); reductions are folded in rank order once every
/// block is in.
class PointToPoint {
 public:
  using space = px::HostSpace;
  static constexpr const char* name = "point_to_point";

  struct Request {
    std::vector<MPI_Request> requests;
    std::vector<std::byte> scratch;  // the blocks a reduction folds
    std::function<void()> then;      // runs once every message is in
  };

  PointToPoint(const px::Context& ctx, MPI_Comm comm, const engine::Options&, const engine::backend::Site&)
      : comm_(comm), n_(ctx.size()), me_(ctx.rank()) {}

  px::Exec<px::HostSpace>& exec() noexcept { return exec_; }

  void allreduce(Request& x, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    const std::size_t bytes = count * px::size_of(t);
    open(x);
    x.scratch.resize(static_cast<std::size_t>(n_) * bytes);
    std::byte* blocks = x.scratch.data();
    if (bytes) std::memcpy(blocks + static_cast<std::size_t>(me_) * bytes, send, bytes);
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      post_send(x, send, bytes, p, collective_tag);
      post_recv(x, blocks + static_cast<std::size_t>(p) * bytes, bytes, p, collective_tag);
    }
    x.then = [=] { fold(t, op, recv, blocks, count); };
  }

  void reduce_scatter(Request& x, const void* send, void* recv, const std::size_t* counts, DataType t, ReduceOp op) {
    const std::size_t es = px::size_of(t), mine = counts[me_] * es;
    open(x);
    x.scratch.resize(static_cast<std::size_t>(n_) * mine);
    std::byte* blocks = x.scratch.data();
    std::size_t at = 0;
    for (int p = 0; p < n_; ++p) {
      const auto* block = static_cast<const std::byte*>(send) + at;
      if (p == me_) {
        if (mine) std::memcpy(blocks + static_cast<std::size_t>(me_) * mine, block, mine);
      } else {
        post_send(x, block, counts[p] * es, p, collective_tag);
        post_recv(x, blocks + static_cast<std::size_t>(p) * mine, mine, p, collective_tag);
      }
      at += counts[p] * es;
    }
    const std::size_t count = counts[me_];
    x.then = [=] { fold(t, op, recv, blocks, count); };
  }

  void allgather(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n_), count), displs(counts.size());
    for (std::size_t p = 0; p < counts.size(); ++p) displs[p] = p * count;
    allgatherv(x, send, count, recv, counts.data(), displs.data(), t);
  }

  void allgatherv(Request& x, const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    const std::size_t es = px::size_of(t);
    open(x);
    auto* r = static_cast<std::byte*>(recv);
    if (count) std::memcpy(r + displs[me_] * es, send, count * es);
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      post_send(x, send, count * es, p, collective_tag);
      post_recv(x, r + displs[p] * es, counts[p] * es, p, collective_tag);
    }
  }

  void alltoall(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n_), count), displs(counts.size());
    for (std::size_t p = 0; p < counts.size(); ++p) displs[p] = p * count;
    alltoallv(x, send, counts.data(), displs.data(), recv, counts.data(), displs.data(), t);
  }

  void alltoallv(Request& x, const void* send, const std::size_t* sc, const std::size_t* sd, void* recv,
                 const std::size_t* rc, const std::size_t* rd, DataType t) {
    const std::size_t es = px::size_of(t);
    open(x);
    const auto* s = static_cast<const std::byte*>(send);
    auto* r = static_cast<std::byte*>(recv);
    if (sc[me_]) std::memcpy(r + rd[me_] * es, s + sd[me_] * es, sc[me_] * es);
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      post_send(x, s + sd[p] * es, sc[p] * es, p, collective_tag);
      post_recv(x, r + rd[p] * es, rc[p] * es, p, collective_tag);
    }
  }

  void broadcast(Request& x, void* buf, std::size_t count, DataType t, int root) {
    const std::size_t bytes = count * px::size_of(t);
    open(x);
    if (me_ == root) {
      for (int p = 0; p < n_; ++p)
        if (p != root) post_send(x, buf, bytes, p, collective_tag);
    } else {
      post_recv(x, buf, bytes, root, collective_tag);
    }
  }

  void barrier(Request& x) {
    open(x);
    for (int p = 0; p < n_; ++p) {
      if (p == me_) continue;
      post_send(x, nullptr, 0, p, collective_tag);
      post_recv(x, nullptr, 0, p, collective_tag);
    }
  }

  void sendrecv(Request& x, const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                int src, DataType t, int tag) {
    open(x);
    if (src >= 0) post_recv(x, recvbuf, rcount * px::size_of(t), src, tag);
    if (dst >= 0) post_send(x, sendbuf, scount * px::size_of(t), dst, tag);
  }

  bool test(Request& x) {
    int all = 0;
    const int status =
        MPI_Testall(static_cast<int>(x.requests.size()), x.requests.data(), &all, MPI_STATUSES_IGNORE);
    if (status != MPI_SUCCESS) throw engine::backend::Failure{"lost a peer"};
    if (!all) return false;
    if (x.then) std::exchange(x.then, nullptr)();
    return true;
  }

  bool cancel(Request& x) noexcept {
    for (auto& r : x.requests) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    return true;
  }

  const char* give_up() noexcept { return ""; }

 private:
  // Apart from the small tags of the engine's point-to-point calls.
  static constexpr int collective_tag = 30000;

  static void open(Request& x) {
    x.requests.clear();
    x.then = nullptr;
  }
  void post_send(Request& x, const void* buf, std::size_t bytes, int peer, int tag) {
    PARALLAX_MPI_CHECK(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &x.requests.emplace_back()));
  }
  void post_recv(Request& x, void* buf, std::size_t bytes, int peer, int tag) {
    PARALLAX_MPI_CHECK(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, peer, tag, comm_, &x.requests.emplace_back()));
  }

  /// out = blocks[0] op blocks[1] op ... (rank order), `count` elements each.
  void fold(DataType t, ReduceOp op, void* out, const std::byte* blocks, std::size_t count) const {
    switch (t) {
      case DataType::f32: return fold_as<float>(op, out, blocks, count);
      case DataType::f64: return fold_as<double>(op, out, blocks, count);
      case DataType::i32: return fold_as<std::int32_t>(op, out, blocks, count);
      case DataType::i64: return fold_as<std::int64_t>(op, out, blocks, count);
      case DataType::u8: return fold_as<std::uint8_t>(op, out, blocks, count);
      case DataType::bf16:
      case DataType::f16:
        break;  // the contract reduces no 16-bit elements over this backend
    }
    throw parallax::error("PointToPoint folds f32, f64, i32, i64 and u8 elements only");
  }
  template <class T>
  void fold_as(ReduceOp op, void* out, const std::byte* blocks, std::size_t count) const {
    const auto* b = reinterpret_cast<const T*>(blocks);
    auto* o = static_cast<T*>(out);
    for (std::size_t i = 0; i < count; ++i) {
      T acc = b[i];
      for (int p = 1; p < n_; ++p) {
        const T v = b[static_cast<std::size_t>(p) * count + i];
        acc = op == ReduceOp::sum ? static_cast<T>(acc + v) : op == ReduceOp::max ? std::max(acc, v) : std::min(acc, v);
      }
      o[i] = acc;
    }
  }

  MPI_Comm comm_;
  int n_, me_;
  px::Exec<px::HostSpace> exec_;
};

static_assert(engine::check<engine::Comm<PointToPoint>>());

}  // namespace

using ContractEngines = std::tuple<px::engine::Mpi, px::engine::Comm<PointToPoint>>;
#define PARALLAX_CONTRACT_TAGS "[engine][contract]"
#include "contract.hpp"
