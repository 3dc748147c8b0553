// ShardedPS machinery: lookups return exact rows, pushes reach the owners
// summed by row then rank (bit-exact), bytes match docs/design.md, "Byte
// accounting", exactly (in host and device memory), and local aggregation
// sends each row across hosts once per host.
#include "support.hpp"
#include "policy/sharded_ps/sharded_table.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

template <class Space>
using TableIn = test::ShardedTable<float, test::engine_for<Space>>;
using Table = TableIn<px::HostSpace>;
constexpr std::size_t R = 29, C = 3;

float initial(px::index_t row, std::size_t c) { return static_cast<float>(row * 100 + static_cast<px::index_t>(c)); }

template <class Engine>
void fill_table(test::ShardedTable<float, Engine>& t) {
  using Space = typename test::ShardedTable<float, Engine>::space;
  t.initialize([&](const px::index_t* rows_in_space, std::size_t k, float* out) {
    const auto rows = test::to_host<Space>(rows_in_space, k);
    std::vector<float> values(k * C);
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t c = 0; c < C; ++c) values[i * C + c] = initial(rows[i], c);
    test::copy_from_host<Space>(out, values);
  });
}

// Rank r asks for 4 + r ids with repeats; rank 1 asks for none.
std::vector<px::index_t> lookup_ids(int r) {
  if (r == 1) return {};
  std::vector<px::index_t> ids;
  for (int j = 0; j < 4 + r; ++j) ids.push_back((r * 5 + 3 * j) % static_cast<px::index_t>(R));
  ids.push_back(0);
  ids.push_back(0);
  return ids;
}

// Rank r pushes 6 distinct rows, ascending.
std::vector<px::index_t> push_ids(int r) {
  std::set<px::index_t> s;
  for (int j = 0; j < 6; ++j) s.insert((r + 2 * j) % static_cast<px::index_t>(R));
  return {s.begin(), s.end()};
}
float push_value(int r, px::index_t id, std::size_t c) { return 0.1f * (r + 1) + 0.01f * id + static_cast<float>(c); }

std::uint64_t pad8(std::uint64_t b) { return (b + 7) / 8 * 8; }

/// engine::Mpi without alltoallv_unsized: its routes take an alltoall of the
/// headers' first words and an alltoallv of the rest, as on the device
/// engines.
struct MpiTwoCalls : px::engine::Mpi {
  using px::engine::Mpi::Mpi;
};
static_assert(!px::engine::supports_v<MpiTwoCalls, px::engine::op_alltoallv_unsized>);

/// "rank r" or "ranks a, b, c": the ranks of [first, last] but `skip`.
std::string ranks_but(int first, int last, int skip) {
  std::vector<int> r;
  for (int i = first; i <= last; ++i)
    if (i != skip) r.push_back(i);
  std::string out = r.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < r.size(); ++i) out += (i ? ", " : "") + std::to_string(r[i]);
  return out;
}

