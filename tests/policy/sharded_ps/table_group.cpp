// policy/sharded_ps/table_group.hpp: tables of one width stored and
// exchanged as a group. A batch's lookups of several tables (each with its
// own partitioning, ids in any order, repeats) return every caller's rows
// in one route and one reply; a push of several tables sums each row by row
// then rank, as each table alone would; a bad id names its table on every
// rank; bytes equal the tables' own.
#include "support.hpp"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr std::size_t C = 3;

/// Table t's row id, column c, as initialised.
float initial(std::size_t t, px::index_t id, std::size_t c) {
  return static_cast<float>(1000 * (t + 1) + id * 10 + static_cast<px::index_t>(c));
}

template <class Space>
using Group = px::policy::sharded::TableGroup<float, test::engine_for<Space>>;

/// What a route of this test carries, named for a disagreement (none here).
std::string describe(bool) { return "the test's tables"; }

/// Three tables: rows 29, 17 and 5; one partition per rank, 2N+1 (owners
/// interleave), and one partition (a single owner).
struct Tables {
  std::vector<std::size_t> rows{29, 17, 5};
  std::vector<int> parts;
  explicit Tables(int n) : parts{n, 2 * n + 1, 1} {}
};

template <class Space>
void build(Group<Space>& g, const Tables& t, int n) {
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    g.add("t" + std::to_string(i), px::PartitionMap(t.rows[i], t.parts[i], n));
  g.build();
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    g.initialize(i, [&](const px::index_t* rows_in_space, std::size_t k, float* out) {
      const auto rows = test::to_host<Space>(rows_in_space, k);
      std::vector<float> v(k * C);
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t c = 0; c < C; ++c) v[j * C + c] = initial(i, rows[j], c);
      test::copy_from_host<Space>(out, v);
    });
}

/// Rank r's ids of table t: repeats and any order for t0, ascending and
/// distinct for t1, everything twice for t2; none of t1 on rank 1.
std::vector<px::index_t> ids_of(std::size_t t, int r, const Tables& tables) {
  const auto rows = static_cast<px::index_t>(tables.rows[t]);
  std::vector<px::index_t> ids;
  if (t == 0)
    for (int j = 0; j < 6 + r; ++j) ids.push_back((r * 7 + j * 11) % rows);
  if (t == 1 && r != 1)
    for (px::index_t id = r % 3; id < rows; id += 2) ids.push_back(id);
  if (t == 2)
    for (int k = 0; k < 2; ++k)
      for (px::index_t id = 0; id < rows; ++id) ids.push_back(id);
  return ids;
}

}  // namespace

TEMPLATE_TEST_CASE("a batch of lookups of several tables takes one route and one reply", "[policy][table_group]",
                   PARALLAX_TEST_SPACES) {
  using Space = TestType;
  using Engine = test::engine_for<Space>;
  Engine mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const bool want_shared = GENERATE(true, false);
  const Tables tables(n);
  Group<Space> group(mpi, C, true, want_shared);
  build<Space>(group, tables, n);
  CHECK((!group.shared() || (want_shared && test::can_share(mpi))));  // only where asked and possible

  // The batch names t2, t0, t1 (not the group's order).
  const std::vector<std::size_t> order{2, 0, 1};
  std::vector<px::Buffer<px::index_t, Space>> ids;
  std::vector<px::Buffer<float, Space>> outs;
  std::vector<typename Group<Space>::Request> requests;
  for (std::size_t t : order) {
    const auto host = ids_of(t, me, tables);
    ids.push_back(px::Buffer<px::index_t, Space>::from_host(host));
    outs.push_back(px::Buffer<float, Space>::from_host(std::vector<float>(host.size() * C, -1.f)));
  }
  for (std::size_t i = 0; i < order.size(); ++i)
    requests.push_back({order[i], ids[i].data(), ids[i].size(), outs[i].data()});

  const px::Traffic before = mpi.stats().total();
  px::policy::sharded::RouteBuffers<Space> buffers;
  px::policy::sharded::RouteLane* lane = &group.plan_lookup(requests.data(), requests.size());
  CHECK(group.lookup_problem() == px::policy::sharded::no_problem);
  CHECK_FALSE(px::policy::sharded::route_lanes(mpi, &lane, 1, buffers, px::policy::sharded::CallShape{group.identity()}, describe));
  group.start_reply();
  if constexpr (px::engine::supports_v<Engine, px::engine::op_start_alltoallv>) mpi.wait_started();
  group.finish_lookup();
  const px::Traffic spent = mpi.stats().total() - before;

  bool exact = true;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto host_ids = ids_of(order[i], me, tables);
    const auto rows = outs[i].to_host();
    for (std::size_t j = 0; j < host_ids.size(); ++j)
      for (std::size_t c = 0; c < C; ++c) exact = exact && rows[j * C + c] == initial(order[i], host_ids[j], c);
  }
  CHECK(test::all_ranks(exact));
  // One route for the three tables, then one reply for all of them (none
  // when the rows are read where they lie: shared shards, or one rank).
  CHECK(group.reads_directly() == (group.shared() || n == 1));
  CHECK(spent.calls == test::route_calls<Engine> + (group.reads_directly() ? 0 : 1));

  // Bytes: each table's as if alone, sharing one 24-byte header per peer
  // (one lane: shape, rest, count): 8 per unique id asked of a peer and C
  // floats per row back; shared shards: C floats per id read from a peer
  // (repeats too).
  std::uint64_t sent = 24 * (n - 1), recv = 24 * (n - 1);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::uint64_t to_p = 0, from_p = 0;
    for (std::size_t t = 0; t < tables.rows.size(); ++t) {
      const px::PartitionMap map(tables.rows[t], tables.parts[t], n);
      auto mine = ids_of(t, me, tables), theirs = ids_of(t, p, tables);
      if (!group.shared()) {
        const std::set<px::index_t> um(mine.begin(), mine.end()), ut(theirs.begin(), theirs.end());
        mine.assign(um.begin(), um.end());
        theirs.assign(ut.begin(), ut.end());
      }
      for (auto id : mine) to_p += map.owner(id) == p;
      for (auto id : theirs) from_p += map.owner(id) == me;
    }
    const std::uint64_t key_bytes = group.shared() ? 0 : 8;
    sent += key_bytes * to_p + 4 * C * from_p;
    recv += key_bytes * from_p + 4 * C * to_p;
  }
  CHECK(spent.sent() == sent);
  CHECK(spent.received() == recv);
}

