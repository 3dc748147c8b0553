// detail/algorithms.hpp: the host's stable counting sort (group_stably) and
// the coalesce's radix grouping (radix_group), against std::stable_sort.
#include "support.hpp"

#include <parallax/detail/algorithms.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace {

// Places (and group starts) of a stable sort by key, the slow way.
void check_against_stable_sort(const std::vector<std::int32_t>& key, std::size_t groups) {
  const std::size_t k = key.size();
  std::vector<px::index_t> first(groups + 1, -1), place(k, -1);
  px::detail::group_stably(
      k, groups, [&](std::size_t i) { return key[i]; }, first.data(),
      [&](std::size_t i, px::index_t at) { place[i] = at; });

  std::vector<std::size_t> order(k);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
  std::vector<px::index_t> expected(k);
  for (std::size_t at = 0; at < k; ++at) expected[order[at]] = static_cast<px::index_t>(at);
  CHECK(place == expected);
  for (std::size_t g = 0; g <= groups; ++g)
    CHECK(first[g] == std::count_if(key.begin(), key.end(), [&](std::int32_t x) { return static_cast<std::size_t>(x) < g; }));
}

}  // namespace

TEST_CASE("group_stably groups by a small key, in input order within a group", "[detail][algorithms]") {
  SECTION("nothing") { check_against_stable_sort({}, 4); }
  SECTION("one group") { check_against_stable_sort({0, 0, 0}, 1); }
  SECTION("empty groups between and at the ends") { check_against_stable_sort({2, 2, 4, 2, 4}, 6); }
  SECTION("already grouped") { check_against_stable_sort({0, 0, 1, 1, 1, 3}, 4); }
  SECTION("interleaved, as ascending ids over round-robin partitions") {
    std::vector<std::int32_t> key;
    for (int i = 0; i < 100; ++i) key.push_back((i / 3) % 4);
    check_against_stable_sort(key, 4);
  }
  SECTION("random") {
    std::mt19937 gen(7);
    for (const std::size_t groups : {std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
      std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(groups) - 1);
      std::vector<std::int32_t> key(5000);
      for (auto& x : key) x = pick(gen);
      check_against_stable_sort(key, groups);
    }
  }
}

namespace {

// radix_group against a stable sort of (id, position), the slow way: the
// same unique ids, order and segment starts, and each row's segment and
// whether it comes first there; and the whole coalesce against Thrust's,
// bit for bit.
void check_radix_group(const std::vector<px::index_t>& ids) {
  const std::size_t n = ids.size();
  px::detail::CoalesceScratch<px::HostSpace> scratch;
  px::Buffer<px::index_t> unique;
  const auto m = px::detail::radix_group(ids.data(), n, scratch, unique);
  REQUIRE(m.has_value());

  std::vector<px::index_t> order(n);
  std::iota(order.begin(), order.end(), px::index_t{0});
  std::stable_sort(order.begin(), order.end(), [&](px::index_t a, px::index_t b) { return ids[a] < ids[b]; });
  std::vector<px::index_t> expected_unique, expected_starts, expected_segment_of(n);
  for (std::size_t k = 0; k < n; ++k) {
    const bool first = k == 0 || ids[order[k]] != ids[order[k - 1]];
    if (first) {
      expected_unique.push_back(ids[order[k]]);
      expected_starts.push_back(static_cast<px::index_t>(k));
    }
    expected_segment_of[order[k]] = static_cast<px::index_t>((expected_unique.size() - 1) * 2 + first);
  }
  expected_starts.push_back(static_cast<px::index_t>(n));
  REQUIRE(*m == expected_unique.size());
  CHECK(std::vector<px::index_t>(scratch.segment_of.data(), scratch.segment_of.data() + n) == expected_segment_of);
  CHECK(std::vector<px::index_t>(unique.data(), unique.data() + *m) == expected_unique);
  CHECK(std::vector<px::index_t>(scratch.order.data(), scratch.order.data() + n) == order);
  CHECK(std::vector<px::index_t>(scratch.starts.data(), scratch.starts.data() + *m + 1) == expected_starts);

  // Values whose sums depend on the order of the additions.
  constexpr std::size_t cols = 3;
  std::vector<float> values(n * cols);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  for (auto& v : values) v = u(gen);
  const px::Exec<px::HostSpace> ex;
  px::detail::CoalesceScratch<px::HostSpace> scratch_a, scratch_b;
  px::Buffer<px::index_t> ids_a, ids_b;
  px::Buffer<float> sums_a, sums_b;
  const std::size_t ma = px::detail::coalesce_rows(ex, ids.data(), values.data(), n, cols, ids_a, sums_a, scratch_a);
  const std::size_t mb =
      px::detail::coalesce_rows_thrust(ex, ids.data(), values.data(), n, cols, ids_b, sums_b, scratch_b);
  REQUIRE(ma == mb);
  CHECK(std::equal(ids_a.data(), ids_a.data() + ma, ids_b.data()));
  // (memcmp must not be given the null data of empty buffers.)
  CHECK((ma == 0 || std::memcmp(sums_a.data(), sums_b.data(), ma * cols * sizeof(float)) == 0));
}

}  // namespace

TEST_CASE("radix_group orders ids as a stable sort does, over the bits their range spans", "[detail][algorithms]") {
  SECTION("nothing") { check_radix_group({}); }
  SECTION("one id") { check_radix_group({42}); }
  SECTION("one id repeated") { check_radix_group({7, 7, 7, 7}); }
  SECTION("negative and extreme ids") {
    check_radix_group({3, -1, std::numeric_limits<px::index_t>::min() / 64, 3, -1, 0, -5});
  }
  SECTION("one pass, two passes, three passes, a pass with one digit for all") {
    std::mt19937_64 gen(5);
    for (const px::index_t range : {px::index_t{1} << 10, px::index_t{200000}, px::index_t{1} << 30}) {
      std::uniform_int_distribution<px::index_t> pick(0, range - 1);
      std::vector<px::index_t> ids(3000);
      for (auto& x : ids) x = pick(gen);
      check_radix_group(ids);
      for (auto& x : ids) x = (x & 0x3ff) | ((x >> 10 & 1) << 30);  // bits 10..29 zero for all
      check_radix_group(ids);
    }
  }
  SECTION("word frequencies: a few ids repeat a lot") {
    std::mt19937_64 gen(11);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<px::index_t> ids(16384);
    for (auto& x : ids) x = static_cast<px::index_t>(std::exp(u(gen) * std::log(200000.0))) - 1;
    check_radix_group(ids);
  }
}

TEST_CASE("radix_group leaves ids spanning too many bits to Thrust's sort", "[detail][algorithms]") {
  const std::vector<px::index_t> ids = {std::numeric_limits<px::index_t>::max(), 0,
                                        std::numeric_limits<px::index_t>::min(), 0};
  px::detail::CoalesceScratch<px::HostSpace> scratch;
  px::Buffer<px::index_t> unique;
  CHECK_FALSE(px::detail::radix_group(ids.data(), ids.size(), scratch, unique).has_value());
  const px::Exec<px::HostSpace> ex;
  const std::vector<float> values = {1.f, 2.f, 3.f, 4.f};
  px::Buffer<float> sums;
  const std::size_t m = px::detail::coalesce_rows(ex, ids.data(), values.data(), ids.size(), 1, unique, sums, scratch);
  REQUIRE(m == 3);
  CHECK(unique.data()[0] == std::numeric_limits<px::index_t>::min());
  CHECK(unique.data()[1] == 0);
  CHECK(unique.data()[2] == std::numeric_limits<px::index_t>::max());
  CHECK(sums.data()[1] == 6.f);
}