/// The longest time any rank took, in seconds (collective).
double slowest(std::chrono::steady_clock::time_point since) {
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

// Ranks whose routes carry different things (other variables, or tables
// grouped or partitioned otherwise) see each other's shape words in the
// routes' headers and throw one message, with no PARALLAX_CHECK_CALLS. One
// rank cannot disagree with itself: these run from 2 ranks.
TEMPLATE_TEST_CASE("ranks that look up other variables all throw one message naming them, at once",
                   "[policy][sharded_ps][errors][np2+]", px::engine::Mpi, MpiTwoCalls) {
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  const int n = ctx.size(), odd = n - 1;
  const bool group = GENERATE(true, false), shared = GENERATE(true, false);
  px::TrainerOptions o;
  o.sharded.group_tables = group;
  o.sharded.shared_memory = shared;
  px::Variable<px::Sparse, float> emb(ctx, "emb", {50, 4}), emb2(ctx, "emb2", {30, 4});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd, TestType> trainer(ctx, o, px::optim::Sgd{0.1f}, emb, emb2);
  const std::vector<px::index_t> ids{0, 2, 7}, ids2{1, 2};
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = test::error_of([&] {
    if (ctx.rank() == odd) trainer.lookup(emb, ids);  // one table; the others look up two
    else trainer.lookup({px::Lookup{emb, ids}, px::Lookup{emb2, ids2}});
  });
  const double seconds = slowest(t0);
  INFO("grouped: " << group << ", shared shards: " << shared << "; " << msg);
  CHECK(msg == "parallax: ranks make different batched lookups: " + ranks_but(0, odd, odd) + ": 'emb', 'emb2'; rank " +
                   std::to_string(odd) +
                   ": 'emb'. Every rank must look up the same sparse variables, in the same order, in each batched "
                   "lookup (the ids may differ, and may be none).");
  CHECK(test::same_on_every_rank(msg));
  CHECK(seconds < 1.0);
  // The ranks are in step again: a lookup they agree on works.
  const auto rows = trainer.lookup(emb, ids);
  const auto all = trainer.fetch(emb);
  bool exact = rows.rows == ids.size();
  for (std::size_t i = 0; exact && i < ids.size(); ++i)
    for (std::size_t c = 0; c < 4; ++c) exact = exact && rows.data[i * 4 + c] == all[static_cast<std::size_t>(ids[i]) * 4 + c];
  CHECK(test::all_ranks(exact));
}

TEMPLATE_TEST_CASE("ranks whose tables are grouped or partitioned otherwise all throw one message at the push",
                   "[policy][sharded_ps][errors][np2+]", px::engine::Mpi, MpiTwoCalls) {
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  const int n = ctx.size(), odd = n - 1;
  const bool partitions = GENERATE(true, false);  // what differs on the odd rank
  px::TrainerOptions o;
  // Shared shards are off: a rank with more groups would make more shared
  // windows while the trainers are built, which MPI cannot name.
  o.sharded.shared_memory = false;
  if (ctx.rank() == odd) {
    if (partitions) o.partitions["emb"] = 2 * n + 1;
    else o.sharded.group_tables = false;
  }
  px::Variable<px::Sparse, float> emb(ctx, "emb", {50, 4}), emb2(ctx, "emb2", {30, 4});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd, TestType> trainer(ctx, o, px::optim::Sgd{0.1f}, emb, emb2);
  emb.grad().add(std::vector<px::index_t>{1, 3}, std::vector<float>(8, 0.5f));
  emb2.grad().add(std::vector<px::index_t>{2}, std::vector<float>(4, 0.5f));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string msg = test::error_of([&] { trainer.step(); });
  const double seconds = slowest(t0);
  INFO(msg);
  const std::string head = "parallax: ranks make different pushes of sparse gradients: " + ranks_but(0, odd, odd) + ": ";
  const std::string rule =
      ". Every rank must hold the same sharded variables, grouped and partitioned alike (give every rank the same "
      "TrainerOptions).";
  if (partitions) {
    // Same names: the message shows the layouts.
    const std::string p = std::to_string(n), q = std::to_string(2 * n + 1);
    const std::string tail = ", 'emb2' (30 rows, " + p + " partitions)] of 4 x f32, rows asked of their owners";
    CHECK(msg == head + "groups ['emb' (50 rows, " + p + " partitions)" + tail + "; rank " + std::to_string(odd) +
                     ": groups ['emb' (50 rows, " + q + " partitions)" + tail + rule);
  } else {
    CHECK(msg == head + "groups ['emb', 'emb2']; rank " + std::to_string(odd) + ": groups ['emb'], ['emb2']" + rule);
  }
  CHECK(test::same_on_every_rank(msg));
  CHECK(seconds < 1.0);
  CHECK(trainer.steps() == 0);
}

TEMPLATE_TEST_CASE("ShardedTable::lookup returns the rows of the caller's ids, with exact bytes",
                   "[policy][sharded_ps]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  // n partitions: ascending ids go out grouped by owner already (no sort, the
  // replies are read in place); 2n+1: owners interleave, ids are regrouped.
  const int parts = GENERATE(0, 1) == 0 ? n : 2 * n + 1;
  // Shared shards (rows read from the owners' memory) or messages.
  const bool want_shared = GENERATE(true, false);
  TableIn<Space> table(mpi, px::PartitionMap(R, parts, n), C, "emb", true, want_shared);
  fill_table(table);
  CHECK(table.shard_rows() == table.map().shard_rows(me));
  // Shared only where asked and possible (that it is shared wherever it can
  // be: "... wherever it can, given room in /dev/shm" below).
  CHECK((!table.shared() || (want_shared && test::can_share(mpi))));

  // The ids as given (repeats, any order), strictly ascending (with n
  // partitions their keys are in order: the rows land in place), or
  // strictly descending.
  const int order = GENERATE(0, 1, 2);
  auto ids_of = [&](int r) {
    auto ids = lookup_ids(r);
    if (order == 0) return ids;
    const std::set<px::index_t> u(ids.begin(), ids.end());
    ids.assign(u.begin(), u.end());
    if (order == 2) std::reverse(ids.begin(), ids.end());
    return ids;
  };
  const auto ids = ids_of(me);
  auto out_in_space = px::Buffer<float, Space>::from_host(std::vector<float>(ids.size() * C, -1.f));
  table.lookup(px::Buffer<px::index_t, Space>::from_host(ids).data(), ids.size(), out_in_space.data());
  const auto out = out_in_space.to_host();
  bool keys_ascend = true;
  const auto key = [&](px::index_t id) {
    return static_cast<px::index_t>(table.map().owner(id)) * static_cast<px::index_t>(R) +
           static_cast<px::index_t>(table.map().local_row(id));
  };
  for (std::size_t i = 1; i < ids.size(); ++i) keys_ascend = keys_ascend && key(ids[i - 1]) < key(ids[i]);
  if (!table.reads_directly()) {
    CHECK(table.lookup_in_order() == (keys_ascend && !ids.empty()));
    if (order == 1 && parts == n) CHECK(table.lookup_in_order() == !ids.empty());
  }
  bool exact = true;
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t c = 0; c < C; ++c) exact = exact && out[i * C + c] == initial(ids[i], c);
  CHECK(exact);

  // Bytes: a 24-byte header to each peer (shape, rest, count), 8 bytes per unique id asked of a
  // peer, and C floats per row back; the same again for what peers ask of
  // us. Shared shards: the headers, and C floats per id read from a peer's
  // shard (repeats read again), booked as sent by that peer.
  std::uint64_t sent = 24 * (n - 1), recv = 24 * (n - 1);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    auto mine = ids_of(me), theirs = ids_of(p);
    if (!table.shared()) {
      const std::set<px::index_t> um(mine.begin(), mine.end()), ut(theirs.begin(), theirs.end());
      mine.assign(um.begin(), um.end());
      theirs.assign(ut.begin(), ut.end());
    }
    std::uint64_t to_p = 0, from_p = 0;
    for (auto id : mine) to_p += table.map().owner(id) == p;
    for (auto id : theirs) from_p += table.map().owner(id) == me;
    const std::uint64_t key_bytes = table.shared() ? 0 : 8;
    sent += key_bytes * to_p + 4 * C * from_p;
    recv += key_bytes * from_p + 4 * C * to_p;
  }
  CHECK(mpi.stats().total().sent() == sent);
  CHECK(mpi.stats().total().received() == recv);
  // The route of the keys, then the reply; shared shards (and one rank,
  // which reads its own shard): the route of the headers alone.
  CHECK(table.reads_directly() == (table.shared() || n == 1));
  CHECK(mpi.stats().total().calls == test::route_calls<test::engine_for<Space>> + (table.reads_directly() ? 0 : 1));
}

