#pragma once
/// @file
/// Choosing how many partitions a sharded variable gets.
///
/// Two tools, documented in docs/design.md ("Partition count"):
/// * plan_partitions(): a cost model. A sharded step waits for its busiest
///   owner, so its time grows with the largest number of rows any one rank
///   serves and receives. From a sample of the ids the ranks will use, it
///   predicts that load for every candidate P and picks the smallest P within
///   `tolerance` of the best. Collective, deterministic, no timing noise.
/// * fit_partition_model(): Parallax's measured search. Given step times at a
///   few P, it fits t(P) = b/P + a(P-1) + c by least squares and returns the
///   candidate the fit predicts fastest.

#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/partition.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace parallax {

/// The partition counts tried when none are given: N, 2N, 4N, ... up to 64N
/// (and never more than the rows).
inline std::vector<int> default_partition_candidates(std::size_t rows, int ranks) {
  std::vector<int> out;
  for (int f = 1; f <= 64; f *= 2) {
    const std::size_t p = static_cast<std::size_t>(ranks) * static_cast<std::size_t>(f);
    if (p > rows) break;
    out.push_back(static_cast<int>(p));
  }
  if (out.empty()) out.push_back(static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(rows, ranks))));
  return out;
}

/// What plan_partitions() found.
struct PartitionPlan {
  int partitions = 1;  ///< the chosen P
  struct Candidate {
    int partitions;
    std::uint64_t max_load;  ///< rows the busiest owner serves per sample
    double imbalance;        ///< max_load / mean load (1 is perfect balance)
  };
  std::vector<Candidate> candidates;  ///< every P considered, ascending
};

/// Chooses P for a sharded variable of `rows` rows from a sample of the ids
/// this rank will look up (e.g. a few batches' worth). Collective: every rank
/// passes its own sample and gets the same plan.
///
/// The load of an owner is the number of distinct (rank, row) requests that
/// land on it, counted over the ranks' de-duplicated samples, which is what
/// its pull and push traffic is proportional to. Among the candidates, the
/// smallest P whose busiest owner carries at most (1 + tolerance) times the
/// best candidate's is chosen: fewer partitions keep dense sharded variables
/// in their natural row order and checkpoints simpler.
template <class Engine>
PartitionPlan plan_partitions(Engine& engine, std::size_t rows, std::vector<index_t> sample,
                              std::vector<int> candidates = {}, double tolerance = 0.02) {
  const int n = engine.size();
  if (candidates.empty()) candidates = default_partition_candidates(rows, n);
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::sort(sample.begin(), sample.end());
  sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  for (index_t id : sample)
    PARALLAX_EXPECTS(id >= 0 && static_cast<std::size_t>(id) < rows, "plan_partitions: sample id ", id,
                     " is outside [0, ", rows, ")");

  const auto un = static_cast<std::size_t>(n);
  std::vector<std::int64_t> loads(candidates.size() * un, 0);
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const PartitionMap map(rows, candidates[c], n);
    for (index_t id : sample) ++loads[c * un + static_cast<std::size_t>(map.owner(id))];
  }
  {
    auto scope = engine.stats().scope("", "control");
    engine.allreduce(loads.data(), loads.data(), loads.size(), DataType::i64, ReduceOp::sum);
  }

  PartitionPlan plan;
  std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    std::uint64_t most = 0, total = 0;
    for (std::size_t r = 0; r < un; ++r) {
      most = std::max<std::uint64_t>(most, static_cast<std::uint64_t>(loads[c * un + r]));
      total += static_cast<std::uint64_t>(loads[c * un + r]);
    }
    const double mean = static_cast<double>(total) / static_cast<double>(n);
    plan.candidates.push_back({candidates[c], most, mean > 0 ? static_cast<double>(most) / mean : 1.0});
    best = std::min(best, most);
  }
  for (const auto& c : plan.candidates) {
    if (static_cast<double>(c.max_load) <= (1.0 + tolerance) * static_cast<double>(best)) {
      plan.partitions = c.partitions;
      break;
    }
  }
  return plan;
}

/// A fitted t(P) = b/P + a(P-1) + c.
struct PartitionModel {
  double a = 0, b = 0, c = 0;
  double operator()(double p) const { return b / p + a * (p - 1) + c; }
  /// The candidate with the smallest predicted time.
  int best(const std::vector<int>& candidates) const {
    int arg = candidates.front();
    for (int p : candidates)
      if ((*this)(p) < (*this)(arg)) arg = p;
    return arg;
  }
};

/// Least-squares fit of t(P) = b/P + a(P-1) + c to measured step times
/// (Parallax, EuroSys'19, section 4.2). Needs at least three distinct P.
inline PartitionModel fit_partition_model(const std::vector<int>& partitions, const std::vector<double>& times) {
  PARALLAX_EXPECTS(partitions.size() == times.size(), "fit_partition_model: ", partitions.size(),
                   " partition counts but ", times.size(), " times");
  PARALLAX_EXPECTS(partitions.size() >= 3, "fit_partition_model needs at least three measurements, got ",
                   partitions.size());
  // Normal equations for the basis (1/P, P-1, 1).
  double m[3][4] = {};
  for (std::size_t i = 0; i < partitions.size(); ++i) {
    const double p = partitions[i];
    const double x[3] = {1.0 / p, p - 1.0, 1.0};
    for (int r = 0; r < 3; ++r) {
      for (int k = 0; k < 3; ++k) m[r][k] += x[r] * x[k];
      m[r][3] += x[r] * times[i];
    }
  }
  for (int col = 0; col < 3; ++col) {  // Gauss-Jordan with partial pivoting
    int piv = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::abs(m[r][col]) > std::abs(m[piv][col])) piv = r;
    for (int k = 0; k < 4; ++k) std::swap(m[col][k], m[piv][k]);
    PARALLAX_EXPECTS(std::abs(m[col][col]) > 1e-300, "fit_partition_model: the partition counts must be distinct");
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int k = col; k < 4; ++k) m[r][k] -= f * m[col][k];
    }
  }
  return PartitionModel{m[1][3] / m[1][1], m[0][3] / m[0][0], m[2][3] / m[2][2]};
}

}  // namespace parallax
