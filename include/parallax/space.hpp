#pragma once
/// @file
/// Memory spaces (where buffers live and kernels run), execution contexts,
/// the portable `for_each`, and the owning `Buffer`.
///
/// HostSpace runs on the CPU with OpenMP and Thrust's OpenMP backend; CudaSpace
/// (parallax/cuda/space.cuh, nvcc only) runs CUDA kernels on a stream. Code
/// written against `Exec<Space>`, `Buffer<T, Space>` and `for_each` serves both.

#include <parallax/config.hpp>
#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/system/omp/execution_policy.h>

#include <sys/mman.h>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax {

/// CPU memory; kernels run as OpenMP loops.
struct HostSpace {
  static constexpr const char* name = "host";
};

/// GPU memory from cudaMalloc; kernels run on a CUDA stream. Usable in
/// translation units compiled by nvcc that include parallax/cuda/space.cuh.
struct CudaSpace {
  static constexpr const char* name = "cuda";
};

template <class Space> inline constexpr bool is_space_v = detail::is_any_of_v<Space, HostSpace, CudaSpace>;

/// Allocation and bulk copies in a space. Specialised per space; these calls
/// are synchronous (set-up work, not the per-step path).
template <class Space>
struct space_traits {
  static_assert(sizeof(Space) == 0,
                "parallax: no space_traits for this memory space; for CudaSpace include "
                "<parallax/cuda/space.cuh> and compile with nvcc");
};

template <>
struct space_traits<HostSpace> {
  static constexpr std::size_t alignment = 64;
  /// Allocations at least this large go on 2 MiB boundaries and ask the
  /// kernel for transparent huge pages (where it grants them on request):
  /// a table's scattered rows then cost a TLB miss per 2 MiB instead of
  /// per 4 KiB.
  static constexpr std::size_t huge_page = std::size_t{2} << 20;
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const bool large = bytes >= 2 * huge_page;
    void* p = nullptr;
    if (posix_memalign(&p, large ? huge_page : alignment, bytes) != 0) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (large) ::madvise(p, bytes, MADV_HUGEPAGE);  // advice: nothing happens where THP is off
#endif
    return p;
  }
  static void deallocate(void* p) noexcept { std::free(p); }
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memmove(dst, src, bytes);
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  static void copy_from_host(void* dst, const void* src, std::size_t bytes) { copy(dst, src, bytes); }
  static void zero(void* dst, std::size_t bytes) {
    if (bytes) std::memset(dst, 0, bytes);
  }
};

namespace detail {
/// Temporary storage for Thrust's algorithms (a sort's buffers), kept and
/// reused from call to call instead of allocated and freed by each. Requests
/// are rounded up to a power of two, so sizes that vary from step to step
/// (every batch touches a different number of rows) reuse a few blocks
/// rather than fragment the heap: a long job's memory stays flat
/// (bench/soak.cpp). At most twice the largest request per block in use at
/// once, plus the smaller classes seen (less than that again). Thread-safe:
/// Thrust's OpenMP sorts allocate from inside their parallel regions (each
/// thread's merge takes its own temporaries).
template <class Space>
class TempPool {
 public:
  using value_type = char;
  TempPool() = default;
  TempPool(const TempPool&) = delete;
  TempPool& operator=(const TempPool&) = delete;
  ~TempPool() {
    for (const Block& b : blocks_) space_traits<Space>::deallocate(b.data);
  }
  char* allocate(std::ptrdiff_t n) {
    std::size_t want = 256;
    while (want < static_cast<std::size_t>(n)) want *= 2;
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Block& b : blocks_)
      if (!b.busy && b.bytes == want) {
        b.busy = true;
        return b.data;
      }
    blocks_.reserve(blocks_.size() + 1);  // so the push cannot throw after the allocation
    blocks_.push_back(Block{static_cast<char*>(space_traits<Space>::allocate(want)), want, true});
    return blocks_.back().data;
  }
  void deallocate(char* p, std::size_t) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (Block& b : blocks_)
      if (b.data == p) b.busy = false;
  }
  /// Blocks held, and their bytes.
  std::size_t blocks() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size();
  }
  std::size_t bytes() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const Block& b : blocks_) total += b.bytes;
    return total;
  }

 private:
  struct Block {
    char* data;
    std::size_t bytes;
    bool busy;
  };
  mutable std::mutex mutex_;
  std::vector<Block> blocks_;
};
}  // namespace detail

