#pragma once
/// @file
/// word_lm's sampled-softmax kernels as hand-written functors (a dot product
/// or a register-tiled sum per call), as the example ran them before its
/// matrix products went to a BLAS: the reference the BLAS version is tested
/// against (tests/kernels.cpp) and the baseline bench/dense_math.cpp times
/// the BLAS against, at the example's shapes. Each follows the layout its
/// neighbours write: d is candidates x rows here, not rows x candidates.

#include "01_word_lm/model.hpp"

#include <parallax/parallax.hpp>

#include <cstddef>
#include <cstdint>

namespace examples::word_lm::reference {

/// z[b, 0] = the true word's logit, z[b, 1 + j] = sampled word j's; each
/// h[b] . w[row] + bias[row] - log Q[row]. A sampled word equal to b's label
/// (an accidental hit) gets a logit of -1e30, i.e. probability 0. One logit
/// per call, the batch rows of one candidate next to each other: a softmax
/// row is read from memory once a step, then from cache (on a GPU, by
/// neighbouring threads together), not once per batch row.
template <class T>
struct SampledLogits {
  const T* h;                      // rows x dim
  const T* w;                      // candidates x (dim + 1)
  const float* log_q;              // per candidate
  const px::index_t* sampled_row;  // per sampled word
  const px::index_t* label_row;    // per batch row
  T* z;                            // rows x (1 + sampled)
  std::size_t rows, dim, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t k = e / rows, b = e % rows;
    T* out = z + b * (1 + sampled) + k;
    const auto row = static_cast<std::size_t>(k == 0 ? label_row[b] : sampled_row[k - 1]);
    if (k > 0 && row == static_cast<std::size_t>(label_row[b])) {
      *out = T(-1e30);
      return;
    }
    const T* wr = w + row * (dim + 1);
    *out = dot(h + b * dim, wr, dim) + wr[dim] - static_cast<T>(log_q[row]);
  }
};

/// The gradient of the logits as a candidates x rows matrix: d[r, b] =
/// dz[b, 1 + j] if candidate row r is sampled word j, else 0. The true
/// words' terms (dz[b, 0]) stay apart, so the sums below add the same terms
/// in the same order as a loop over the sampled words would. One element per call.
template <class T>
struct SampledGrad {
  const T* dz;                  // rows x (1 + sampled)
  const std::int32_t* column;  // per candidate: 1 + j, or 0
  T* d;                         // candidates x rows
  std::size_t rows, sampled;
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t r = e / rows, b = e % rows;
    const auto col = static_cast<std::size_t>(column[r]);
    d[e] = col ? dz[b * (1 + sampled) + col] : T(0);
  }
};

