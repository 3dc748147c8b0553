#pragma once
// RowExchange: sends rows (id + values) to ranks chosen per row, and replies
// back. The parameter-server pull and push are built from it.
//
// One route() is two engine calls: an alltoall of a two-word header per pair
// (row count, status) and an alltoallv of the rows packed per destination as
// [ids][values]. The status word carries a bad row id, so a bad input on any
// rank is known to every rank after the header, and the rows are not sent.

#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <thrust/binary_search.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace parallax::detail {

inline constexpr index_t no_problem = std::numeric_limits<index_t>::min();

/// A bad row id reported by some rank during an exchange.
struct RemoteProblem {
  int rank;
  index_t id;
};

template <class T>
struct PackIds {
  const index_t* ids;
  const index_t* order;    // row sent j-th is input row order[j]
  const std::int32_t* dest;  // sorted destinations
  const index_t* meta;     // [first row per dest (N+1)][byte offset per dest (N)]
  int ranks;
  std::byte* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j) const {
    const int p = dest[j];
    const index_t t = static_cast<index_t>(j) - meta[p];
    RowBlock<T>::ids(out + meta[ranks + 1 + p])[t] = ids[order[j]];
  }
};

template <class T>
struct PackValues {
  const T* values;
  const index_t* order;
  const std::int32_t* dest;
  const index_t* meta;
  int ranks;
  std::size_t cols;
  std::byte* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t j, std::size_t c) const {
    const int p = dest[j];
    const index_t t = static_cast<index_t>(j) - meta[p];
    const auto count = static_cast<std::size_t>(meta[p + 1] - meta[p]);
    T* block = RowBlock<T>::values(out + meta[ranks + 1 + p], count);
    block[static_cast<std::size_t>(t) * cols + c] = values[static_cast<std::size_t>(order[j]) * cols + c];
  }
};

template <class T, class Engine>
class RowExchange {
 public:
  using space = engine::space_of_t<Engine>;

  explicit RowExchange(Engine& engine) : engine_(&engine) {}

  /// Sends row i (ids[i] and, if cols > 0, values[i*cols, (i+1)*cols)) to
  /// rank dest[i]. Collective. `bad_id` is this rank's problem to share
  /// (no_problem if none); if any rank has one, no rows move and every rank
  /// gets the lowest such rank's report.
  std::optional<RemoteProblem> route(const index_t* ids, const T* values, const std::int32_t* dest, std::size_t k,
                                     std::size_t cols, index_t bad_id = no_problem) {
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    auto& ex = engine_->exec();
    if (bad_id != no_problem) k = 0;

    // Group rows by destination, keeping their order within a destination.
    // Rows already grouped (ascending ids over contiguous partitions, the
    // usual case) skip the sort and keep their input order.
    keys_.resize_discard(k);
    order_.resize_discard(k);
    in_order_ = true;
    meta_.resize_discard(2 * un + 1);
    with_thrust(ex, k, [&](auto policy) {
      if (k) {
        ex.copy(keys_.data(), dest, k * sizeof(std::int32_t));
        thrust::sequence(policy, order_.data(), order_.data() + k);
        in_order_ = thrust::is_sorted(policy, keys_.data(), keys_.data() + k);
        if (!in_order_) thrust::stable_sort_by_key(policy, keys_.data(), keys_.data() + k, order_.data());
      }
      thrust::lower_bound(policy, keys_.data(), keys_.data() + k, thrust::counting_iterator<std::int32_t>(0),
                          thrust::counting_iterator<std::int32_t>(n + 1), meta_.data());
    });
    host_meta_.resize(2 * un + 1);
    space_traits<space>::copy_to_host(host_meta_.data(), meta_.data(), (un + 1) * sizeof(index_t));

    // Header: (rows for you, my status) to every rank.
    send_header_.resize(2 * un);
    recv_header_.resize(2 * un);
    for (std::size_t p = 0; p < un; ++p) {
      send_header_[2 * p] = host_meta_[p + 1] - host_meta_[p];
      send_header_[2 * p + 1] = bad_id;
    }
    engine_->alltoall(send_header_.data(), recv_header_.data(), 2, DataType::i64);
    for (int p = 0; p < n; ++p)
      if (recv_header_[2 * static_cast<std::size_t>(p) + 1] != no_problem)
        return RemoteProblem{p, recv_header_[2 * static_cast<std::size_t>(p) + 1]};

    // Rows, packed per destination as [ids][values] (RowBlock).
    send_bytes_.resize(un);
    send_displs_.resize(un);
    recv_bytes_.resize(un);
    recv_displs_.resize(un);
    recv_rows_.resize(un);
    recv_first_.resize(un + 1);
    std::size_t st = 0, rt = 0, rows_in = 0;
    for (std::size_t p = 0; p < un; ++p) {
      const auto out_rows = static_cast<std::size_t>(send_header_[2 * p]);
      send_bytes_[p] = RowBlock<T>::bytes(out_rows, cols);
      send_displs_[p] = st;
      host_meta_[un + 1 + p] = static_cast<index_t>(st);
      st += send_bytes_[p];
      recv_rows_[p] = static_cast<std::size_t>(recv_header_[2 * p]);
      recv_first_[p] = rows_in;
      rows_in += recv_rows_[p];
      recv_bytes_[p] = RowBlock<T>::bytes(recv_rows_[p], cols);
      recv_displs_[p] = rt;
      rt += recv_bytes_[p];
    }
    recv_first_[un] = rows_in;
    space_traits<space>::copy_from_host(meta_.data() + un + 1, host_meta_.data() + un + 1, un * sizeof(index_t));
    send_.resize_discard(st);
    if (k) {
      for_each(ex, k, PackIds<T>{ids, order_.data(), keys_.data(), meta_.data(), n, send_.data()});
      for_each_rows(ex, k, cols, PackValues<T>{values, order_.data(), keys_.data(), meta_.data(), n, cols, send_.data()});
    }
    ex.synchronize();
    recv_.resize_discard(rt);
    engine_->alltoallv(send_.data(), send_bytes_.data(), send_displs_.data(), recv_.data(), recv_bytes_.data(),
                       recv_displs_.data(), DataType::u8);

    // Unpack to contiguous ids / values, in source-rank order.
    received_ids_.resize_discard(rows_in);
    received_values_.resize_discard(rows_in * cols);
    for (std::size_t p = 0; p < un; ++p) {
      const std::size_t r = recv_rows_[p];
      if (!r) continue;
      std::byte* block = recv_.data() + recv_displs_[p];
      ex.copy(received_ids_.data() + recv_first_[p], RowBlock<T>::ids(block), r * sizeof(index_t));
      if (cols)
        ex.copy(received_values_.data() + recv_first_[p] * cols, RowBlock<T>::values(block, r), r * cols * sizeof(T));
    }
    ex.synchronize();
    return std::nullopt;
  }

