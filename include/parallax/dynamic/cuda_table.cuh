#pragma once
/// @file
/// dynamic::CudaTable: the dynamic table (dynamic/table.hpp) in device
/// memory (docs/design.md, "Dynamic tables", "The CUDA table"). nvcc only.
///
/// Same options, layout and contract as the host Table, with keys, slots,
/// gradients and rows in device memory:
///   * the index: open addressing with linear probing and backward-shift
///     deletion over device arrays of bucket keys and rows;
///   * per row: values, optimizer state (one array per slot), key, last
///     step, count; a free list; the count-min sketch's counters.
/// find_or_insert() sorts the batch by key (a stable CUB radix sort, so a
/// key's occurrences keep their order) and runs the table's control path,
/// probe, admission, insert, in that order in one device thread, exactly
/// as the host Table does key by key: the result is the host Table's fed
/// the batch sorted by key, whatever the thread scheduling. Where a new key
/// finds no free row the thread stops, the host evicts the lowest
/// (score, last step, key) rows not seen at this step (a parallel select
/// and sort), and the thread goes on. find(), gather() and apply() run a
/// thread per key or element.
///
/// Against the host Table: keys, counts, last steps, slots refused and the
/// statistics are the same; rows and state are the same up to the device's
/// floating-point contraction in the optimizer's rule (a fused multiply-add
/// where the host rounds twice). Fresh rows of init::Zeros, Constant and
/// Uniform are the host's bit for bit; init::Normal's use the device's log
/// and cos. Evict::score (a host function) is refused.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/dynamic/cuda_table.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/cuda/error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/dynamic/cuda_table_kernels.cuh>
#include <parallax/dynamic/table.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace parallax::dynamic {

/// One shard's dynamic table of T (float or double) in device memory. See
/// the file comment for how it matches the host Table.
template <class T = float>
class CudaTable {
  static_assert(std::is_floating_point_v<T>, "parallax::dynamic::CudaTable holds float or double values");
  template <class U>
  using Dev = Buffer<U, CudaSpace>;

 public:
  explicit CudaTable(Options o) : options_(std::move(o)) {
    const Options& op = options_;
    const std::string what = "parallax::dynamic::CudaTable \"" + op.name + "\": ";
    if (op.evict == Evict::score)
      throw error(what + "Evict::score takes a host function; the CUDA table evicts by Evict::lru or Evict::lfu");
    check_options(op, what);
    rule_ = parallax::detail::make_init_rule(op.init, op.name, Shape{op.capacity, op.cols});
    buckets_ = std::max<std::size_t>(op.capacity + 1,
                                     static_cast<std::size_t>(std::ceil(static_cast<double>(op.capacity) / op.max_load)));
    bucket_keys_.resize(buckets_);
    bucket_rows_.resize(buckets_);
    PARALLAX_CUDA_CHECK(cudaMemset(bucket_rows_.data(), 0xFF, buckets_ * sizeof(std::uint32_t)));
    values_.resize(op.capacity * op.cols);
    values_.zero();
    for (int k = 0; k < op.slots; ++k) {
      state_[k].resize(op.capacity * op.cols);
      state_[k].zero();
    }
    keys_.resize(op.capacity);
    last_.resize(op.capacity);
    count_.resize(op.capacity);
    std::vector<std::uint32_t> free(op.capacity);
    for (std::size_t r = 0; r < op.capacity; ++r) free[r] = static_cast<std::uint32_t>(op.capacity - 1 - r);
    free_.assign_from_host(free.data(), free.size());
    slot_initial_.assign_from_host(op.slot_initial, optim::max_slots);
    if (const auto* c = std::get_if<admit::CountMin>(&op.admission)) {
      sketch_.resize(c->width * static_cast<std::size_t>(c->depth));
      sketch_.zero();
    }
    cuda_detail::Control c;
    c.free_count = op.capacity;
    control_.assign_from_host(&c, 1);
  }