/// Where a space's kernels run. For HostSpace: the calling thread and its
/// OpenMP team. For CudaSpace: one stream (parallax/cuda/space.cuh).
template <class Space>
class Exec;

template <>
class Exec<HostSpace> {
 public:
  using space = HostSpace;
  /// The Thrust execution policy for sorts, scans and searches in this
  /// space; their temporary storage comes from this context's pool (copies
  /// of the context share it).
  auto thrust_policy() const { return thrust::omp::par(temp_pool()); }
  /// The pool of thrust_policy()'s temporary storage.
  detail::TempPool<HostSpace>& temp_pool() const {
    if (!temp_) temp_ = std::make_shared<detail::TempPool<HostSpace>>();
    return *temp_;
  }
  /// Copies bytes within the space, ordered with this context's kernels.
  void copy(void* dst, const void* src, std::size_t bytes) const { space_traits<HostSpace>::copy(dst, src, bytes); }
  /// Waits until every kernel issued on this context has finished.
  void synchronize() const {}

 private:
  mutable std::shared_ptr<detail::TempPool<HostSpace>> temp_;  // made at first use
};

namespace detail {
/// Loops with less work than this (indices x Cost::per_item) run on the
/// calling thread: an OpenMP team costs more than it saves on small loops.
inline constexpr std::size_t host_parallel_threshold = std::size_t{1} << 15;
/// Thrust calls on the host over fewer elements than this run sequentially.
/// Thrust's OpenMP sorts open several parallel regions per call, which cost
/// more than a small sort itself (docs/benchmarks.md, "Kernel choices").
inline constexpr std::size_t thrust_parallel_threshold = std::size_t{1} << 16;
}  // namespace detail

/// Calls `f(policy)` with the Thrust execution policy for an algorithm over
/// `n` elements in `ex`'s space, and returns what it returns:
///
///     with_thrust(ex, n, [&](auto policy) { thrust::sort(policy, first, first + n); });
///
/// Every space but the host: ex.thrust_policy(). The host: the OpenMP policy
/// from detail::thrust_parallel_threshold elements up, else the sequential
/// one; both take their temporary storage from ex's pool.
template <class Space, class F>
decltype(auto) with_thrust(const Exec<Space>& ex, std::size_t, F&& f) {
  return std::forward<F>(f)(ex.thrust_policy());
}
template <class F>
decltype(auto) with_thrust(const Exec<HostSpace>& ex, std::size_t n, F&& f) {
  if (n >= detail::thrust_parallel_threshold) return std::forward<F>(f)(ex.thrust_policy());
  return std::forward<F>(f)(thrust::cpp::par(ex.temp_pool()));
}

/// How much work one index of a for_each does, in multiply-adds or so. The
/// host runs a loop on its OpenMP team when indices x per_item reaches
/// detail::host_parallel_threshold, so a short loop of heavy items (a row of
/// a matrix product per index) still runs in parallel; the GPU ignores it.
struct Cost {
  std::size_t per_item = 1;
};

/// Calls `f(i)` for every i in [0, n), in parallel and in no particular order.
/// `f` must be a `PARALLAX_HOST_DEVICE` functor (or lambda) taking std::size_t,
/// so the same kernel compiles for every space.
template <class F>
void for_each(const Exec<HostSpace>&, std::size_t n, F f, Cost cost = {}) {
  const auto count = static_cast<std::int64_t>(n);
  const std::size_t per_item = cost.per_item ? cost.per_item : 1;
  // maybe_unused: nvcc's front end does not see the use in the pragma.
  [[maybe_unused]] const bool team = n > 1 && n >= (detail::host_parallel_threshold + per_item - 1) / per_item;
#pragma omp parallel for schedule(static) if (team)
  for (std::int64_t i = 0; i < count; ++i) f(static_cast<std::size_t>(i));
}