// PARALLAX_SHARED_SHARDS=0 turns ShardedOptions::shared_memory off in
// TrainerOptions::resolve() (tests/options.cpp); a table asked not to share
// keeps its shard private.
TEST_CASE("a table asked not to share keeps its shard private", "[policy][sharded_ps][shared]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size();
  Table off(mpi, px::PartitionMap(R, n, n), C, "emb", true, false);
  Table on(mpi, px::PartitionMap(R, n, n), C, "emb");
  CHECK(!off.shared());
  CHECK((!on.shared() || test::can_share(mpi)));
}

// docs/design.md, "One training step, through the code" (shared shards): on
// wherever every rank of a host-memory engine is on one machine, unless
// turned off or /dev/shm lacks room, which the skip rules out.
TEMPLATE_TEST_CASE("ShardedTable keeps its shard in shared memory wherever it can, given room in /dev/shm",
                   "[policy][sharded_ps][shared][needs-shm]", PARALLAX_TEST_SPACES) {
  if (test::skip_without_shm_room()) return;
  test::engine_for<TestType> mpi(test::world());
  const int n = mpi.size();
  // Host memory, several ranks, one host (test::can_share): shared unless
  // asked not to (the option, which PARALLAX_SHARED_SHARDS=0 turns off).
  TableIn<TestType> asked(mpi, px::PartitionMap(R, n, n), C, "emb", true, true);
  TableIn<TestType> not_asked(mpi, px::PartitionMap(R, n, n), C, "emb", true, false);
  CHECK(asked.shared() == test::can_share(mpi));
  CHECK(!not_asked.shared());
  TableIn<TestType> by_default(mpi, px::PartitionMap(R, n, n), C, "emb");
  CHECK(by_default.shared() == test::can_share(mpi));
}

