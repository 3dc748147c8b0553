// The workload of bench/row_kernels.cpp, shared with its -fmath-errno twin
// (row_kernels_errno.cpp), so both time the same rows of the same tables.
#pragma once

#include <parallax/parallax.hpp>

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

namespace parallax::bench {

/// A table of `rows` rows of 128 floats with its Adagrad accumulator, and
/// `sets` sets of 8,192 distinct rows each in ascending order (as the
/// sharded PS applies them); an iteration takes the next set. Two sizes:
/// * shard(): a rank's shard of word_lm's softmax table at the demo's shape
///   (800,000 words over 4 ranks: 200,000 rows, 100 MB), 16 sets (128 MB
///   touched): in cache where the last-level cache holds it, as it may when
///   one process has the machine;
/// * table(): 2,000,000 rows (1 GB, and 1 GB of accumulator), 64 sets (512 MB
///   touched, more than the L3): the rows come from DRAM, as they do when
///   several ranks' tables and other jobs share the cache.
struct RowWorkload {
  static constexpr std::size_t cols = 128, touched = 8192;
  std::size_t rows, sets;
  Buffer<float> table;  // allocated as the library allocates a shard
  optim::State<optim::Adagrad, float, HostSpace> state;  // accumulator 0.1
  std::vector<float> grad = std::vector<float>(touched * cols, 1e-3f);
  std::vector<float> out = std::vector<float>(touched * cols);
  std::vector<std::vector<index_t>> ids;
  RowWorkload(std::size_t n, std::size_t s)
      : rows(n), sets(s), table(n * cols), state(optim::Adagrad{0.5f}, n * cols) {
    std::fill(table.data(), table.data() + table.size(), 0.01f);
    std::mt19937_64 rng(7);
    std::vector<index_t> all(rows);
    std::iota(all.begin(), all.end(), index_t{0});
    for (std::size_t k = 0; k < sets; ++k) {
      std::shuffle(all.begin(), all.end(), rng);
      ids.emplace_back(all.begin(), all.begin() + touched);
      std::sort(ids.back().begin(), ids.back().end());
    }
  }
  static RowWorkload& shard() {
    static RowWorkload w(200000, 16);
    return w;
  }
  static RowWorkload& table_in_dram() {
    static RowWorkload w(2000000, 64);
    return w;
  }
  static RowWorkload& of(std::int64_t size) { return size == 0 ? shard() : table_in_dram(); }

  /// Set s's rows as pointers into the table (what a lookup from shared
  /// shards gathers from), made at first use.
  const float* const* row_pointers(std::size_t s) {
    if (pointers.empty()) {
      for (const auto& set : ids) {
        pointers.emplace_back();
        for (index_t id : set) pointers.back().push_back(table.data() + static_cast<std::size_t>(id) * cols);
      }
    }
    return pointers[s].data();
  }
  /// Set s's count of rows, contiguous (rows s x touched on): the rows the
  /// memcpy baseline copies, for a kernel's speed without the scatter.
  const index_t* contiguous_ids(std::size_t s) {
    if (contiguous.empty()) {
      for (std::size_t k = 0; k < sets; ++k) {
        contiguous.emplace_back(touched);
        std::iota(contiguous.back().begin(), contiguous.back().end(), static_cast<index_t>(k * touched));
      }
    }
    return contiguous[s].data();
  }
  /// Adam's two moments, made at first use.
  optim::State<optim::Adam, float, HostSpace>& adam() {
    if (!adam_state) adam_state = std::make_unique<optim::State<optim::Adam, float, HostSpace>>(optim::Adam{}, rows * cols);
    return *adam_state;
  }

 private:
  std::vector<std::vector<const float*>> pointers;
  std::vector<std::vector<index_t>> contiguous;
  std::unique_ptr<optim::State<optim::Adam, float, HostSpace>> adam_state;
};

/// The kernel optim::apply_rows runs for Adagrad on set `s` of the workload,
/// as an `Update` (RowUpdate or a type derived from it without members).
template <class Update>
Update adagrad_update(RowWorkload& w, std::size_t s) {
  return Update{{optim::Adagrad{0.5f}.rule<float>(1), w.table.data(), w.state.slot(0), nullptr, w.ids[s].data(),
                 w.grad.data(), RowWorkload::cols, 1.0f}};
}

/// optim::apply_rows with Adagrad on set `s` of the workload, compiled with
/// -fmath-errno (row_kernels_errno.cpp).
void adagrad_rows_math_errno(RowWorkload& w, std::size_t s);

/// optim::apply_rows with Adagrad on set `s`, built for the baseline x86-64
/// only (PARALLAX_NO_ISA_CLONES; row_kernels_baseline_isa.cpp).
void adagrad_rows_baseline_isa(RowWorkload& w, std::size_t s);

}  // namespace parallax::bench