TEST_CASE("a bad id in one table of a batch names that table on every rank", "[policy][table_group][errors]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), last = n - 1;
  const bool want_shared = GENERATE(true, false);
  const Tables tables(n);
  Group<px::HostSpace> group(mpi, C, true, want_shared);
  build<px::HostSpace>(group, tables, n);
  std::vector<px::index_t> a{0, 3}, b{1, mpi.rank() == last ? 17 : 2}, c{4};
  std::vector<float> oa(a.size() * C), ob(b.size() * C), oc(c.size() * C);
  const std::vector<Group<px::HostSpace>::Request> requests{
      {0, a.data(), a.size(), oa.data()}, {1, b.data(), b.size(), ob.data()}, {2, c.data(), c.size(), oc.data()}};
  px::policy::sharded::RouteBuffers<px::HostSpace> buffers;
  px::policy::sharded::RouteLane* lane = &group.plan_lookup(requests.data(), requests.size());
  const std::string msg = test::error_of([&] {
    if (auto p = px::policy::sharded::route_lanes(mpi, &lane, 1, buffers, px::policy::sharded::CallShape{group.identity()}, describe,
                                         group.lookup_problem(), 0, group.problem_table()))
      group.fail(*p, "lookup id");
  });
  CHECK_THAT(msg, Catch::Contains("variable 't1'") && Catch::Contains("lookup id 17") &&
                      Catch::Contains("[0, 17)") && Catch::Contains("rank " + std::to_string(last)));
}

TEMPLATE_TEST_CASE("a push of several tables sums each row at its owner, by row then rank",
                   "[policy][table_group]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  using Engine = test::engine_for<Space>;
  Engine mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const Tables tables(n);
  Group<Space> group(mpi, C, true, false);
  build<Space>(group, tables, n);
  // Rank r pushes distinct ascending rows of each table (a coalesced gradient).
  auto push_ids = [&](std::size_t t, int r) {
    std::set<px::index_t> s;
    for (int j = 0; j < 5; ++j) s.insert((r + 3 * j + static_cast<int>(t)) % static_cast<px::index_t>(tables.rows[t]));
    return std::vector<px::index_t>(s.begin(), s.end());
  };
  auto value = [](std::size_t t, int r, px::index_t id, std::size_t c) {
    return 0.25f * static_cast<float>(t + 1) + 0.5f * static_cast<float>(r) + static_cast<float>(id) / 64 +
           static_cast<float>(c);
  };
  std::vector<px::Buffer<px::index_t, Space>> ids;
  std::vector<px::Buffer<float, Space>> values;
  std::vector<typename Group<Space>::Push> pushes;
  for (std::size_t t = 0; t < tables.rows.size(); ++t) {
    const auto host = push_ids(t, me);
    std::vector<float> v(host.size() * C);
    for (std::size_t j = 0; j < host.size(); ++j)
      for (std::size_t c = 0; c < C; ++c) v[j * C + c] = value(t, me, host[j], c);
    ids.push_back(px::Buffer<px::index_t, Space>::from_host(host));
    values.push_back(px::Buffer<float, Space>::from_host(v));
  }
  for (std::size_t t = 0; t < tables.rows.size(); ++t) pushes.push_back({t, ids[t].data(), values[t].data(), ids[t].size()});
  px::policy::sharded::RouteBuffers<Space> buffers;
  px::policy::sharded::RouteLane* lane = &group.plan_push(pushes.data(), pushes.size());
  px::policy::sharded::route_lanes(mpi, &lane, 1, buffers, px::policy::sharded::CallShape{group.identity()}, describe);
  px::Buffer<px::index_t, Space> local_in_space;
  px::Buffer<float, Space> sums_in_space;
  const std::size_t m = group.finish_push(local_in_space, sums_in_space);
  const auto local = local_in_space.to_host();
  const auto sums = sums_in_space.to_host();

  // Rows owned here, in group-shard order (table by table, each in its
  // shard's order), summed in rank order.
  std::map<std::size_t, std::vector<float>> want;
  for (std::size_t t = 0; t < tables.rows.size(); ++t) {
    const px::PartitionMap map(tables.rows[t], tables.parts[t], n);
    for (int r = 0; r < n; ++r)
      for (auto id : push_ids(t, r)) {
        if (map.owner(id) != me) continue;
        auto& w = want[group.base(t) + map.local_row(id)];
        w.resize(C, 0.f);
        for (std::size_t c = 0; c < C; ++c) w[c] += value(t, r, id, c);
      }
  }
  REQUIRE(m == want.size());
  std::size_t k = 0;
  bool exact = true;
  for (const auto& [row, sum] : want) {
    exact = exact && local[k] == static_cast<px::index_t>(row);
    for (std::size_t c = 0; c < C; ++c) exact = exact && sums[k * C + c] == sum[c];
    ++k;
  }
  CHECK(test::all_ranks(exact));
}
