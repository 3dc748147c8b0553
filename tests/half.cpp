// half.hpp: bf16 and fp16 against an independent reference. Every one of the
// 65,536 patterns of each type round-trips through float; float -> 16 bits
// rounds to nearest even at the edges (subnormals, ties, the largest finite
// values, overflow, infinities, NaN) and over a large random sample, checked
// against a reference that searches the sorted table of representable values
// in double (and, for fp16, against the compiler's _Float16 where it has
// one); stochastic rounding lands on one of the two neighbours, with the
// right probability exactly over a grid of draws and within statistical
// tolerance over hashed ones.
#include "support.hpp"

#include <parallax/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Facts of a 16-bit format, from its parameters rather than its bit tricks.
template <class H>
struct Format;
template <>
struct Format<px::bf16> {
  static constexpr int mantissa = 7;
  static constexpr std::uint16_t inf = 0x7F80, quiet = 0x0040;
  /// The overflow threshold's magnitude: the next value after the largest
  /// finite one were the exponent unbounded (IEEE 754 rounds past it to inf).
  static double beyond() { return std::ldexp(1.0, 128); }
  static const char* name() { return "bf16"; }
};
template <>
struct Format<px::fp16> {
  static constexpr int mantissa = 10;
  static constexpr std::uint16_t inf = 0x7C00, quiet = 0x0200;
  static double beyond() { return 65536.0; }
  static const char* name() { return "fp16"; }
};

/// The value of a 16-bit pattern computed from its fields with ldexp (not
/// through the type's conversion).
template <class H>
double value_of_pattern(std::uint16_t b) {
  constexpr int m = Format<H>::mantissa, e_bits = 15 - m, bias = (1 << (e_bits - 1)) - 1;
  const int e = (b >> m) & ((1 << e_bits) - 1);
  const int frac = b & ((1 << m) - 1);
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << e_bits) - 1) return frac ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (e == 0) return sign * std::ldexp(frac, 1 - bias - m);
  return sign * std::ldexp((1 << m) + frac, e - bias - m);
}

/// The non-negative finite patterns, in order of value (patterns 0x0000 up
/// to the largest finite one are increasing: the table checks it).
template <class H>
struct Table {
  std::vector<double> values;  // values[p] for pattern p
  Table() {
    for (std::uint32_t p = 0; p < Format<H>::inf; ++p) values.push_back(value_of_pattern<H>(static_cast<std::uint16_t>(p)));
  }
  /// The neighbour patterns of |x|: below <= |x| < above (above may be the
  /// infinity pattern, standing for beyond()), and their values.
  struct Neighbours {
    std::uint16_t below, above;
    double low, high;
  };
  Neighbours around(double magnitude) const {
    const auto it = std::upper_bound(values.begin(), values.end(), magnitude);
    const auto above = static_cast<std::uint16_t>(it - values.begin());
    const auto below = static_cast<std::uint16_t>(above - 1);
    return {below, above, values[below], above == Format<H>::inf ? Format<H>::beyond() : values[above]};
  }
  /// IEEE 754 round to nearest, ties to even, of a finite float, as bits.
  std::uint16_t nearest_even(float x) const {
    const double a = std::fabs(static_cast<double>(x));  // exact
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const Neighbours n = around(a);
    if (a == n.low) return static_cast<std::uint16_t>(sign | n.below);
    // Both differences are exact in double: the neighbours and x share
    // their binade up to one step, and a float has 24 significant bits.
    const double down = a - n.low, up = n.high - a;
    const bool take_above = up < down || (up == down && (n.above & 1) == 0);
    return static_cast<std::uint16_t>(sign | (take_above ? n.above : n.below));
  }
};

template <class H>
const Table<H>& table() {
  static const Table<H> t;
  return t;
}

