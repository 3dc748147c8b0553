#pragma once
/// @file
/// A lookup ahead's rows served in two parts (ShardedOptions::early_rows):
/// once the prefetch's route has brought an owner the keys asked of it, the
/// owner replies at once, on the communication thread, with every asked row
/// that the step in progress is not expected to change, and at rows() with
/// the rest. Both parts travel as routes of (position, row) pairs from the
/// owner to the requester, who places each row where the single reply of a
/// plain lookup would have put it (the position is the row's place among
/// the keys the requester sent that owner).
///
/// Which rows wait: an owner cannot know the step's push before it
/// arrives, so it defers the asked rows whose keys it served since its last
/// push (the rows the step is expected to update) and serves the others
/// early. Exactness does not rest on that guess: every key the owner's
/// updates applied between the early reply and rows() is recorded, and at
/// rows() an early row whose key was applied is sent again, read after the
/// update. So a push outside the looked-up rows still gives exact rows.
///
/// Host memory only (the owners' keys and rows are read on the CPU); the
/// caller serves a device engine's prefetch at rows() in one part.

#include <parallax/detail/algorithms.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/policy/sharded_ps/group_routes.hpp>
#include <parallax/policy/sharded_ps/row_exchange.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace parallax::policy::sharded {

/// An owner's keys served since its last push (the rows a step is
/// expected to update). Host memory alone (elsewhere it records nothing).
class LookedUp {
 public:
  /// Adds the `n` keys a route brought, about to be served. Compacts the
  /// list when it doubles past its last compacted size (2^16 at least), so
  /// lookups without a push (an evaluation loop) keep it within twice the
  /// keys they served.
  template <class Space>
  void note(const index_t* keys, std::size_t n) {
    if constexpr (std::is_same_v<Space, HostSpace>) {
      keys_.insert(keys_.end(), keys, keys + n);
      if (keys_.size() >= std::max<std::size_t>(std::size_t{1} << 16, 2 * compacted_)) sorted();
    } else {
      (void)keys, (void)n;
    }
  }
  /// The keys, sorted and unique.
  const std::vector<index_t>& sorted() {
    std::sort(keys_.begin(), keys_.end());
    keys_.erase(std::unique(keys_.begin(), keys_.end()), keys_.end());
    compacted_ = keys_.size();
    return keys_;
  }
  void clear() noexcept {
    keys_.clear();
    compacted_ = 0;
  }

 private:
  std::vector<index_t> keys_;
  std::size_t compacted_ = 0;
};

/// One Pull's two-part reply: the owner's choice of rows and the
/// requester's landing buffer (rows in the order they were sent, as
/// RowExchange::reply() returns them).
template <class T, class Engine, class S = T>
class EarlyRows {
 public:
  using space = engine::space_of_t<Engine>;  // its functions are for HostSpace alone

  explicit EarlyRows(Engine& engine) : engine_(&engine), lane_(engine) {
    // Positions fit 32 bits (a route carries fewer rows than that per pair).
    if constexpr (sizeof(T) <= sizeof(std::uint32_t)) lane_.narrow_ids(0);
  }
  EarlyRows(const EarlyRows&) = delete;
  EarlyRows& operator=(const EarlyRows&) = delete;

  /// Whether an early part went out and the rest is still to come.
  bool pending() const noexcept { return pending_; }
  /// Forgets a pending reply (its lookup was cancelled).
  void cancel() noexcept {
    pending_ = false;
    applied_.clear();
  }

  /// Owner, after the route of `asked` (the lookup's lane): the lane of the
  /// early part, every asked row whose key is not in `looked_up` (sorted,
  /// unique). `shard` and `base`: this rank's group shard and its first key.
  RouteLane& plan_early(const RowExchange<T, Engine>& asked, const std::vector<index_t>& looked_up, const S* shard,
                        index_t base, std::size_t cols) {
    const std::size_t k = asked.received();
    const index_t* keys = asked.received_ids();
    early_.assign(k, false);
    for (std::size_t j = 0; j < k; ++j)
      early_[j] = !std::binary_search(looked_up.begin(), looked_up.end(), keys[j]);
    applied_.clear();
    pending_ = true;
    return plan_rows(asked, shard, base, cols, [&](std::size_t j) { return early_[j]; });
  }