namespace detail {
/// for_each_rows on spaces without their own: one flat index per element.
template <class F>
struct FlatRows {
  F f;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const { f(j / cols, j % cols); }
};
}  // namespace detail

/// Asks the host's caches for the `bytes` from `p` (a hint: faults on
/// nothing, and compiles to nothing where the compiler has no prefetch). For
/// the `prefetch(r)` of a row kernel (for_each_rows), for memory it reads or
/// writes: x86 compilers drop a prefetch for writing unless the target has
/// PREFETCHW (GCC without -mprfchw emits no instruction at all), and a line
/// fetched for reading is written from L1 just as fast on one core.
///
/// The lines go to the second-level cache (locality 2), not to L1: a core
/// keeps few L1 misses in flight and a prefetch into L1 holds one of them
/// until its line arrives, so rows prefetched into L1 far enough ahead to
/// hide DRAM's latency stall the loads of the row being worked on; L2 takes
/// many more (docs/benchmarks.md, "Row kernels").
inline void prefetch_bytes([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t bytes) noexcept {
#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
  constexpr std::size_t line = 64;
  const auto* b = static_cast<const char*>(p);
  for (std::size_t at = 0; at < bytes; at += line) {
    __builtin_prefetch(b + at, 0, 2);
    // A loop whose only effect is a prefetch may be deleted (C++ lets a
    // compiler assume a loop without side effects ends, and GCC's
    // -ffinite-loops then drops it whole when `bytes` is not a constant):
    // the empty volatile asm is a side effect that keeps it.
    asm volatile("");
  }
#endif
}

namespace detail {
template <class F, class = void>
struct has_prefetch : std::false_type {};
template <class F>
struct has_prefetch<F, std::void_t<decltype(std::declval<const F&>().prefetch(std::size_t{}))>> : std::true_type {};

/// How many rows of `cols` elements ahead for_each_rows prefetches: about
/// 8 KiB of 4-byte elements, enough rows in flight to cover a DRAM round
/// trip while the current row is worked on, and not so many that the
/// prefetched lines are evicted before their row comes.
constexpr std::size_t prefetch_rows_ahead(std::size_t cols) noexcept {
  const std::size_t rows = 2048 / (cols == 0 ? 1 : cols);
  return rows < 1 ? 1 : (rows > 64 ? 64 : rows);
}

/// Host row kernels (the lookup's gathers, the sparse optimizer updates)
/// are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline,
/// and the loader picks the best the CPU has (GCC's target_clones): built
/// for the baseline, a row update's square roots and divisions, four lanes
/// at a time, cost more than its scattered memory (docs/benchmarks.md, "Row
/// kernels"). Floating-point contraction is off in the clones, so every
/// level computes the baseline's bits: element-wise IEEE operations round
/// the same at any vector width, and no FMA is formed (tests/optim.cpp
/// compares the kernels with the rules bit for bit). GCC 12+ on x86-64 ELF
/// outside nvcc; elsewhere the kernels are built once, for the compiler's
/// target. Defining PARALLAX_NO_ISA_CLONES turns it off; so does
/// ThreadSanitizer, which instruments the clones' resolvers, and the loader
/// runs those before TSan's runtime is up (the program crashes at start).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__) && defined(__ELF__) && \
    !defined(__CUDACC__) && !defined(PARALLAX_NO_ISA_CLONES) && !defined(__SANITIZE_THREAD__)
#define PARALLAX_HOST_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("fp-contract=off")))
#else
#define PARALLAX_HOST_ISA_CLONES
#endif

/// Rows [begin, end) of a row kernel on one thread, prefetching ahead
/// within the range where the kernel has a prefetch(r).
template <class F>
PARALLAX_HOST_ISA_CLONES void run_rows(const F& f, std::size_t begin, std::size_t end, std::size_t cols) {
  if constexpr (has_prefetch<F>::value) {
    const std::size_t ahead = prefetch_rows_ahead(cols);
    for (std::size_t r = begin; r < end && r < begin + ahead; ++r) f.prefetch(r);
    for (std::size_t r = begin; r < end; ++r) {
      if (r + ahead < end) f.prefetch(r + ahead);
#pragma omp simd
      for (std::size_t c = 0; c < cols; ++c) f(r, c);
    }
  } else {
    for (std::size_t r = begin; r < end; ++r) {
#pragma omp simd
      for (std::size_t c = 0; c < cols; ++c) f(r, c);
    }
  }
}
}  // namespace detail

/// Calls `f(r, c)` for every r in [0, rows) and c in [0, cols), in parallel.
/// For kernels over rows of a matrix: on a GPU every element is a thread
/// (coalesced), on the host every row is a task with a vectorisable inner
/// loop over its columns.
///
/// A kernel whose rows are scattered in memory (a gather: row ids[r] of a
/// large table; the sparse optimizer update of rows ids[r] in place) may
/// have a host member `void prefetch(std::size_t r) const` that names that
/// memory with prefetch_bytes(). On the host each thread takes a block of
/// rows and calls it prefetch_rows_ahead(cols) rows before it runs a row,
/// so the misses of the rows ahead overlap the work on this one. A GPU
/// ignores it.
template <class Space, class F>
void for_each_rows(const Exec<Space>& ex, std::size_t rows, std::size_t cols, F f) {
  if (rows == 0 || cols == 0) return;
  for_each(ex, rows * cols, detail::FlatRows<F>{f, cols});
}

template <class F>
void for_each_rows(const Exec<HostSpace>&, std::size_t rows, std::size_t cols, F f) {
  if (rows == 0 || cols == 0) return;
#if defined(_OPENMP)
  if (rows * cols >= detail::host_parallel_threshold) {
#pragma omp parallel
    {
      const auto threads = static_cast<std::size_t>(omp_get_num_threads());
      const auto t = static_cast<std::size_t>(omp_get_thread_num());
      detail::run_rows(f, rows * t / threads, rows * (t + 1) / threads, cols);
    }
    return;
  }
#endif
  detail::run_rows(f, 0, rows, cols);
}

/// A contiguous array of `T` in `Space`, owning its memory unless made by
/// borrow(). Move-only; growing it reallocates (into memory it owns),
/// shrinking keeps the allocation (buffers are reused across steps).
template <class T, class Space = HostSpace>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>, "parallax::Buffer holds trivially copyable elements");

 public:
  using value_type = T;
  using space = Space;

  Buffer() = default;
  explicit Buffer(std::size_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)),
        owned_(std::exchange(o.owned_, true)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
      owned_ = std::exchange(o.owned_, true);
    }
    return *this;
  }
  ~Buffer() { release(); }

  /// A buffer of the `n` elements at `data`, which it uses but never frees
  /// (a slice of an arena that outlives it). Growing it past n moves the
  /// contents into memory it owns.
  static Buffer borrow(T* data, std::size_t n) noexcept {
    Buffer b;
    b.data_ = data;
    b.size_ = b.capacity_ = n;
    b.owned_ = false;
    return b;
  }
  /// False for a buffer made by borrow() (until it grows).
  bool owned() const noexcept { return owned_; }

  /// A buffer holding a copy of host data.
  static Buffer from_host(const T* src, std::size_t n) {
    Buffer b(n);
    space_traits<Space>::copy_from_host(b.data_, src, n * sizeof(T));
    return b;
  }
  static Buffer from_host(const std::vector<T>& v) { return from_host(v.data(), v.size()); }

  /// Sets the size to n, keeping the first min(size, n) elements. New elements
  /// are uninitialised. Like resize_discard, a buffer that already held
  /// memory grows by at least half its capacity.
  void resize(std::size_t n) {
    if (n > capacity_) reserve(grown(n));
    size_ = n;
  }
  /// Makes room for n elements, keeping the contents and the size.
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    const std::size_t keep = size_;
    T* fresh = static_cast<T*>(space_traits<Space>::allocate(n * sizeof(T)));
    if (keep) space_traits<Space>::copy(fresh, data_, keep * sizeof(T));
    release();
    data_ = fresh;
    capacity_ = n;
    size_ = keep;
  }
  /// Appends n elements copied from `src` (same space), growing geometrically.
  /// `src` may point into this buffer (b.append(b.data(), k)): growing
  /// frees the old storage, so such a source is re-pointed into the new one.
  void append(const T* src, std::size_t n) {
    if (n == 0) return;
    const std::size_t old = size_;
    if (old + n > capacity_) {
      const bool inside = data_ != nullptr && std::less_equal<const T*>()(data_, src) &&
                          std::less<const T*>()(src, data_ + old);
      const std::size_t at = inside ? static_cast<std::size_t>(src - data_) : 0;
      reserve(std::max(old + n, 2 * capacity_));
      if (inside) src = data_ + at;
    }
    space_traits<Space>::copy(data_ + old, src, n * sizeof(T));
    size_ = old + n;
  }
  /// Sets the size to n without keeping the contents (cheaper than resize).
  /// The first allocation is exact; growing one takes at least 1.5x the old
  /// capacity, so sizes that creep upwards step after step (a per-peer
  /// message meeting a new largest batch) reallocate a few times, not at
  /// every new maximum: a long job's memory settles (bench/soak.cpp).
  void resize_discard(std::size_t n) {
    if (n > capacity_) {
      const std::size_t want = grown(n);
      release();
      data_ = static_cast<T*>(space_traits<Space>::allocate(want * sizeof(T)));
      capacity_ = want;
    }
    size_ = n;
  }
  void clear() noexcept { size_ = 0; }
  void zero() { space_traits<Space>::zero(data_, size_ * sizeof(T)); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  bool empty() const noexcept { return size_ == 0; }

  /// Copies the contents to a host vector.
  std::vector<T> to_host() const {
    std::vector<T> out(size_);
    space_traits<Space>::copy_to_host(out.data(), data_, size_ * sizeof(T));
    return out;
  }
  /// Replaces the contents with n elements copied from host memory.
  void assign_from_host(const T* src, std::size_t n) {
    resize_discard(n);
    space_traits<Space>::copy_from_host(data_, src, n * sizeof(T));
  }

  /// Element access, HostSpace only.
  T& operator[](std::size_t i) noexcept {
    static_assert(std::is_same_v<Space, HostSpace>, "element access is host-only; use to_host()");
    return data_[i];
  }
  const T& operator[](std::size_t i) const noexcept {
    static_assert(std::is_same_v<Space, HostSpace>, "element access is host-only; use to_host()");
    return data_[i];
  }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }

 private:
  /// The capacity to allocate for n (> capacity_) elements.
  std::size_t grown(std::size_t n) const noexcept {
    return capacity_ == 0 ? n : std::max(n, capacity_ + capacity_ / 2);
  }
  void release() noexcept {
    if (owned_) space_traits<Space>::deallocate(data_);
    owned_ = true;
    data_ = nullptr;
    capacity_ = 0;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  bool owned_ = true;  // false: data_ belongs to someone else (borrow())
};

/// A non-owning view of `n` rows of `cols` elements in a space, row-major.
template <class T, class Space = HostSpace>
struct Rows {
  T* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t size() const noexcept { return rows * cols; }
  /// Row r: `cols` elements (in Space).
  T* row(std::size_t r) const noexcept { return data + r * cols; }
};

}  // namespace parallax
