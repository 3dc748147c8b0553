#pragma once
/// @file
/// AllGatherv machinery: every rank's sparse rows gathered everywhere, then
/// coalesced, so every rank holds the global sparse gradient.

#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax {


/// Gathers sparse rows from every rank of an engine and sums duplicates.
///
/// Per call: one allgather of the row counts and one allgatherv of the rows
/// (ids + values). Rank i sends about (N-1)/N * sum_j k_j rows in a ring,
/// which grows with N; that is this policy's weakness. The sum of each row is
/// taken by rank order, so every rank computes identical bits.
template <class T, class Engine>
class SparseAllGatherer {
 public:
  using space = engine::space_of_t<Engine>;

  SparseAllGatherer(Engine& engine, std::size_t cols) : engine_(&engine), cols_(cols) {}

  /// Gathers this rank's k rows (`ids`, `values`, in space; coalesced or not)
  /// with every other rank's. Writes the m unique ids (ascending) and summed
  /// rows to out_ids / out_values and returns m. `rows_from` gets each rank's
  /// row count if given.
  std::size_t gather(const index_t* ids, const T* values, std::size_t k, Buffer<index_t, space>& out_ids,
                     Buffer<T, space>& out_values, std::vector<std::int64_t>* rows_from = nullptr) {
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    auto& ex = engine_->exec();
    counts_.resize(un);
    const auto mine = static_cast<std::int64_t>(k);
    engine_->allgather(&mine, counts_.data(), 1, DataType::i64);
    if (rows_from) *rows_from = counts_;

    byte_counts_.resize(un);
    byte_displs_.resize(un);
    std::size_t total_bytes = 0, total_rows = 0;
    for (std::size_t r = 0; r < un; ++r) {
      const auto kr = static_cast<std::size_t>(counts_[r]);
      byte_counts_[r] = detail::RowBlock<T>::bytes(kr, cols_);
      byte_displs_[r] = total_bytes;
      total_bytes += byte_counts_[r];
      total_rows += kr;
    }
    send_.resize_discard(detail::RowBlock<T>::bytes(k, cols_));
    ex.copy(detail::RowBlock<T>::ids(send_.data()), ids, k * sizeof(index_t));
    ex.copy(detail::RowBlock<T>::values(send_.data(), k), values, k * cols_ * sizeof(T));
    ex.synchronize();
    recv_.resize_discard(total_bytes);
    engine_->allgatherv(send_.data(), send_.size(), recv_.data(), byte_counts_.data(), byte_displs_.data(),
                        DataType::u8);

    // In rank order, the values read where they landed (on the host): the
    // coalesce then sums each row by rank.
    rows_.resize(un);
    for (std::size_t r = 0; r < un; ++r) rows_[r] = static_cast<std::size_t>(counts_[r]);
    received_.unpack(ex, recv_.data(), byte_displs_.data(), rows_.data(), un, cols_);
    return detail::coalesce_rows(ex, received_.ids(), received_.values(), total_rows, cols_, out_ids, out_values,
                                 scratch_);
  }

 private:
  Engine* engine_;
  std::size_t cols_;
  std::vector<std::int64_t> counts_;
  std::vector<std::size_t> byte_counts_, byte_displs_, rows_;
  Buffer<std::byte, space> send_, recv_;
  detail::ReceivedRows<T, space> received_;
  detail::CoalesceScratch<space> scratch_;
};

}  // namespace parallax
