// sparse_grad.hpp: appending rows, coalescing (sorted, duplicates summed in
// insertion order), and the problems it reports.
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

TEMPLATE_TEST_CASE("SparseGrad::coalesce sorts rows and sums duplicates", "[sparse_grad]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  const std::size_t n = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{5000});
  const std::size_t rows = 50, cols = 3;
  std::mt19937 rng(static_cast<unsigned>(n));
  std::vector<px::index_t> ids(n);
  std::vector<double> vals(n * cols);
  std::map<px::index_t, std::vector<double>> want;
  for (std::size_t i = 0; i < n; ++i) {
    ids[i] = static_cast<px::index_t>(rng() % rows);
    auto& w = want[ids[i]];
    w.resize(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      vals[i * cols + c] = static_cast<double>(i * 10 + c);
      w[c] += vals[i * cols + c];
    }
  }
  px::SparseGrad<double, Space> g(px::Shape{rows, cols}, "emb");
  g.add(ids, vals);
  CHECK(g.size() == n);
  CHECK(g.touched());
  g.coalesce();
  CHECK(g.is_coalesced());
  REQUIRE(g.size() == want.size());
  auto got_ids = g.index_buffer().to_host();
  auto got_vals = g.value_buffer().to_host();
  std::size_t k = 0;
  for (const auto& [id, row] : want) {
    CHECK(got_ids[k] == id);
    for (std::size_t c = 0; c < cols; ++c) CHECK(got_vals[k * cols + c] == row[c]);
    ++k;
  }
}

TEMPLATE_TEST_CASE("SparseGrad::add_rows takes rows written in place, as add() takes copies", "[sparse_grad]",
                   PARALLAX_TEST_SPACES) {
  using Space = TestType;
  const std::size_t rows = 40, cols = 3;
  // Two appends, the second with a duplicate of the first's ids: unsorted as a whole.
  const std::vector<px::index_t> a{3, 9, 1}, b{9, 30};
  auto values_of = [&](const std::vector<px::index_t>& ids, double base) {
    std::vector<double> v(ids.size() * cols);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<double>(i) * 0.25;
    return v;
  };
  px::SparseGrad<double, Space> copied(px::Shape{rows, cols}, "w"), written(px::Shape{rows, cols}, "w");
  copied.add(a, values_of(a, 1));
  copied.add(b, values_of(b, 100));
  for (const auto& [ids, base] : {std::pair{a, 1.0}, std::pair{b, 100.0}}) {
    auto slot = written.add_rows(ids.size());
    REQUIRE(slot.values.rows == ids.size());
    REQUIRE(slot.values.cols == cols);
    test::copy_from_host<Space>(slot.ids, ids);
    test::copy_from_host<Space>(slot.values.data, values_of(ids, base));
  }
  CHECK(written.size() == 5);
  CHECK(written.touched());
  CHECK_FALSE(written.is_coalesced());
  CHECK(written.index_buffer().to_host() == copied.index_buffer().to_host());
  CHECK(written.value_buffer().to_host() == copied.value_buffer().to_host());
  copied.coalesce();
  written.coalesce();
  CHECK(written.index_buffer().to_host() == std::vector<px::index_t>{1, 3, 9, 30});
  CHECK(written.value_buffer().to_host() == copied.value_buffer().to_host());
}

