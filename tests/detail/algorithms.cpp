// detail/algorithms.hpp: the host's stable counting sort (group_stably),
// against std::stable_sort.
#include "support.hpp"

#include <parallax/detail/algorithms.hpp>

#include <algorithm>
#include <cstdint>
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
