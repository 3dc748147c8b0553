// The engine contract, one test body for every backend (gloo's shape: one
// allreduce test instantiated over transports): every call against a
// closed-form expectation, with the bytes it books checked exactly against
// the accounting rules (docs/design.md, "Byte accounting"), the deadline of
// a point-to-point call, and check_calls mode. Buffers live in the engine's
// space. A test file defines `ContractEngines` (a std::tuple of engine
// types), a tag string PARALLAX_CONTRACT_TAGS and, if some hosts cannot run
// its engines, PARALLAX_CONTRACT_SKIP() (true: skip, having said why), then
// includes this file; every rank count runs it (tests/CMakeLists.txt).
#pragma once

#ifndef PARALLAX_CONTRACT_SKIP
#define PARALLAX_CONTRACT_SKIP() false
#endif

#include "support.hpp"

#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

namespace contract {

using px::DataType;
using px::ReduceOp;

template <class Engine, class T>
px::Buffer<T, typename Engine::space> put(const std::vector<T>& v) {
  return px::Buffer<T, typename Engine::space>::from_host(v);
}
template <class Engine, class T>
px::Buffer<T, typename Engine::space> room(std::size_t n, T fill) {
  return put<Engine>(std::vector<T>(n, fill));
}

inline std::uint64_t f32(std::size_t n) { return n * sizeof(float); }

template <class Engine>
struct Fixture {
  Engine eng{test::world()};
  int n = eng.size();
  int me = eng.rank();
  int right = (me + 1) % n;
  int left = (me - 1 + n) % n;
};

/// Per-peer counts and displacements of an alltoallv in which rank `from`
/// sends count(from, to) elements to rank `to`.
struct Layout {
  std::vector<std::size_t> sc, sd, rc, rd;
  std::size_t st = 0, rt = 0;  // extent of the send and receive buffers
};
template <class Count>
Layout layout_of(int n, int me, Count count) {
  const auto un = static_cast<std::size_t>(n);
  Layout l{std::vector<std::size_t>(un), std::vector<std::size_t>(un), std::vector<std::size_t>(un),
           std::vector<std::size_t>(un)};
  for (int p = 0; p < n; ++p) {
    l.sc[p] = count(me, p);
    l.sd[p] = l.st;
    l.st += l.sc[p];
    l.rc[p] = count(p, me);
    l.rd[p] = l.rt;
    l.rt += l.rc[p] + 1;  // a gap after each block, which must keep its value
  }
  return l;
}

/// Whether a point-to-point call that misses its deadline is withdrawn and
/// the engine stays usable (NCCL cannot withdraw: it aborts, and the job ends).
template <class Engine>
constexpr bool withdraws() {
  return std::string_view(Engine::name) != "nccl";
}

}  // namespace contract

TEMPLATE_LIST_TEST_CASE("engine: allreduce sums distinct values of every rank", PARALLAX_CONTRACT_TAGS,
                        ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  const std::size_t count = GENERATE(0u, 1u, 7u, 1001u);
  std::vector<float> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(f.me * 1000 + i);
  auto in = put<TestType>(data);
  auto out = room<TestType>(count, -1.f);
  f.eng.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
  const auto got = out.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += got[i] != static_cast<float>(1000 * f.n * (f.n - 1) / 2 + f.n * static_cast<int>(i));
  CHECK(wrong == 0);

  const px::Traffic t = f.eng.stats().total();
  CHECK(t.calls == 1);
  CHECK(f.eng.calls() == 1);
  CHECK(t.sent() == f32(px::detail::ring::allreduce_sent(count, f.n, f.me)));
  CHECK(t.received() == f32(px::detail::ring::allreduce_received(count, f.n, f.me)));
  if (count % static_cast<std::size_t>(f.n) == 0) CHECK(t.sent() == f32(2 * (f.n - 1) * count / f.n));
}

