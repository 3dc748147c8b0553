#pragma once
/// @file
/// What the CUDA engines need to move bytes between host and device memory:
/// where a pointer points (memory_kind), pinned host buffers that are kept
/// and grown on demand (PinnedBuffer), stream-ordered copies in any
/// direction, and the extent of a counts/displacements layout. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/cuda/memory.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/cuda/error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>

namespace parallax::detail {

/// Where a buffer handed to an engine lives. The engines take device buffers
/// (the engine's space) and, for small control messages the library keeps in
/// host vectors, host memory too; they tell the two apart per call.
enum class MemoryKind {
  host,     ///< pageable or pinned host memory (MPI reads it directly)
  device,   ///< cudaMalloc memory
  managed,  ///< cudaMallocManaged memory (device kernels and the host can both use it)
};

/// The kind of memory `p` points to. Null (an empty buffer) counts as host.
/// Unregistered host memory is not an error for cudaPointerGetAttributes
/// since CUDA 11; should a runtime report one anyway, it is cleared and the
/// pointer treated as host memory.
inline MemoryKind memory_kind(const void* p) {
  if (p == nullptr) return MemoryKind::host;
  cudaPointerAttributes a{};
  const cudaError_t status = cudaPointerGetAttributes(&a, p);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return MemoryKind::host;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice: return MemoryKind::device;
    case cudaMemoryTypeManaged: return MemoryKind::managed;
    default: return MemoryKind::host;
  }
}

/// Copies `bytes` from `src` to `dst` on `stream`, host or device on either
/// side (cudaMemcpyDefault: unified addressing tells the direction).
/// Asynchronous for pinned and device memory; a pageable host side makes
/// the CUDA runtime stage it, which may return before the copy is done, so
/// synchronise the stream before reading or reusing either side.
inline void copy_async(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return;
  PARALLAX_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

/// Page-locked host memory from cudaHostAlloc, kept across calls and grown
/// (geometrically) on demand: the staging area between device memory and
/// MPI. Move-only. Allocation is slow (it pins pages), so an engine keeps
/// its buffers for its lifetime.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      free();
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  ~PinnedBuffer() { free(); }

  /// Makes room for at least `bytes` (contents are not kept when it grows).
  std::byte* reserve(std::size_t bytes) {
    if (bytes <= capacity_) return data_;
    const std::size_t want = std::max(bytes, 2 * capacity_);
    free();
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, want, cudaHostAllocPortable);
    if (status != cudaSuccess)
      throw_cuda_error(status, "cudaHostAlloc(&p, want, cudaHostAllocPortable)", __FILE__, __LINE__,
                       concat("pinning ", want, " bytes of host memory for staging"));
    data_ = static_cast<std::byte*>(p);
    capacity_ = want;
    return data_;
  }
  std::byte* data() noexcept { return data_; }
  std::size_t capacity() const noexcept { return capacity_; }

  /// Gives up the memory without freeing it: for a buffer that MPI may still
  /// write into (an exchange abandoned before its wait), leaking is the safe
  /// choice.
  void leak() noexcept {
    data_ = nullptr;
    capacity_ = 0;
  }

 private:
  void free() noexcept {
    if (data_) record_release_error(cudaFreeHost(data_));
    data_ = nullptr;
    capacity_ = 0;
  }
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// Elements spanned by a counts/displacements layout of n blocks:
/// max over j of displs[j] + counts[j] (0 when every block is empty).
inline std::size_t layout_extent(const std::size_t* counts, const std::size_t* displs, int n) {
  std::size_t end = 0;
  for (int j = 0; j < n; ++j)
    if (counts[j] != 0) end = std::max(end, displs[j] + counts[j]);
  return end;
}

/// A CUDA event without timing (cheap to record and query), created on
/// demand and destroyed with the owner. Move-only.
class CudaEvent {
 public:
  CudaEvent() { PARALLAX_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    if (this != &o) {
      destroy();
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  ~CudaEvent() { destroy(); }

  /// Marks the point `stream` has reached; complete when the work before it is.
  void record(cudaStream_t stream) { PARALLAX_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  /// Waits until the work before the last record() has finished.
  void synchronize() { PARALLAX_CUDA_CHECK(cudaEventSynchronize(event_)); }
  /// True when the work before the last record() has finished; throws on a
  /// failure of that work.
  bool done() {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    if (status != cudaSuccess) throw_cuda_error(status, "cudaEventQuery(event)", __FILE__, __LINE__);
    return true;
  }
  cudaEvent_t get() const noexcept { return event_; }

 private:
  void destroy() noexcept {
    if (event_) record_release_error(cudaEventDestroy(event_));
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace parallax::detail
