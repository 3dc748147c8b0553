// ShardedPS machinery: lookups return exact rows, pushes reach the owners
// summed by row then rank (bit-exact), bytes match DESIGN.md §4 exactly (in
// host and device memory), and local aggregation sends each row across
// hosts once per host.
#include "support.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

namespace {

template <class Space>
using TableIn = px::ShardedTable<float, test::engine_for<Space>>;
using Table = TableIn<px::HostSpace>;
constexpr std::size_t R = 29, C = 3;

float initial(px::index_t row, std::size_t c) { return static_cast<float>(row * 100 + static_cast<px::index_t>(c)); }

template <class Engine>
void fill_table(px::ShardedTable<float, Engine>& t) {
  using Space = typename px::ShardedTable<float, Engine>::space;
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

}  // namespace

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
  if (test::dev_shm_roomy()) CHECK(table.shared() == (want_shared && test::can_share(mpi)));
  if (!test::can_share(mpi)) CHECK(!table.shared());

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

  // Bytes: a 16-byte header to each peer, 8 bytes per unique id asked of a
  // peer, and C floats per row back; the same again for what peers ask of
  // us. Shared shards: the headers, and C floats per id read from a peer's
  // shard (repeats read again), booked as sent by that peer.
  std::uint64_t sent = 16 * (n - 1), recv = 16 * (n - 1);
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

TEST_CASE("PARALLAX_SHARED_SHARDS=0 keeps shards private", "[policy][sharded_ps][shared]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size();
  ::setenv("PARALLAX_SHARED_SHARDS", "0", 1);
  Table off(mpi, px::PartitionMap(R, n, n), C, "emb");
  ::unsetenv("PARALLAX_SHARED_SHARDS");
  Table on(mpi, px::PartitionMap(R, n, n), C, "emb");
  CHECK(!off.shared());
  if (test::dev_shm_roomy()) CHECK(on.shared() == test::can_share(mpi));
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

  std::uint64_t sent = 16 * (n - 1), recv = 16 * (n - 1);
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
  CHECK(plain.sent_inter == 16 * off_host_peers + plain_data);
  if (topo.num_hosts() > 1 && topo.num_hosts() < n) {
    CHECK(aggregated.sent_inter == 2 * 16 * off_host_peers + aggregated_data);
    // Summed over a host of two ranks, rows cross to each other host once, not twice.
    std::uint64_t host_plain = plain_data, host_agg = aggregated_data;
    MPI_Allreduce(MPI_IN_PLACE, &host_plain, 1, MPI_UINT64_T, MPI_SUM, hosts.host_comm());
    MPI_Allreduce(MPI_IN_PLACE, &host_agg, 1, MPI_UINT64_T, MPI_SUM, hosts.host_comm());
    CHECK(host_agg * static_cast<std::uint64_t>(topo.local_size()) == host_plain);
  } else {
    CHECK(aggregated == plain);
  }
}

TEST_CASE("a bad lookup id on one rank fails the lookup on every rank", "[policy][sharded_ps][errors]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), last = n - 1;
  const bool want_shared = GENERATE(true, false);
  Table table(mpi, px::PartitionMap(R, n, n), C, "emb", true, want_shared);
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
  px::DenseShards<float, test::engine_for<Space>> shards(mpi, px::PartitionMap(rows, parts, n), cols);
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
