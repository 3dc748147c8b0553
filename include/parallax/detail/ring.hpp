#pragma once
// The chunk layout and schedule of the bandwidth-optimal ring all-reduce
// (reduce-scatter, then all-gather), shared by RingAllReduce, which runs it,
// and by the engines' byte model for the collectives they delegate.
//
// A buffer of `count` elements is cut into n chunks; chunk j has
// count / n + (j < count % n) elements. In reduce-scatter step s (0..n-2) rank
// i sends chunk (i - s) mod n to rank i+1 and receives chunk (i - s - 1) mod n
// from rank i-1, which it reduces into its own copy. Afterwards rank i holds
// the reduced chunk (i + 1) mod n. In all-gather step s rank i sends chunk
// (i + 1 - s) mod n and receives chunk (i - s) mod n.

#include <cstddef>

namespace parallax::detail::ring {

inline std::size_t chunk_count(std::size_t count, int n, int j) {
  const auto un = static_cast<std::size_t>(n);
  const auto uj = static_cast<std::size_t>(j);
  return count / un + (uj < count % un ? 1 : 0);
}

inline std::size_t chunk_offset(std::size_t count, int n, int j) {
  const auto un = static_cast<std::size_t>(n);
  const auto uj = static_cast<std::size_t>(j);
  const std::size_t base = count / un, extra = count % un;
  return uj * base + (uj < extra ? uj : extra);
}

inline int mod(int a, int n) { return ((a % n) + n) % n; }

/// Chunk rank `rank` sends in reduce-scatter step s; it receives chunk `rs_send(rank-1, s)`.
inline int rs_send(int rank, int n, int s) { return mod(rank - s, n); }
/// Chunk rank `rank` sends in all-gather step s; it receives chunk `ag_send(rank-1, s)`.
inline int ag_send(int rank, int n, int s) { return mod(rank + 1 - s, n); }
/// The chunk a rank owns, fully reduced, after reduce-scatter.
inline int owned_chunk(int rank, int n) { return mod(rank + 1, n); }

/// Elements rank `rank` sends in the whole all-reduce: every chunk but
/// (rank+1) in reduce-scatter and every chunk but (rank+2) in all-gather.
inline std::size_t allreduce_sent(std::size_t count, int n, int rank) {
  if (n <= 1) return 0;
  return 2 * count - chunk_count(count, n, mod(rank + 1, n)) - chunk_count(count, n, mod(rank + 2, n));
}
/// Elements it receives: every chunk but (rank) and every chunk but (rank+1).
inline std::size_t allreduce_received(std::size_t count, int n, int rank) {
  if (n <= 1) return 0;
  return 2 * count - chunk_count(count, n, rank) - chunk_count(count, n, mod(rank + 1, n));
}

}  // namespace parallax::detail::ring
