#pragma once
/// @file
/// The eviction order of a dynamic table (dynamic::Table, table.hpp): which
/// live rows go first when the table is full, and each row's record (its
/// key, last step, count, whether it is live, and LRU's place in the
/// queue), one record a row so that what a lookup, an insert or an
/// eviction reads and writes of a row lies in one cache line. Rows go by
/// lowest (score, last step, key), so the same contents evict the same
/// keys whatever their insertion order.
///
/// LRU keeps its rows in a queue in the order of their last step: a row's
/// first sighting at a step appends it, and the entry it had before goes
/// stale (each row knows the place of its one current entry). The lowest
/// rows are then the queue's head, and only the head's step is sorted by
/// key, when evictions reach it; a row costs one append a step it is seen,
/// whatever the capacity.
///
/// LFU and a user score move rows both ways, so they keep a cache of the
/// lowest rows instead (a table gives it room for a quarter of its
/// capacity, a rebuild fills about half of that), read in order from call
/// to call, so a full table scans its rows about once per that many
/// evictions. Rows seen after the cache was built that fall at or below
/// its threshold join it (catch_up).

#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace parallax::dynamic {

/// Which rows go when the table is full: the lowest score first.
enum class Evict : std::uint8_t {
  lru,   ///< score: the step a row was last seen
  lfu,   ///< score: how often it was seen since it took its row
  score  ///< score: Options::score(key, count, last_step)
};

/// A user's eviction score (Evict::score): lower goes first.
using ScoreFn = std::function<double(std::uint64_t key, std::uint64_t count, std::uint64_t last_step)>;

/// A row's record: what the table and its eviction order keep of a row
/// besides its values and optimizer state. 32 bytes, aligned so that a
/// record never straddles two cache lines.
struct alignas(32) RowRecord {
  std::uint64_t key = 0;
  std::uint64_t last = 0;   ///< the step it was last seen
  std::uint64_t count = 0;  ///< how often it was seen since it took its row
  std::uint32_t place = 0;  ///< LRU: its current entry in the queue
  std::uint8_t flags = 0;   ///< live, and (LFU, score) in the seen list
};
static_assert(sizeof(RowRecord) == 32, "a RowRecord is half a cache line");

/// The eviction order of `capacity` rows, with their records.
class EvictionOrder {
 public:
  EvictionOrder() = default;
  /// `cache_rows`: the lowest rows kept from call to call (at most capacity).
  EvictionOrder(std::size_t capacity, std::size_t cache_rows, Evict evict, ScoreFn score)
      : evict_(evict), score_(std::move(score)), capacity_(capacity), cache_rows_(cache_rows) {
    rows_.assign(capacity, RowRecord{});
    if (evict_ == Evict::lru) {
      // Room for half the capacity's appends between compactions, each of
      // which leaves at most the live rows: a compaction per capacity / 2
      // appends. Places are 32-bit (Table's capacity is below 2^32 - 1).
      queue_.resize(std::min<std::size_t>(capacity + std::max<std::size_t>(capacity / 2, 1), UINT32_MAX));
      return;
    }
    cache_.reserve(cache_rows_);
    if (tracks_seen()) {
      extra_.reserve(cache_rows_);
      seen_.reserve(capacity);
    }
  }

  /// Row r's record (r in [0, capacity)).
  RowRecord& row(std::size_t r) noexcept { return rows_[r]; }
  const RowRecord& row(std::size_t r) const noexcept { return rows_[r]; }
  void prefetch_row(std::size_t r) const noexcept { prefetch_bytes(&rows_[r], sizeof(RowRecord)); }
  bool live(std::size_t r) const noexcept { return (rows_[r].flags & live_flag) != 0; }
  void set_live(std::size_t r) noexcept { rows_[r].flags |= live_flag; }
  void clear_live(std::size_t r) noexcept { rows_[r].flags &= static_cast<std::uint8_t>(~live_flag); }

  /// Row r was found or created (its record's last step and count updated); `fresh`:
  /// its first sighting at this step (a created row always is).
  void seen(std::uint32_t r, bool fresh) {
    if (evict_ == Evict::lru) {
      if (fresh && !stale_) append(r);
    } else if (cached_) {
      mark_seen(r);
    }
  }

