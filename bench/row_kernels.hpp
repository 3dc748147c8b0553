// The workload of bench/row_kernels.cpp, shared with its -fmath-errno twin
// (row_kernels_errno.cpp), so both time the same rows of the same tables.
#pragma once

#include <parallax/parallax.hpp>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <random>
#include <vector>

namespace parallax::bench {

/// A rank's shard of word_lm's softmax table at the demo's shape (800,000
/// words over 4 ranks: 200,000 rows of 128 floats, 100 MB) with its Adagrad
/// accumulator, and `sets` sets of `touched` distinct rows in ascending order
/// (as the sharded PS applies them). The sets together touch 128 MB, far
/// more than a core's L2, so each iteration finds its rows in the shared L3
/// or DRAM, as a training step does.
struct RowWorkload {
  static constexpr std::size_t rows = 200000, cols = 128, touched = 8192, sets = 16;
  std::vector<float> table = std::vector<float>(rows * cols, 0.01f);
  optim::State<optim::Adagrad, float, HostSpace> state{optim::Adagrad{0.5f}, rows * cols};  // accumulator 0.1
  std::vector<float> grad = std::vector<float>(touched * cols, 1e-3f);
  std::vector<float> out = std::vector<float>(touched * cols);
  std::vector<std::vector<index_t>> ids;
  RowWorkload() {
    std::mt19937_64 rng(7);
    std::vector<index_t> all(rows);
    std::iota(all.begin(), all.end(), index_t{0});
    for (std::size_t s = 0; s < sets; ++s) {
      std::shuffle(all.begin(), all.end(), rng);
      ids.emplace_back(all.begin(), all.begin() + touched);
      std::sort(ids.back().begin(), ids.back().end());
    }
  }
  static RowWorkload& get() {
    static RowWorkload w;
    return w;
  }
};

/// optim::apply_rows with Adagrad on set `s` of the workload, compiled with
/// -fmath-errno (row_kernels_errno.cpp).
void adagrad_rows_math_errno(RowWorkload& w, std::size_t s);

}  // namespace parallax::bench