TEST_CASE("a lookup reads what the owners wrote after the last push, shared or not", "[policy][sharded_ps][shared]") {
  // The owners update their shards after a push; the next lookup on every
  // rank must see the new rows, whether it reads the owners' shared memory
  // or asks them. Three rounds, so a stale read of any round shows.
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const bool want_shared = GENERATE(true, false);
  Table table(mpi, px::PartitionMap(R, 2 * n + 1, n), C, "emb", true, want_shared);
  fill_table(table);
  std::vector<float> want(R * C);  // the whole table as every owner should hold it
  for (px::index_t id = 0; id < static_cast<px::index_t>(R); ++id)
    for (std::size_t c = 0; c < C; ++c) want[static_cast<std::size_t>(id) * C + c] = initial(id, c);
  std::vector<px::index_t> every(R);
  for (std::size_t i = 0; i < R; ++i) every[i] = static_cast<px::index_t>(R - 1 - i);  // descending
  px::Buffer<px::index_t> local_rows;
  px::Buffer<float> sums;
  bool exact = true;
  for (int round = 0; round < 3; ++round) {
    const auto ids = push_ids(me);
    std::vector<float> values(ids.size() * C);
    for (std::size_t i = 0; i < ids.size(); ++i)
      for (std::size_t c = 0; c < C; ++c) values[i * C + c] = push_value(me + round, ids[i], c);
    const std::size_t m = table.push(ids.data(), values.data(), ids.size(), local_rows, sums);
    for (std::size_t i = 0; i < m; ++i)  // the owner's "optimizer": row += sum
      for (std::size_t c = 0; c < C; ++c)
        table.shard().data()[static_cast<std::size_t>(local_rows.data()[i]) * C + c] += sums.data()[i * C + c];
    for (px::index_t id = 0; id < static_cast<px::index_t>(R); ++id)  // the same sums, by rank, on the host
      for (std::size_t c = 0; c < C; ++c) {
        float sum = 0.f;
        bool touched = false;
        for (int r = 0; r < n; ++r) {
          const auto theirs = push_ids(r);
          if (std::find(theirs.begin(), theirs.end(), id) == theirs.end()) continue;
          sum += push_value(r + round, id, c);
          touched = true;
        }
        if (touched) want[static_cast<std::size_t>(id) * C + c] += sum;
      }
    std::vector<float> out(R * C, -1.f);
    table.lookup(every.data(), every.size(), out.data());
    for (std::size_t i = 0; i < R; ++i)
      for (std::size_t c = 0; c < C; ++c)
        exact = exact && out[i * C + c] == want[static_cast<std::size_t>(every[i]) * C + c];
  }
  CHECK(test::all_ranks(exact));
}

TEMPLATE_TEST_CASE("ShardedTable::lookup of every row, ascending, over interleaved owners", "[policy][sharded_ps]",
                   PARALLAX_TEST_SPACES) {
  // Ascending ids over more partitions than ranks: the keys ascend within
  // each owner only (on the host they are grouped by a counting sort).
  using Space = TestType;
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size();
  const int parts = GENERATE_COPY(n + 1, 3 * n, static_cast<int>(R));
  TableIn<Space> table(mpi, px::PartitionMap(R, parts, n), C, "emb");
  fill_table(table);
  // Rank r asks for every row but the first r (so the ranks' requests differ).
  std::vector<px::index_t> ids;
  for (px::index_t id = mpi.rank(); id < static_cast<px::index_t>(R); ++id) ids.push_back(id);
  auto out = px::Buffer<float, Space>::from_host(std::vector<float>(ids.size() * C, -1.f));
  table.lookup(px::Buffer<px::index_t, Space>::from_host(ids).data(), ids.size(), out.data());
  // Keys ascend within each owner only; one rank reads its own shard.
  CHECK_FALSE(table.lookup_in_order());
  CHECK(table.reads_directly() == (table.shared() || n == 1));
  const auto rows = out.to_host();
  bool exact = true;
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t c = 0; c < C; ++c) exact = exact && rows[i * C + c] == initial(ids[i], c);
  CHECK(exact);
}

