#pragma once
/// @file
/// backend::Mpi: raw non-blocking MPI operations over host memory, started
/// and tested for engine::Mpi (= engine::Comm<backend::Mpi>). Every
/// operation is one MPI_I* call (or a few); the facade polls test() against
/// its deadline.

#include <parallax/context.hpp>
#include <parallax/detail/half_reduce.hpp>
#include <parallax/detail/mpi.hpp>
#include <parallax/engine/backend/backend.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace parallax::engine::backend {

class Mpi {
 public:
  using space = HostSpace;
  static constexpr const char* name = "mpi";

  /// A started operation: its MPI requests, and what MPI reads until they
  /// complete (the converted counts of a v-collective, matched messages).
  /// Reused by the facade for its blocking calls, so the vectors keep their
  /// room.
  struct Request {
    MPI_Request few[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    std::vector<MPI_Request> many;  // when more than two
    int n = 0;
    std::vector<detail::mpi_count> counts;
    std::vector<detail::mpi_displ> displs;
    std::vector<MPI_Message> messages;  // probe(): matched, not yet received
    std::size_t sends = 0;              // prepare(): where the receives start

    /// Makes room for `k` requests, all null.
    MPI_Request* reset(int k) {
      n = k;
      if (k <= 2) {
        few[0] = few[1] = MPI_REQUEST_NULL;
        return few;
      }
      many.assign(static_cast<std::size_t>(k), MPI_REQUEST_NULL);
      return many.data();
    }
    MPI_Request* data() noexcept { return n <= 2 ? few : many.data(); }
  };

  /// `comm` is the facade's communicator (a duplicate of the context's).
  Mpi(const Context& ctx, MPI_Comm comm, const Options&, const Site&) : comm_(comm), size_(ctx.size()) {}

  Exec<HostSpace>& exec() noexcept { return exec_; }

