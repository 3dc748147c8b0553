// engine::Mpi: every collective against a closed-form expectation, with the
// bytes it books checked exactly against the accounting rules.
#include "support.hpp"

#include <numeric>
#include <thread>

using px::DataType;
using px::ReduceOp;

namespace {

std::uint64_t f32(std::size_t n) { return n * sizeof(float); }

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

TEST_CASE("Mpi::allreduce sums distinct values of every rank", "[engine][mpi]") {
  Fixture f;
  const std::size_t count = GENERATE(0u, 1u, 7u, 1001u);
  std::vector<float> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<float>(f.me * 1000 + i);
  std::vector<float> out(count, -1.f);
  f.mpi.allreduce(data.data(), out.data(), count, DataType::f32, ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i)
    CHECK(out[i] == static_cast<float>(1000 * f.n * (f.n - 1) / 2 + f.n * static_cast<int>(i)));

  const px::Traffic t = f.mpi.stats().total();
  CHECK(t.calls == 1);
  CHECK(t.sent() == f32(px::detail::ring::allreduce_sent(count, f.n, f.me)));
  CHECK(t.received() == f32(px::detail::ring::allreduce_received(count, f.n, f.me)));
  if (count % static_cast<std::size_t>(f.n) == 0) CHECK(t.sent() == f32(2 * (f.n - 1) * count / f.n));
}

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

TEST_CASE("Mpi::allreduce in place, max and min", "[engine][mpi]") {
  Fixture f;
  std::vector<std::int64_t> v{f.me, -f.me, 7};
  f.mpi.allreduce(v.data(), v.data(), 3, DataType::i64, ReduceOp::sum);
  CHECK(v == std::vector<std::int64_t>{f.n * (f.n - 1) / 2, -f.n * (f.n - 1) / 2, 7 * f.n});
  std::int32_t mx = f.me, mn = f.me;
  f.mpi.allreduce(&mx, &mx, 1, DataType::i32, ReduceOp::max);
  f.mpi.allreduce(&mn, &mn, 1, DataType::i32, ReduceOp::min);
  CHECK(mx == f.n - 1);
  CHECK(mn == 0);
}

TEST_CASE("Mpi::reduce_scatter gives rank i the sum of block i", "[engine][mpi]") {
  Fixture f;
  // Block j has j+1 elements (uneven), the first block may be empty too.
  std::vector<std::size_t> counts(f.n);
  for (int j = 0; j < f.n; ++j) counts[j] = static_cast<std::size_t>(j % 3);
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<double> send(total);
  for (std::size_t i = 0; i < total; ++i) send[i] = f.me + 10.0 * i;
  std::vector<double> recv(counts[f.me] + 1, -1.0);
  f.mpi.reduce_scatter(send.data(), recv.data(), counts.data(), DataType::f64, ReduceOp::sum);
  const std::size_t first = std::accumulate(counts.begin(), counts.begin() + f.me, std::size_t{0});
  for (std::size_t k = 0; k < counts[f.me]; ++k)
    CHECK(recv[k] == f.n * (f.n - 1) / 2.0 + f.n * 10.0 * (first + k));
  CHECK(recv[counts[f.me]] == -1.0);  // nothing written past the block
  const px::Traffic t = f.mpi.stats().total();
  const std::size_t left = static_cast<std::size_t>((f.me - 1 + f.n) % f.n);
  CHECK(t.sent() == (f.n > 1 ? 8 * (total - counts[f.me]) : 0));
  CHECK(t.received() == (f.n > 1 ? 8 * (total - counts[left]) : 0));
}

TEST_CASE("Mpi::allgather and allgatherv place every rank's block", "[engine][mpi]") {
  Fixture f;
  std::vector<std::int32_t> mine{f.me, f.me * 10};
  std::vector<std::int32_t> all(2 * f.n);
  f.mpi.allgather(mine.data(), all.data(), 2, DataType::i32);
  for (int r = 0; r < f.n; ++r) {
    CHECK(all[2 * r] == r);
    CHECK(all[2 * r + 1] == 10 * r);
  }
  CHECK(f.mpi.stats().total().sent() == static_cast<std::uint64_t>(4 * 2 * (f.n - 1)));

  f.mpi.stats().reset();
  // Rank r contributes r elements (rank 0 none), in reverse rank order.
  std::vector<std::size_t> counts(f.n), displs(f.n);
  std::size_t total = 0;
  for (int r = f.n - 1; r >= 0; --r) {
    counts[r] = static_cast<std::size_t>(r);
    displs[r] = total;
    total += counts[r];
  }
  std::vector<std::int64_t> block(counts[f.me]);
  for (std::size_t k = 0; k < block.size(); ++k) block[k] = 100 * f.me + static_cast<std::int64_t>(k);
  std::vector<std::int64_t> gathered(total, -1);
  f.mpi.allgatherv(block.data(), block.size(), gathered.data(), counts.data(), displs.data(), DataType::i64);
  for (int r = 0; r < f.n; ++r)
    for (std::size_t k = 0; k < counts[r]; ++k) CHECK(gathered[displs[r] + k] == 100 * r + static_cast<std::int64_t>(k));
  const px::Traffic t = f.mpi.stats().total();
  const int right = (f.me + 1) % f.n;
  CHECK(t.sent() == (f.n > 1 ? 8 * (total - counts[right]) : 0));
  CHECK(t.received() == (f.n > 1 ? 8 * (total - counts[f.me]) : 0));
}

TEST_CASE("Mpi::alltoallv delivers every pair's block and books exact bytes", "[engine][mpi]") {
  Fixture f;
  const auto un = static_cast<std::size_t>(f.n);
  auto count = [](int from, int to) { return static_cast<std::size_t>((from + 2 * to) % 3); };
  auto [sc, sd, rc, rd, st, rt] = layout_of(f, count);
  std::vector<float> send(st), recv(rt, -1.f);
  for (int p = 0; p < f.n; ++p)
    for (std::size_t k = 0; k < sc[p]; ++k) send[sd[p] + k] = static_cast<float>(100 * f.me + 10 * p + k);
  f.mpi.alltoallv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), DataType::f32);
  for (int p = 0; p < f.n; ++p)
    for (std::size_t k = 0; k < rc[p]; ++k) CHECK(recv[rd[p] + k] == static_cast<float>(100 * p + 10 * f.me + k));
  std::uint64_t sent = 0, got = 0;
  for (int p = 0; p < f.n; ++p)
    if (p != f.me) {
      sent += f32(sc[p]);
      got += f32(rc[p]);
    }
  CHECK(f.mpi.stats().total().sent() == sent);
  CHECK(f.mpi.stats().total().received() == got);

  std::vector<std::int64_t> a(un), b(un);
  for (int p = 0; p < f.n; ++p) a[p] = 10 * f.me + p;
  f.mpi.alltoall(a.data(), b.data(), 1, DataType::i64);
  for (int p = 0; p < f.n; ++p) CHECK(b[p] == 10 * p + f.me);
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