TEMPLATE_TEST_CASE("ShardedTable::push sums every rank's rows at their owner, by row then rank",
                   "[policy][sharded_ps]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const int parts = GENERATE(1, 2, 5);
  TableIn<Space> table(mpi, px::PartitionMap(R, parts, n), C, "emb");
  const auto ids = push_ids(me);
  std::vector<float> vals(ids.size() * C);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t c = 0; c < C; ++c) vals[i * C + c] = push_value(me, ids[i], c);

  px::Buffer<px::index_t, Space> local_in_space;
  px::Buffer<float, Space> sums_in_space;
  const std::size_t m = table.push(px::Buffer<px::index_t, Space>::from_host(ids).data(),
                                   px::Buffer<float, Space>::from_host(vals).data(), ids.size(), local_in_space,
                                   sums_in_space);
  const auto pushed = table.pushed_ids().to_host();
  const auto local = local_in_space.to_host();
  const auto sums = sums_in_space.to_host();

  std::map<px::index_t, std::vector<float>> want;  // rows owned here, summed in rank order
  for (int r = 0; r < n; ++r)
    for (auto id : push_ids(r)) {
      if (table.map().owner(id) != me) continue;
      auto& w = want[id];
      w.resize(C, 0.f);
      for (std::size_t c = 0; c < C; ++c) w[c] += push_value(r, id, c);
    }
  REQUIRE(m == want.size());
  std::size_t k = 0;
  bool exact = true;
  for (const auto& [id, row] : want) {
    exact = exact && pushed[k] == id;
    exact = exact && local[k] == static_cast<px::index_t>(table.map().local_row(id));
    for (std::size_t c = 0; c < C; ++c) exact = exact && sums[k * C + c] == row[c];
    ++k;
  }
  CHECK(exact);

  std::uint64_t sent = 24 * (n - 1), recv = 24 * (n - 1);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::uint64_t to_p = 0, from_p = 0;
    for (auto id : push_ids(me)) to_p += table.map().owner(id) == p;
    for (auto id : push_ids(p)) from_p += table.map().owner(id) == me;
    sent += pad8(to_p * (8 + 4 * C));
    recv += pad8(from_p * (8 + 4 * C));
  }
  CHECK(mpi.stats().total().sent() == sent);
  CHECK(mpi.stats().total().received() == recv);
}

TEST_CASE("local aggregation sends each row across hosts once per host", "[policy][sharded_ps][hosts]") {
  px::Context hosts(MPI_COMM_WORLD, px::ContextOptions{2});
  const auto& topo = hosts.topology();
  const int n = hosts.size(), me = hosts.rank();
  // Every rank pushes every row, with value rank + 1: integer sums are exact
  // in any order, so both paths must agree to the bit.
  std::vector<px::index_t> ids(R);
  std::vector<float> vals(R * C);
  for (std::size_t i = 0; i < R; ++i) {
    ids[i] = static_cast<px::index_t>(i);
    for (std::size_t c = 0; c < C; ++c) vals[i * C + c] = static_cast<float>((me + 1) * (c + 1));
  }
  auto run = [&](bool aggregate, px::Traffic& traffic, std::vector<float>& sums_out) {
    px::engine::Mpi mpi(hosts);
    Table table(mpi, px::PartitionMap(R, n, n), C, "emb", aggregate);
    CHECK(table.aggregates() == (aggregate && topo.num_hosts() > 1 && topo.num_hosts() < n));
    px::Buffer<px::index_t> local;
    px::Buffer<float> sums;
    const std::size_t m = table.push(ids.data(), vals.data(), R, local, sums);
    CHECK(m == table.shard_rows());
    sums_out = sums.to_host();
    traffic = mpi.stats().total();
    return table.map();
  };
  px::Traffic plain, aggregated;
  std::vector<float> s_plain, s_agg;
  const px::PartitionMap map = run(false, plain, s_plain);
  run(true, aggregated, s_agg);
  CHECK(s_agg == s_plain);
  for (std::size_t i = 0; i < s_plain.size(); ++i) CHECK(s_plain[i] == static_cast<float>(n * (n + 1) / 2 * (i % C + 1)));

  // Predicted inter-host bytes: without aggregation every rank sends each
  // off-host owner all of its rows; with it, only the host's aggregator for
  // that owner does (mates[o % local_size]), after a second header exchange.
  const auto mates = topo.ranks_of_host(topo.host());
  std::uint64_t off_host_peers = 0, plain_data = 0, aggregated_data = 0;
  for (int o = 0; o < n; ++o) {
    if (topo.same_host(o)) continue;
    ++off_host_peers;
    const std::uint64_t block = pad8(map.shard_rows(o) * (8 + 4 * C));
    plain_data += block;
    if (mates[static_cast<std::size_t>(o) % mates.size()] == me) aggregated_data += block;
  }
  CHECK(plain.sent_inter == 24 * off_host_peers + plain_data);
  if (topo.num_hosts() > 1 && topo.num_hosts() < n) {
    CHECK(aggregated.sent_inter == 2 * 24 * off_host_peers + aggregated_data);
    // Summed over a host of two ranks, rows cross to each other host once, not twice.
    std::uint64_t host_plain = plain_data, host_agg = aggregated_data;
    MPI_Allreduce(MPI_IN_PLACE, &host_plain, 1, MPI_UINT64_T, MPI_SUM, hosts.host_comm());
    MPI_Allreduce(MPI_IN_PLACE, &host_agg, 1, MPI_UINT64_T, MPI_SUM, hosts.host_comm());
    CHECK(host_agg * static_cast<std::uint64_t>(topo.local_size()) == host_plain);
  } else {
    CHECK(aggregated == plain);
  }
}

