#pragma once
/// @file
/// CudaSpace: device memory from cudaMalloc, kernels on a CUDA stream. Gives
/// `space_traits<CudaSpace>`, `Exec<CudaSpace>` and the CudaSpace `for_each`,
/// so code written against space.hpp's portable interface runs on the GPU.
/// nvcc only.
///
/// Ordering: space_traits calls run on the legacy default stream and return
/// when done. Streams an Exec creates are blocking streams (not
/// cudaStreamNonBlocking), which the legacy default stream orders with, so a
/// space_traits copy after a for_each on any parallax stream sees its result.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/cuda/space.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/cuda/error.cuh>
#include <parallax/space.hpp>

#include <thrust/system/cuda/execution_policy.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace parallax {

namespace detail {

/// The last error a noexcept release (cudaFree, cudaStreamDestroy) met, as a
/// cudaError_t; cudaSuccess if none. Destructors cannot throw, so they record
/// it here (and clear CUDA's last error) instead.
inline std::atomic<int> cuda_release_error{cudaSuccess};

inline void record_release_error(cudaError_t status) noexcept {
  if (status == cudaSuccess) return;
  // At exit the runtime may be torn down before static buffers are freed:
  // that is not a failure of the program.
  if (status != cudaErrorCudartUnloading) cuda_release_error.store(status, std::memory_order_relaxed);
  (void)cudaGetLastError();
}

/// Runs a copy or fill on the legacy default stream and waits for it: the
/// space_traits calls are synchronous (set-up work), and the legacy stream
/// orders them after earlier work on every blocking stream.
inline void finish_on_legacy_stream(cudaError_t issued, const char* call, const char* file, int line) {
  if (issued != cudaSuccess) throw_cuda_error(issued, call, file, line);
  const cudaError_t done = cudaStreamSynchronize(cudaStreamLegacy);
  if (done != cudaSuccess) throw_cuda_error(done, call, file, line);
}

}  // namespace detail

/// Allocation and bulk copies in device memory (cudaMalloc; no managed
/// memory, so a host dereference is a bug the hardware reports).
template <>
struct space_traits<CudaSpace> {
  /// cudaMalloc returns at least 256-byte aligned memory.
  static constexpr std::size_t alignment = 256;

  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess)
      detail::throw_cuda_error(status, "cudaMalloc(&p, bytes)", __FILE__, __LINE__,
                               detail::concat("allocating ", bytes, " bytes of device memory"));
    return p;
  }
  /// Never throws; a failure is kept in detail::cuda_release_error.
  static void deallocate(void* p) noexcept {
    if (p) detail::record_release_error(cudaFree(p));
  }
  /// Device to device.
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::finish_on_legacy_stream(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cudaStreamLegacy),
                                    "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)", __FILE__, __LINE__);
  }
  /// Device to host memory (pageable or pinned).
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::finish_on_legacy_stream(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy),
                                    "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost)", __FILE__, __LINE__);
  }
  /// Host memory (pageable or pinned) to device.
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    detail::finish_on_legacy_stream(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy),
                                    "cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice)", __FILE__, __LINE__);
  }
  static void zero(void* dst, std::size_t bytes) {
    if (bytes == 0) return;
    detail::finish_on_legacy_stream(cudaMemsetAsync(dst, 0, bytes, cudaStreamLegacy),
                                    "cudaMemsetAsync(dst, 0, bytes)", __FILE__, __LINE__);
  }
};

/// Kernels and copies on one CUDA stream.
///
/// A default-constructed Exec uses the legacy default stream. `Exec(stream)`
/// borrows a stream the caller keeps alive; `Exec::create()` makes a new
/// stream that the Exec and its copies share and the last of them destroys.
template <>
class Exec<CudaSpace> {
 public:
  using space = CudaSpace;

  /// The legacy default stream.
  Exec() noexcept = default;
  /// Borrows `stream`; the caller keeps it alive while this Exec is used.
  explicit Exec(cudaStream_t stream) noexcept : stream_(stream) {}

