#pragma once
// Rows and their sums, the part of coalescing every space shares: how rows
// lie on the wire (RowBlock) and in memory (RowsAt), the segment sums, and
// the coalesce written with Thrust that every space can run. The CUB
// coalesce (cuda/coalesce.cuh) builds on this header, and
// detail/algorithms.hpp picks between the two (coalesce_rows).

#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

namespace parallax::detail {

/// Rows on the wire: a block of k rows is k ids followed by k*cols values,
/// padded to a multiple of 8 bytes so the next block's ids stay aligned. One
/// message per block instead of two halves the calls. The ids are int64, or
/// with `id_bytes` 4 uint32 offsets from a base both ends know
/// (RowExchange::narrow_ids); values then need at most 4-byte alignment.
template <class T>
struct RowBlock {
  static_assert(alignof(T) <= alignof(index_t), "row values must not need more alignment than the ids");
  PARALLAX_HOST_DEVICE static std::size_t bytes(std::size_t k, std::size_t cols,
                                                std::size_t id_bytes = sizeof(index_t)) {
    const std::size_t raw = k * (id_bytes + cols * sizeof(T));
    return (raw + 7) / 8 * 8;
  }
  PARALLAX_HOST_DEVICE static index_t* ids(std::byte* block) { return reinterpret_cast<index_t*>(block); }
  PARALLAX_HOST_DEVICE static std::uint32_t* narrow_ids(std::byte* block) {
    return reinterpret_cast<std::uint32_t*>(block);
  }
  PARALLAX_HOST_DEVICE static T* values(std::byte* block, std::size_t k, std::size_t id_bytes = sizeof(index_t)) {
    return reinterpret_cast<T*>(block + k * id_bytes);
  }
};

/// Rows of `cols` elements, each contiguous but not necessarily end to end:
/// row i starts at rows[i] when a pointer per row is given, else at
/// base + at[i] (in elements), or at base + i * cols when `at` is null. Lets
/// a coalesce read rows where a message left them, and a route send rows of
/// several tables, each where its gradient holds it.
template <class T>
struct RowsAt {
  const T* base = nullptr;
  const index_t* at = nullptr;
  const T* const* rows = nullptr;
  RowsAt() = default;
  PARALLAX_HOST_DEVICE RowsAt(const T* values, const index_t* offsets = nullptr) : base(values), at(offsets) {}
  PARALLAX_HOST_DEVICE explicit RowsAt(const T* const* each) : rows(each) {}
  PARALLAX_HOST_DEVICE const T* row(std::size_t i, std::size_t cols) const {
    if (rows) return rows[i];
    return base + (at ? static_cast<std::size_t>(at[i]) : i * cols);
  }
  /// Contiguous rows end to end (what CUB's coalesce reads).
  PARALLAX_HOST_DEVICE bool contiguous() const { return rows == nullptr && at == nullptr; }
};

/// T itself, in a context template deduction does not look at (C++20's
/// std::type_identity_t): lets a RowsAt<T> parameter take a plain pointer.
template <class T>
struct identity {
  using type = T;
};
template <class T>
using identity_t = typename identity<T>::type;

/// Scratch buffers for coalesce_rows, kept across steps.
template <class Space>
struct CoalesceScratch {
  Buffer<index_t, Space> keys;
  Buffer<index_t, Space> order;
  Buffer<index_t, Space> starts;
  // CUB's input positions and run lengths, and its temporary storage
  // (cuda/coalesce.cuh); the host's radix passes (radix_group).
  Buffer<index_t, Space> positions;
  Buffer<std::byte, Space> temp;
  // The host's segment of each input row (radix_group).
  Buffer<index_t, Space> segment_of;
};

/// The sum of each segment's rows: out[s] = the sum over k in [segments[s],
/// segments[s + 1]) of weights[k] * row(k) (no weights: 1), from zero, in k
/// order, where row(k) is rows.row(order[k]) (no order: rows.row(k));
/// divided by divide[s + 1] - divide[s] when `divide` is given and that is
/// not 0. Rows of R (an owner's 16-bit shard) are widened to T, exactly, as
/// they are read. A coalesce sums each id's rows (order: the rows sorted by
/// id); bags pool their rows (bags.hpp, PoolBags). An element per call.
template <class T, class R = T>
struct SumSegments {
  RowsAt<R> rows;
  const index_t* segments;
  const T* weights;
  const index_t* divide;
  T* out;
  std::size_t cols;
  const index_t* order = nullptr;
  PARALLAX_HOST_DEVICE const R* row(std::size_t k) const {
    return rows.row(order ? static_cast<std::size_t>(order[k]) : k, cols);
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t s, std::size_t c) const {
    T acc = T(0);
    for (index_t k = segments[s]; k < segments[s + 1]; ++k) {
      const T x = static_cast<T>(row(static_cast<std::size_t>(k))[c]);
      acc += weights ? weights[k] * x : x;
    }
    if (divide) {
      const index_t count = divide[s + 1] - divide[s];
      if (count > 0) acc = acc / static_cast<T>(count);
    }
    out[s * cols + c] = acc;
  }
};

/// SumSegments by whole segments, for the host: a task per segment adds its
/// rows one at a time, each a loop along the row that vectorises. The same
/// additions in the same order as SumSegments (from zero: the first row is
/// added to 0), so the same bits. Why not SumSegments' element per index on
/// the host: its inner loop runs down a segment and does not vectorise
/// (docs/benchmarks.md, "Kernel choices").
///
/// Rows read through `order` lie scattered over the input: each one read
/// asks for the row prefetch_rows_ahead(cols) places further in that order
/// (the segments of a thread follow each other, so that is the row it reads
/// then), up to `n`, the rows in all.
template <class T, class R = T>
struct SumSegmentRows : SumSegments<T, R> {
  std::size_t n = 0;
  void operator()(std::size_t s) const {
    const std::size_t width = this->cols, ahead = prefetch_rows_ahead(width);
    T* o = this->out + s * width;
    const auto first = static_cast<std::size_t>(this->segments[s]), last = static_cast<std::size_t>(this->segments[s + 1]);
    if (first == last)
      for (std::size_t c = 0; c < width; ++c) o[c] = T(0);
    for (std::size_t k = first; k < last; ++k) {
      if (this->order && k + ahead < n) prefetch_bytes(this->row(k + ahead), width * sizeof(R));
      const R* x = this->row(k);
      if (this->weights) {
        const T w = this->weights[k];
        if (k == first) {
#pragma omp simd
          for (std::size_t c = 0; c < width; ++c) o[c] = T(0) + w * static_cast<T>(x[c]);
        } else {
#pragma omp simd
          for (std::size_t c = 0; c < width; ++c) o[c] += w * static_cast<T>(x[c]);
        }
      } else if (k == first) {
#pragma omp simd
        for (std::size_t c = 0; c < width; ++c) o[c] = T(0) + static_cast<T>(x[c]);
      } else {
#pragma omp simd
        for (std::size_t c = 0; c < width; ++c) o[c] += static_cast<T>(x[c]);
      }
    }
    if (this->divide) {
      const index_t count = this->divide[s + 1] - this->divide[s];
      if (count > 0)
        for (std::size_t c = 0; c < width; ++c) o[c] = o[c] / static_cast<T>(count);
    }
  }
};

/// Runs SumSegments over m segments: a thread per element on a device, a
/// task per segment on the host (SumSegmentRows), the team's share sized by
/// about `rows_per_segment` rows a task; `n`: the rows in all (order's
/// length, for its prefetch).
template <class T, class R, class Space>
void sum_segments(const Exec<Space>& ex, const SumSegments<T, R>& f, std::size_t m, std::size_t, std::size_t) {
  if (m) for_each_rows(ex, m, f.cols, f);
}
template <class T, class R>
void sum_segments(const Exec<HostSpace>& ex, const SumSegments<T, R>& f, std::size_t m, std::size_t n,
                  std::size_t rows_per_segment) {
  if (m == 0 || f.cols == 0) return;
  for_each(ex, m, SumSegmentRows<T, R>{f, n}, Cost{f.cols * rows_per_segment});
}

/// out[seg] = the sum of rows order[starts[seg] .. starts[seg + 1]) of
/// `values`, in that order, for seg < m; n rows in all.
template <class T, class Space>
void sum_segments(const Exec<Space>& ex, identity_t<RowsAt<T>> values, const index_t* order, const index_t* starts,
                  std::size_t m, std::size_t n, std::size_t cols, T* out) {
  sum_segments(ex, SumSegments<T>{values, starts, nullptr, nullptr, out, cols, order}, m, n, m ? (n + m - 1) / m : 0);
}

struct SetValue {
  index_t* where;
  index_t value;
  PARALLAX_HOST_DEVICE void operator()(std::size_t) const { *where = value; }
};

/// The end of every coalesce: m segments found (starts[m] = n), their sums.
template <class T, class Space>
std::size_t sum_coalesced(const Exec<Space>& ex, identity_t<RowsAt<T>> values, std::size_t n, std::size_t m,
                          std::size_t cols, Buffer<index_t, Space>& out_ids, Buffer<T, Space>& out_values,
                          CoalesceScratch<Space>& scratch) {
  out_ids.resize(m);
  out_values.resize_discard(m * cols);
  sum_segments(ex, values, scratch.order.data(), scratch.starts.data(), m, n, cols, out_values.data());
  return m;
}

/// coalesce_rows with Thrust algorithms, for every space.
template <class T, class Space>
std::size_t coalesce_rows_thrust(const Exec<Space>& ex, const index_t* ids, identity_t<RowsAt<T>> values, std::size_t n,
                                 std::size_t cols, Buffer<index_t, Space>& out_ids, Buffer<T, Space>& out_values,
                                 CoalesceScratch<Space>& scratch) {
  out_ids.resize_discard(n);
  if (n == 0) {
    out_values.resize_discard(0);
    out_ids.resize_discard(0);
    return 0;
  }
  scratch.keys.resize_discard(n);
  scratch.order.resize_discard(n);
  scratch.starts.resize_discard(n + 1);
  space_traits<Space>::copy(scratch.keys.data(), ids, n * sizeof(index_t));
  const std::size_t m = with_thrust(ex, n, [&](auto policy) {
    thrust::sequence(policy, scratch.order.data(), scratch.order.data() + n);
    thrust::stable_sort_by_key(policy, scratch.keys.data(), scratch.keys.data() + n, scratch.order.data());
    auto ends = thrust::unique_by_key_copy(policy, scratch.keys.data(), scratch.keys.data() + n,
                                           thrust::counting_iterator<index_t>(0), out_ids.data(),
                                           scratch.starts.data());
    return static_cast<std::size_t>(ends.first - out_ids.data());
  });
  for_each(ex, 1, SetValue{scratch.starts.data() + m, static_cast<index_t>(n)});
  return sum_coalesced(ex, values, n, m, cols, out_ids, out_values, scratch);
}

/// Bits needed to write v (0 for 0).
constexpr unsigned bit_width(std::uint64_t v) noexcept {
  unsigned b = 0;
  for (; v; v >>= 1) ++b;
  return b;
}

/// Groups ids[0 .. n) on the host as a stable sort would: writes the m
/// unique ids, ascending, to out_ids and returns m; into scratch, the rows'
/// positions in that order (order), where each id's rows start there
/// (starts, m + 1 entries), and for each input row i, segment_of[i] = (the
/// index of its id among the unique ones) * 2 + (1 if no row before i has
/// that id).
/// A least-significant-digit radix sort of words that hold an id's offset
/// from the smallest id above its position: the passes cover only the bits
/// the ids' range spans (two of 9 bits for ids below 2^18, where a sort of
/// 64-bit keys takes eight), and a pass whose digit is the same for every id
/// is skipped. Returns no value, writing nothing to out_ids, where offset
/// and position do not fit one 64-bit word (ids spanning more than
/// 2^(64 - log2 n)) or n does not fit 32 bits, for the caller to sort
/// otherwise.
inline std::optional<std::size_t> radix_group(const index_t* ids, std::size_t n, CoalesceScratch<HostSpace>& scratch,
                                              Buffer<index_t, HostSpace>& out_ids) {
  if (n == 0) {
    out_ids.resize_discard(0);
    scratch.starts.resize_discard(1);
    scratch.starts.data()[0] = 0;
    return std::size_t{0};
  }
  std::uint64_t low = static_cast<std::uint64_t>(ids[0]) ^ (std::uint64_t{1} << 63), high = low;
  for (std::size_t i = 1; i < n; ++i) {
    // Flipping the sign bit orders int64 as uint64.
    const std::uint64_t k = static_cast<std::uint64_t>(ids[i]) ^ (std::uint64_t{1} << 63);
    low = k < low ? k : low;
    high = k > high ? k : high;
  }
  const unsigned place = bit_width(n - 1), key_bits = bit_width(high - low);
  if (place + key_bits > 64 || n > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
  constexpr unsigned max_digit = 11;
  const unsigned passes = (key_bits + max_digit - 1) / max_digit;
  const unsigned digit = passes ? (key_bits + passes - 1) / passes : 0;
  const std::size_t buckets = std::size_t{1} << digit;
  scratch.keys.resize_discard(n);
  scratch.positions.resize_discard(n);
  scratch.temp.resize_discard(2 * passes * buckets * sizeof(std::uint32_t));
  auto* src = reinterpret_cast<std::uint64_t*>(scratch.keys.data());
  auto* dst = reinterpret_cast<std::uint64_t*>(scratch.positions.data());
  auto* counts = reinterpret_cast<std::uint32_t*>(scratch.temp.data());
  std::fill(counts, counts + 2 * passes * buckets, std::uint32_t{0});
  const std::uint64_t mask = buckets - 1;
  // Two tables of counts, for even and odd rows: frequent ids share a digit
  // (half of word_lm's ids share the high one), and counting them all in one
  // place makes each increment wait for the last.
  std::uint32_t* odd = counts + passes * buckets;
  const auto word_of = [&](std::size_t i) {
    return ((static_cast<std::uint64_t>(ids[i]) ^ (std::uint64_t{1} << 63)) - low) << place | i;
  };
  std::size_t i = 0;
  for (; i + 1 < n; i += 2) {
    const std::uint64_t a = word_of(i), b = word_of(i + 1);
    src[i] = a;
    src[i + 1] = b;
    for (unsigned p = 0; p < passes; ++p) {
      ++counts[p * buckets + ((a >> (place + p * digit)) & mask)];
      ++odd[p * buckets + ((b >> (place + p * digit)) & mask)];
    }
  }
  if (i < n) {
    src[i] = word_of(i);
    for (unsigned p = 0; p < passes; ++p) ++counts[p * buckets + ((src[i] >> (place + p * digit)) & mask)];
  }
  for (std::size_t b = 0; b < passes * buckets; ++b) counts[b] += odd[b];
  for (unsigned p = 0; p < passes; ++p) {
    std::uint32_t* c = counts + p * buckets;
    const unsigned shift = place + p * digit;
    if (static_cast<std::size_t>(c[(src[0] >> shift) & mask]) == n) continue;  // one digit for all
    std::uint32_t sum = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      const std::uint32_t here = c[b];
      c[b] = sum;
      sum += here;
    }
    for (std::size_t j = 0; j < n; ++j) dst[c[(src[j] >> shift) & mask]++] = src[j];
    std::swap(src, dst);
  }
  scratch.segment_of.resize_discard(n);
  scratch.order.resize_discard(n);
  scratch.starts.resize_discard(n + 1);
  out_ids.resize_discard(n);
  index_t* segment_of = scratch.segment_of.data();
  index_t* order = scratch.order.data();
  index_t* starts = scratch.starts.data();
  index_t* unique = out_ids.data();
  const std::uint64_t position = (std::uint64_t{1} << place) - 1;
  // Without a branch: whether an id starts a segment is as unpredictable
  // as the ids (half the time at word frequencies), so every id is written
  // at the next segment's place, which only a new id moves on.
  std::size_t m = 0;
  std::uint64_t previous = ~std::uint64_t{0};
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint64_t key = src[k] >> place;
    const bool first = key != previous;
    const std::uint64_t at = src[k] & position;
    order[k] = static_cast<index_t>(at);
    unique[m] = static_cast<index_t>((key + low) ^ (std::uint64_t{1} << 63));
    starts[m] = static_cast<index_t>(k);
    m += first;
    segment_of[at] = static_cast<index_t>((m - 1) << 1 | first);
    previous = key;
  }
  starts[m] = static_cast<index_t>(n);
  return m;
}