/// The gradient of candidate row r: sum_b delta(r, b) [h_b, 1], where
/// delta(r, b) is d[r, b] (SampledGrad) plus dz[b, 0] if r is b's label. One row
/// per call, its sums held in registers a tile of `Cols` columns at a time.
template <class T, std::size_t Cols = 16>
struct CandidateGrad {
  const T* h;   // rows x dim
  const T* d;   // candidates x rows (SampledGrad)
  const T* dz;  // rows x (1 + sampled): column 0, the true words
  const px::index_t* label_row;
  T* g;  // candidates x (dim + 1)
  std::size_t rows, dim, sampled;
  PARALLAX_HOST_DEVICE T delta(std::size_t r, std::size_t b) const {
    return d[r * rows + b] + (static_cast<std::size_t>(label_row[b]) == r ? dz[b * (1 + sampled)] : T(0));
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const {
    T* gr = g + r * (dim + 1);
    std::size_t c0 = 0;
    for (; c0 + Cols <= dim; c0 += Cols) {
      T acc[Cols] = {};
      for (std::size_t b = 0; b < rows; ++b) {
        const T x = delta(r, b);
        const T* hb = h + b * dim + c0;
        for (std::size_t i = 0; i < Cols; ++i) acc[i] += x * hb[i];
      }
      for (std::size_t i = 0; i < Cols; ++i) gr[c0 + i] = acc[i];
    }
    for (; c0 < dim; ++c0) {
      T acc = T(0);
      for (std::size_t b = 0; b < rows; ++b) acc += delta(r, b) * h[b * dim + c0];
      gr[c0] = acc;
    }
    T bias = T(0);
    for (std::size_t b = 0; b < rows; ++b) bias += delta(r, b);
    gr[dim] = bias;
  }
};

/// dh[b, :] = dz[b, 0] w[label_b, :dim] + sum_r d[r, b] w[r, :dim]: a
/// matrix product. A call owns `Rows` batch rows x `Panel` columns of dh and
/// walks the candidate rows in memory order, `Block` at a time; within a
/// block it sums one tile of up to `Rows` x `Cols` at a time in registers.
/// The host takes 4 x 8 tiles (8 SSE registers of sums, each w fragment
/// loaded once for 4 batch rows), panels of 64 columns and blocks of 32
/// rows: 8 KiB of w, prefetched while the block before is summed, then read
/// from L1 by every tile. A GPU takes one element a thread, rows x dim
/// threads. Each element adds its terms in candidate order, the same sums
/// whatever the tiling.
template <class T, std::size_t Rows = 4, std::size_t Cols = 8, std::size_t Panel = 64, std::size_t Block = 32>
struct HiddenGrad {
  static_assert(Panel % Cols == 0, "a panel is whole tiles");
  const T* w;   // candidates x (dim + 1)
  const T* d;   // candidates x rows (SampledGrad)
  const T* dz;  // rows x (1 + sampled): column 0, the true words
  const px::index_t* label_row;
  T* dh;  // rows x dim
  std::size_t rows, dim, sampled, candidates;
  /// Multiply-adds a call does per candidate row.
  static constexpr std::size_t work = Rows * Panel;
  /// Calls that cover dh.
  static std::size_t calls(std::size_t rows, std::size_t dim) {
    return (rows + Rows - 1) / Rows * ((dim + Panel - 1) / Panel);
  }
  PARALLAX_HOST_DEVICE void operator()(std::size_t e) const {
    const std::size_t row_tiles = (rows + Rows - 1) / Rows;
    const std::size_t b0 = e % row_tiles * Rows, p0 = e / row_tiles * Panel;
    const std::size_t nb = rows - b0 < Rows ? rows - b0 : Rows, p1 = dim - p0 < Panel ? dim : p0 + Panel;
    for (std::size_t b = b0; b < b0 + nb; ++b) {  // the true words' terms come first
      const T t = dz[b * (1 + sampled)];
      const T* wl = w + static_cast<std::size_t>(label_row[b]) * (dim + 1);
      for (std::size_t c = p0; c < p1; ++c) dh[b * dim + c] = t * wl[c];
    }
    for (std::size_t r0 = 0; r0 < candidates; r0 += Block) {
      const std::size_t r1 = candidates - r0 < Block ? candidates : r0 + Block;
#if !defined(__CUDA_ARCH__) && defined(__GNUC__)
      // The tiles walk down the block's rows, a stride the hardware does
      // not prefetch: ask for the next block's part of the panel now.
      for (std::size_t r = r1; r < r1 + Block && r < candidates; ++r)
        for (std::size_t c = p0; c < p1; c += 64 / sizeof(T)) __builtin_prefetch(w + r * (dim + 1) + c);
#endif
      for (std::size_t c0 = p0; c0 < p1; c0 += Cols) {
        const std::size_t nc = p1 - c0 < Cols ? p1 - c0 : Cols;
        rows_tile<Rows>(nb, b0, c0, r0, r1, nc);
      }
    }
  }

 private:
  // A tile of nb <= R rows, with nb as a template argument: bounds the
  // compiler sees are unrolled, their sums held in registers.
  template <std::size_t R>
  PARALLAX_HOST_DEVICE void rows_tile(std::size_t nb, std::size_t b0, std::size_t c0, std::size_t r0, std::size_t r1,
                                      std::size_t nc) const {
    if constexpr (R > 1) {
      if (nb < R) return rows_tile<R - 1>(nb, b0, c0, r0, r1, nc);
    }
    nc == Cols ? tile<R>(b0, c0, r0, r1, Cols) : tile<R>(b0, c0, r0, r1, nc);
  }
  // Adds candidate rows [r0, r1) to dh's R x nc tile at (b0, c0).
  template <std::size_t R>
  PARALLAX_HOST_DEVICE void tile(std::size_t b0, std::size_t c0, std::size_t r0, std::size_t r1, std::size_t nc) const {
    T acc[R][Cols];
    for (std::size_t bi = 0; bi < R; ++bi)
      for (std::size_t i = 0; i < nc; ++i) acc[bi][i] = dh[(b0 + bi) * dim + c0 + i];
    for (std::size_t r = r0; r < r1; ++r) {
      const T* dr = d + r * rows + b0;
      const T* wr = w + r * (dim + 1) + c0;
      for (std::size_t bi = 0; bi < R; ++bi)
        for (std::size_t i = 0; i < nc; ++i) acc[bi][i] += dr[bi] * wr[i];
    }
    for (std::size_t bi = 0; bi < R; ++bi)
      for (std::size_t i = 0; i < nc; ++i) dh[(b0 + bi) * dim + c0 + i] = acc[bi][i];
  }
};


}  // namespace examples::word_lm::reference