  /// As Table::find_or_insert, with keys and slots_out in device memory:
  /// the host Table's result for the keys sorted by key (stable).
  void find_or_insert(const std::uint64_t* keys, std::size_t n, std::uint64_t step, index_t* slots_out) {
    cuda_detail::Control c = control();
    if (step < c.step)
      throw error("parallax::dynamic::CudaTable \"" + options_.name + "\": step " + std::to_string(step) +
                  " is before the last one seen, " + std::to_string(c.step));
    c.step = step;
    c.next = 0;
    c.need_evict = 0;
    control_.assign_from_host(&c, 1);
    if (n == 0) return;
    sort(keys, n);
    sorted_slots_.resize_discard(n);
    const auto v = view();
    for (;;) {
      cuda_detail::control_path<T><<<1, 1>>>(v, rule_, slot_initial_.data(), values_.data(), state_ptr(0), state_ptr(1),
                                             sorted_keys_.data(), n, step, sorted_slots_.data());
      PARALLAX_CUDA_CHECK(cudaGetLastError());
      c = control();
      if (!c.need_evict) break;
      const auto batch = static_cast<std::size_t>(std::ceil(options_.evict_fraction * static_cast<double>(options_.capacity)));
      if (evict_lowest(std::max<std::size_t>(batch, 1), true, step) == 0)
        throw error("parallax::dynamic::CudaTable \"" + options_.name + "\": step " + std::to_string(step) +
                    " asks for more distinct keys than its capacity of " + std::to_string(options_.capacity) +
                    " rows, every one of them seen at this step");
    }
    cuda_detail::scatter_slots<<<cuda_detail::blocks(n), 256>>>(sorted_slots_.data(), sorted_positions_.data(), n,
                                                                   slots_out);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// The row of each key, or -1 (no insert, no statistics). Device memory.
  void find(const std::uint64_t* keys, std::size_t n, index_t* slots_out) const {
    if (n == 0) return;
    cuda_detail::find_keys<<<cuda_detail::blocks(n), 256>>>(view(), keys, n, slots_out);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// As Table::gather; device memory.
  void gather(const std::uint64_t* keys, const index_t* slots, std::size_t n, T* out) const {
    const std::size_t cols = options_.cols;
    if (n == 0) return;
    cuda_detail::gather_rows<T><<<cuda_detail::blocks(n * cols), 256>>>(
        rule_, options_.unadmitted == Unadmitted::initial, values_.data(), keys, slots, n, cols, out);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// As Table::apply: slots unique (or -1, dropped), grads n x cols; device memory.
  template <class O>
  void apply(const O& opt, std::uint64_t step, const index_t* slots, const T* grads, std::size_t n, T scale = T(1)) {
    static_assert(optim::check<O>());
    static_assert(!optim::is_groups_v<O>, "dynamic::CudaTable takes one optimizer (a group's), not optim::Groups");
    if (O::slots != options_.slots)
      throw error("parallax::dynamic::CudaTable \"" + options_.name + "\": built for " + std::to_string(options_.slots) +
                  " optimizer slots, applied with " + O::name + " (" + std::to_string(O::slots) + ")");
    const std::size_t cols = options_.cols;
    if (n == 0) return;
    T* s0 = state_ptr(0);
    T* s1 = state_ptr(1);
    optim::detail::with_decay_known<T>(opt.template rule<T>(step), [&](auto rule) {
      cuda_detail::apply_rows<O::slots><<<cuda_detail::blocks(n * cols), 256>>>(rule, values_.data(), s0, s1, slots,
                                                                                grads, n, cols, scale);
    });
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// As Table::evict.
  std::size_t evict(std::size_t n) { return evict_lowest(n, false, control().step); }

  /// As Table::erase, keys in host memory.
  std::size_t erase(const std::uint64_t* keys, std::size_t n) {
    if (n == 0) return 0;
    const std::uint64_t before = control().erased;
    scratch_keys_.assign_from_host(keys, n);
    cuda_detail::erase_keys<<<1, 1>>>(view(), scratch_keys_.data(), n);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    return static_cast<std::size_t>(control().erased - before);
  }

  /// Every live row, in key order, in host memory (as Table::export_rows).
  Snapshot<T> export_rows() const {
    const std::vector<std::uint32_t> brows = bucket_rows_.to_host();
    const std::vector<std::uint64_t> keys = keys_.to_host(), last = last_.to_host(), count = count_.to_host();
    const std::vector<T> values = values_.to_host();
    std::vector<T> state[optim::max_slots];
    for (int k = 0; k < options_.slots; ++k) state[k] = state_[k].to_host();
    std::vector<std::uint32_t> rows;
    for (std::uint32_t r : brows)
      if (r != cuda_detail::none) rows.push_back(r);
    std::sort(rows.begin(), rows.end(), [&](std::uint32_t a, std::uint32_t b) { return keys[a] < keys[b]; });
    Snapshot<T> s;
    s.cols = options_.cols;
    s.slots = options_.slots;
    const std::size_t cols = options_.cols;
    for (std::uint32_t r : rows) {
      s.keys.push_back(keys[r]);
      s.rows.insert(s.rows.end(), values.begin() + r * cols, values.begin() + (r + 1) * cols);
      for (int k = 0; k < s.slots; ++k)
        s.state[k].insert(s.state[k].end(), state[k].begin() + r * cols, state[k].begin() + (r + 1) * cols);
      s.counts.push_back(count[r]);
      s.last_steps.push_back(last[r]);
    }
    return s;
  }

  /// As Table::import_rows: the snapshot's keys (those owner(key, ranks)
  /// gives `rank`, with `ranks` > 0) with their rows, state, counts and
  /// last steps; more new keys than free rows is an error that leaves the
  /// table unchanged.
  std::size_t import_rows(const Snapshot<T>& s, int rank = 0, int ranks = 0) {
    const std::string what = "parallax::dynamic::CudaTable \"" + options_.name + "\": import: ";
    const std::size_t cols = options_.cols;
    if (s.cols != cols || s.slots != options_.slots)
      throw error(what + "the snapshot has " + std::to_string(s.cols) + " cols and " + std::to_string(s.slots) +
                  " slots, the table " + std::to_string(cols) + " and " + std::to_string(options_.slots));
    const Snapshot<T> mine = ranks > 0 ? owned_share(s, rank, ranks) : s;
    const std::size_t n = mine.size();
    if (n == 0) return 0;
    scratch_keys_.assign_from_host(mine.keys.data(), n);
    Dev<index_t> rows(n);
    find(scratch_keys_.data(), n, rows.data());
    const std::vector<index_t> found = rows.to_host();
    const std::size_t fresh = static_cast<std::size_t>(std::count(found.begin(), found.end(), index_t{-1}));
    cuda_detail::Control c = control();
    if (fresh > c.free_count)
      throw error(what + std::to_string(fresh) + " new keys, " + std::to_string(c.free_count) + " free rows");
    cuda_detail::import_keys<<<1, 1>>>(view(), scratch_keys_.data(), n, rows.data());
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    auto put = [&](const auto& host, auto* to, std::size_t width) {
      using U = std::decay_t<decltype(host[0])>;
      Dev<U> in = Dev<U>::from_host(host);
      cuda_detail::scatter_rows<U><<<cuda_detail::blocks(n * width), 256>>>(rows.data(), in.data(), n, width, to);
      PARALLAX_CUDA_CHECK(cudaGetLastError());
      PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
    };
    put(mine.rows, values_.data(), cols);
    for (int k = 0; k < s.slots; ++k) put(mine.state[k], state_[k].data(), cols);
    put(mine.counts, count_.data(), 1);
    put(mine.last_steps, last_.data(), 1);
    c = control();
    c.step = std::max(c.step, *std::max_element(mine.last_steps.begin(), mine.last_steps.end()));
    control_.assign_from_host(&c, 1);
    return n;
  }

  Stats stats() const {
    const cuda_detail::Control c = control();
    Stats s;
    s.size = c.size;
    s.capacity = options_.capacity;
    s.lookups = c.lookups;
    s.hits = c.hits;
    s.inserts = c.inserts;
    s.evictions = c.evictions;
    s.erased = c.erased;
    s.admissions_refused = c.refused;
    return s;
  }
  std::size_t size() const { return control().size; }
  std::size_t capacity() const noexcept { return options_.capacity; }
  std::size_t cols() const noexcept { return options_.cols; }
  const Options& options() const noexcept { return options_; }
  /// The device bytes the table holds, all allocated at construction (the
  /// batch's sort scratch grows with the batch).
  std::size_t bytes() const noexcept {
    std::size_t b = bucket_keys_.bytes() + bucket_rows_.bytes() + values_.bytes() + keys_.bytes() + last_.bytes() +
                    count_.bytes() + free_.bytes() + sketch_.bytes();
    for (const auto& s : state_) b += s.bytes();
    return b;
  }

 private:
  T* state_ptr(int k) const noexcept { return k < options_.slots ? const_cast<T*>(state_[k].data()) : nullptr; }

  cuda_detail::View view() const {
    cuda_detail::View v{};
    v.bucket_keys = const_cast<std::uint64_t*>(bucket_keys_.data());
    v.bucket_rows = const_cast<std::uint32_t*>(bucket_rows_.data());
    v.buckets = buckets_;
    v.keys = const_cast<std::uint64_t*>(keys_.data());
    v.last = const_cast<std::uint64_t*>(last_.data());
    v.count = const_cast<std::uint64_t*>(count_.data());
    v.free_list = const_cast<std::uint32_t*>(free_.data());
    v.sketch = const_cast<std::uint32_t*>(sketch_.data());
    v.cols = options_.cols;
    v.slots = options_.slots;
    v.control = const_cast<cuda_detail::Control*>(control_.data());
    if (const auto* c = std::get_if<admit::CountMin>(&options_.admission)) {
      v.admission = 1;
      v.width = c->width;
      v.depth = c->depth;
      v.sightings = c->sightings;
      v.halve_every = c->halve_every;
    } else if (const auto* p = std::get_if<admit::Probability>(&options_.admission)) {
      v.admission = 2;
      v.p = p->p;
      v.seed = p->seed;
    }
    return v;
  }

  cuda_detail::Control control() const {
    cuda_detail::Control c;
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
    PARALLAX_CUDA_CHECK(cudaMemcpy(&c, control_.data(), sizeof c, cudaMemcpyDeviceToHost));
    return c;
  }

  /// keys[0, n) sorted (stable) into sorted_keys_, their positions into sorted_positions_.
  void sort(const std::uint64_t* keys, std::size_t n) {
    positions_.resize_discard(n);
    sorted_keys_.resize_discard(n);
    sorted_positions_.resize_discard(n);
    cuda_detail::iota<<<cuda_detail::blocks(n), 256>>>(positions_.data(), n);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    std::size_t bytes = 0;
    PARALLAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys_.data(), positions_.data(),
                                                        sorted_positions_.data(), static_cast<int>(n)));
    temp_.resize_discard(bytes);
    PARALLAX_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp_.data(), bytes, keys, sorted_keys_.data(),
                                                        positions_.data(), sorted_positions_.data(), static_cast<int>(n)));
  }