  /// An Exec on a new stream it owns (shared by its copies). The stream is
  /// blocking (cudaStreamDefault): it stays ordered with the legacy default
  /// stream that space_traits<CudaSpace> uses.
  /// @param priority stream priority (lower is more urgent; 0 is the default)
  static Exec create(int priority = 0) {
    cudaStream_t s = nullptr;
    PARALLAX_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamDefault, priority));
    Exec ex(s);
    ex.owned_ = std::shared_ptr<CUstream_st>(s, [](cudaStream_t p) noexcept {
      detail::record_release_error(cudaStreamDestroy(p));
    });
    return ex;
  }

  cudaStream_t stream() const noexcept { return stream_; }
  /// True when this Exec (with its copies) owns its stream.
  bool owns_stream() const noexcept { return static_cast<bool>(owned_); }

  /// The Thrust execution policy for sorts, scans and searches on this stream.
  /// par_nosync: algorithms that return nothing to the host (sequence, sort)
  /// stay asynchronous and are ordered by the stream; those that must read a
  /// result back (unique_by_key_copy, find_if, reduce) still synchronise.
  auto thrust_policy() const { return thrust::cuda::par_nosync.on(stream_); }

  /// Copies bytes within device memory, ordered with this stream's kernels;
  /// asynchronous with respect to the host.
  void copy(void* dst, const void* src, std::size_t bytes) const {
    if (bytes == 0) return;
    PARALLAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  /// Waits until every kernel and copy issued on this stream has finished.
  void synchronize() const { PARALLAX_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = cudaStreamLegacy;
  std::shared_ptr<CUstream_st> owned_;
};

namespace detail {

/// Threads per block of for_each, and a cap on its grid: beyond that the grid
/// strides (more blocks than the GPU holds at once buy nothing).
inline constexpr unsigned cuda_block_size = 256;
inline constexpr std::size_t cuda_max_blocks = std::size_t{1} << 16;

template <class F>
__global__ void for_each_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

/// for_each_rows' kernel: a block is `blockDim.y` rows of `blockDim.x`
/// threads across the columns, so neighbouring threads touch neighbouring
/// elements of a row and no thread divides a flat index by `cols` (a 64-bit
/// division costs tens of instructions on the GPU).
template <class F>
__global__ void for_each_rows_kernel(std::size_t rows, std::size_t cols, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.y;
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += stride)
    for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) f(r, c);
}

}  // namespace detail

/// Calls `f(r, c)` for every r in [0, rows) and c in [0, cols) on the GPU, on
/// the Exec's stream, asynchronously: one thread per element of a row (up to
/// 256 columns; wider rows loop), several rows per block.
template <class F>
void for_each_rows(const Exec<CudaSpace>& ex, std::size_t rows, std::size_t cols, F f) {
  if (rows == 0 || cols == 0) return;
  unsigned tx = 1;
  while (tx < cols && tx < detail::cuda_block_size) tx *= 2;
  const unsigned ty = detail::cuda_block_size / tx;
  const std::size_t blocks = std::min((rows + ty - 1) / ty, detail::cuda_max_blocks);
  detail::for_each_rows_kernel<<<static_cast<unsigned>(blocks), dim3(tx, ty), 0, ex.stream()>>>(rows, cols, f);
  PARALLAX_CUDA_CHECK(cudaGetLastError());
}

/// Calls `f(i)` for every i in [0, n) on the GPU, on the Exec's stream,
/// asynchronously: a grid-stride kernel. `f` is copied to the device, so it
/// must capture device pointers and values, not host references. Throws
/// cuda_error if the launch fails (the launch error is cleared).
template <class F>
void for_each(const Exec<CudaSpace>& ex, std::size_t n, F f, Cost = {}) {
  if (n == 0) return;
  const std::size_t blocks = std::min((n + detail::cuda_block_size - 1) / detail::cuda_block_size, detail::cuda_max_blocks);
  detail::for_each_kernel<<<static_cast<unsigned>(blocks), detail::cuda_block_size, 0, ex.stream()>>>(n, f);
  PARALLAX_CUDA_CHECK(cudaGetLastError());
}

}  // namespace parallax
