#pragma once
/// @file
/// Coalescing rows on the GPU with CUB: what detail::coalesce_rows runs for
/// CudaSpace (detail/algorithms.hpp dispatches here in nvcc translation
/// units). Same result, bit for bit, as the Thrust path: the sort is stable,
/// and each output element is summed sequentially in the order its rows were
/// added. nvcc only.
///
///   0. cub::DeviceReduce::Min / Max of the ids: the sort only looks at the
///      bits the largest id uses (3 passes for 2M rows instead of 8; all 64
///      bits if an id is negative);
///   1. cub::DeviceRadixSort::SortPairs: keys = row ids, values = positions
///      0..n-1 (a radix sort is stable, so equal ids keep their order);
///   2. cub::DeviceRunLengthEncode::Encode: the m unique ids and the length
///      of each run (m is read back: the one synchronisation);
///   3. cub::DeviceScan::InclusiveSum of the lengths: segment starts;
///   4. one thread per (unique row, column) sums its segment (SumSegments),
///      or per 16 bytes of columns where rows allow (SumSegmentsPacked).
///
/// Two synchronisations: the id range (step 0) and the run count (step 2).
/// Temporary storage and the index arrays live in the caller's
/// CoalesceScratch, so a training loop allocates nothing after its first
/// steps.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/cuda/coalesce.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/cuda/error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/detail/row_sums.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_reduce.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace parallax::detail {

/// out[i] = i
struct Iota {
  index_t* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = static_cast<index_t>(i); }
};

/// 16 bytes of a row: what one thread of the wide segment sum loads at once.
template <class T>
struct alignas(16) RowPack {
  static constexpr int width = static_cast<int>(16 / sizeof(T));
  T v[width];
};

/// SumSegments over 16-byte packs of columns: a thread keeps 16 bytes in
/// flight per row instead of one element, so that the sum approaches the
/// device's memory bandwidth (docs/benchmarks.md, "Kernel choices").
/// Each element is still summed in the order of its segment: same bits.
template <class T>
struct SumSegmentsPacked {
  const RowPack<T>* values;
  const index_t* order;
  const index_t* starts;
  RowPack<T>* out;
  std::size_t packs;  // per row
  __device__ void operator()(std::size_t seg, std::size_t p) const {
    RowPack<T> acc;
    for (int i = 0; i < RowPack<T>::width; ++i) acc.v[i] = T(0);
    for (index_t k = starts[seg]; k < starts[seg + 1]; ++k) {
      const RowPack<T> x = values[static_cast<std::size_t>(order[k]) * packs + p];
      for (int i = 0; i < RowPack<T>::width; ++i) acc.v[i] += x.v[i];
    }
    out[seg * packs + p] = acc;
  }
};

