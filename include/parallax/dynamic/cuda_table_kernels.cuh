#pragma once
/// @file
/// The kernels and device views of dynamic::CudaTable (dynamic/cuda_table.cuh,
/// whose file comment states the contract): the control path that runs a
/// batch sorted by key in one device thread, the per-key and per-element
/// kernels (find, gather, apply, remove, import) and eviction's candidate
/// selection. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/dynamic/cuda_table_kernels.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/dynamic/table.hpp>
#include <parallax/init.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace parallax::dynamic {

namespace cuda_detail {

inline constexpr std::uint32_t none = UINT32_MAX;

/// What the control thread keeps between launches; in device memory.
struct Control {
  std::uint64_t free_count = 0, size = 0, increments = 0;
  std::uint64_t lookups = 0, hits = 0, inserts = 0, evictions = 0, erased = 0, refused = 0;
  std::uint64_t next = 0;     // the sorted position to go on from
  std::uint64_t step = 0;     // the last step seen
  int need_evict = 0;         // stopped at `next` for want of a free row, its key admitted
};

/// The table's device arrays, passed to kernels by value.
struct View {
  std::uint64_t* bucket_keys;
  std::uint32_t* bucket_rows;
  std::uint64_t buckets;
  std::uint64_t* keys;
  std::uint64_t* last;
  std::uint64_t* count;
  std::uint32_t* free_list;
  std::uint32_t* sketch;
  std::uint64_t width;
  int depth;
  std::uint32_t sightings;
  std::uint64_t halve_every;
  int admission;  // 0 always, 1 count-min, 2 probability
  double p;
  std::uint64_t seed;
  std::uint64_t cols;
  int slots;
  Control* control;
};

__device__ inline std::uint64_t reduce(std::uint64_t h, std::uint64_t n) { return __umul64hi(h, n); }
__device__ inline std::uint64_t mix(std::uint64_t key, std::uint64_t salt) {
  return parallax::detail::splitmix64(key ^ salt);
}
__device__ inline std::uint64_t home(const View& v, std::uint64_t key) {
  return reduce(mix(key, detail::index_salt), v.buckets);
}
__device__ inline std::uint64_t locate(const View& v, std::uint64_t key) {
  std::uint64_t b = home(v, key);
  while (v.bucket_rows[b] != none && v.bucket_keys[b] != key)
    if (++b == v.buckets) b = 0;
  return b;
}

/// The initial value of element `element`, rounded as the host rounds it
/// (no contraction) for zeros, constant and uniform.
__device__ inline double initial_value(const parallax::detail::InitRule& r, std::uint64_t element) {
  using R = parallax::detail::InitRule;
  if (r.kind == R::uniform) {
    const double u = parallax::detail::unit(parallax::detail::splitmix64(r.key ^ parallax::detail::splitmix64(element)));
    return __dadd_rn(r.a, __dmul_rn(__dsub_rn(r.b, r.a), u));
  }
  return r.value(element);
}

template <class T>
__device__ void initial_row(const parallax::detail::InitRule& rule, std::uint64_t key, std::uint64_t cols, T* out) {
  const std::uint64_t base = parallax::detail::splitmix64(key);
  for (std::uint64_t c = 0; c < cols; ++c) out[c] = static_cast<T>(initial_value(rule, base + c));
}

/// Empties bucket b (its row back on the free list) and shifts later
/// entries of its probe run back, as the host Table's remove_bucket.
__device__ inline void remove_bucket(const View& v, std::uint64_t b) {
  Control& c = *v.control;
  v.free_list[c.free_count++] = v.bucket_rows[b];
  --c.size;
  std::uint64_t hole = b, j = b;
  for (;;) {
    if (++j == v.buckets) j = 0;
    if (v.bucket_rows[j] == none) break;
    const std::uint64_t h = home(v, v.bucket_keys[j]);
    const std::uint64_t dist_j = (j + v.buckets - h) % v.buckets;
    const std::uint64_t dist_hole = (hole + v.buckets - h) % v.buckets;
    if (dist_hole < dist_j) {
      v.bucket_keys[hole] = v.bucket_keys[j];
      v.bucket_rows[hole] = v.bucket_rows[j];
      hole = j;
    }
  }
  v.bucket_rows[hole] = none;
}

__device__ inline bool admit(const View& v, std::uint64_t key, std::uint64_t step) {
  if (v.admission == 2) {
    const std::uint64_t h = mix(key ^ parallax::detail::splitmix64(step ^ v.seed), detail::admit_salt);
    return parallax::detail::unit(h) < v.p;
  }
  if (v.admission != 1) return true;
  // CountMinSketch::add: conservative update, then halving.
  std::uint32_t least = UINT32_MAX;
  std::uint64_t at[16];
  for (int r = 0; r < v.depth; ++r) {
    const std::uint64_t h = mix(key, detail::sketch_salt + static_cast<std::uint64_t>(r) * 0x9E3779B97F4A7C15ull);
    at[r] = static_cast<std::uint64_t>(r) * v.width + reduce(h, v.width);
    least = min(least, v.sketch[at[r]]);
  }
  if (least == UINT32_MAX) return least >= v.sightings;
  for (int r = 0; r < v.depth; ++r)
    if (v.sketch[at[r]] == least) v.sketch[at[r]] = least + 1;
  Control& c = *v.control;
  if (v.halve_every != 0 && ++c.increments >= v.halve_every) {
    for (std::uint64_t i = 0; i < v.width * static_cast<std::uint64_t>(v.depth); ++i) v.sketch[i] >>= 1;
    c.increments = 0;
  }
  return least + 1 >= v.sightings;
}

/// The control path over keys sorted by key, from control.next, as the host
/// Table's find_or_insert_one key by key; stops where a new admitted key
/// finds no free row (need_evict). One thread.
template <class T>
__global__ void control_path(View v, parallax::detail::InitRule rule, const double* slot_initial, T* values, T* s0,
                             T* s1, const std::uint64_t* sorted, std::uint64_t n, std::uint64_t step, index_t* slots) {
  Control& c = *v.control;
  for (std::uint64_t i = c.next; i < n; ++i) {
    const std::uint64_t key = sorted[i];
    const bool admitted_before = c.need_evict != 0;
    c.need_evict = 0;
    std::uint64_t b = locate(v, key);
    std::uint32_t r = v.bucket_rows[b];
    if (!admitted_before) {
      ++c.lookups;
      if (r != none) {
        ++c.hits;
        v.last[r] = step;
        ++v.count[r];
        slots[i] = static_cast<index_t>(r);
        continue;
      }
      if (!admit(v, key, step)) {
        ++c.refused;
        slots[i] = -1;
        continue;
      }
    }
    if (c.free_count == 0) {
      c.next = i;
      c.need_evict = 1;
      return;
    }
    r = v.free_list[--c.free_count];
    v.bucket_keys[b] = key;
    v.bucket_rows[b] = r;
    v.keys[r] = key;
    ++c.size;
    initial_row(rule, key, v.cols, values + static_cast<std::uint64_t>(r) * v.cols);
    for (std::uint64_t k = 0; k < v.cols; ++k) {
      if (v.slots > 0) s0[r * v.cols + k] = static_cast<T>(slot_initial[0]);
      if (v.slots > 1) s1[r * v.cols + k] = static_cast<T>(slot_initial[1]);
    }
    v.last[r] = step;
    v.count[r] = 1;
    ++c.inserts;
    slots[i] = static_cast<index_t>(r);
  }
  c.next = n;
}

/// Removes the rows rows[0, n) (live, distinct). One thread.
template <int = 0>
__global__ void remove_rows(View v, const std::uint32_t* rows, std::uint64_t n, std::uint64_t* counter) {
  for (std::uint64_t i = 0; i < n; ++i) remove_bucket(v, locate(v, v.keys[rows[i]]));
  *counter += n;
}

/// Removes the keys present among keys[0, n). One thread.
template <int = 0>
__global__ void erase_keys(View v, const std::uint64_t* keys, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t b = locate(v, keys[i]);
    if (v.bucket_rows[b] == none) continue;
    remove_bucket(v, b);
    ++v.control->erased;
  }
}

