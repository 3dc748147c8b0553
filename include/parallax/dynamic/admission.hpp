#pragma once
/// @file
/// Admission filters of a dynamic table (dynamic/table.hpp): whether a key
/// seen for the first time may take a row. A key the filter refuses reads a
/// default row and pushes no gradient. Both filters are deterministic: the
/// decision depends on the key, the step and the sightings so far, never on
/// the rank count or on a random device.
///
/// Also the hashes every dynamic table shares: a key's owner among the ranks
/// and its bucket in a shard use different salts, so a shard's keys are not
/// clustered in its index.

#include <parallax/config.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace parallax::dynamic {

namespace detail {

inline constexpr std::uint64_t owner_salt = 0x6A09E667F3BCC908ull;
inline constexpr std::uint64_t index_salt = 0xBB67AE8584CAA73Bull;
inline constexpr std::uint64_t sketch_salt = 0x3C6EF372FE94F82Bull;
inline constexpr std::uint64_t admit_salt = 0xA54FF53A5F1D36F1ull;

__extension__ typedef unsigned __int128 uint128;

/// floor(h * n / 2^64): a 64-bit hash mapped onto [0, n) without a division.
inline std::uint64_t reduce(std::uint64_t h, std::uint64_t n) noexcept {
  return static_cast<std::uint64_t>((static_cast<uint128>(h) * n) >> 64);
}

inline std::uint64_t mix(std::uint64_t key, std::uint64_t salt) noexcept {
  return parallax::detail::splitmix64(key ^ salt);
}

}  // namespace detail

/// The rank that owns `key` among `ranks`: a hash of the key alone, so it
/// does not depend on when the key arrived or on which rank saw it.
inline int owner(std::uint64_t key, int ranks) {
  if (ranks < 1) throw error("parallax::dynamic::owner: ranks must be at least 1, got " + std::to_string(ranks));
  return static_cast<int>(detail::reduce(detail::mix(key, detail::owner_salt), static_cast<std::uint64_t>(ranks)));
}

namespace admit {

/// Every key takes a row on first sight.
struct Always {};

/// A key takes a row once a count-min sketch has seen it `sightings` times.
/// `depth` rows of `width` counters, each row with its own hash; the count
/// of a key is the least of its counters, so it is never below the true
/// count and above it by at most e * N / width (N increments since the last
/// halving) with probability 1 - e^-depth. Conservative update (only the
/// counters equal to the least one grow) keeps the over-count lower.
struct CountMin {
  std::uint32_t sightings = 2;
  std::size_t width = std::size_t{1} << 20;
  int depth = 4;
  /// Halve every counter after this many increments (0: never), so that old
  /// sightings fade and the over-count stays bounded on an endless stream.
  std::uint64_t halve_every = 0;
};

/// A key seen at a step takes a row with probability `p`, decided by a hash
/// of (seed, key, step): the same on every rank count, and a key seen at
/// many steps is admitted after about 1/p of them.
struct Probability {
  double p = 0.1;
  std::uint64_t seed = 0;
};

}  // namespace admit

/// A count-min sketch of 32-bit saturating counters; memory allocated once.
class CountMinSketch {
 public:
  CountMinSketch() = default;
  explicit CountMinSketch(const admit::CountMin& o) : options_(o) {
    if (o.width == 0 || o.depth < 1 || o.depth > 16)
      throw error("parallax::dynamic::CountMinSketch: width must be positive and depth in [1, 16], got width " +
                  std::to_string(o.width) + ", depth " + std::to_string(o.depth));
    counters_.assign(o.width * static_cast<std::size_t>(o.depth), 0);
  }

  /// The estimated count of `key` (never below its true count).
  /// A default-constructed sketch (a table without CountMin) counts nothing.
  std::uint32_t estimate(std::uint64_t key) const noexcept {
    if (counters_.empty()) return 0;
    std::uint32_t least = UINT32_MAX;
    for (int r = 0; r < options_.depth; ++r) least = std::min(least, counters_[at(key, r)]);
    return least;
  }

  /// Counts one sighting of `key`; returns its new estimate.
  std::uint32_t add(std::uint64_t key) noexcept {
    const std::uint32_t least = estimate(key);
    if (counters_.empty() || least == UINT32_MAX) return least;
    for (int r = 0; r < options_.depth; ++r) {
      std::uint32_t& c = counters_[at(key, r)];
      if (c == least) c = least + 1;  // conservative update
    }
    if (options_.halve_every != 0 && ++increments_ >= options_.halve_every) halve();
    return least + 1;
  }

  /// Halves every counter (old sightings fade).
  void halve() noexcept {
    for (auto& c : counters_) c >>= 1;
    increments_ = 0;
  }

  /// The counter of `key` in row r (for tests of collisions).
  std::size_t bucket(std::uint64_t key, int r) const noexcept { return at(key, r) - static_cast<std::size_t>(r) * options_.width; }
  std::size_t bytes() const noexcept { return counters_.size() * sizeof(std::uint32_t); }
  const admit::CountMin& options() const noexcept { return options_; }

 private:
  std::size_t at(std::uint64_t key, int r) const noexcept {
    const std::uint64_t h = detail::mix(key, detail::sketch_salt + static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull);
    return static_cast<std::size_t>(r) * options_.width + static_cast<std::size_t>(detail::reduce(h, options_.width));
  }

  admit::CountMin options_{};
  std::vector<std::uint32_t> counters_;
  std::uint64_t increments_ = 0;
};

/// Whether the probability filter admits `key` seen at `step`.
inline bool admitted(const admit::Probability& a, std::uint64_t key, std::uint64_t step) noexcept {
  const std::uint64_t h = detail::mix(key ^ parallax::detail::splitmix64(step ^ a.seed), detail::admit_salt);
  return parallax::detail::unit(h) < a.p;
}

}  // namespace parallax::dynamic