/// Floats at the edges of H's grid: zeros, the smallest subnormals and
/// their halves (ties), subnormal and normal ties in both directions, the
/// normal boundary, the largest finite value and the overflow threshold,
/// each with its float neighbours.
template <class H>
std::vector<float> edge_floats() {
  std::vector<float> out{0.f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                         std::numeric_limits<float>::max(), 1.f, 1.5f, 3.f};
  const auto& t = table<H>().values;
  for (std::size_t p : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{0x3FF}, std::size_t{0x400},
                        std::size_t{0x7F}, std::size_t{0x80}, std::size_t{0x3C00}, std::size_t{0x3C01}, t.size() - 2,
                        t.size() - 1}) {
    const double lo = t[p - 1], hi = p + 1 < t.size() ? t[p + 1] : Format<H>::beyond();
    for (double v : {t[p], (lo + t[p]) / 2, (t[p] + hi) / 2, hi}) {
      const float f = static_cast<float>(v);
      if (static_cast<double>(f) != v) continue;  // not a float: no tie to test
      for (float g : {f, std::nextafter(f, 0.f), std::nextafter(f, HUGE_VALF)}) out.push_back(g);
    }
  }
  std::vector<float> both;
  for (float f : out) {
    both.push_back(f);
    both.push_back(-f);
  }
  return both;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> out;
  while (out.size() < n) {
    const float f = float_of(static_cast<std::uint32_t>(rng()));
    if (std::isfinite(f)) out.push_back(f);
  }
  // And values near the 16-bit ranges, where random bit patterns rarely land.
  std::uniform_real_distribution<double> exponent(-30.0, 17.0);
  for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<float>(std::exp2(exponent(rng)) * (rng() & 1 ? 1 : -1)));
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("every 16-bit pattern round-trips through float exactly", "[half]", px::bf16, px::fp16) {
  using H = TestType;
  std::size_t wrong = 0, nans = 0;
  for (std::uint32_t p = 0; p < 0x10000; ++p) {
    const auto b = static_cast<std::uint16_t>(p);
    const H h = H::from_bits(b);
    const float f = h;
    const double want = value_of_pattern<H>(b);
    if (std::isnan(want)) {
      ++nans;
      // A NaN stays a NaN of the same sign, quiet after the trip back.
      const H back(f);
      wrong += !std::isnan(f) || std::signbit(f) != bool(b & 0x8000) || !back.is_nan() ||
               back.bits != (b | Format<H>::quiet);
      continue;
    }
    const H back(f);
    wrong += static_cast<double>(f) != want || std::signbit(f) != bool(b & 0x8000) || back.bits != b ||
             back.is_nan() || back.is_inf() != std::isinf(want);
  }
  CHECK(wrong == 0);
  CHECK(nans == 2 * ((std::size_t{1} << Format<H>::mantissa) - 1));  // all-ones exponent, mantissa not zero
  // The table the reference searches is increasing.
  CHECK(std::is_sorted(table<H>().values.begin(), table<H>().values.end()));
  CHECK(std::adjacent_find(table<H>().values.begin(), table<H>().values.end()) == table<H>().values.end());
}

TEMPLATE_TEST_CASE("float to 16 bits rounds to nearest even at the edges", "[half]", px::bf16, px::fp16) {
  using H = TestType;
  const auto& ref = table<H>();
  for (float f : edge_floats<H>()) {
    INFO(Format<H>::name() << " of " << std::hexfloat << f << " (0x" << std::hex << bits_of(f) << ")");
    CHECK(H(f).bits == ref.nearest_even(f));
    CHECK(H::round_nearest(f).bits == H(f).bits);
  }
}

TEST_CASE("fp16 rounding: the named edges", "[half]") {
  CHECK(px::fp16(65504.f).bits == 0x7BFF);                         // largest finite
  CHECK(px::fp16(65519.996f).bits == 0x7BFF);                      // just under the threshold
  CHECK(px::fp16(65520.f).bits == 0x7C00);                         // the tie goes to even: infinity
  CHECK(px::fp16(-1e6f).bits == 0xFC00);                           // overflow keeps the sign
  CHECK(px::fp16(std::ldexp(1.f, -24)).bits == 0x0001);            // smallest subnormal
  CHECK(px::fp16(std::ldexp(1.f, -25)).bits == 0x0000);            // its half: tie to even, zero
  CHECK(px::fp16(std::ldexp(1.5f, -25)).bits == 0x0001);           // above the tie
  CHECK(px::fp16(std::ldexp(3.f, -25)).bits == 0x0002);            // 1.5 units: tie to even, 2
  CHECK(px::fp16(std::ldexp(5.f, -25)).bits == 0x0002);            // 2.5 units: tie to even, 2
  CHECK(px::fp16(std::ldexp(1023.5f, -24)).bits == 0x0400);        // the last subnormal tie carries into a normal
  CHECK(px::fp16(1.f + std::ldexp(1.f, -11)).bits == 0x3C00);      // tie, even below
  CHECK(px::fp16(1.f + 3 * std::ldexp(1.f, -11)).bits == 0x3C02);  // tie, even above
  CHECK(px::fp16(-0.f).bits == 0x8000);
  CHECK(px::fp16(std::numeric_limits<float>::denorm_min()).bits == 0x0000);
  CHECK(px::fp16(HUGE_VALF).bits == 0x7C00);
  CHECK(px::fp16(-HUGE_VALF).bits == 0xFC00);
}