TEMPLATE_LIST_TEST_CASE("engine: allreduce in place, max and min", PARALLAX_CONTRACT_TAGS, ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  auto v = put<TestType>(std::vector<std::int64_t>{f.me, -f.me, 7});
  f.eng.allreduce(v.data(), v.data(), 3, DataType::i64, ReduceOp::sum);
  CHECK(v.to_host() == std::vector<std::int64_t>{f.n * (f.n - 1) / 2, -f.n * (f.n - 1) / 2, 7 * f.n});
  auto mx = put<TestType>(std::vector<std::int32_t>{f.me});
  auto mn = put<TestType>(std::vector<std::int32_t>{f.me});
  f.eng.allreduce(mx.data(), mx.data(), 1, DataType::i32, ReduceOp::max);
  f.eng.allreduce(mn.data(), mn.data(), 1, DataType::i32, ReduceOp::min);
  CHECK(mx.to_host()[0] == f.n - 1);
  CHECK(mn.to_host()[0] == 0);
}

TEMPLATE_LIST_TEST_CASE("engine: reduce_scatter gives rank i the sum of block i", PARALLAX_CONTRACT_TAGS,
                        ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  // Uneven blocks, some empty.
  std::vector<std::size_t> counts(f.n);
  for (int j = 0; j < f.n; ++j) counts[j] = static_cast<std::size_t>(j % 3);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<double> data(total);
  for (std::size_t i = 0; i < total; ++i) data[i] = f.me + 10.0 * i;
  auto send = put<TestType>(data);
  auto recv = room<TestType>(counts[f.me] + 1, -1.0);
  f.eng.reduce_scatter(send.data(), recv.data(), counts.data(), DataType::f64, ReduceOp::sum);
  const auto got = recv.to_host();
  const std::size_t first = std::accumulate(counts.begin(), counts.begin() + f.me, std::size_t{0});
  for (std::size_t k = 0; k < counts[f.me]; ++k) CHECK(got[k] == f.n * (f.n - 1) / 2.0 + f.n * 10.0 * (first + k));
  CHECK(got[counts[f.me]] == -1.0);  // nothing written past the block
  const px::Traffic t = f.eng.stats().total();
  CHECK(t.sent() == (f.n > 1 ? 8 * (total - counts[f.me]) : 0));
  CHECK(t.received() == (f.n > 1 ? 8 * (total - counts[f.left]) : 0));
}

TEMPLATE_LIST_TEST_CASE("engine: allgather and allgatherv place every rank's block", PARALLAX_CONTRACT_TAGS,
                        ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  auto mine = put<TestType>(std::vector<std::int32_t>{f.me, f.me * 10});
  auto all = room<TestType>(2 * static_cast<std::size_t>(f.n), std::int32_t{-1});
  f.eng.allgather(mine.data(), all.data(), 2, DataType::i32);
  const auto a = all.to_host();
  for (int r = 0; r < f.n; ++r) {
    CHECK(a[2 * r] == r);
    CHECK(a[2 * r + 1] == 10 * r);
  }
  CHECK(f.eng.stats().total().sent() == static_cast<std::uint64_t>(4 * 2 * (f.n - 1)));

  f.eng.stats().reset();
  // Rank r contributes r elements (rank 0 none), in reverse rank order, with
  // a gap after each block that must keep what it held.
  std::vector<std::size_t> counts(f.n), displs(f.n);
  std::size_t total = 0;
  for (int r = f.n - 1; r >= 0; --r) {
    counts[r] = static_cast<std::size_t>(r);
    displs[r] = total;
    total += counts[r] + 1;
  }
  std::vector<std::int64_t> block(counts[f.me]);
  for (std::size_t k = 0; k < block.size(); ++k) block[k] = 100 * f.me + static_cast<std::int64_t>(k);
  auto in = put<TestType>(block);
  auto gathered = room<TestType>(total, std::int64_t{-1});
  f.eng.allgatherv(in.data(), block.size(), gathered.data(), counts.data(), displs.data(), DataType::i64);
  const auto g = gathered.to_host();
  for (int r = 0; r < f.n; ++r) {
    for (std::size_t k = 0; k < counts[r]; ++k) CHECK(g[displs[r] + k] == 100 * r + static_cast<std::int64_t>(k));
    CHECK(g[displs[r] + counts[r]] == -1);
  }
  std::size_t blocks = 0;
  for (int r = 0; r < f.n; ++r) blocks += counts[r];
  const px::Traffic t = f.eng.stats().total();
  CHECK(t.sent() == (f.n > 1 ? 8 * (blocks - counts[f.right]) : 0));
  CHECK(t.received() == (f.n > 1 ? 8 * (blocks - counts[f.me]) : 0));
}