TEMPLATE_TEST_CASE("a bad lookup id on one rank fails the lookup on every rank", "[policy][sharded_ps][errors]",
                   px::engine::Mpi, MpiTwoCalls) {
  TestType mpi(test::world());
  const int n = mpi.size(), last = n - 1;
  const bool want_shared = GENERATE(true, false);
  test::ShardedTable<float, TestType> table(mpi, px::PartitionMap(R, n, n), C, "emb", true, want_shared);
  std::vector<px::index_t> ids{1, mpi.rank() == last ? static_cast<px::index_t>(R) + 5 : 2};
  std::vector<float> out(ids.size() * C);
  const std::string msg = test::error_of([&] { table.lookup(ids.data(), ids.size(), out.data()); });
  CHECK_THAT(msg, Catch::Contains("variable 'emb'") && Catch::Contains("lookup id 34") &&
                      Catch::Contains("rank " + std::to_string(last)));
  // The table still works afterwards: nothing was half-sent.
  std::vector<px::index_t> good{0};
  std::vector<float> row(C);
  fill_table(table);
  table.lookup(good.data(), 1, row.data());
  CHECK(row[2] == initial(0, 2));
}

TEMPLATE_TEST_CASE("DenseShards reduces by rank and gathers the whole variable back", "[policy][sharded_ps][dense]",
                   PARALLAX_TEST_SPACES) {
  using Space = TestType;
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const int parts = GENERATE_COPY(1, n, 2 * n + 1);
  const std::size_t rows = 17, cols = 2;
  px::policy::sharded::DenseShards<float, test::engine_for<Space>> shards(mpi, px::PartitionMap(rows, parts, n), cols);
  const px::PartitionMap& map = shards.map();
  std::vector<float> grad(rows * cols);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(me * 1000 + static_cast<int>(i));
  px::Buffer<float, Space> sum_in_space(shards.shard_elements());
  shards.reduce(px::Buffer<float, Space>::from_host(grad).data(), sum_in_space.data());
  const auto sum = sum_in_space.to_host();
  bool exact = true;
  for (std::size_t l = 0; l < map.shard_rows(me); ++l) {
    const auto g = static_cast<std::size_t>(map.global_row(me, l));
    for (std::size_t c = 0; c < cols; ++c)
      exact = exact && sum[l * cols + c] == static_cast<float>(1000 * n * (n - 1) / 2 + n * static_cast<int>(g * cols + c));
  }
  CHECK(exact);

  // Each rank's shard holds -(global index); gathering gives -(i) everywhere.
  std::vector<float> shard(shards.shard_elements());
  for (std::size_t l = 0; l < map.shard_rows(me); ++l)
    for (std::size_t c = 0; c < cols; ++c)
      shard[l * cols + c] = -static_cast<float>(static_cast<std::size_t>(map.global_row(me, l)) * cols + c);
  test::copy_from_host<Space>(shards.shard().data(), shard);
  auto full_in_space = px::Buffer<float, Space>::from_host(std::vector<float>(rows * cols, 1.f));
  shards.gather(shards.shard().data(), full_in_space.data());
  const auto full = full_in_space.to_host();
  exact = true;
  for (std::size_t i = 0; i < full.size(); ++i) exact = exact && full[i] == -static_cast<float>(i);
  CHECK(exact);
  // The ring model's bytes: 2(N-1)/N of the variable per rank when shards are equal.
  if (rows % static_cast<std::size_t>(n) == 0 && parts == n) CHECK(mpi.stats().total().sent() == 2 * (n - 1) * rows * cols * 4 / n);
}
