// partition.hpp: every row in exactly one partition; owners, shard offsets
// and local rows consistent, for every small (rows, partitions, ranks).
#include "support.hpp"

TEST_CASE("PartitionMap places every row exactly once, contiguously", "[partition]") {
  for (std::size_t rows = 1; rows <= 37; ++rows) {
    for (int parts = 1; parts <= std::min<int>(static_cast<int>(rows), 11); ++parts) {
      for (int ranks = 1; ranks <= 5; ++ranks) {
        const px::PartitionMap m(rows, parts, ranks);
        INFO("rows " << rows << " parts " << parts << " ranks " << ranks);
        // Partitions tile the rows, sizes differ by at most one, larger first.
        std::size_t next = 0;
        for (int p = 0; p < parts; ++p) {
          REQUIRE(m.begin(p) == next);
          REQUIRE((m.size(p) == rows / parts || m.size(p) == rows / parts + 1));
          if (p > 0) REQUIRE(m.size(p) <= m.size(p - 1));
          next += m.size(p);
        }
        REQUIRE(next == rows);
        // Each rank's shard holds its partitions back to back; local rows are
        // a bijection onto [0, shard_rows(owner)).
        std::vector<std::vector<int>> seen(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) seen[r].assign(m.shard_rows(r), 0);
        std::size_t total = 0;
        for (int r = 0; r < ranks; ++r) total += m.shard_rows(r);
        REQUIRE(total == rows);
        for (std::size_t row = 0; row < rows; ++row) {
          const auto id = static_cast<px::index_t>(row);
          const int p = m.partition_of(id);
          REQUIRE(row >= m.begin(p));
          REQUIRE(row < m.begin(p) + m.size(p));
          REQUIRE(m.owner(id) == p % ranks);
          const std::size_t local = m.local_row(id);
          REQUIRE(local < m.shard_rows(m.owner(id)));
          REQUIRE(m.global_row(m.owner(id), local) == id);
          ++seen[m.owner(id)][local];
        }
        for (const auto& s : seen)
          for (int hits : s) REQUIRE(hits == 1);
      }
    }
  }
}

TEST_CASE("PartitionMap with more ranks than partitions leaves ranks empty", "[partition]") {
  const px::PartitionMap m(10, 2, 4);
  CHECK(m.shard_rows(0) == 5);
  CHECK(m.shard_rows(1) == 5);
  CHECK(m.shard_rows(2) == 0);
  CHECK(m.partitions_on(3) == 0);
}

TEST_CASE("PartitionMap rejects impossible partition counts", "[partition]") {
  CHECK_THAT(test::error_of([] { px::PartitionMap(10, 11, 2); }), Catch::Contains("[1, rows = 10]") && Catch::Contains("11"));
  CHECK_THAT(test::error_of([] { px::PartitionMap(10, 0, 2); }), Catch::Contains("got 0"));
  CHECK_THAT(test::error_of([] { px::PartitionMap(10, 2, 0); }), Catch::Contains("rank count"));
}