TEMPLATE_LIST_TEST_CASE("engine: alltoallv and alltoall deliver every pair's block, exact bytes",
                        PARALLAX_CONTRACT_TAGS, ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  const auto un = static_cast<std::size_t>(f.n);
  auto count = [](int from, int to) { return static_cast<std::size_t>((from + 2 * to) % 3); };
  const Layout l = layout_of(f.n, f.me, count);
  std::vector<float> data(l.st);
  for (int p = 0; p < f.n; ++p)
    for (std::size_t k = 0; k < l.sc[p]; ++k) data[l.sd[p] + k] = static_cast<float>(100 * f.me + 10 * p + k);
  auto send = put<TestType>(data);
  auto recv = room<TestType>(l.rt, -1.f);
  f.eng.alltoallv(send.data(), l.sc.data(), l.sd.data(), recv.data(), l.rc.data(), l.rd.data(), DataType::f32);
  const auto r = recv.to_host();
  for (int p = 0; p < f.n; ++p) {
    for (std::size_t k = 0; k < l.rc[p]; ++k) CHECK(r[l.rd[p] + k] == static_cast<float>(100 * p + 10 * f.me + k));
    CHECK(r[l.rd[p] + l.rc[p]] == -1.f);
  }
  std::uint64_t sent = 0, got = 0;
  for (int p = 0; p < f.n; ++p)
    if (p != f.me) {
      sent += f32(l.sc[p]);
      got += f32(l.rc[p]);
    }
  CHECK(f.eng.stats().total().sent() == sent);
  CHECK(f.eng.stats().total().received() == got);

  std::vector<std::int64_t> a(un);
  for (int p = 0; p < f.n; ++p) a[p] = 10 * f.me + p;
  auto da = put<TestType>(a);
  auto db = room<TestType>(un, std::int64_t{-1});
  f.eng.alltoall(da.data(), db.data(), 1, DataType::i64);
  const auto b = db.to_host();
  for (int p = 0; p < f.n; ++p) CHECK(b[p] == 10 * p + f.me);
}

TEMPLATE_LIST_TEST_CASE("engine: broadcast, send/recv, sendrecv and started exchanges", PARALLAX_CONTRACT_TAGS,
                        ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  const int root = f.n - 1;
  auto v = put<TestType>(std::vector<double>(5, f.me == root ? 3.5 : 0.0));
  f.eng.broadcast(v.data(), 5, DataType::f64, root);
  CHECK(v.to_host() == std::vector<double>(5, 3.5));
  CHECK(f.eng.stats().total().sent() == (f.me == root ? 40u * (f.n - 1) : 0u));

  // A ring of sendrecv: everyone gets its left neighbour's rank.
  auto out = put<TestType>(std::vector<std::int32_t>{f.me});
  auto in = room<TestType>(1, std::int32_t{-1});
  f.eng.sendrecv(out.data(), 1, f.right, in.data(), 1, f.left, DataType::i32);
  CHECK(in.to_host()[0] == f.left);

  // Two exchanges in flight at once, completed in the opposite order.
  auto out2 = put<TestType>(std::vector<std::int32_t>{10 * f.me, 10 * f.me + 1, 10 * f.me + 2});
  auto in2 = room<TestType>(3, std::int32_t{-1});
  auto x = f.eng.start_sendrecv(out.data(), 1, f.right, in.data(), 1, f.left, DataType::i32);
  auto y = f.eng.start_sendrecv(out2.data(), 3, f.left, in2.data(), 3, f.right, DataType::i32, 1);
  f.eng.wait(y);
  f.eng.wait(x);
  CHECK(in.to_host()[0] == f.left);
  CHECK(in2.to_host() == std::vector<std::int32_t>{10 * f.right, 10 * f.right + 1, 10 * f.right + 2});

  // Point-to-point along a chain 0 -> 1 -> ... -> n-1, adding one per hop.
  std::vector<std::int64_t> token{0};
  auto t = put<TestType>(token);
  if (f.me > 0) f.eng.recv(t.data(), 1, DataType::i64, f.me - 1);
  token = t.to_host();
  token[0] += 1;
  t = put<TestType>(token);
  if (f.me < f.n - 1) f.eng.send(t.data(), 1, DataType::i64, f.me + 1);
  CHECK(token[0] == f.me + 1);
  f.eng.barrier();
}