  /// Evicts up to n live rows of lowest (score, last step, key); with
  /// `spare_current`, rows seen at `step` stay. Returns how many went.
  std::size_t evict_lowest(std::size_t n, bool spare_current, std::uint64_t step) {
    flags_.resize_discard(buckets_);
    candidates_.resize_discard(buckets_);
    selected_.resize_discard(1);
    cuda_detail::candidates<<<cuda_detail::blocks(buckets_), 256>>>(view(), spare_current, step, flags_.data());
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    std::size_t bytes = 0;
    PARALLAX_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, bytes, bucket_rows_.data(), flags_.data(),
                                                   candidates_.data(), selected_.data(), static_cast<int>(buckets_)));
    temp_.resize_discard(bytes);
    PARALLAX_CUDA_CHECK(cub::DeviceSelect::Flagged(temp_.data(), bytes, bucket_rows_.data(), flags_.data(),
                                                   candidates_.data(), selected_.data(), static_cast<int>(buckets_)));
    const std::size_t m = static_cast<std::size_t>(selected_.to_host()[0]);
    n = std::min(n, m);
    if (n == 0) return 0;
    thrust::sort(thrust::device, candidates_.data(), candidates_.data() + m,
                 cuda_detail::Lower{keys_.data(), last_.data(), count_.data(), options_.evict == Evict::lfu});
    auto* c = control_.data();
    cuda_detail::remove_rows<<<1, 1>>>(view(), candidates_.data(), n, &c->evictions);
    PARALLAX_CUDA_CHECK(cudaGetLastError());
    PARALLAX_CUDA_CHECK(cudaDeviceSynchronize());
    return n;
  }

  Options options_;
  parallax::detail::InitRule rule_{};
  std::size_t buckets_ = 0;
  Dev<std::uint64_t> bucket_keys_, keys_, last_, count_;
  Dev<std::uint32_t> bucket_rows_, free_, sketch_;
  Dev<T> values_, state_[optim::max_slots];
  Dev<double> slot_initial_;
  Dev<cuda_detail::Control> control_;
  // The batch's scratch.
  Dev<std::uint64_t> positions_, sorted_keys_, sorted_positions_, scratch_keys_;
  Dev<index_t> sorted_slots_;
  Dev<std::uint8_t> flags_;
  Dev<std::uint32_t> candidates_;
  Dev<int> selected_;
  Dev<std::byte> temp_;
};

}  // namespace parallax::dynamic