  /// Rows received by the last route(), concatenated by source rank.
  std::size_t received() const noexcept { return received_ids_.size(); }
  const index_t* received_ids() const noexcept { return received_ids_.data(); }
  const T* received_values() const noexcept { return received_values_.data(); }
  Buffer<index_t, space>& received_id_buffer() noexcept { return received_ids_; }
  Buffer<T, space>& received_value_buffer() noexcept { return received_values_; }
  std::size_t received_from(int rank) const noexcept { return recv_rows_[static_cast<std::size_t>(rank)]; }

  /// True when the last route() sent its rows in input order (they were
  /// already grouped by destination): then reply() is aligned to the input
  /// rows.
  bool sent_in_input_order() const noexcept { return in_order_; }

  /// Sends `cols` values per row received by the last route() back to its
  /// sender. Returns the replies in the order the rows were sent (grouped by
  /// destination, in input order within one; the input order itself when
  /// sent_in_input_order()), valid until the next reply.
  const T* reply(const T* values, std::size_t cols) {
    const int n = engine_->size();
    const auto un = static_cast<std::size_t>(n);
    reply_scounts_.resize(un);
    reply_sdispls_.resize(un);
    reply_rcounts_.resize(un);
    reply_rdispls_.resize(un);
    std::size_t rt = 0;
    for (std::size_t p = 0; p < un; ++p) {
      reply_scounts_[p] = recv_rows_[p] * cols;
      reply_sdispls_[p] = recv_first_[p] * cols;
      reply_rcounts_[p] = static_cast<std::size_t>(host_meta_[p + 1] - host_meta_[p]) * cols;
      reply_rdispls_[p] = rt;
      rt += reply_rcounts_[p];
    }
    replies_.resize_discard(rt);
    engine_->alltoallv(values, reply_scounts_.data(), reply_sdispls_.data(), replies_.data(), reply_rcounts_.data(),
                       reply_rdispls_.data(), data_type_of_v<T>);
    return replies_.data();
  }

 private:
  Engine* engine_;
  bool in_order_ = true;
  Buffer<std::int32_t, space> keys_;
  Buffer<index_t, space> order_;
  Buffer<index_t, space> meta_;
  std::vector<index_t> host_meta_;
  std::vector<std::int64_t> send_header_, recv_header_;
  std::vector<std::size_t> send_bytes_, send_displs_, recv_bytes_, recv_displs_, recv_rows_, recv_first_;
  std::vector<std::size_t> reply_scounts_, reply_sdispls_, reply_rcounts_, reply_rdispls_;
  Buffer<std::byte, space> send_, recv_;
  Buffer<index_t, space> received_ids_;
  Buffer<T, space> received_values_;
  Buffer<T, space> replies_;
};

}  // namespace parallax::detail