TEMPLATE_TEST_CASE("SparseGrad::coalesce leaves strictly ascending rows where they are", "[sparse_grad]",
                   PARALLAX_TEST_SPACES) {
  using Space = TestType;
  // -0.0 shows that no sum from zero ran (0 + -0 is +0).
  px::SparseGrad<float, Space> g(px::Shape{100, 2}, "w");
  g.add(std::vector<px::index_t>{2, 7, 50}, std::vector<float>{-0.f, 1.f, 2.f, 3.f, 4.f, 5.f});
  const px::index_t* ids_before = g.indices();
  const float* values_before = g.values();
  g.coalesce();
  CHECK(g.is_coalesced());
  CHECK(g.indices() == ids_before);
  CHECK(g.values() == values_before);
  const auto v = g.value_buffer().to_host();
  CHECK(std::signbit(v[0]));
  CHECK(v == std::vector<float>{-0.f, 1.f, 2.f, 3.f, 4.f, 5.f});

  // Ascending with a repeat, or rows out of order: sorted and summed from zero.
  g.clear();
  g.add(std::vector<px::index_t>{2, 2, 50}, std::vector<float>{-0.f, 1.f, 2.f, 3.f, 4.f, 5.f});
  g.coalesce();
  CHECK(g.index_buffer().to_host() == std::vector<px::index_t>{2, 50});
  CHECK(g.value_buffer().to_host() == std::vector<float>{2.f, 4.f, 4.f, 5.f});
  g.clear();
  g.add(std::vector<px::index_t>{7, 2, 50}, std::vector<float>{-0.f, 1.f, 2.f, 3.f, 4.f, 5.f});
  g.coalesce();
  CHECK(g.index_buffer().to_host() == std::vector<px::index_t>{2, 7, 50});
  const auto sorted = g.value_buffer().to_host();
  CHECK(sorted == std::vector<float>{2.f, 3.f, 0.f, 1.f, 4.f, 5.f});
  CHECK_FALSE(std::signbit(sorted[2]));
  // Bad ids are still reported.
  g.clear();
  g.add(std::vector<px::index_t>{2, 100}, std::vector<float>(4));
  CHECK_THAT(test::error_of([&] { g.coalesce(); }), Catch::Contains("row index 100"));
}

TEST_CASE("SparseGrad sums duplicates in the order they were added", "[sparse_grad]") {
  // 1e8 + 1 - 1e8 differs from 1e8 - 1e8 + 1 in float: the order shows.
  px::SparseGrad<float> g(px::Shape{4, 1}, "t");
  g.add(std::vector<px::index_t>{2, 2, 2}, std::vector<float>{1e8f, 1.f, -1e8f});
  g.coalesce();
  CHECK(g.values()[0] == (1e8f + 1.f) - 1e8f);
}

TEST_CASE("SparseGrad reports wrong shapes and out-of-range rows", "[sparse_grad]") {
  px::Exec<px::HostSpace> ex;
  px::SparseGrad<float> g(px::Shape{10, 4}, "emb");
  g.add(std::vector<px::index_t>{1, 2, 3}, std::vector<float>(10));
  auto p = g.find_problem(ex);
  REQUIRE(p);
  CHECK_THAT(*p, Catch::Contains("'emb'") && Catch::Contains("3 indices but 10 values") && Catch::Contains("3 x 4 = 12"));
  CHECK_THROWS_AS(g.coalesce(), px::error);

  g.clear();
  CHECK_FALSE(g.find_problem(ex));
  g.add(std::vector<px::index_t>{0, 10}, std::vector<float>(8));
  p = g.find_problem(ex);
  REQUIRE(p);
  CHECK_THAT(*p, Catch::Contains("row index 10") && Catch::Contains("[0, 10)"));
  g.clear();
  g.add(std::vector<px::index_t>{-1}, std::vector<float>(4));
  CHECK_THAT(test::error_of([&] { g.validate(ex); }), Catch::Contains("row index -1"));
}

TEST_CASE("SparseGrad::clear keeps nothing but the allocations", "[sparse_grad]") {
  px::SparseGrad<float> g(px::Shape{10, 2}, "e");
  g.add(std::vector<px::index_t>{1}, std::vector<float>{1, 2});
  g.clear();
  CHECK(g.empty());
  CHECK_FALSE(g.touched());
  CHECK(g.index_buffer().capacity() >= 1);
}

TEST_CASE("The host's segment sum gives the bits of the element-per-thread one", "[sparse_grad]") {
  // The host sums a segment a row at a time (SumSegmentRows); the GPU an
  // element per thread (SumSegments). Same additions, same order, from zero:
  // -0.0 alone sums to +0.0 in both, and cancellation rounds alike.
  const std::size_t cols = 257, segments = 300;
  std::mt19937 rng(7);
  std::vector<px::index_t> starts{0}, order;
  for (std::size_t s = 0; s < segments; ++s) starts.push_back(starts.back() + 1 + static_cast<px::index_t>(rng() % 4));
  const auto n = static_cast<std::size_t>(starts.back());
  for (std::size_t i = 0; i < n; ++i) order.push_back(static_cast<px::index_t>(i));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<float> values(n * cols);
  std::uniform_real_distribution<float> u(-1e8f, 1e8f);
  for (auto& v : values) v = rng() % 5 == 0 ? -0.0f : u(rng);

  px::Exec<px::HostSpace> ex;
  std::vector<float> by_rows(segments * cols), by_elements(segments * cols);
  px::detail::sum_segments(ex, values.data(), order.data(), starts.data(), segments, n, cols, by_rows.data());
  for (std::size_t s = 0; s < segments; ++s)
    for (std::size_t c = 0; c < cols; ++c)
      px::detail::SumSegments<float>{values.data(), starts.data(), nullptr, nullptr, by_elements.data(), cols, order.data()}(s, c);
  CHECK(std::memcmp(by_rows.data(), by_elements.data(), by_rows.size() * sizeof(float)) == 0);
}

