#pragma once
/// @file
/// How a sharded variable's rows are cut into partitions and placed on ranks.

#include <parallax/config.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>

namespace parallax {

/// The rows of a variable cut into P contiguous partitions, placed round-robin
/// on N ranks. (TensorFlow and Parallax cut variables the same way.)
///
/// * Partition p holds rows [begin(p), begin(p) + size(p)); the first R % P
///   partitions have ceil(R/P) rows, the others floor(R/P).
/// * Partition p lives on rank p % N. With P < N some ranks hold nothing;
///   with P > N a rank holds several partitions, which spreads a hot range of
///   rows (low word ids under Zipf's law) over more ranks.
/// * A rank's shard is its partitions concatenated in increasing p, so a row
///   lives at local_row(row) of owner(row)'s shard.
///
/// All lookups are O(1) and usable in kernels.
struct PartitionMap {
  std::size_t rows = 0;
  int parts = 1;
  int ranks = 1;

  PartitionMap() = default;
  PartitionMap(std::size_t rows_, int parts_, int ranks_) : rows(rows_), parts(parts_), ranks(ranks_) {
    PARALLAX_EXPECTS(ranks_ >= 1, "PartitionMap: rank count must be >= 1, got ", ranks_);
    PARALLAX_EXPECTS(parts_ >= 1 && static_cast<std::size_t>(parts_) <= std::max<std::size_t>(rows_, 1),
                     "PartitionMap: partition count must be in [1, rows = ", rows_, "], got ", parts_);
  }

  PARALLAX_HOST_DEVICE std::size_t base() const noexcept { return rows / static_cast<std::size_t>(parts); }
  PARALLAX_HOST_DEVICE std::size_t extra() const noexcept { return rows % static_cast<std::size_t>(parts); }

  /// First row of partition p.
  PARALLAX_HOST_DEVICE std::size_t begin(int p) const noexcept {
    const auto up = static_cast<std::size_t>(p);
    return up * base() + (up < extra() ? up : extra());
  }
  /// Rows in partition p.
  PARALLAX_HOST_DEVICE std::size_t size(int p) const noexcept {
    return base() + (static_cast<std::size_t>(p) < extra() ? 1 : 0);
  }
  /// The partition holding a row.
  PARALLAX_HOST_DEVICE int partition_of(index_t row) const noexcept {
    const auto r = static_cast<std::size_t>(row);
    const std::size_t big = extra() * (base() + 1);  // rows in the larger partitions
    if (r < big) return static_cast<int>(r / (base() + 1));
    return static_cast<int>(extra() + (r - big) / base());
  }
  PARALLAX_HOST_DEVICE int owner_of_partition(int p) const noexcept { return p % ranks; }
  /// The rank holding a row.
  PARALLAX_HOST_DEVICE int owner(index_t row) const noexcept { return owner_of_partition(partition_of(row)); }

  /// Where partition p starts in its owner's shard (in rows).
  PARALLAX_HOST_DEVICE std::size_t shard_offset(int p) const noexcept {
    const int o = p % ranks;
    const auto t = static_cast<std::size_t>(p / ranks);  // p is the owner's t-th partition
    return t * base() + larger_before(o, t);
  }
  /// A row's index in its owner's shard.
  PARALLAX_HOST_DEVICE std::size_t local_row(index_t row) const noexcept {
    const int p = partition_of(row);
    return shard_offset(p) + (static_cast<std::size_t>(row) - begin(p));
  }
  /// Partitions on rank r.
  PARALLAX_HOST_DEVICE std::size_t partitions_on(int r) const noexcept {
    return r < parts ? static_cast<std::size_t>((parts - r + ranks - 1) / ranks) : 0;
  }
  /// Rows in rank r's shard.
  PARALLAX_HOST_DEVICE std::size_t shard_rows(int r) const noexcept {
    const std::size_t t = partitions_on(r);
    return t * base() + larger_before(r, t);
  }
  /// The global row at index `local` of rank r's shard (host-side; O(log P)).
  index_t global_row(int r, std::size_t local) const noexcept {
    // Binary search the owner's t-th partition.
    std::size_t lo = 0, hi = partitions_on(r);
    while (hi - lo > 1) {
      const std::size_t mid = (lo + hi) / 2;
      if (shard_offset(r + static_cast<int>(mid) * ranks) <= local) lo = mid;
      else hi = mid;
    }
    const int p = r + static_cast<int>(lo) * ranks;
    return static_cast<index_t>(begin(p) + (local - shard_offset(p)));
  }

 private:
  /// How many of rank o's first t partitions (o, o+N, ...) are the larger kind.
  PARALLAX_HOST_DEVICE std::size_t larger_before(int o, std::size_t t) const noexcept {
    const auto uo = static_cast<std::size_t>(o), un = static_cast<std::size_t>(ranks);
    if (extra() <= uo) return 0;
    const std::size_t larger = (extra() - uo + un - 1) / un;  // partitions o + kN < extra
    return t < larger ? t : larger;
  }
};

}  // namespace parallax