TEST_CASE("Mpi::broadcast, send/recv and sendrecv", "[engine][mpi]") {
  Fixture f;
  const int root = f.n - 1;
  std::vector<double> v(5, f.me == root ? 3.5 : 0.0);
  f.mpi.broadcast(v.data(), v.size(), DataType::f64, root);
  CHECK(v == std::vector<double>(5, 3.5));
  CHECK(f.mpi.stats().total().sent() == (f.me == root ? 40u * (f.n - 1) : 0u));

  // A ring of sendrecv: everyone gets its left neighbour's rank.
  const int right = (f.me + 1) % f.n, left = (f.me - 1 + f.n) % f.n;
  std::int32_t out = f.me, in = -1;
  f.mpi.sendrecv(&out, 1, right, &in, 1, left, DataType::i32);
  CHECK(in == left);

  // Point-to-point along a chain 0 -> 1 -> ... -> n-1, adding one per hop.
  std::int64_t token = 0;
  if (f.me > 0) f.mpi.recv(&token, 1, DataType::i64, f.me - 1);
  token += 1;
  if (f.me < f.n - 1) f.mpi.send(&token, 1, DataType::i64, f.me + 1);
  CHECK(token == f.me + 1);
  f.mpi.barrier();
}

TEST_CASE("Mpi books bytes under the scope in force, split by host", "[engine][mpi]") {
  px::Context two_per_host(MPI_COMM_WORLD, px::ContextOptions{2});
  px::engine::Mpi mpi(two_per_host);
  const int n = mpi.size(), me = mpi.rank();
  std::vector<float> v(4 * static_cast<std::size_t>(n), 1.f);
  {
    auto scope = mpi.stats().scope("w", "RingAllReduce");
    mpi.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum);
  }
  mpi.barrier();
  const px::Traffic w = mpi.stats().get("w", "RingAllReduce");
  CHECK(w.calls == 1);
  CHECK(mpi.stats().get("", "").calls == 1);  // the barrier, outside any scope
  CHECK(w.sent() == (n > 1 ? 4u * 2 * 4 * (n - 1) : 0u));
  // Ring neighbour me+1 is on this host unless me is the last of its pair.
  const bool right_same_host = n == 1 || (me + 1) % n / 2 == me / 2;
  CHECK((w.sent_inter == 0) == (right_same_host || n == 1));
  CHECK(mpi.stats().variable("w") == w);
  CHECK(mpi.stats().policy("RingAllReduce") == w);
  CHECK(v[0] == static_cast<float>(n));
}

