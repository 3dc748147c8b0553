#pragma once
/// @file
/// AllGatherv machinery: every rank's sparse rows gathered everywhere, then
/// coalesced, so every rank holds the global sparse gradient.

#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace parallax::policy::allgatherv {

/// Gathers sparse rows from every rank of an engine and sums duplicates.
///
/// Per call: one allgather of the row counts and one allgatherv of the rows
/// (ids + values), or, on an engine with alltoallv_unsized (engine::Mpi),
/// one message of (row count, rows) from every rank to every rank. Rank i
/// sends about (N-1)/N * sum_j k_j rows in a ring, or (N-1) k_i directly:
/// the same on average over the ranks, and it grows with N; that is this
/// policy's weakness. The sum of each row is
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
    byte_counts_.resize(un);
    byte_displs_.resize(un);
    std::size_t total_rows = 0;
    const auto mine = static_cast<std::int64_t>(k);
    const std::size_t block = detail::RowBlock<T>::bytes(k, cols_);
    if constexpr (engine::supports_v<Engine, engine::op_alltoallv_unsized>) {
      // One message to every rank: [row count][RowBlock], sizes learned on
      // arrival, so the counts need no round of their own.
      constexpr std::size_t head = sizeof(std::int64_t);
      send_.resize_discard(head + block);
      space_traits<space>::copy_from_host(send_.data(), &mine, head);
      pack(ids, values, k, send_.data() + head);
      sizes_.assign(2 * un, head + block);
      for (std::size_t r = 0; r < un; ++r) sizes_[un + r] = 0;  // every message is the same block
      engine_->alltoallv_unsized(send_.data(), sizes_.data(), sizes_.data() + un, byte_counts_.data(),
                                 byte_displs_.data(), [&](std::size_t total) {
                                   recv_.resize_discard(total);
                                   return recv_.data();
                                 });
      for (std::size_t r = 0; r < un; ++r) {
        space_traits<space>::copy_to_host(&counts_[r], recv_.data() + byte_displs_[r], head);
        byte_displs_[r] += head;
        total_rows += static_cast<std::size_t>(counts_[r]);
      }
    } else {
      engine_->allgather(&mine, counts_.data(), 1, DataType::i64);
      std::size_t total_bytes = 0;
      for (std::size_t r = 0; r < un; ++r) {
        const auto kr = static_cast<std::size_t>(counts_[r]);
        byte_counts_[r] = detail::RowBlock<T>::bytes(kr, cols_);
        byte_displs_[r] = total_bytes;
        total_bytes += byte_counts_[r];
        total_rows += kr;
      }
      send_.resize_discard(block);
      pack(ids, values, k, send_.data());
      recv_.resize_discard(total_bytes);
      engine_->allgatherv(send_.data(), send_.size(), recv_.data(), byte_counts_.data(), byte_displs_.data(),
                          DataType::u8);
    }
    if (rows_from) *rows_from = counts_;

    // In rank order, the values read where they landed (on the host): the
    // coalesce then sums each row by rank.
    rows_.resize(un);
    for (std::size_t r = 0; r < un; ++r) rows_[r] = static_cast<std::size_t>(counts_[r]);
    received_.unpack(ex, recv_.data(), byte_displs_.data(), rows_.data(), un, cols_);
    return detail::coalesce_rows(ex, received_.ids(), received_.values(), total_rows, cols_, out_ids, out_values,
                                 scratch_);
  }

 private:
  /// Writes k rows as a RowBlock at `out`.
  void pack(const index_t* ids, const T* values, std::size_t k, std::byte* out) {
    auto& ex = engine_->exec();
    ex.copy(detail::RowBlock<T>::ids(out), ids, k * sizeof(index_t));
    ex.copy(detail::RowBlock<T>::values(out, k), values, k * cols_ * sizeof(T));
    ex.synchronize();
  }

  Engine* engine_;
  std::size_t cols_;
  std::vector<std::int64_t> counts_;
  std::vector<std::size_t> byte_counts_, byte_displs_, rows_, sizes_;
  Buffer<std::byte, space> send_, recv_;
  detail::ReceivedRows<T, space> received_;
  detail::CoalesceScratch<space> scratch_;
};

}  // namespace parallax::policy::allgatherv

namespace parallax {
using policy::allgatherv::SparseAllGatherer;  // as tests and benchmarks name it
}  // namespace parallax