TEST_CASE("bf16 rounding: the named edges", "[half]") {
  CHECK(px::bf16(1.f + std::ldexp(1.f, -8)).bits == 0x3F80);      // tie, even below
  CHECK(px::bf16(1.f + 3 * std::ldexp(1.f, -8)).bits == 0x3F82);  // tie, even above
  CHECK(px::bf16(std::numeric_limits<float>::max()).bits == 0x7F80);  // past the largest finite bf16's half ulp
  CHECK(px::bf16(float_of(0x7F7F7FFF)).bits == 0x7F7F);               // just under it: finite
  CHECK(px::bf16(float_of(0x7F7F8000)).bits == 0x7F80);               // the tie: even is infinity
  CHECK(px::bf16(float_of(0x00008000)).bits == 0x0000);               // subnormal tie, even below
  CHECK(px::bf16(float_of(0x00018000)).bits == 0x0002);               // subnormal tie, even above
  CHECK(px::bf16(float_of(0x00008001)).bits == 0x0001);
  CHECK(px::bf16(float_of(0x807FFFFF)).bits == 0x8080);  // the largest subnormal carries into the smallest normal
  CHECK(px::bf16(-HUGE_VALF).bits == 0xFF80);
}

TEMPLATE_TEST_CASE("NaN stays NaN, quiet, with its sign", "[half]", px::bf16, px::fp16) {
  using H = TestType;
  for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0xFF800001u, 0xFFFFFFFFu, 0x7F802000u}) {
    INFO(std::hex << nan);
    const H h(float_of(nan));
    CHECK(h.is_nan());
    CHECK((h.bits & Format<H>::quiet) != 0);
    CHECK(bool(h.bits & 0x8000) == bool(nan >> 31));
    CHECK(std::isnan(static_cast<float>(h)));
    CHECK(H::round_stochastic(float_of(nan), 0xFFFFFFFFu).is_nan());
  }
}

TEMPLATE_TEST_CASE("float to 16 bits matches the reference over a random sample", "[half]", px::bf16, px::fp16) {
  using H = TestType;
  const auto& ref = table<H>();
  std::size_t wrong = 0, checked = 0;
  std::uint32_t first_wrong = 0;
  for (float f : random_floats(200000, 39)) {
    const std::uint16_t want = std::fabs(f) >= Format<H>::beyond() ? std::uint16_t((std::signbit(f) ? 0x8000 : 0) | Format<H>::inf)
                                                                   : ref.nearest_even(f);
    if (H(f).bits != want && wrong++ == 0) first_wrong = bits_of(f);
    ++checked;
  }
  INFO("first wrong: float bits 0x" << std::hex << first_wrong);
  CHECK(wrong == 0);
  CHECK(checked == 400000);
}

#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
TEST_CASE("fp16 agrees with the compiler's _Float16 over a sweep of every float", "[half]") {
  // Every 251st bit pattern (all 2^32 would take minutes): a prime stride
  // meets every exponent and every residue of the cut-off bits.
  std::size_t wrong = 0, checked = 0;
  for (std::uint64_t u = 0; u < 0x100000000ull; u += 251) {
    const float f = float_of(static_cast<std::uint32_t>(u));
    if (std::isnan(f)) continue;
    const volatile float in = f;
    const _Float16 c = static_cast<_Float16>(in);
    std::uint16_t want;
    std::memcpy(&want, &c, 2);
    wrong += px::fp16(f).bits != want;
    ++checked;
  }
  CHECK(wrong == 0);
  CHECK(checked > 17000000);
}
#endif

