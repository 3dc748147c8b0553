#pragma once
// Row algorithms shared by every space: coalescing (sort rows, sum
// duplicates), gathers and scatters of rows, id validation. Written once over
// Exec<Space> (Thrust policy + for_each); kernels are named functors so no
// extended-lambda flag is needed under nvcc.

#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/binary_search.h>
#include <thrust/find.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/mismatch.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/unique.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

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
/// row i starts at base + at[i] (in elements), or at base + i * cols when
/// `at` is null. Lets a coalesce read rows where a message left them.
template <class T>
struct RowsAt {
  const T* base = nullptr;
  const index_t* at = nullptr;
  RowsAt() = default;
  PARALLAX_HOST_DEVICE RowsAt(const T* rows, const index_t* offsets = nullptr) : base(rows), at(offsets) {}
  PARALLAX_HOST_DEVICE const T* row(std::size_t i, std::size_t cols) const {
    return base + (at ? static_cast<std::size_t>(at[i]) : i * cols);
  }
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
/// same bits; 3-4x faster on the host than SumSegments' element per index
/// with its own inner loop (rows of 257 floats, bench of this task).
template <class T>
struct SumSegmentRows : SumSegments<T> {
  void operator()(std::size_t seg) const {
    const std::size_t width = this->cols;
    T* o = this->out + seg * width;
    const index_t first = this->starts[seg], last = this->starts[seg + 1];
    const T* row = this->values.row(static_cast<std::size_t>(this->order[first]), width);
#pragma omp simd
    for (std::size_t c = 0; c < width; ++c) o[c] = T(0) + row[c];
    for (index_t k = first + 1; k < last; ++k) {
      row = this->values.row(static_cast<std::size_t>(this->order[k]), width);
#pragma omp simd
      for (std::size_t c = 0; c < width; ++c) o[c] += row[c];
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
  for_each(ex, m, SumSegmentRows<T>{{values, order, starts, out, cols}}, Cost{cols * ((n + m - 1) / m)});
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

#if PARALLAX_HAS_CUDA
/// The CudaSpace path, with CUB (cuda/coalesce.cuh, included at the end).
template <class T>
std::size_t coalesce_rows_cub(const Exec<CudaSpace>& ex, const index_t* ids, const T* values, std::size_t n,
                              std::size_t cols, Buffer<index_t, CudaSpace>& out_ids,
                              Buffer<T, CudaSpace>& out_values, CoalesceScratch<CudaSpace>& scratch);
#endif

/// Sorts `n` (id, row) pairs by id and sums the rows of equal ids, in the
/// order the pairs appear (so the result is deterministic and, for input
/// concatenated by rank, summed by row and then by rank). Writes the m unique
/// ids, ascending, to out_ids and their summed rows to out_values; returns m.
/// `values` are contiguous rows (a pointer) or rows where they lie
/// (RowsAt). Output buffers must not alias the input. CudaSpace runs CUB
/// (cuda/coalesce.cuh) on contiguous rows, every other case Thrust; both
/// give the same bits.
template <class T, class Space>
std::size_t coalesce_rows(const Exec<Space>& ex, const index_t* ids, identity_t<RowsAt<T>> values, std::size_t n,
                          std::size_t cols, Buffer<index_t, Space>& out_ids, Buffer<T, Space>& out_values,
                          CoalesceScratch<Space>& scratch) {
#if PARALLAX_HAS_CUDA
  if constexpr (std::is_same_v<Space, CudaSpace>)
    if (values.at == nullptr) return coalesce_rows_cub(ex, ids, values.base, n, cols, out_ids, out_values, scratch);
#endif
  return coalesce_rows_thrust(ex, ids, values, n, cols, out_ids, out_values, scratch);
}

/// Rows that arrived as RowBlocks, one per source at byte offsets of a
/// receive buffer: their ids copied out end to end (a coalesce sorts them),
/// their values read where they landed on the host (values(), a RowsAt) and
/// copied end to end in other spaces (CUB's coalesce reads contiguous,
/// aligned rows). The host view is valid while the receive buffer is.
template <class T, class Space>
class ReceivedRows {
 public:
  static constexpr bool in_place = std::is_same_v<Space, HostSpace>;

  /// Takes rows[p] rows of `cols` values from each source p < sources, in
  /// source order, from the RowBlock at recv + offsets[p] (bytes).
  void unpack(const Exec<Space>& ex, const std::byte* recv, const std::size_t* offsets, const std::size_t* rows,
              std::size_t sources, std::size_t cols) {
    std::size_t total = 0;
    for (std::size_t p = 0; p < sources; ++p) total += rows[p];
    ids_.resize_discard(total);
    if constexpr (in_place) at_.resize_discard(cols ? total : 0);
    else values_.resize_discard(total * cols);
    std::size_t first = 0;
    for (std::size_t p = 0; p < sources; ++p) {
      const std::size_t r = rows[p];
      if (!r) continue;
      std::byte* block = const_cast<std::byte*>(recv) + offsets[p];
      ex.copy(ids_.data() + first, RowBlock<T>::ids(block), r * sizeof(index_t));
      if (cols) {
        if constexpr (in_place) {
          // RowBlocks start at multiples of 8 bytes and hold 8-byte ids, so
          // the values start at a whole number of T from the buffer.
          const std::size_t at = (offsets[p] + r * sizeof(index_t)) / sizeof(T);
          for (std::size_t i = 0; i < r; ++i) at_.data()[first + i] = static_cast<index_t>(at + i * cols);
        } else {
          ex.copy(values_.data() + first * cols, RowBlock<T>::values(block, r), r * cols * sizeof(T));
        }
      }
      first += r;
    }
    if constexpr (in_place) view_ = RowsAt<T>{reinterpret_cast<const T*>(recv), at_.data()};
    else view_ = RowsAt<T>{values_.data()};
  }

  std::size_t size() const noexcept { return ids_.size(); }
  const index_t* ids() const noexcept { return ids_.data(); }
  RowsAt<T> values() const noexcept { return view_; }

 private:
  Buffer<index_t, Space> ids_, at_;
  Buffer<T, Space> values_;
  RowsAt<T> view_;
};

/// A stable counting sort by a small key, in host memory: the k items
/// grouped by key(i) in [0, groups), in input order within a group. Writes
/// first[g], where group g starts (groups + 1 entries, first[groups] = k),
/// and calls place(i, at) with each item's place. Two passes over the items,
/// O(k + groups): what grouping rows by their destination rank takes (for
/// 8,192 ids about 35 us, against 375 us for a sort, unique and binary
/// search of their keys).
template <class Key, class Place>
void group_stably(std::size_t k, std::size_t groups, Key&& key, index_t* first, Place&& place) {
  std::fill(first, first + groups + 1, index_t{0});
  for (std::size_t i = 0; i < k; ++i) ++first[static_cast<std::size_t>(key(i)) + 1];
  for (std::size_t g = 0; g < groups; ++g) first[g + 1] += first[g];
  // first[g] serves as group g's cursor, which leaves it at group g + 1's
  // start; shifting back by one restores the starts (no scratch array).
  for (std::size_t i = 0; i < k; ++i) place(i, first[static_cast<std::size_t>(key(i))]++);
  std::copy_backward(first, first + groups, first + groups + 1);
  first[0] = 0;
}

struct OutOfRange {
  index_t rows;
  PARALLAX_HOST_DEVICE bool operator()(index_t id) const { return id < 0 || id >= rows; }
};

/// True when ids[0 .. n) are strictly ascending (sorted, no duplicates): the
/// order a coalesce leaves, so such ids need no sort, and rows aligned to
/// them no reordering. One pass over the ids.
template <class Space>
bool strictly_ascending(const Exec<Space>& ex, const index_t* ids, std::size_t n) {
  if (n < 2) return true;
  // The first i with !(ids[i] < ids[i + 1]), if any.
  const index_t* stop = with_thrust(ex, n, [&](auto policy) {
    return thrust::mismatch(policy, ids, ids + n - 1, ids + 1, thrust::less<index_t>()).first;
  });
  return stop == ids + n - 1;
}

/// The position of the first id outside [0, rows), if any.
template <class Space>
std::optional<std::size_t> find_out_of_range(const Exec<Space>& ex, const index_t* ids, std::size_t n,
                                             std::size_t rows) {
  if (n == 0) return std::nullopt;
  const index_t* hit = with_thrust(ex, n, [&](auto policy) {
    return thrust::find_if(policy, ids, ids + n, OutOfRange{static_cast<index_t>(rows)});
  });
  if (hit == ids + n) return std::nullopt;
  return static_cast<std::size_t>(hit - ids);
}

/// Reads one element of a buffer in any space.
template <class T, class Space>
T read_one(const T* p) {
  T v{};
  space_traits<Space>::copy_to_host(&v, p, sizeof(T));
  return v;
}

/// out[i*cols + c] = table[rows[i]*cols + c]   (for_each_rows over i, c)
template <class T>
struct GatherRows {
  const T* table;
  const index_t* rows;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i, std::size_t c) const {
    out[i * cols + c] = table[static_cast<std::size_t>(rows[i]) * cols + c];
  }
  void prefetch(std::size_t i) const { prefetch_bytes(table + static_cast<std::size_t>(rows[i]) * cols, cols * sizeof(T)); }
};

/// table[rows[i]*cols + c] += values[i*cols + c]; rows must be unique.
template <class T>
struct ScatterAddRows {
  T* table;
  const index_t* rows;
  const T* values;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i, std::size_t c) const {
    table[static_cast<std::size_t>(rows[i]) * cols + c] += values[i * cols + c];
  }
};

/// out[i] = base[i] - offset
struct Subtract {
  const index_t* in;
  index_t* out;
  index_t offset;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = in[i] - offset; }
};

}  // namespace parallax::detail

#if PARALLAX_HAS_CUDA
#include <parallax/cuda/coalesce.cuh>
#endif