/// Puts keys[0, n) in the table (a present key keeps its row); their rows'
/// slots in rows_out. The caller checked that the free rows suffice. One thread.
template <int = 0>
__global__ void import_keys(View v, const std::uint64_t* keys, std::uint64_t n, index_t* rows_out) {
  Control& c = *v.control;
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t b = locate(v, keys[i]);
    std::uint32_t r = v.bucket_rows[b];
    if (r == none) {
      r = v.free_list[--c.free_count];
      v.bucket_keys[b] = keys[i];
      v.bucket_rows[b] = r;
      v.keys[r] = keys[i];
      ++c.size;
    }
    rows_out[i] = static_cast<index_t>(r);
  }
}

template <int = 0>
__global__ void find_keys(View v, const std::uint64_t* keys, std::uint64_t n, index_t* out) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const std::uint32_t r = v.bucket_rows[locate(v, keys[i])];
  out[i] = r == none ? index_t{-1} : static_cast<index_t>(r);
}

template <int = 0>
__global__ void candidates(View v, bool spare_current, std::uint64_t step, std::uint8_t* flags) {
  const std::uint64_t b = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (b >= v.buckets) return;
  const std::uint32_t r = v.bucket_rows[b];
  flags[b] = r != none && !(spare_current && v.last[r] == step);
}