TEST_CASE("Mpi gives up on a message that never comes, with a timeout_error", "[engine][mpi]") {
  Fixture f;
  f.mpi.set_timeout(std::chrono::milliseconds(200));
  // Only the last rank waits; nobody sends. The receive is cancelled on timeout.
  std::string message;
  if (f.me == f.n - 1) {
    auto scope = f.mpi.stats().scope("emb", "ShardedPS");
    float x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f.mpi.recv(&x, 1, DataType::f32, 0, /*tag=*/77);
    } catch (const px::timeout_error& e) {
      message = e.what();
    }
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    CHECK_THAT(message, Catch::Contains("recv") && Catch::Contains("emb") && Catch::Contains("200 ms") &&
                            Catch::Contains("rank " + std::to_string(f.me)));
  }
  f.mpi.set_timeout(std::chrono::milliseconds(0));
  f.mpi.barrier();
}

TEST_CASE("check_calls names the first rank whose collective differs, and the engine stays usable", "[engine][mpi]") {
  Fixture f;
  f.mpi.set_check_calls(true);
  const int last = f.n - 1;
  std::vector<float> v(4, 1.f);
  const std::size_t count = f.me == last && f.n > 1 ? 3 : 4;
  std::string msg;
  {
    auto scope = f.mpi.stats().scope("w", "RingAllReduce");
    msg = test::error_of([&] { f.mpi.allreduce(v.data(), v.data(), count, px::DataType::f32, px::ReduceOp::sum); });
  }
  if (f.n > 1) {
    CHECK_THAT(msg, Catch::Contains("different collective calls") && Catch::Contains("rank " + std::to_string(last)) &&
                        Catch::Contains("3 elements") && Catch::Contains("4 elements") && Catch::Contains("'w'"));
  } else {
    CHECK(msg.empty());
  }
  // Nothing was sent: the same call now agrees and works.
  v.assign(4, 1.f);
  f.mpi.allreduce(v.data(), v.data(), 4, px::DataType::f32, px::ReduceOp::sum);
  CHECK(v[3] == static_cast<float>(f.n));
}