TEMPLATE_LIST_TEST_CASE("engine: bytes are booked under the scope in force, split by host", PARALLAX_CONTRACT_TAGS,
                        ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  px::Context two_per_host(MPI_COMM_WORLD, px::ContextOptions{2});
  TestType eng(two_per_host);
  const int n = eng.size(), me = eng.rank();
  auto v = put<TestType>(std::vector<float>(4 * static_cast<std::size_t>(n), 1.f));
  {
    auto scope = eng.stats().scope("w", "RingAllReduce");
    eng.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum);
  }
  eng.barrier();
  const px::Traffic w = eng.stats().get("w", "RingAllReduce");
  CHECK(w.calls == 1);
  CHECK(eng.stats().get("", "").calls == 1);  // the barrier, outside any scope
  CHECK(w.sent() == (n > 1 ? 4u * 2 * 4 * (n - 1) : 0u));
  // Ring neighbour me+1 is on this host unless me is the last of its pair.
  const bool right_same_host = n == 1 || (me + 1) % n / 2 == me / 2;
  CHECK((w.sent_inter == 0) == (right_same_host || n == 1));
  CHECK(eng.stats().variable("w") == w);
  CHECK(eng.stats().policy("RingAllReduce") == w);
  CHECK(v.to_host()[0] == static_cast<float>(n));
}

TEMPLATE_LIST_TEST_CASE("engine: a message that never comes is a timeout_error naming the call",
                        PARALLAX_CONTRACT_TAGS, ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  if (!withdraws<TestType>()) return;  // tested in the backend's own file
  Fixture<TestType> f;
  f.eng.set_timeout(std::chrono::milliseconds(200));
  // Only the last rank waits; nobody sends. The receive is withdrawn at the deadline.
  std::string message;
  if (f.me == f.n - 1) {
    auto scope = f.eng.stats().scope("emb", "ShardedPS");
    auto x = room<TestType>(1, 0.f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f.eng.recv(x.data(), 1, DataType::f32, 0, /*tag=*/77);
    } catch (const px::timeout_error& e) {
      message = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK_THAT(message, Catch::Contains("recv") && Catch::Contains("emb") && Catch::Contains("200 ms") &&
                            Catch::Contains("rank " + std::to_string(f.me)));
  }
  f.eng.set_timeout(std::chrono::milliseconds(0));
  f.eng.barrier();
}

TEMPLATE_LIST_TEST_CASE("engine: check_calls names the first rank whose collective differs, and the engine "
                        "stays usable",
                        PARALLAX_CONTRACT_TAGS, ContractEngines) {
  using namespace contract;
  if (PARALLAX_CONTRACT_SKIP()) return;
  Fixture<TestType> f;
  f.eng.set_check_calls(true);
  const int last = f.n - 1;
  auto v = put<TestType>(std::vector<float>(4, 1.f));
  const std::size_t count = f.me == last && f.n > 1 ? 3 : 4;
  std::string msg;
  {
    auto scope = f.eng.stats().scope("w", "RingAllReduce");
    msg = test::error_of([&] { f.eng.allreduce(v.data(), v.data(), count, DataType::f32, ReduceOp::sum); });
  }
  if (f.n > 1) {
    CHECK_THAT(msg, Catch::Contains("different collective calls") && Catch::Contains("rank " + std::to_string(last)) &&
                        Catch::Contains("3 elements") && Catch::Contains("4 elements") && Catch::Contains("'w'"));
  } else {
    CHECK(msg.empty());
  }
  // Nothing was sent: the same call now agrees and works.
  v = put<TestType>(std::vector<float>(4, 1.f));
  f.eng.allreduce(v.data(), v.data(), 4, DataType::f32, ReduceOp::sum);
  CHECK(v.to_host()[3] == static_cast<float>(f.n));
}