/// Eviction's order: (score, last step, key), lowest first.
struct Lower {
  const std::uint64_t* keys;
  const std::uint64_t* last;
  const std::uint64_t* count;
  bool lfu;
  __device__ bool operator()(std::uint32_t a, std::uint32_t b) const {
    if (lfu && count[a] != count[b]) return count[a] < count[b];
    if (last[a] != last[b]) return last[a] < last[b];
    return keys[a] < keys[b];
  }
};

template <int = 0>
__global__ void scatter_slots(const index_t* sorted_slots, const std::uint64_t* positions, std::uint64_t n,
                              index_t* out) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[positions[i]] = sorted_slots[i];
}

template <int = 0>
__global__ void iota(std::uint64_t* out, std::uint64_t n) {
  const std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = i;
}

template <class T>
__global__ void gather_rows(parallax::detail::InitRule rule, bool initial, const T* values, const std::uint64_t* keys,
                            const index_t* slots, std::uint64_t n, std::uint64_t cols, T* out) {
  const std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (j >= n * cols) return;
  const std::uint64_t i = j / cols, c = j % cols;
  if (slots[i] >= 0) out[j] = values[static_cast<std::uint64_t>(slots[i]) * cols + c];
  else if (initial) out[j] = static_cast<T>(initial_value(rule, parallax::detail::splitmix64(keys[i]) + c));
  else out[j] = T(0);
}

template <int Slots, class Rule, class T>
__global__ void apply_rows(Rule rule, T* values, T* s0, T* s1, const index_t* slots, const T* grads, std::uint64_t n,
                           std::uint64_t cols, T scale) {
  const std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (j >= n * cols) return;
  const std::uint64_t i = j / cols, c = j % cols;
  if (slots[i] < 0) return;
  const std::size_t at = static_cast<std::size_t>(slots[i]) * cols + c;
  optim::detail::apply_rule<Slots>(rule, values[at], grads[j] * scale, s0, s1, at);
}

/// Scatters per-key columns into rows: out[rows[i] * cols + c] = in[i * cols + c].
template <class T>
__global__ void scatter_rows(const index_t* rows, const T* in, std::uint64_t n, std::uint64_t cols, T* out) {
  const std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  if (j < n * cols) out[static_cast<std::uint64_t>(rows[j / cols]) * cols + j % cols] = in[j];
}

inline unsigned blocks(std::uint64_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::max<std::uint64_t>(1, (n + threads - 1) / threads));
}

}  // namespace cuda_detail

}  // namespace parallax::dynamic
