// Clipping by the global norm: the norm of every synchronizer's part summed
// over the ranks, and the factor that brings it within the bound.

#include "support.hpp"

#include <parallax/trainer/clipping.hpp>

#include <cmath>
#include <optional>
#include <vector>

namespace {

/// Stands for a trainer's registry: synchronizers that report their square sums.
struct Parts {
  struct Part {
    std::optional<double> sum;
    std::optional<double> gradient_square_sum() const { return sum; }
  };
  std::vector<Part> parts;
  std::size_t size() const { return parts.size(); }
  Part& synchronizer(std::size_t i) { return parts[i]; }
  const char* policy_name(std::size_t i) const { return i == 0 ? "RingAllReduce" : "MyPolicy"; }
};

}  // namespace

TEST_CASE("global_norm adds every part over the ranks, once, and scales it", "[trainer][clipping]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), r = mpi.rank();
  // Rank r's parts: r + 1 and 2 (r + 1); the sum over ranks is 3 n (n + 1) / 2.
  Parts parts{{{static_cast<double>(r + 1)}, {2.0 * (r + 1)}}};
  const double expected = std::sqrt(3.0 * n * (n + 1) / 2.0) * 0.5;
  const auto calls = mpi.stats().total().calls;
  CHECK(px::trainer::global_norm(parts, mpi, 0.5) == expected);
  CHECK(mpi.stats().total().calls == calls + 1);  // one all-reduce
  CHECK(px::trainer::clip_factor(expected, 2 * expected) == 1.0);
  CHECK(px::trainer::clip_factor(expected, expected / 4) == 0.25);
  CHECK(px::trainer::clip_factor(std::nan(""), 1.0) == 1.0);  // the step decides what a NaN norm does
}

TEST_CASE("global_norm names a policy that cannot report its gradients' norm, on every rank", "[trainer][clipping]") {
  px::engine::Mpi mpi(test::world());
  Parts parts{{{1.0}, {std::nullopt}}};
  const std::string msg = test::error_of([&] { px::trainer::global_norm(parts, mpi, 1.0); });
  CHECK(msg == "clipping by the global norm: policy MyPolicy cannot report its gradients' norm");
  CHECK(test::same_on_every_rank(msg));
}
