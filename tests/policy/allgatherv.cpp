// AllGatherv: every rank ends with the global sparse gradient, summed by row
// then by rank (bit-exact against a sequential reference), and books the
// bytes of docs/design.md, "Byte accounting", exactly, in host and device
// memory.
#include "support.hpp"

#include <map>

namespace {

// Rank r touches rows (r + 3j) % rows for j < k_r, plus row 0 twice: duplicates
// within and across ranks. k_r differs per rank; rank 1 has none.
std::vector<px::index_t> ids_of(int r, std::size_t rows) {
  const std::size_t k = r == 1 ? 0 : 5 + 4 * static_cast<std::size_t>(r);
  std::vector<px::index_t> ids;
  for (std::size_t j = 0; j < k; ++j) ids.push_back(static_cast<px::index_t>((r + 3 * j) % rows));
  if (k) {
    ids.push_back(0);
    ids.push_back(0);
  }
  return ids;
}
float value_of(int r, std::size_t entry, std::size_t c) { return 0.1f * static_cast<float>(r + 1) + 0.01f * entry + c; }

}  // namespace

TEMPLATE_TEST_CASE("SparseAllGatherer gives every rank the global rows, summed by row then rank",
                   "[policy][allgatherv]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const std::size_t rows = 23, cols = 3;
  const auto ids = ids_of(me, rows);
  std::vector<float> vals(ids.size() * cols);
  for (std::size_t e = 0; e < ids.size(); ++e)
    for (std::size_t c = 0; c < cols; ++c) vals[e * cols + c] = value_of(me, e, c);

  px::SparseAllGatherer<float, test::engine_for<Space>> gatherer(mpi, cols);
  px::Buffer<px::index_t, Space> out_ids_in_space;
  px::Buffer<float, Space> out_vals_in_space;
  std::vector<std::int64_t> per_rank;
  const std::size_t m = gatherer.gather(px::Buffer<px::index_t, Space>::from_host(ids).data(),
                                        px::Buffer<float, Space>::from_host(vals).data(), ids.size(),
                                        out_ids_in_space, out_vals_in_space, &per_rank);
  const auto out_ids = out_ids_in_space.to_host();
  const auto out_vals = out_vals_in_space.to_host();

  // Sequential reference: ranks in order, entries in order.
  std::map<px::index_t, std::vector<float>> want;
  for (int r = 0; r < n; ++r) {
    const auto rids = ids_of(r, rows);
    CHECK(per_rank[r] == static_cast<std::int64_t>(rids.size()));
    for (std::size_t e = 0; e < rids.size(); ++e) {
      auto& w = want[rids[e]];
      w.resize(cols, 0.f);
      for (std::size_t c = 0; c < cols; ++c) w[c] += value_of(r, e, c);
    }
  }
  REQUIRE(m == want.size());
  std::size_t k = 0;
  bool exact = true;
  for (const auto& [id, row] : want) {
    exact = exact && out_ids[k] == id;
    for (std::size_t c = 0; c < cols; ++c) exact = exact && out_vals[k * cols + c] == row[c];
    ++k;
  }
  CHECK(exact);

  // Bytes: a row block is k ids and k*cols floats, padded to 8 bytes. On an
  // engine with alltoallv_unsized (engine::Mpi) each rank sends its count
  // and block straight to every other rank, in one call; elsewhere the
  // counts go in an allgather and the blocks in an allgatherv, booked as a
  // ring (every block but the right neighbour's). The totals over the ranks
  // are the same.
  auto block = [&](int r) { return px::detail::RowBlock<float>::bytes(ids_of(r, rows).size(), cols); };
  std::uint64_t all_blocks = 0;
  for (int r = 0; r < n; ++r) all_blocks += block(r);
  CHECK(block(0) % 8 == 0);
  constexpr bool direct = px::engine::supports_v<test::engine_for<Space>, px::engine::op_alltoallv_unsized>;
  const std::uint64_t peers = static_cast<std::uint64_t>(n - 1);
  const std::uint64_t want_sent = direct ? peers * (8 + block(me)) : n == 1 ? 0 : 8 * peers + all_blocks - block((me + 1) % n);
  const std::uint64_t want_recv = direct ? 8 * peers + all_blocks - block(me) : n == 1 ? 0 : 8 * peers + all_blocks - block(me);
  CHECK(mpi.stats().total().sent() == want_sent);
  CHECK(mpi.stats().total().received() == want_recv);
  CHECK(mpi.stats().total().calls == (direct ? 1u : 2u));
}

TEST_CASE("SparseAllGatherer with no rows anywhere returns nothing", "[policy][allgatherv]") {
  px::engine::Mpi mpi(test::world());
  px::SparseAllGatherer<double, px::engine::Mpi> gatherer(mpi, 4);
  px::Buffer<px::index_t> ids;
  px::Buffer<double> vals;
  CHECK(gatherer.gather(nullptr, nullptr, 0, ids, vals) == 0);
  CHECK(ids.empty());
  CHECK(vals.empty());
}
