#pragma once
/// @file
/// Bags under AsyncPS (docs/design.md, "Bags"). No owner computes for
/// another rank under AsyncPS: a rank reads the rows it needs itself, from
/// the owners' shared-memory shards or by RMA gets. So it pools where it
/// reads: each request's distinct ids are read once (a row lock each, or a
/// row of the owner's get), however many bags name them, and its bags
/// pooled from those rows with the kernels every policy uses (bags.hpp).
/// The pooled gradient gives each id its row (LocalBags), in the variable's
/// sparse gradient, which the step pushes as any other.
///
/// Not collective, as AsyncPS's lookups are not: a bad request or gradient
/// throws on the rank that made it, `rank r: bags of variable 'v': ...`.

#include <parallax/bags.hpp>
#include <parallax/error.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace parallax::policy::async {

/// A request's ids, each read once: `distinct` ascending, and `at[j]` the
/// offset of id j's row among the distinct ids' rows (`cols` values each).
struct DistinctIds {
  std::vector<index_t> distinct, at;

  void assign(const index_t* ids, std::size_t n, std::size_t cols) {
    order_.resize(n);
    for (std::size_t j = 0; j < n; ++j) order_[j] = j;
    std::sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) { return ids[a] < ids[b]; });
    distinct.clear();
    at.resize(n);
    for (std::size_t j : order_) {
      if (distinct.empty() || distinct.back() != ids[j]) distinct.push_back(ids[j]);
      at[j] = static_cast<index_t>((distinct.size() - 1) * cols);
    }
  }

 private:
  std::vector<std::size_t> order_;
};

/// The bags of an AsyncPS rank, pooled where it reads them.
template <class Space>
class ReadBags {
 public:
  /// The pooled rows of each request of `batch`: `read(var, ids, n)` reads
  /// n rows of a table (AsyncPS's lookup: valid until the step's clear()).
  /// Throws, here only, if a request is bad.
  template <class V, class Read>
  std::vector<Rows<typename V::value_type, Space>> lookup(const Exec<Space>& ex, int rank, const Bags<V>* batch,
                                                          std::size_t count, Read&& read) {
    using T = typename V::value_type;
    std::vector<std::vector<index_t>> offsets;
    throw_if(rank, detail::batch_problem(ex, batch, count, offsets));
    std::vector<detail::RowsAt<T>> rows;
    for (std::size_t i = 0; i < count; ++i) {
      if (used_ == distinct_.size()) distinct_.emplace_back();
      DistinctIds& d = distinct_[used_++];
      d.assign(batch[i].ids, batch[i].n, batch[i].var->cols());
      rows.emplace_back(read(*batch[i].var, d.distinct.data(), d.distinct.size()).data, d.at.data());
    }
    return bags_.template of<T>().pool(ex, batch, count, rows);
  }

  /// The gradients of the last batch whose gradient was not given yet, one
  /// per request in its order, given to its ids' rows of the variables'
  /// sparse gradients. Throws, here only, if they do not fit that batch.
  template <class V>
  void gradients(const Exec<Space>& ex, int rank, const BagGradient<V>* g, std::size_t count) {
    auto& bags = bags_.template of<typename V::value_type>();
    throw_if(rank, bags.gradients_problem(g, count));
    bags.give(ex, g, count);
  }

  /// Forgets the step's lookups (the buffers stay for the next one).
  void clear() noexcept {
    bags_.clear();
    used_ = 0;
  }

 private:
  static void throw_if(int rank, const std::optional<std::string>& problem) {
    if (problem) throw error(detail::concat("rank ", rank, ": ", *problem));
  }

  LocalBagsOfEachType<Space> bags_;
  std::vector<DistinctIds> distinct_;  // per request of the step; at[] is read until clear()
  std::size_t used_ = 0;
};

}  // namespace parallax::policy::async