/// Rows added into their segment's sum in input order, on one thread: the
/// additions of SumSegmentRows (each sum from zero, then its rows in input
/// order), so the same bits, but the rows are read in the order they lie and
/// the sums (fewer, and often in cache) are the memory visited out of order,
/// each prefetched prefetch_rows_ahead(cols) rows before its row comes
/// (docs/benchmarks.md, "Row kernels").
template <class T>
PARALLAX_HOST_ISA_CLONES void add_rows_in_order(RowsAt<T> values, const index_t* segment_of, std::size_t n,
                                                std::size_t cols, T* out) {
  const std::size_t ahead = prefetch_rows_ahead(cols);
  for (std::size_t i = 0; i < n; ++i) {
    if (i + ahead < n) prefetch_bytes(out + static_cast<std::size_t>(segment_of[i + ahead] >> 1) * cols, cols * sizeof(T));
    const index_t here = segment_of[i];
    const T* row = values.row(i, cols);
    T* o = out + static_cast<std::size_t>(here >> 1) * cols;
    if (here & 1) {
#pragma omp simd
      for (std::size_t c = 0; c < cols; ++c) o[c] = T(0) + row[c];
    } else {
#pragma omp simd
      for (std::size_t c = 0; c < cols; ++c) o[c] += row[c];
    }
  }
}

