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

#include <cstddef>
#include <cstdint>

namespace parallax::detail {

/// Rows on the wire: a block of k rows is k ids (int64) followed by k*cols
/// values, padded to a multiple of 8 bytes so the next block's ids stay
/// aligned. One message per block instead of two halves the calls.
template <class T>
struct RowBlock {
  static_assert(alignof(T) <= alignof(index_t), "row values must not need more alignment than the ids");
  PARALLAX_HOST_DEVICE static std::size_t bytes(std::size_t k, std::size_t cols) {
    const std::size_t raw = k * (sizeof(index_t) + cols * sizeof(T));
    return (raw + 7) / 8 * 8;
  }
  PARALLAX_HOST_DEVICE static index_t* ids(std::byte* block) { return reinterpret_cast<index_t*>(block); }
  PARALLAX_HOST_DEVICE static T* values(std::byte* block, std::size_t k) {
    return reinterpret_cast<T*>(block + k * sizeof(index_t));
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
  // Used by the CudaSpace path only (cuda/coalesce.cuh): CUB's input
  // positions and run lengths, and its temporary storage.
  Buffer<index_t, Space> positions;
  Buffer<std::byte, Space> temp;
};

template <class T>
struct SumSegments {
  RowsAt<T> values;
  const index_t* order;
  const index_t* starts;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t seg, std::size_t col) const {
    T acc = T(0);
    for (index_t k = starts[seg]; k < starts[seg + 1]; ++k) acc += values.row(static_cast<std::size_t>(order[k]), cols)[col];
    out[seg * cols + col] = acc;
  }
};

/// SumSegments by whole segments, for the host: a task per segment adds its
/// rows one at a time, each a loop along the row that vectorises. The same
/// additions in the same order as SumSegments (starting from zero), so the
/// same bits. Why not SumSegments' element per index on the host: its inner
/// loop runs down a segment and does not vectorise (docs/benchmarks.md,
/// "Kernel choices").
///
/// The rows are read in `order`, scattered over the input: each one read
/// asks for the row prefetch_rows_ahead(cols) places further in that order
/// (the segments of a thread follow each other, so that is the row it
/// reads then).
template <class T>
struct SumSegmentRows : SumSegments<T> {
  std::size_t n;  // rows in all (order's length)
  void operator()(std::size_t seg) const {
    const std::size_t width = this->cols, ahead = prefetch_rows_ahead(width);
    T* o = this->out + seg * width;
    const auto first = static_cast<std::size_t>(this->starts[seg]), last = static_cast<std::size_t>(this->starts[seg + 1]);
    for (std::size_t k = first; k < last; ++k) {
      if (k + ahead < n) prefetch_bytes(this->values.row(static_cast<std::size_t>(this->order[k + ahead]), width), width * sizeof(T));
      const T* row = this->values.row(static_cast<std::size_t>(this->order[k]), width);
      if (k == first) {
#pragma omp simd
        for (std::size_t c = 0; c < width; ++c) o[c] = T(0) + row[c];
      } else {
#pragma omp simd
        for (std::size_t c = 0; c < width; ++c) o[c] += row[c];
      }
    }
  }
};

/// out[seg] = the sum of rows order[starts[seg] .. starts[seg + 1]) of
/// `values`, in that order, for seg < m; n rows in all. A thread per element.
template <class T, class Space>
void sum_segments(const Exec<Space>& ex, identity_t<RowsAt<T>> values, const index_t* order, const index_t* starts,
                  std::size_t m, std::size_t, std::size_t cols, T* out) {
  for_each_rows(ex, m, cols, SumSegments<T>{values, order, starts, out, cols});
}
/// The host: a task per segment (SumSegmentRows).
template <class T>
void sum_segments(const Exec<HostSpace>& ex, identity_t<RowsAt<T>> values, const index_t* order, const index_t* starts,
                  std::size_t m, std::size_t n, std::size_t cols, T* out) {
  if (m == 0 || cols == 0) return;
  for_each(ex, m, SumSegmentRows<T>{{values, order, starts, out, cols}, n}, Cost{cols * ((n + m - 1) / m)});
}

struct SetValue {
  index_t* where;
  index_t value;
  PARALLAX_HOST_DEVICE void operator()(std::size_t) const { *where = value; }
};

/// coalesce_rows with Thrust algorithms, for every space (the HostSpace path).
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
  out_ids.resize(m);
  out_values.resize_discard(m * cols);
  sum_segments(ex, values, scratch.order.data(), scratch.starts.data(), m, n, cols, out_values.data());
  return m;
}

}  // namespace parallax::detail