  /// Starts a round of evictions at `step` (the current one); with
  /// `spare_current`, rows seen at it stay, and the cache is kept for later rounds.
  void begin(std::uint64_t step, bool spare_current) {
    if (evict_ == Evict::lru) {
      if (stale_) rebuild_queue();
      return;
    }
    if (!spare_current) cached_ = false;  // its entries spare the current step
    else if (cached_) catch_up(step, true);
  }
  /// The key of the next row to go, `wanted` being how many more this
  /// round takes at most; false when no row is left to evict. The caller
  /// removes the row (clear_live) before asking for another.
  bool next(std::uint64_t step, bool spare_current, std::size_t wanted, std::uint64_t& key) {
    if (evict_ == Evict::lru) return next_in_queue(step, spare_current, key);
    Candidate c;
    if (!cached_ || !next_victim(c)) {
      build_cache(step, spare_current ? cache_rows_ : std::min(wanted, cache_rows_), spare_current);
      if (!cached_ || !next_victim(c)) return false;
    }
    key = c.key;
    return true;
  }
  /// Whether next() may be asked again before the row it gave is removed
  /// (LRU: each entry it gives is its row's only current one).
  bool takes_ahead() const noexcept { return evict_ == Evict::lru; }
  /// Drops the cache or the queue (rows changed behind it: an import).
  void forget() noexcept {
    cached_ = false;
    stale_ = evict_ == Evict::lru;
  }
  /// Ends the round begun with the same `spare_current`.
  void end(bool spare_current) noexcept {
    if (!spare_current) cached_ = false;  // a one-off cache
  }

  /// The bytes held, all reserved at construction.
  std::size_t bytes() const noexcept {
    return rows_.capacity() * sizeof(RowRecord) + (cache_.capacity() + extra_.capacity()) * sizeof(Candidate) +
           (seen_.capacity() + queue_.capacity()) * sizeof(std::uint32_t);
  }

 private:
  /// A row's place in the eviction order, as it was when the entry was
  /// made: lower goes first. For LRU the score is 0 and (last, key) orders.
  struct Candidate {
    double score;
    std::uint64_t last, key;
    std::uint32_t row;
  };
  static bool before(const Candidate& a, const Candidate& b) noexcept {
    if (a.score != b.score) return a.score < b.score;
    return a.last != b.last ? a.last < b.last : a.key < b.key;
  }
  // As function objects, so that the heap algorithms inline them.
  struct Before {
    bool operator()(const Candidate& a, const Candidate& b) const noexcept { return before(a, b); }
  };
  struct After {
    bool operator()(const Candidate& a, const Candidate& b) const noexcept { return before(b, a); }
  };
  Candidate candidate(std::uint32_t r) const {
    const RowRecord& x = rows_[r];
    double score = 0.0;
    if (evict_ == Evict::lfu) score = static_cast<double>(x.count);
    else if (evict_ == Evict::score) score = score_(x.key, x.count, x.last);
    return Candidate{score, x.last, x.key, r};
  }
  /// An entry still describes its row: the row is live, holds the key and
  /// has not been seen since (every lookup that finds or creates a row
  /// sets its last step to one after every entry's).
  bool current(const Candidate& c) const noexcept {
    return live(c.row) && rows_[c.row].key == c.key && rows_[c.row].last == c.last;
  }
  /// LFU's and a user score's rows move in the order when seen (a count
  /// goes up, a score may go down); LRU's only go to the end.
  bool tracks_seen() const noexcept { return evict_ != Evict::lru; }
  void mark_seen(std::uint32_t r) {
    if (!tracks_seen() || (rows_[r].flags & seen_flag) != 0) return;
    rows_[r].flags |= seen_flag;
    seen_.push_back(r);
  }
  void unmark_seen(std::uint32_t r) noexcept { rows_[r].flags &= static_cast<std::uint8_t>(~seen_flag); }

