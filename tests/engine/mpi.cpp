// engine::Mpi beyond the engine contract (tests/engine/contract.hpp, which
// runs over it in contract.cpp): yielding, alltoallv_unsized,
// start_alltoallv, recv_sized.
#include "support.hpp"

#include <numeric>
#include <thread>

using px::DataType;
using px::ReduceOp;

namespace {


struct Fixture {
  px::engine::Mpi mpi{test::world()};
  int n = mpi.size();
  int me = mpi.rank();
};

/// Per-peer counts and displacements of an alltoallv in which rank `from`
/// sends count(from, to) elements to rank `to`.
struct Layout {
  std::vector<std::size_t> sc, sd, rc, rd;
  std::size_t st = 0, rt = 0;  // elements sent, received
};
template <class Count>
Layout layout_of(const Fixture& f, Count count) {
  const auto un = static_cast<std::size_t>(f.n);
  Layout l{std::vector<std::size_t>(un), std::vector<std::size_t>(un), std::vector<std::size_t>(un),
           std::vector<std::size_t>(un)};
  for (int p = 0; p < f.n; ++p) {
    l.sc[p] = count(f.me, p);
    l.sd[p] = l.st;
    l.st += l.sc[p];
    l.rc[p] = count(p, f.me);
    l.rd[p] = l.rt;
    l.rt += l.rc[p];
  }
  return l;
}

}  // namespace

TEST_CASE("Mpi yields between polls when asked or oversubscribed, with the same results", "[engine][mpi]") {
  using Yield = px::engine::Options::Yield;
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  const bool oversubscribed = threads > 0 && test::world().topology().local_size() > threads;
  for (Yield y : {Yield::always, Yield::never, Yield::automatic}) {
    px::engine::Options options;
    options.yield = y;
    px::engine::Mpi mpi(test::world(), options);
    CHECK(mpi.yields() == (y == Yield::always || (y == Yield::automatic && oversubscribed)));
    std::vector<std::int64_t> v(333);
    std::iota(v.begin(), v.end(), std::int64_t{mpi.rank()});
    mpi.allreduce(v.data(), v.data(), v.size(), DataType::i64, ReduceOp::sum);
    const std::int64_t n = mpi.size();
    bool exact = true;
    for (std::size_t i = 0; i < v.size(); ++i) exact = exact && v[i] == n * std::int64_t(i) + n * (n - 1) / 2;
    CHECK(exact);
  }
}

TEST_CASE("Mpi::alltoallv_unsized delivers blocks whose sizes only the senders know", "[engine][mpi]") {
  static_assert(px::engine::supports_v<px::engine::Mpi, px::engine::op_alltoallv_unsized>);
  Fixture f;
  const auto un = static_cast<std::size_t>(f.n);
  // Sizes (in bytes) differ per pair and per round, empty messages included;
  // two rounds back to back check that one round's messages never match the
  // next's.
  for (int round = 0; round < 2; ++round) {
    auto bytes = [&](int from, int to) { return static_cast<std::size_t>((3 * from + 5 * to + 7 * round) % 4) * 1500; };
    std::vector<std::size_t> sb(un), sd(un), rb(un, 99), rd(un, 99);
    std::size_t st = 0;
    for (int p = 0; p < f.n; ++p) {
      sb[p] = bytes(f.me, p);
      sd[p] = st;
      st += sb[p];
    }
    std::vector<std::uint8_t> send(st), recv;
    for (int p = 0; p < f.n; ++p)
      for (std::size_t k = 0; k < sb[p]; ++k) send[sd[p] + k] = static_cast<std::uint8_t>(31 * f.me + 7 * p + k + round);
    std::size_t asked = 0;
    const auto before = f.mpi.stats().total();
    f.mpi.alltoallv_unsized(send.data(), sb.data(), sd.data(), rb.data(), rd.data(), [&](std::size_t total) {
      asked = total;
      recv.assign(total, 0xEE);
      return recv.data();
    });
    const auto t = f.mpi.stats().total() - before;
    std::size_t want_total = 0, sent = 0, got = 0;
    bool exact = true;
    for (int p = 0; p < f.n; ++p) {
      CHECK(rb[p] == bytes(p, f.me));
      CHECK(rd[p] == want_total);
      want_total += bytes(p, f.me);
      for (std::size_t k = 0; k < rb[p]; ++k)
        exact = exact && recv[rd[p] + k] == static_cast<std::uint8_t>(31 * p + 7 * f.me + k + round);
      if (p != f.me) {
        sent += sb[p];
        got += rb[p];
      }
    }
    CHECK(exact);
    CHECK(asked == want_total);
    CHECK(t.calls == 1);
    CHECK(t.sent() == sent);
    CHECK(t.received() == got);
  }
}