  void allreduce(Request& x, const void* send, void* recv, std::size_t count, DataType t, ReduceOp op) {
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallreduce)(send == recv ? MPI_IN_PLACE : send, recv,
                                                      detail::to_mpi_count(count), detail::mpi_type_for(t),
                                                      detail::mpi_op_for(t, op), comm_, x.reset(1)));
  }

  void reduce_scatter(Request& x, const void* send, void* recv, const std::size_t* recv_counts, DataType t,
                      ReduceOp op) {
    const int n = ranks();
    x.counts.resize(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) x.counts[static_cast<std::size_t>(j)] = detail::to_mpi_count(recv_counts[j]);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ireduce_scatter)(send, recv, x.counts.data(), detail::mpi_type_for(t),
                                                           detail::mpi_op_for(t, op), comm_, x.reset(1)));
  }

  void allgather(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    const auto c = detail::to_mpi_count(count);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallgather)(send, c, detail::mpi_type_for(t), recv, c,
                                                      detail::mpi_type_for(t), comm_, x.reset(1)));
  }

  void allgatherv(Request& x, const void* send, std::size_t count, void* recv, const std::size_t* counts,
                  const std::size_t* displs, DataType t) {
    convert(x, counts, displs, nullptr, nullptr);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Iallgatherv)(send, detail::to_mpi_count(count), detail::mpi_type_for(t),
                                                       recv, x.counts.data(), x.displs.data(),
                                                       detail::mpi_type_for(t), comm_, x.reset(1)));
  }

  void alltoall(Request& x, const void* send, void* recv, std::size_t count, DataType t) {
    const auto c = detail::to_mpi_count(count);
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ialltoall)(send, c, detail::mpi_type_for(t), recv, c,
                                                     detail::mpi_type_for(t), comm_, x.reset(1)));
  }

  void alltoallv(Request& x, const void* send, const std::size_t* scounts, const std::size_t* sdispls, void* recv,
                 const std::size_t* rcounts, const std::size_t* rdispls, DataType t) {
    convert(x, scounts, sdispls, rcounts, rdispls);
    const std::size_t n = static_cast<std::size_t>(ranks());
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ialltoallv)(send, x.counts.data(), x.displs.data(), detail::mpi_type_for(t),
                                                      recv, x.counts.data() + n, x.displs.data() + n,
                                                      detail::mpi_type_for(t), comm_, x.reset(1)));
  }

  void broadcast(Request& x, void* buf, std::size_t count, DataType t, int root) {
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Ibcast)(buf, detail::to_mpi_count(count), detail::mpi_type_for(t), root,
                                                  comm_, x.reset(1)));
  }

  void barrier(Request& x) { PARALLAX_MPI_CHECK(MPI_Ibarrier(comm_, x.reset(1))); }

  /// Sends `scount` elements to `dst` while receiving `rcount` from `src`
  /// (a negative peer: that side is left out). Messages between one pair
  /// with one tag arrive in the order sent.
  void sendrecv(Request& x, const void* sendbuf, std::size_t scount, int dst, void* recvbuf, std::size_t rcount,
                int src, DataType t, int tag) {
    MPI_Request* r = x.reset(2);
    if (src >= 0)
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Irecv)(recvbuf, detail::to_mpi_count(rcount), detail::mpi_type_for(t),
                                                   src, tag, comm_, &r[0]));
    if (dst >= 0)
      PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(sendbuf, detail::to_mpi_count(scount), detail::mpi_type_for(t),
                                                   dst, tag, comm_, &r[1]));
  }

  /// Whether the operation has completed; throws Failure if it cannot.
  bool test(Request& x) {
    int all = 0;
    const int status = MPI_Testall(x.n, x.data(), &all, MPI_STATUSES_IGNORE);
    if (status != MPI_SUCCESS) throw Failure{detail::concat("lost a peer (", detail::mpi_error_string(status), ")")};
    return all != 0;
  }

  /// Withdraws what is left of a point-to-point operation; the backend
  /// stays usable.
  bool cancel(Request& x) noexcept {
    MPI_Request* r = x.data();
    for (int i = 0; i < x.n; ++i) {
      if (r[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r[i]);
      MPI_Request_free(&r[i]);
    }
    return true;
  }
  /// A collective missed its deadline: nothing to release (the job ends).
  const char* give_up() noexcept { return ""; }

  // Messages whose length only the sender knows (op_alltoallv_unsized, and
  // the facade's recv_sized): probe() matches the next message from `peer`
  // with `tag` into slot `slot` (so no later message takes its place) and
  // measures it; recv_probed() receives it.

  /// Sizes `x` for `slots` matched messages and `sends` sends: requests
  /// [0, sends) are sends, [sends, sends + slots) the receives.
  void prepare(Request& x, std::size_t sends, std::size_t slots) {
    x.reset(static_cast<int>(sends + slots));
    x.messages.assign(slots, MPI_MESSAGE_NULL);  // stays null until a message is matched
    x.sends = sends;
  }
  /// Starts send number `i` of `x` (prepare()d): `bytes` bytes to `peer`.
  void send_bytes(Request& x, std::size_t i, const void* buf, std::size_t bytes, int peer, int tag) {
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Isend)(buf, detail::to_mpi_count(bytes), MPI_BYTE, peer, tag, comm_,
                                                 &x.data()[i]));
  }
  /// True once slot `slot` holds a matched message (then `bytes` is its length).
  bool probe(Request& x, std::size_t slot, int peer, int tag, std::size_t& bytes) {
    if (x.messages[slot] != MPI_MESSAGE_NULL) return true;
    int found = 0;
    MPI_Status st;
    MPI_Message m = MPI_MESSAGE_NULL;  // MPI leaves it undefined when nothing is found
    const int status = MPI_Improbe(peer, tag, comm_, &found, &m, &st);
    if (status != MPI_SUCCESS) throw Failure{detail::concat("lost a peer (", detail::mpi_error_string(status), ")")};
    if (!found) return false;
    x.messages[slot] = m;
    MPI_Count got = 0;
    PARALLAX_MPI_CHECK(MPI_Get_elements_x(&st, MPI_BYTE, &got));
    bytes = static_cast<std::size_t>(got);
    return true;
  }
  /// Starts receiving slot `slot`'s matched message (`bytes` long) into buf.
  void recv_probed(Request& x, std::size_t slot, void* buf, std::size_t bytes) {
    PARALLAX_MPI_CHECK(PARALLAX_MPI_C(MPI_Imrecv)(buf, detail::to_mpi_count(bytes), MPI_BYTE, &x.messages[slot],
                                                  &x.data()[x.sends + slot]));
  }

 private:
  int ranks() const noexcept { return size_; }
  /// Counts and displacements as MPI reads them: sends, then receives.
  void convert(Request& x, const std::size_t* sc, const std::size_t* sd, const std::size_t* rc,
               const std::size_t* rd) {
    const auto n = static_cast<std::size_t>(ranks());
    const std::size_t sides = rc ? 2 : 1;
    x.counts.resize(sides * n);
    x.displs.resize(sides * n);
    for (std::size_t p = 0; p < n; ++p) {
      x.counts[p] = detail::to_mpi_count(sc[p]);
      x.displs[p] = static_cast<detail::mpi_displ>(sd[p]);
      if (rc) {
        x.counts[n + p] = detail::to_mpi_count(rc[p]);
        x.displs[n + p] = static_cast<detail::mpi_displ>(rd[p]);
      }
    }
  }

  MPI_Comm comm_;
  int size_ = 0;
  Exec<HostSpace> exec_;
};

}  // namespace parallax::engine::backend

namespace parallax::engine {

template <>
struct supports<backend::Mpi, op_sendrecv> : std::true_type {};
template <>
struct supports<backend::Mpi, op_alltoallv> : std::true_type {};
template <>
struct supports<backend::Mpi, op_allreduce> : std::true_type {};
template <>
struct supports<backend::Mpi, op_alltoallv_unsized> : std::true_type {};
template <>
struct supports<backend::Mpi, op_start_alltoallv> : std::true_type {};

}  // namespace parallax::engine