/// coalesce_rows for CudaSpace (see detail/algorithms.hpp for the contract).
/// Inputs of more than INT_MAX rows (CUB's run-length encoding counts in
/// int) take the Thrust path, which gives the same result.
template <class T>
std::size_t coalesce_rows_cub(const Exec<CudaSpace>& ex, const index_t* ids, const T* values, std::size_t n,
                              std::size_t cols, Buffer<index_t, CudaSpace>& out_ids,
                              Buffer<T, CudaSpace>& out_values, CoalesceScratch<CudaSpace>& scratch) {
  if (n > static_cast<std::size_t>(INT_MAX))
    return coalesce_rows_thrust(ex, ids, values, n, cols, out_ids, out_values, scratch);
  out_ids.resize_discard(n);
  if (n == 0) {
    out_values.resize_discard(0);
    out_ids.resize_discard(0);
    return 0;
  }
  const cudaStream_t s = ex.stream();
  const int items = static_cast<int>(n);
  scratch.keys.resize_discard(n);        // ids, sorted
  scratch.order.resize_discard(n);       // input position of each sorted id
  scratch.positions.resize_discard(n);   // 0..n-1, then the run lengths
  scratch.starts.resize_discard(n + 1);  // segment starts; starts[n] first receives the run count
  index_t* keys = scratch.keys.data();
  index_t* order = scratch.order.data();
  index_t* positions = scratch.positions.data();
  index_t* starts = scratch.starts.data();
  for_each(ex, n, Iota{positions});

  // The id range, in starts[0..1] (overwritten by the scan below).
  std::size_t min_bytes = 0, max_bytes = 0;
  PARALLAX_CUDA_CHECK(cub::DeviceReduce::Min(nullptr, min_bytes, ids, starts, items, s));
  PARALLAX_CUDA_CHECK(cub::DeviceReduce::Max(nullptr, max_bytes, ids, starts + 1, items, s));
  scratch.temp.resize_discard(std::max({min_bytes, max_bytes, std::size_t{1}}));
  std::size_t temp_bytes = scratch.temp.size();
  PARALLAX_CUDA_CHECK(cub::DeviceReduce::Min(scratch.temp.data(), temp_bytes, ids, starts, items, s));
  temp_bytes = scratch.temp.size();
  PARALLAX_CUDA_CHECK(cub::DeviceReduce::Max(scratch.temp.data(), temp_bytes, ids, starts + 1, items, s));
  index_t range[2] = {0, 0};
  PARALLAX_CUDA_CHECK(cudaMemcpyAsync(range, starts, sizeof range, cudaMemcpyDeviceToHost, s));
  PARALLAX_CUDA_CHECK(cudaStreamSynchronize(s));
  int end_bit = static_cast<int>(sizeof(index_t) * 8);
  if (range[0] >= 0) {
    end_bit = 1;
    while (end_bit < 63 && (range[1] >> end_bit) != 0) ++end_bit;
  }

  std::size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  PARALLAX_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, keys, positions, order, items, 0, end_bit, s));
  PARALLAX_CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, keys, out_ids.data(), positions,
                                                         starts + n, items, s));
  PARALLAX_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, positions, starts + 1, items, s));
  temp_bytes = std::max({sort_bytes, rle_bytes, scan_bytes, std::size_t{1}});
  scratch.temp.resize_discard(temp_bytes);
  void* temp = scratch.temp.data();

  PARALLAX_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, keys, positions, order, items, 0, end_bit, s));
  temp_bytes = scratch.temp.size();
  PARALLAX_CUDA_CHECK(
      cub::DeviceRunLengthEncode::Encode(temp, temp_bytes, keys, out_ids.data(), positions, starts + n, items, s));
  index_t runs = 0;
  PARALLAX_CUDA_CHECK(cudaMemcpyAsync(&runs, starts + n, sizeof(index_t), cudaMemcpyDeviceToHost, s));
  PARALLAX_CUDA_CHECK(cudaStreamSynchronize(s));
  const auto m = static_cast<std::size_t>(runs);

  PARALLAX_CUDA_CHECK(cudaMemsetAsync(starts, 0, sizeof(index_t), s));
  temp_bytes = scratch.temp.size();
  PARALLAX_CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, positions, starts + 1, static_cast<int>(m), s));
  out_ids.resize(m);
  out_values.resize_discard(m * cols);
  const bool packed = sizeof(T) <= 16 && 16 % sizeof(T) == 0 && (cols * sizeof(T)) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(values) % 16 == 0 &&
                      reinterpret_cast<std::uintptr_t>(out_values.data()) % 16 == 0;
  if (packed) {
    const std::size_t packs = cols * sizeof(T) / 16;
    for_each_rows(ex, m, packs,
                  SumSegmentsPacked<T>{reinterpret_cast<const RowPack<T>*>(values), order, starts,
                                       reinterpret_cast<RowPack<T>*>(out_values.data()), packs});
  } else {
    for_each_rows(ex, m, cols, SumSegments<T>{values, starts, nullptr, nullptr, out_values.data(), cols, order});
  }
  return m;
}

}  // namespace parallax::detail