TEST_CASE("Mpi::start_alltoallv leaves calls in flight that one wait_started() completes", "[engine][mpi]") {
  static_assert(px::engine::supports_v<px::engine::Mpi, px::engine::op_start_alltoallv>);
  Fixture f;
  // Three alltoallvs of different shapes in flight at once (the counts
  // arrays are gone before the wait: the engine keeps its own).
  constexpr int calls = 3;
  std::vector<std::vector<std::int32_t>> send(calls), recv(calls);
  std::uint64_t sent = 0, got = 0;
  for (int c = 0; c < calls; ++c) {
    auto count = [&](int from, int to) { return static_cast<std::size_t>((from + 2 * to + c) % 4) * 100; };
    auto [sc, sd, rc, rd, st, rt] = layout_of(f, count);
    for (int p = 0; p < f.n; ++p) {
      if (p != f.me) {
        sent += 4 * sc[p];
        got += 4 * rc[p];
      }
    }
    send[c].resize(st);
    recv[c].assign(rt, -1);
    for (int p = 0; p < f.n; ++p)
      for (std::size_t k = 0; k < sc[p]; ++k) send[c][sd[p] + k] = 100000 * c + 1000 * f.me + 10 * p + static_cast<int>(k % 10);
    f.mpi.start_alltoallv(send[c].data(), sc.data(), sd.data(), recv[c].data(), rc.data(), rd.data(), DataType::i32);
  }
  f.mpi.wait_started();
  f.mpi.wait_started();  // nothing left: returns at once
  for (int c = 0; c < calls; ++c) {
    auto count = [&](int from, int to) { return static_cast<std::size_t>((from + 2 * to + c) % 4) * 100; };
    std::size_t at = 0;
    bool exact = true;
    for (int p = 0; p < f.n; ++p)
      for (std::size_t k = 0; k < count(p, f.me); ++k)
        exact = exact && recv[c][at++] == 100000 * c + 1000 * p + 10 * f.me + static_cast<int>(k % 10);
    CHECK(exact);
    CHECK(at == recv[c].size());
  }
  CHECK(f.mpi.stats().total().calls == static_cast<std::uint64_t>(calls));
  CHECK(f.mpi.stats().total().sent() == sent);
  CHECK(f.mpi.stats().total().received() == got);
}

TEST_CASE("Mpi::recv_sized takes a message of any length, in the order sent", "[engine][mpi]") {
  Fixture f;
  // Each rank sends its right neighbour two messages of different lengths
  // with one tag; the neighbour learns each length from the message.
  const int right = (f.me + 1) % f.n, left = (f.me - 1 + f.n) % f.n;
  std::vector<std::int32_t> a(static_cast<std::size_t>(f.me) + 1, f.me), b(3, -f.me);
  auto x = f.mpi.start_sendrecv(a.data(), a.size(), right, nullptr, 0, -1, DataType::i32, 5);
  auto y = f.mpi.start_sendrecv(b.data(), b.size(), right, nullptr, 0, -1, DataType::i32, 5);
  std::vector<std::int32_t> first, second;
  const std::size_t n1 = f.mpi.recv_sized(DataType::i32, left, 5, [&](std::size_t n) {
    first.assign(n, 99);
    return first.data();
  });
  const std::size_t n2 = f.mpi.recv_sized(DataType::i32, left, 5, [&](std::size_t n) {
    second.assign(n, 99);
    return second.data();
  });
  f.mpi.wait(x);
  f.mpi.wait(y);
  CHECK(n1 == static_cast<std::size_t>(left) + 1);
  CHECK(first == std::vector<std::int32_t>(static_cast<std::size_t>(left) + 1, left));
  CHECK(n2 == 3);
  CHECK(second == std::vector<std::int32_t>(3, -left));
  const px::Traffic t = f.mpi.stats().total();
  CHECK(t.calls == 4);
  CHECK(t.received() == 4 * (n1 + n2));
  CHECK(t.sent() == 4 * (a.size() + b.size()));
}

TEST_CASE("Mpi sums, takes the max of and gathers bf16 and fp16, each combination in float", "[engine][mpi][half]") {
  px::engine::Mpi eng(test::world());
  const int n = eng.size(), me = eng.rank();
  // Small integers: every partial sum is exact in 16 bits, whatever MPI's combining order.
  std::vector<px::bf16> b{px::bf16(float(me + 1)), px::bf16(-2.0f * me), px::bf16(0.5f)};
  eng.allreduce(b.data(), b.data(), b.size(), px::DataType::bf16, px::ReduceOp::sum);
  CHECK(float(b[0]) == float(n * (n + 1) / 2));
  CHECK(float(b[1]) == float(-n * (n - 1)));
  CHECK(float(b[2]) == 0.5f * n);
  std::vector<px::fp16> h{px::fp16(float(me) - 1.5f)};
  eng.allreduce(h.data(), h.data(), 1, px::DataType::f16, px::ReduceOp::max);
  CHECK(float(h[0]) == float(n - 1) - 1.5f);
  std::vector<px::fp16> mine{px::fp16(float(me) * 0.25f), px::fp16(65504.0f)};
  std::vector<px::fp16> all(2 * static_cast<std::size_t>(n));
  eng.allgather(mine.data(), all.data(), 2, px::DataType::f16);
  std::size_t wrong = 0;
  for (int r = 0; r < n; ++r)
    wrong += float(all[2 * r]) != float(r) * 0.25f || all[2 * r + 1].bits != px::fp16(65504.0f).bits;
  CHECK(wrong == 0);
  // Booked as 2 bytes an element.
  CHECK(eng.stats().total().sent() % 2 == 0);
}