  /// Rebuilds the cache with the lowest live rows (sparing the current
  /// step's with `spare_current`), at most `k` and about k / 2, in
  /// ascending order. A systematic sample of the rows gives a threshold
  /// (its place in the sample is k / 2 rows' in the table), one pass over
  /// the rows keeps those at or below it, and a sort orders them; should
  /// more than k pass, a bounded max-heap keeps the k lowest. `threshold_`
  /// is then such that every row outside the cache lies above it.
  void build_cache(std::uint64_t step, std::size_t k, bool spare_current) {
    cached_ = false;
    cache_.clear();
    extra_.clear();
    at_ = 0;
    for (std::uint32_t r : seen_) unmark_seen(r);
    seen_.clear();
    if (k == 0) return;
    const auto eligible = [&](std::uint32_t r) { return live(r) && !(spare_current && rows_[r].last == step); };
    // The sample, in cache_'s storage: every stride-th row.
    const std::size_t stride = std::max<std::size_t>(1, capacity_ / std::min<std::size_t>(k, sample_rows));
    for (std::size_t i = 0; i < capacity_; i += stride)
      if (eligible(static_cast<std::uint32_t>(i))) cache_.push_back(candidate(static_cast<std::uint32_t>(i)));
    const std::size_t pick = k / 2 / stride;  // each sampled row stands for `stride` rows
    const bool bounded = pick < cache_.size();
    Candidate cut{};
    if (bounded) {
      std::nth_element(cache_.begin(), cache_.begin() + static_cast<std::ptrdiff_t>(pick), cache_.end(), Before{});
      cut = cache_[pick];
    }
    cache_.clear();
    bool heap = false;
    for (std::size_t i = 0; i < capacity_; ++i) {
      const auto r = static_cast<std::uint32_t>(i);
      if (!live(r)) continue;
      if (spare_current && rows_[r].last == step) {
        mark_seen(r);  // may fall below the threshold once its step has passed
        continue;
      }
      const Candidate c = candidate(r);
      if (bounded && before(cut, c)) continue;
      if (cache_.size() < k) {
        cache_.push_back(c);
      } else {
        if (!heap) std::make_heap(cache_.begin(), cache_.end(), Before{});
        heap = true;
        if (before(c, cache_.front())) replace_top(c);
      }
    }
    if (cache_.empty()) return;
    std::sort(cache_.begin(), cache_.end(), Before{});
    threshold_ = heap || !bounded ? cache_.back() : cut;
    cached_ = true;
  }

  /// Replaces the top of the max-heap cache_ with c, which is below it, and sifts it down.
  void replace_top(const Candidate& c) noexcept {
    const std::size_t n = cache_.size();
    std::size_t hole = 0;
    for (;;) {
      std::size_t child = 2 * hole + 1;
      if (child >= n) break;
      if (child + 1 < n && before(cache_[child], cache_[child + 1])) ++child;
      if (!before(c, cache_[child])) break;
      cache_[hole] = cache_[child];
      hole = child;
    }
    cache_[hole] = c;
  }