TEMPLATE_TEST_CASE("Rows received as RowBlocks are coalesced where they lie, with the bits of contiguous rows",
                   "[sparse_grad][received]", PARALLAX_TEST_SPACES) {
  // detail::ReceivedRows: a receive buffer of one RowBlock per source (ids,
  // then values), with a source that sent nothing and 8-byte gaps of NaN
  // between blocks, so a row read from the wrong place shows.
  using Space = TestType;
  const std::size_t cols = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{257});
  const std::vector<std::size_t> rows{3, 0, 5, 2};
  std::mt19937 rng(static_cast<unsigned>(cols));
  std::vector<std::byte> recv;
  std::vector<std::size_t> offsets;
  std::vector<px::index_t> ids;
  std::vector<float> values;
  for (std::size_t r : rows) {
    recv.resize(recv.size() + 8, std::byte{0xFF});  // a gap
    offsets.push_back(recv.size());
    recv.resize(recv.size() + px::detail::RowBlock<float>::bytes(r, cols), std::byte{0xFF});
    std::byte* block = recv.data() + offsets.back();
    for (std::size_t i = 0; i < r; ++i) {
      const auto id = static_cast<px::index_t>(rng() % 4);  // repeats within and across sources
      std::memcpy(px::detail::RowBlock<float>::ids(block) + i, &id, sizeof id);
      ids.push_back(id);
      for (std::size_t c = 0; c < cols; ++c) {
        const float v = static_cast<float>(rng() % 1000) / 7.0f - 50.0f;
        std::memcpy(px::detail::RowBlock<float>::values(block, r) + i * cols + c, &v, sizeof v);
        values.push_back(v);
      }
    }
  }
  const auto dev_recv = px::Buffer<std::byte, Space>::from_host(recv);
  px::Exec<Space> ex;
  px::detail::ReceivedRows<float, Space> got;
  got.unpack(ex, dev_recv.data(), offsets.data(), rows.data(), rows.size(), cols);
  ex.synchronize();
  REQUIRE(got.size() == ids.size());
  std::vector<px::index_t> got_ids(ids.size());
  px::space_traits<Space>::copy_to_host(got_ids.data(), got.ids(), ids.size() * sizeof(px::index_t));
  CHECK(got_ids == ids);
  // The host reads values in the receive buffer itself; other spaces copy.
  if (std::is_same_v<Space, px::HostSpace> && cols > 0) {
    CHECK(got.values().at != nullptr);
    const auto* base = reinterpret_cast<const float*>(dev_recv.data());
    CHECK(got.values().row(0, cols) == base + (offsets[0] + 3 * sizeof(px::index_t)) / sizeof(float));
  }

  // Coalesced in place and from contiguous copies: the same ids and bits.
  const auto dev_ids = px::Buffer<px::index_t, Space>::from_host(ids);
  const auto dev_values = px::Buffer<float, Space>::from_host(values);
  px::Buffer<px::index_t, Space> ids_a, ids_b;
  px::Buffer<float, Space> sums_a, sums_b;
  px::detail::CoalesceScratch<Space> scratch;
  const std::size_t m_a =
      px::detail::coalesce_rows(ex, got.ids(), got.values(), got.size(), cols, ids_a, sums_a, scratch);
  const std::size_t m_b =
      px::detail::coalesce_rows(ex, dev_ids.data(), dev_values.data(), ids.size(), cols, ids_b, sums_b, scratch);
  ex.synchronize();
  REQUIRE(m_a == m_b);
  CHECK(ids_a.to_host() == ids_b.to_host());
  const auto a = sums_a.to_host(), b = sums_b.to_host();
  REQUIRE(a.size() == m_a * cols);
  CHECK((a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0));
}