/// coalesce_rows on the host: radix_group, then add_rows_in_order, both on
/// the calling thread, or Thrust's sort and SumSegmentRows where
/// radix_group cannot take the ids. One thread: threads that split the
/// input rows would each stream all of them (a thread's rows are not
/// contiguous), and splitting the segments over threads that gather their
/// rows in sorted order (SumSegmentRows) was no faster on two cores
/// (docs/benchmarks.md, "Row kernels").
template <class T>
std::size_t coalesce_rows_host(const Exec<HostSpace>& ex, const index_t* ids, identity_t<RowsAt<T>> values,
                               std::size_t n, std::size_t cols, Buffer<index_t, HostSpace>& out_ids,
                               Buffer<T, HostSpace>& out_values, CoalesceScratch<HostSpace>& scratch) {
  const std::optional<std::size_t> found = radix_group(ids, n, scratch, out_ids);
  if (!found) return coalesce_rows_thrust(ex, ids, values, n, cols, out_ids, out_values, scratch);
  const std::size_t m = *found;
  out_ids.resize(m);
  out_values.resize_discard(m * cols);
  if (m == 0 || cols == 0) return m;
  add_rows_in_order<T>(values, scratch.segment_of.data(), n, cols, out_values.data());
  return m;
}

}  // namespace parallax::detail
