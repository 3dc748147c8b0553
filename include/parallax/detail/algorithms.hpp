#pragma once
// Row algorithms shared by every space: coalescing (sort rows, sum
// duplicates; CUB in device memory), gathers and scatters of rows, id
// validation. Written once over Exec<Space> (Thrust policy + for_each);
// kernels are named functors so no extended-lambda flag is needed under nvcc.

#include <parallax/config.hpp>
#include <parallax/detail/row_sums.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>
#if PARALLAX_HAS_CUDA
#include <parallax/cuda/coalesce.cuh>  // coalesce_rows_cub, the CudaSpace path
#endif

#include <thrust/binary_search.h>
#include <thrust/find.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/mismatch.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform_reduce.h>
#include <thrust/unique.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#if PARALLAX_HAS_CUDA
#include <parallax/cuda/coalesce.cuh>  // coalesce_rows_cub, which coalesce_rows picks for device memory
#endif

namespace parallax::detail {

/// Sorts `n` (id, row) pairs by id and sums the rows of equal ids, in the
/// order the pairs appear (so the result is deterministic and, for input
/// concatenated by rank, summed by row and then by rank). Writes the m unique
/// ids, ascending, to out_ids and their summed rows to out_values; returns m.
/// `values` are contiguous rows (a pointer) or rows where they lie
/// (RowsAt). Output buffers must not alias the input. CudaSpace runs CUB
/// (cuda/coalesce.cuh) on contiguous rows, the host a radix sort over the
/// ids' range (radix_group), every other case Thrust; all give the same
/// bits.
template <class T, class Space>
std::size_t coalesce_rows(const Exec<Space>& ex, const index_t* ids, identity_t<RowsAt<T>> values, std::size_t n,
                          std::size_t cols, Buffer<index_t, Space>& out_ids, Buffer<T, Space>& out_values,
                          CoalesceScratch<Space>& scratch) {
#if PARALLAX_HAS_CUDA
  if constexpr (std::is_same_v<Space, CudaSpace>)
    if (values.contiguous()) return coalesce_rows_cub(ex, ids, values.base, n, cols, out_ids, out_values, scratch);
#endif
  if constexpr (std::is_same_v<Space, HostSpace>)
    return coalesce_rows_host(ex, ids, values, n, cols, out_ids, out_values, scratch);
  else
    return coalesce_rows_thrust(ex, ids, values, n, cols, out_ids, out_values, scratch);
}

/// out[i] = base + narrow[i]: ids that crossed the wire as 32-bit offsets.
struct WidenIds {
  const std::uint32_t* narrow;
  index_t base;
  index_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = base + static_cast<index_t>(narrow[i]); }
};

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
  /// source order, from the RowBlock at recv + offsets[p] (bytes). Ids of
  /// `id_bytes` 4 arrived as offsets from `id_base` (RowBlock); with
  /// `id_bytes` 0 none came (ids() then holds no values).
  void unpack(const Exec<Space>& ex, const std::byte* recv, const std::size_t* offsets, const std::size_t* rows,
              std::size_t sources, std::size_t cols, std::size_t id_bytes = sizeof(index_t), index_t id_base = 0) {
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
      if (id_bytes == sizeof(index_t))
        ex.copy(ids_.data() + first, RowBlock<T>::ids(block), r * sizeof(index_t));
      else if (id_bytes)
        for_each(ex, r, WidenIds{RowBlock<T>::narrow_ids(block), id_base, ids_.data() + first});
      if (cols) {
        if constexpr (in_place) {
          // RowBlocks start at multiples of 8 bytes and hold 8-byte ids (or
          // 4-byte ones before values of at most 4 bytes), so the values
          // start at a whole number of T from the buffer.
          const std::size_t at = (offsets[p] + r * id_bytes) / sizeof(T);
          for (std::size_t i = 0; i < r; ++i) at_.data()[first + i] = static_cast<index_t>(at + i * cols);
        } else {
          ex.copy(values_.data() + first * cols, RowBlock<T>::values(block, r, id_bytes), r * cols * sizeof(T));
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
/// O(k + groups): what grouping rows by their destination rank takes, where
/// a sort of the keys would be O(k log k) (docs/benchmarks.md,
/// "Kernel choices").
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

template <class T>
struct SquareInDouble {
  PARALLAX_HOST_DEVICE double operator()(T x) const { return static_cast<double>(x) * static_cast<double>(x); }
};

/// The sum of x[i]^2 over n elements (in Space), in double precision.
template <class T, class Space>
double sum_of_squares(const Exec<Space>& ex, const T* x, std::size_t n) {
  if (n == 0) return 0.0;
  return with_thrust(ex, n, [&](auto policy) {
    return thrust::transform_reduce(policy, x, x + n, SquareInDouble<T>{}, 0.0, thrust::plus<double>());
  });
}

/// NaN or an infinity: x - x is 0 for every finite x and NaN otherwise (no
/// <cmath> call, so the host and a device share it).
template <class T>
struct NotFinite {
  PARALLAX_HOST_DEVICE bool operator()(T v) const {
    const T d = v - v;
    return !(d == d);
  }
};

/// The position of the first NaN or infinity among values[0 .. n), if any.
/// On the host a pass of integer tests of the exponent bits (all ones),
/// which vectorises, over blocks in parallel, then a scan of the first
/// flagged block; on a device a find_if. Needs IEEE floats, which
/// -ffinite-math-only does not promise.
template <class T, class Space>
std::optional<std::size_t> find_non_finite(const Exec<Space>& ex, const T* values, std::size_t n) {
  static_assert(std::is_floating_point_v<T>, "find_non_finite: floating-point values");
  if (n == 0) return std::nullopt;
  if constexpr (std::is_same_v<Space, HostSpace>) {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    static_assert(sizeof(Bits) == sizeof(T), "find_non_finite: 32- or 64-bit IEEE floats");
    constexpr Bits exponent = sizeof(T) == 4 ? Bits(0x7F800000u) : Bits(0x7FF0000000000000ull);
    constexpr std::size_t block = 4096;
    const std::size_t blocks = (n + block - 1) / block;
    std::vector<std::uint8_t> flagged(blocks);
    for_each(
        ex, blocks,
        [&](std::size_t b) {
          const std::size_t end = std::min(n, (b + 1) * block);
          Bits any = 0;
          for (std::size_t i = b * block; i < end; ++i) {
            Bits x;
            std::memcpy(&x, values + i, sizeof(x));
            any |= static_cast<Bits>((x & exponent) == exponent);
          }
          flagged[b] = any != 0;
        },
        Cost{block});
    for (std::size_t b = 0; b < blocks; ++b)
      if (flagged[b])
        for (std::size_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
          if (NotFinite<T>{}(values[i])) return i;
    return std::nullopt;
  } else {
    const T* hit = with_thrust(ex, n, [&](auto policy) { return thrust::find_if(policy, values, values + n, NotFinite<T>{}); });
    if (hit == values + n) return std::nullopt;
    return static_cast<std::size_t>(hit - values);
  }
}

/// Reads one element of a buffer in any space.
template <class T, class Space>
T read_one(const T* p) {
  T v{};
  space_traits<Space>::copy_to_host(&v, p, sizeof(T));
  return v;
}

/// out[i*cols + c] = table[rows[i]*cols + c]   (for_each_rows over i, c)
template <class T, class Stored = T>
struct GatherRows {
  const Stored* table;
  const index_t* rows;
  T* out;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i, std::size_t c) const {
    out[i * cols + c] = static_cast<T>(table[static_cast<std::size_t>(rows[i]) * cols + c]);
  }
  void prefetch(std::size_t i) const {
    prefetch_bytes(table + static_cast<std::size_t>(rows[i]) * cols, cols * sizeof(Stored));
  }
};

/// out[i] = in[i] as To (float <-> bf16 / fp16: widened exactly, or rounded
/// to nearest even).
template <class To, class From>
struct Convert {
  const From* in;
  To* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = static_cast<To>(in[i]); }
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

