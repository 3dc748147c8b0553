// dynamic/admission.hpp: owner() spreads keys over the ranks and does not
// depend on anything but the key; the count-min sketch never under-counts,
// and a key that shares counters with busy keys in some rows, not all,
// keeps its own count; the probability filter is a function of (key, step).
#include <parallax/dynamic/admission.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <vector>

namespace pd = parallax::dynamic;

TEST_CASE("owner() is a hash of the key, spread evenly over the ranks", "[dynamic][admission]") {
  for (int ranks = 1; ranks <= 5; ++ranks) {
    std::vector<int> per(static_cast<std::size_t>(ranks), 0);
    const int n = 100000;
    for (std::uint64_t k = 0; k < static_cast<std::uint64_t>(n); ++k) {
      const int o = pd::owner(k * 7919, ranks);
      REQUIRE(o >= 0);
      REQUIRE(o < ranks);
      REQUIRE(o == pd::owner(k * 7919, ranks));
      ++per[static_cast<std::size_t>(o)];
    }
    for (int c : per) {
      INFO("ranks " << ranks << " count " << c);
      REQUIRE(std::abs(c - n / ranks) < n / ranks / 20);  // within 5% of even
    }
  }
  REQUIRE_THROWS_WITH(pd::owner(1, 0), Catch::Contains("ranks must be at least 1"));
}

TEST_CASE("count-min: exact for a lone key, never below the true count", "[dynamic][admission]") {
  pd::CountMinSketch s(pd::admit::CountMin{3, 1 << 12, 4, 0});
  for (std::uint32_t i = 1; i <= 5; ++i) REQUIRE(s.add(42) == i);
  REQUIRE(s.estimate(42) == 5);
  REQUIRE(s.estimate(43) == 0);
  pd::CountMinSketch none;
  REQUIRE(none.add(42) == 0);
  REQUIRE(none.estimate(42) == 0);
  REQUIRE(none.bytes() == 0);
  // Many keys: every estimate >= the truth, and the excess bounded by
  // e * N / width on all but a few keys.
  std::map<std::uint64_t, std::uint32_t> truth;
  std::uint64_t x = 1;
  const int increments = 20000;
  for (int i = 0; i < increments; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const std::uint64_t key = (x >> 33) % 3000;
    s.add(key);
    ++truth[key];
  }
  int over = 0;
  const double bound = 2.718281828 * (increments + 5) / (1 << 12);
  for (const auto& [key, count] : truth) {
    REQUIRE(s.estimate(key) >= count);
    if (s.estimate(key) - count > bound) ++over;
  }
  REQUIRE(over <= static_cast<int>(truth.size()) / 50);  // P(excess > bound) <= e^-4 < 2%
}

TEST_CASE("count-min: keys that collide with a busy key in one row do not admit it", "[dynamic][admission]") {
  const pd::admit::CountMin opt{3, 64, 4, 0};
  pd::CountMinSketch s(opt);
  const std::uint64_t a = 12345;
  // Keys sharing a's counter in row 0 (but, with four independent rows, not
  // in all of them).
  std::vector<std::uint64_t> colliding;
  for (std::uint64_t k = 1; colliding.size() < 20; ++k) {
    if (k == a || s.bucket(k, 0) != s.bucket(a, 0)) continue;
    bool all = true;
    for (int r = 1; r < opt.depth; ++r) all = all && s.bucket(k, r) == s.bucket(a, r);
    if (!all) colliding.push_back(k);
  }
  // The colliding keys, seen five times each, fill a's row-0 counter; a
  // row where none of them shares a's counter keeps a's count at zero.
  for (int round = 0; round < 5; ++round)
    for (std::uint64_t k : colliding) s.add(k);
  bool clean_row = false;
  for (int r = 1; r < opt.depth; ++r) {
    bool shared = false;
    for (std::uint64_t k : colliding) shared = shared || s.bucket(k, r) == s.bucket(a, r);
    clean_row = clean_row || !shared;
  }
  REQUIRE(clean_row);  // 20 keys over 64 counters: some row of a is clean
  REQUIRE(s.estimate(a) == 0);
  // So a still needs its own three sightings.
  REQUIRE(s.add(a) == 1);
  REQUIRE(s.add(a) == 2);
  REQUIRE(s.add(a) >= opt.sightings);
}

TEST_CASE("count-min: halving fades old sightings", "[dynamic][admission]") {
  pd::CountMinSketch s(pd::admit::CountMin{2, 1024, 3, 8});
  for (int i = 0; i < 7; ++i) s.add(7);
  REQUIRE(s.estimate(7) == 7);
  s.add(7);  // the 8th increment halves
  REQUIRE(s.estimate(7) == 4);
  REQUIRE_THROWS_WITH(pd::CountMinSketch(pd::admit::CountMin{2, 0, 3, 0}), Catch::Contains("width must be positive"));
}

TEST_CASE("probability filter: a pure function of (seed, key, step) admitting about p", "[dynamic][admission]") {
  const pd::admit::Probability p{0.25, 9};
  int in = 0;
  for (std::uint64_t k = 0; k < 40000; ++k) {
    const bool a = pd::admitted(p, k, 3);
    REQUIRE(a == pd::admitted(p, k, 3));
    in += a;
  }
  REQUIRE(std::abs(in - 10000) < 500);
  // Over steps, a key refused once is admitted later.
  int steps = 0;
  while (!pd::admitted(p, 77, static_cast<std::uint64_t>(steps))) ++steps;
  REQUIRE(steps < 100);
}
