#pragma once
/// @file
/// Initial values of variables. Every element's value is a pure function of
/// (seed, variable name, row, column), so a row has the same value whether it
/// lives in a full replica, in any rank's shard, or in a single-process run.

#include <parallax/config.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

namespace parallax {
namespace init {

/// All zeros.
struct Zeros {};
/// Every element `value`.
struct Constant {
  double value = 0.0;
};
/// Uniform in [low, high).
struct Uniform {
  float low = -0.05f;
  float high = 0.05f;
  std::uint64_t seed = 0;
};
/// Normal(mean, stddev).
struct Normal {
  float mean = 0.0f;
  float stddev = 0.05f;
  std::uint64_t seed = 0;
};
/// Glorot/Xavier uniform: U(-l, l) with l = sqrt(6 / (rows + cols)).
struct Glorot {
  std::uint64_t seed = 0;
};

}  // namespace init

/// Any initializer a variable accepts.
using Init = std::variant<init::Zeros, init::Constant, init::Uniform, init::Normal, init::Glorot>;

namespace detail {

inline constexpr std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

PARALLAX_HOST_DEVICE inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform double in [0, 1) from a 64-bit hash.
PARALLAX_HOST_DEVICE inline double unit(std::uint64_t h) noexcept {
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

/// The uniform initializer's value of `element` on [low, low + span) with
/// `key`: InitRule::value's uniform case, and dynamic tables' fresh rows
/// (dynamic::detail::uniform_row) a column a lane.
PARALLAX_HOST_DEVICE inline double uniform_value(std::uint64_t key, std::uint64_t element, double low,
                                                 double span) noexcept {
  return low + span * unit(splitmix64(key ^ splitmix64(element)));
}

/// The initializer reduced to numbers a kernel can use.
struct InitRule {
  enum Kind : int { zeros, constant, uniform, normal } kind = zeros;
  double a = 0, b = 0;  // constant: a; uniform: [a, b); normal: mean a, stddev b
  std::uint64_t key = 0;

  PARALLAX_HOST_DEVICE double value(std::uint64_t element) const noexcept {
    switch (kind) {
      case zeros: return 0.0;
      case constant: return a;
      case uniform: return uniform_value(key, element, a, b - a);
      case normal: {
        const double u1 = 1.0 - unit(splitmix64(key ^ splitmix64(2 * element)));
        const double u2 = unit(splitmix64(key ^ splitmix64(2 * element + 1)));
        return a + b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      }
    }
    return 0.0;
  }
};

inline InitRule make_init_rule(const Init& init, std::string_view name, Shape shape) {
  InitRule r;
  const std::uint64_t name_key = fnv1a(name);
  std::visit(
      [&](const auto& i) {
        using I = std::decay_t<decltype(i)>;
        if constexpr (std::is_same_v<I, init::Zeros>) {
          r.kind = InitRule::zeros;
        } else if constexpr (std::is_same_v<I, init::Constant>) {
          r.kind = InitRule::constant;
          r.a = i.value;
        } else if constexpr (std::is_same_v<I, init::Uniform>) {
          r.kind = InitRule::uniform;
          r.a = i.low;
          r.b = i.high;
          r.key = splitmix64(i.seed) ^ name_key;
        } else if constexpr (std::is_same_v<I, init::Normal>) {
          r.kind = InitRule::normal;
          r.a = i.mean;
          r.b = i.stddev;
          r.key = splitmix64(i.seed) ^ name_key;
        } else {
          const double limit = std::sqrt(6.0 / static_cast<double>(shape.rows + shape.cols));
          r.kind = InitRule::uniform;
          r.a = -limit;
          r.b = limit;
          r.key = splitmix64(i.seed) ^ name_key;
        }
      },
      init);
  return r;
}

/// out[j] = initial value of global row rows[j / cols] (or first_row + j / cols).
template <class T>
struct FillInit {
  InitRule rule;
  T* out;
  std::size_t cols;
  std::size_t first_row;
  const index_t* rows;  // optional: global row of each local row
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const std::size_t local = j / cols, col = j % cols;
    const std::size_t row = rows ? static_cast<std::size_t>(rows[local]) : first_row + local;
    out[j] = static_cast<T>(rule.value(static_cast<std::uint64_t>(row) * cols + col));
  }
};

}  // namespace detail
}  // namespace parallax