  /// Rows seen since the cache was built whose place now lies at or below
  /// its threshold join it (a min-heap beside the sorted cache); when
  /// more than the cache holds would, the cache is dropped and rebuilt.
  void catch_up(std::uint64_t step, bool spare_current) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < seen_.size(); ++i) {
      const std::uint32_t r = seen_[i];
      if (!live(r)) {
        unmark_seen(r);
        continue;
      }
      if (spare_current && rows_[r].last == step) {
        seen_[kept++] = r;  // not a candidate until its step has passed
        continue;
      }
      unmark_seen(r);
      const Candidate c = candidate(r);
      if (before(threshold_, c)) continue;
      if (extra_.size() == extra_.capacity()) {  // rebuilt at once: every row is looked at again
        cached_ = false;
        for (std::uint32_t q : seen_) unmark_seen(q);
        seen_.clear();
        return;
      }
      extra_.push_back(c);
      std::push_heap(extra_.begin(), extra_.end(), After{});
    }
    seen_.resize(kept);
  }

  /// The lowest current entry of the cache, removed from it; false when none is left.
  bool next_victim(Candidate& out) {
    for (;;) {
      const bool in_cache = at_ < cache_.size(), in_extra = !extra_.empty();
      if (!in_cache && !in_extra) return false;
      if (in_extra && (!in_cache || before(extra_.front(), cache_[at_]))) {
        std::pop_heap(extra_.begin(), extra_.end(), After{});
        out = extra_.back();
        extra_.pop_back();
      } else {
        out = cache_[at_++];
      }
      if (current(out)) return true;
    }
  }

  /// LRU's queue: whether queue_[p] is its row's current entry.
  bool current_at(std::size_t p) const noexcept {
    const std::uint32_t r = queue_[p];
    return live(r) && rows_[r].place == p;
  }
  /// Asks for the record current_at(p + ahead) reads, where the queue has
  /// that entry: the queue is read in order, its rows lie anywhere.
  static constexpr std::size_t ahead = 8;
  void prefetch_entry(std::size_t p) const noexcept {
    if (p + ahead < tail_) prefetch_row(queue_[p + ahead]);
  }
  void append(std::uint32_t r) {
    if (sorted_open_) sorted_end_ = head_;  // r may join the sorted step: sort it again
    sorted_open_ = false;
    if (tail_ == queue_.size()) compact();
    queue_[tail_] = r;
    rows_[r].place = static_cast<std::uint32_t>(tail_);
    ++tail_;
  }
  /// Moves the current entries to the front, in order.
  void compact() noexcept {
    std::size_t w = 0;
    for (std::size_t p = head_; p < tail_; ++p) {
      prefetch_entry(p);
      if (current_at(p)) {
        const std::uint32_t r = queue_[p];
        queue_[w] = r;
        rows_[r].place = static_cast<std::uint32_t>(w++);
      }
    }
    head_ = sorted_end_ = 0;
    tail_ = w;
  }
  /// The queue anew from the live rows, by (last step, key): after an import.
  void rebuild_queue() {
    tail_ = 0;
    for (std::size_t r = 0; r < capacity_; ++r)
      if (live(r)) queue_[tail_++] = static_cast<std::uint32_t>(r);
    std::sort(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(tail_), [&](std::uint32_t a, std::uint32_t b) {
      const RowRecord &x = rows_[a], &y = rows_[b];
      return x.last != y.last ? x.last < y.last : x.key < y.key;
    });
    for (std::size_t p = 0; p < tail_; ++p) rows_[queue_[p]].place = static_cast<std::uint32_t>(p);
    head_ = sorted_end_ = 0;  // sort_head() reads the first step off again
    sorted_open_ = stale_ = false;
  }
  /// Sorts the head's step by key: its current entries, gathered to the
  /// head (the ones of later steps stay behind them). Current entries lie
  /// in the queue in the order of their last step, each at the step it was
  /// appended. False when the queue holds no current entry.
  bool sort_head(std::uint64_t step) {
    for (std::size_t p = head_; p < std::min(head_ + ahead, tail_); ++p) prefetch_row(queue_[p]);
    for (; head_ < tail_; ++head_) {
      prefetch_entry(head_);
      if (current_at(head_)) break;
    }
    if (head_ == tail_) return false;
    sorted_step_ = rows_[queue_[head_]].last;
    // The step's rows with their keys beside them, so that the sort
    // compares keys in its own array, not through the scattered records.
    by_key_.clear();
    for (std::size_t p = head_; p < tail_; ++p) {
      prefetch_entry(p);
      if (!current_at(p)) continue;  // stale entries are passed over: no place points to them
      const std::uint32_t r = queue_[p];
      if (rows_[r].last != sorted_step_) break;
      by_key_.emplace_back(rows_[r].key, r);
    }
    std::sort(by_key_.begin(), by_key_.end(),
              [](const std::pair<std::uint64_t, std::uint32_t>& a, const std::pair<std::uint64_t, std::uint32_t>& b) {
                return a.first < b.first;
              });
    std::size_t w = head_;
    for (const auto& [key, r] : by_key_) {
      queue_[w] = r;
      rows_[r].place = static_cast<std::uint32_t>(w++);
    }
    sorted_end_ = w;
    sorted_open_ = sorted_step_ >= step;
    return true;
  }
  bool next_in_queue(std::uint64_t step, bool spare_current, std::uint64_t& key) {
    for (;;) {  // begin() rebuilt a stale queue
      if (head_ >= sorted_end_ && !sort_head(step)) return false;
      if (spare_current && sorted_step_ == step) return false;  // every row left was seen at this step
      const std::size_t p = head_++;
      if (p + ahead < sorted_end_) prefetch_row(queue_[p + ahead]);
      if (!current_at(p)) continue;
      key = rows_[queue_[p]].key;
      return true;
    }
  }

  Evict evict_ = Evict::lru;
  ScoreFn score_;
  std::size_t capacity_ = 0, cache_rows_ = 0;
  // The rows' records (flags: live, and in seen_); the cache of the lowest
  // rows in ascending order, read from at_, with extra_ (a min-heap) for
  // rows that fell below threshold_ after it was built, and seen_, the rows
  // seen since (LFU and score).
  static constexpr std::uint8_t live_flag = 1, seen_flag = 2;
  std::vector<RowRecord> rows_;
  std::vector<Candidate> cache_, extra_;
  std::vector<std::uint32_t> seen_;
  Candidate threshold_{};
  std::size_t at_ = 0;
  static constexpr std::size_t sample_rows = 1024;  // build_cache's sample of the rows
  bool cached_ = false;
  // LRU: the queue of rows by last step, each row's current entry at its record's place;
  // [head_, sorted_end_) is the head's step (sorted_step_) in key order,
  // [sorted_end_, tail_) the later appends. sorted_open_: the sorted step
  // is the current one, which appends may still join. stale_: rebuilt
  // before use.
  std::vector<std::uint32_t> queue_;
  // sort_head()'s scratch: (key, row) of the head's step, at most the rows
  // one step saw (the batch's working set, not the table's: it grows to the
  // largest step, not with the keys streamed through).
  std::vector<std::pair<std::uint64_t, std::uint32_t>> by_key_;
  std::size_t head_ = 0, sorted_end_ = 0, tail_ = 0;
  std::uint64_t sorted_step_ = 0;
  bool sorted_open_ = false, stale_ = false;
};

}  // namespace parallax::dynamic