  /// Owner, at rows(): the lane of the rest, the rows deferred and the
  /// early ones whose keys an update applied since (applied()).
  RouteLane& plan_late(const RowExchange<T, Engine>& asked, const S* shard, index_t base, std::size_t cols) {
    std::sort(applied_.begin(), applied_.end());
    applied_.erase(std::unique(applied_.begin(), applied_.end()), applied_.end());
    const index_t* keys = asked.received_ids();
    pending_ = false;
    return plan_rows(asked, shard, base, cols, [&](std::size_t j) {
      return !early_[j] || std::binary_search(applied_.begin(), applied_.end(), keys[j]);
    });
  }
  /// Owner: an update wrote the rows of these `m` keys (while pending()).
  void applied(const index_t* keys, std::size_t m) {
    if (pending_) applied_.insert(applied_.end(), keys, keys + m);
  }
  /// How many of the last plan_late()'s rows were early rows sent again
  /// (an update touched them after the early part).
  std::size_t resent() const noexcept { return resent_; }

  /// Requester, after the route of a part: puts the rows it brought where
  /// the lookup's single reply would have (`sent`: the lookup's lane, whose
  /// plan sent the keys). `first`: the early part (sizes the landing).
  void land(const RowExchange<T, Engine>& sent, std::size_t cols, bool first) {
    const auto un = static_cast<std::size_t>(engine_->size());
    sent_first_.assign(un + 1, 0);
    for (std::size_t o = 0; o < un; ++o) sent_first_[o + 1] = sent_first_[o] + sent.rows_to(static_cast<int>(o));
    if (first) landing_.resize_discard(sent_first_[un] * cols);
    const index_t* pos = lane_.received_ids();
    const detail::RowsAt<T> rows = lane_.received_values();
    std::size_t i = 0;
    for (std::size_t o = 0; o < un; ++o)
      for (std::size_t r = lane_.received_from(static_cast<int>(o)); r > 0; --r, ++i)
        std::copy_n(rows.row(i, cols), cols, landing_.data() + (sent_first_[o] + static_cast<std::size_t>(pos[i])) * cols);
  }
  /// The rows, in the order the lookup's lane sent their keys; copied to
  /// `out` too when given (a lookup whose rows land in place).
  const T* landing(T* out) {
    if (out) engine_->exec().copy(out, landing_.data(), landing_.size() * sizeof(T));
    return landing_.data();
  }

 private:
  /// The lane of the asked rows j with pick(j): each one's place among its
  /// sender's keys, and its row as the shard holds it now.
  template <class Pick>
  RouteLane& plan_rows(const RowExchange<T, Engine>& asked, const S* shard, index_t base, std::size_t cols,
                       Pick&& pick) {
    const std::size_t k = asked.received();
    const index_t* keys = asked.received_ids();
    const auto un = static_cast<std::size_t>(engine_->size());
    pos_.resize_discard(k);
    dest_.resize_discard(k);
    keys_.resize_discard(k);
    std::size_t m = 0, j = 0;
    resent_ = 0;
    for (std::size_t p = 0; p < un; ++p)
      for (std::size_t t = 0, from = asked.received_from(static_cast<int>(p)); t < from; ++t, ++j)
        if (pick(j)) {
          pos_.data()[m] = static_cast<index_t>(t);
          dest_.data()[m] = static_cast<std::int32_t>(p);
          keys_.data()[m] = keys[j];
          resent_ += early_.size() > j && early_[j] && !pending_;
          ++m;
        }
    rows_.resize_discard(m * cols);
    auto& ex = engine_->exec();
    if (m) for_each_rows(ex, m, cols, GatherKeyedRows<T, S>{shard, keys_.data(), base, rows_.data(), cols});
    ex.synchronize();
    lane_.plan(pos_.data(), detail::RowsAt<T>(rows_.data()), dest_.data(), m, cols);
    return lane_;
  }

  Engine* engine_;
  bool pending_ = false;
  std::size_t resent_ = 0;
  std::vector<bool> early_;        // per asked row: sent in the early part
  std::vector<index_t> applied_;   // keys updated while pending
  std::vector<std::size_t> sent_first_;
  Buffer<index_t, space> pos_, keys_;
  Buffer<std::int32_t, space> dest_;
  Buffer<T, space> rows_, landing_;
  RowExchange<T, Engine> lane_;  // both parts' lane, owner to requester
};

}  // namespace parallax::policy::sharded