TEMPLATE_TEST_CASE("stochastic rounding: the two neighbours, with exact odds over a grid of draws", "[half]",
                   px::bf16, px::fp16) {
  using H = TestType;
  const auto& ref = table<H>();
  // A draw in [0, 2^32) rounds up when below fraction x 2^32; with the draws
  // k x 2^16 (k < 2^16) the count of ups is the fraction x 2^16, exactly
  // where the cut-off bits number 16 or fewer (bf16's always; fp16's in the
  // normal range).
  std::vector<float> xs{1.f + std::ldexp(1.f, -12), 3.14159f, -2.71828f, 0.1f, 1000.7f, -65500.f, 1e-3f,
                        std::ldexp(1.f, -14) * 1.3f};
  if (std::is_same_v<H, px::bf16>) xs.insert(xs.end(), {1e30f, -3e-39f, 6e-42f});
  for (float x : xs) {
    INFO(Format<H>::name() << " of " << std::hexfloat << x);
    const auto n = ref.around(std::fabs(static_cast<double>(x)));
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    double sum = 0;
    std::size_t outside = 0;
    for (std::uint32_t k = 0; k < 0x10000; ++k) {
      const H h = H::round_stochastic(x, k << 16);
      outside += h.bits != (sign | n.below) && h.bits != (sign | n.above);
      sum += static_cast<double>(static_cast<float>(h));
    }
    CHECK(outside == 0);
    CHECK(sum / 65536.0 == Approx(static_cast<double>(x)).epsilon(0).margin(std::ldexp(n.high - n.low, -16)));
    if (n.low == std::fabs(x)) CHECK(sum / 65536.0 == static_cast<double>(x));  // on the grid: never moves
  }
}

TEMPLATE_TEST_CASE("stochastic rounding with hashed draws: the mean is the value", "[half]", px::bf16, px::fp16) {
  using H = TestType;
  const auto& ref = table<H>();
  std::mt19937_64 pick(7);
  for (int trial = 0; trial < 40; ++trial) {
    // Values across the normal and (for fp16) subnormal ranges.
    const float x = static_cast<float>(std::exp2(std::uniform_real_distribution<double>(-26, 15)(pick))) *
                    (trial & 1 ? -1.f : 1.f);
    const auto n = ref.around(std::fabs(static_cast<double>(x)));
    const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    constexpr std::size_t draws = 20000;
    double sum = 0;
    std::size_t outside = 0;
    for (std::size_t d = 0; d < draws; ++d) {
      // A counter-based draw, as optimizers derive them.
      const auto r = static_cast<std::uint32_t>(px::detail::splitmix64(0x1234u ^ px::detail::splitmix64(trial * draws + d)) >> 32);
      const H h = H::round_stochastic(x, r);
      outside += h.bits != (sign | n.below) && h.bits != (sign | n.above);
      sum += std::fabs(static_cast<double>(static_cast<float>(h)));
    }
    const double p = (std::fabs(static_cast<double>(x)) - n.low) / (n.high - n.low);
    const double sigma = (n.high - n.low) * std::sqrt(p * (1 - p) / draws);
    INFO(Format<H>::name() << " of " << std::hexfloat << x << ", p " << p);
    CHECK(outside == 0);
    CHECK(std::fabs(sum / draws - std::fabs(static_cast<double>(x))) <= 5 * sigma + 1e-300);
  }
}

TEST_CASE("stochastic rounding below fp16's smallest subnormal keeps its odds", "[half]") {
  // 2^-30 is 1/64 of the smallest subnormal: a draw below 2^26 rounds up.
  const float x = std::ldexp(1.f, -30);
  CHECK(px::fp16::round_stochastic(x, (1u << 26) - 1).bits == 0x0001);
  CHECK(px::fp16::round_stochastic(x, 1u << 26).bits == 0x0000);
  CHECK(px::fp16::round_stochastic(-x, 0).bits == 0x8001);
  // Far below (2^-60): it always rounds to zero.
  CHECK(px::fp16::round_stochastic(std::ldexp(1.f, -60), 0).bits == 0x0000);
  // Infinity stays infinity; the largest finite value never rounds up.
  CHECK(px::fp16::round_stochastic(HUGE_VALF, 0).bits == 0x7C00);
  CHECK(px::fp16::round_stochastic(65504.f, 0).bits == 0x7BFF);
  CHECK(px::bf16::round_stochastic(HUGE_VALF, 0).bits == 0x7F80);
}

TEST_CASE("16-bit types are 2-byte trivially copyable storage and convert implicitly", "[half]") {
  STATIC_REQUIRE(sizeof(px::bf16) == 2);
  STATIC_REQUIRE(std::is_trivially_copyable_v<px::fp16>);
  STATIC_REQUIRE(px::is_half_v<px::bf16>);
  STATIC_REQUIRE(!px::is_half_v<float>);
  STATIC_REQUIRE(std::is_same_v<px::compute_t<px::fp16>, float>);
  STATIC_REQUIRE(std::is_same_v<px::compute_t<double>, double>);
  px::bf16 a = 2.5f;
  px::fp16 b = 0.75f;
  const float sum = a + b;  // arithmetic happens in float
  CHECK(sum == 3.25f);
  CHECK(a > b);
}
