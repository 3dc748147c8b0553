#pragma once
/// @file
/// Each rank's share of a global batch, also when the batch does not divide
/// evenly by the rank count.

#include <parallax/context.hpp>
#include <parallax/error.hpp>

#include <cstddef>

namespace parallax {

/// This rank's share of a global batch of `global` examples: examples
/// [first, first + count). The first global % ranks ranks take one example
/// more than the others, so shares differ by at most one.
///
/// With Reduction::mean a trainer averages the ranks' gradients, which is the
/// global batch's mean gradient only when every share is the same size. A
/// rank whose gradient is the mean over its own `count` examples multiplies
/// it by scale() (count x ranks / global) to keep the average exact; with
/// equal shares scale() is 1. (Equivalently: divide by `global` instead of
/// `count`, and train with Reduction::sum.)
struct BatchShare {
  std::size_t first = 0;
  std::size_t count = 0;
  std::size_t global = 0;
  int ranks = 1;

  double scale() const noexcept {
    return global == 0 ? 0.0 : static_cast<double>(count) * ranks / static_cast<double>(global);
  }
};

/// Rank `rank`'s share of a global batch of `global` examples over `ranks` ranks.
inline BatchShare share_of(std::size_t global, int rank, int ranks) {
  PARALLAX_EXPECTS(ranks >= 1 && rank >= 0 && rank < ranks, "share_of: rank ", rank, " of ", ranks, " ranks");
  const auto n = static_cast<std::size_t>(ranks), r = static_cast<std::size_t>(rank);
  const std::size_t base = global / n, extra = global % n;
  return BatchShare{r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0), global, ranks};
}
/// This rank's share of a global batch of `global` examples.
inline BatchShare share_of(std::size_t global, const Context& ctx) { return share_of(global, ctx.rank(), ctx.size()); }

}  // namespace parallax
