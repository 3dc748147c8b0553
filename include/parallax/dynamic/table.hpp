#pragma once
/// @file
/// The shard-local dynamic table: rows keyed by 64-bit ids, created on first
/// sight, up to a capacity fixed at construction, evicted by lowest score
/// when full (docs/design.md, "Dynamic tables").
///
/// Layout: every array is allocated once, in the constructor, so the table's
/// memory is `bytes()` from its first step to its last.
///   * the index: `buckets` (key, row, distance from home) entries, open
///     addressing with linear probing and backward-shift deletion (no
///     tombstones), at most `max_load` full when the table is;
///   * per row (`capacity` of them): `cols` values, `slots` optimizer state
///     rows of `cols` values each (laid out as optim::State lays out a
///     variable's, one array per slot, row r at r * cols), and a 32-byte
///     record (RowRecord: its key, the step it was last seen, how often it
///     was seen, whether it is live, its place in LRU's queue);
///   * a free list of rows, and the eviction order (EvictionOrder,
///     eviction.hpp), which holds the records: for LRU a queue of 1.5
///     entries a row, for LFU and a user score a cache of a quarter of the
///     capacity of the lowest rows and the rows seen since it was built.
/// A row's initial values are a pure function of (initializer, name, key,
/// column), its state starts at the optimizer's slot_initial: the same key
/// gets the same fresh row on any rank, in any order, after any eviction.

#include <parallax/config.hpp>
#include <parallax/dynamic/admission.hpp>
#include <parallax/dynamic/eviction.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace parallax::dynamic {

/// What an unadmitted key reads.
enum class Unadmitted : std::uint8_t { zeros, initial };

/// How a table is built. Every size is fixed at construction.
struct Options {
  std::size_t capacity = 0;  ///< rows
  std::size_t cols = 1;
  /// Initial rows: a pure function of (init, name, key, column). Glorot needs
  /// a row count, which a dynamic table has not: give Uniform its limit.
  Init init = init::Zeros{};
  std::string name = "dynamic";
  /// Optimizer state values per element (0-2) and their initial values;
  /// with_optimizer(opt) sets both.
  int slots = 0;
  double slot_initial[optim::max_slots] = {0.0, 0.0};
  Evict evict = Evict::lru;
  /// For Evict::score: lower scores go first.
  ScoreFn score;
  /// When full, this fraction of the capacity goes at once (at least one
  /// row): the batch whose keys are the lowest at that moment.
  double evict_fraction = 0.01;
  /// The index's load when every row is taken: buckets = capacity / max_load.
  /// A full table inserts and evicts at this load, each walking a probe run
  /// (about 2.5 buckets at 0.5, 6 at 0.7; docs/design.md, "Layout").
  double max_load = 0.5;
  std::variant<admit::Always, admit::CountMin, admit::Probability> admission = admit::Always{};
  Unadmitted unadmitted = Unadmitted::zeros;

  template <class O>
  Options& with_optimizer(const O& opt) {
    static_assert(optim::check<O>());
    static_assert(!optim::is_groups_v<O>, "dynamic::Table takes one optimizer (a group's, e.g. optim::Adagrad), "
                                          "not optim::Groups");
    slots = O::slots;
    for (int k = 0; k < O::slots; ++k) slot_initial[k] = static_cast<double>(opt.template slot_initial<double>(k));
    return *this;
  }
};

/// What a table has done since it was built.
struct Stats {
  std::size_t size = 0;       ///< live rows
  std::size_t capacity = 0;   ///< rows
  std::uint64_t lookups = 0;  ///< keys asked for by find_or_insert
  std::uint64_t hits = 0;     ///< of them, found with a row
  std::uint64_t inserts = 0;  ///< rows created
  std::uint64_t evictions = 0;
  std::uint64_t erased = 0;             ///< rows removed by erase()
  std::uint64_t admissions_refused = 0; ///< lookups of new keys the filter refused
  double hit_rate() const noexcept { return lookups ? static_cast<double>(hits) / static_cast<double>(lookups) : 0.0; }
};

/// Live rows in key order: what a checkpoint saves and a serving export
/// reads. rows and state[k] hold `cols` values per key.
template <class T>
struct Snapshot {
  std::size_t cols = 1;
  int slots = 0;
  std::vector<std::uint64_t> keys;
  std::vector<T> rows;
  std::vector<T> state[optim::max_slots];
  std::vector<std::uint64_t> counts;
  std::vector<std::uint64_t> last_steps;
  std::size_t size() const noexcept { return keys.size(); }
};

namespace detail {

/// out[c] = parallax::detail::uniform_value(key, base + c, low, span) for
/// c < cols, a column a lane. An insert's cost: built for each ISA level
/// (AVX-512 has the 64-bit multiplies and conversions the hashes need), and
/// the same bits at every level (integer hashing; a 53-bit integer converts
/// exactly; no FMA is formed: PARALLAX_HOST_ISA_CLONES).
template <class T>
PARALLAX_HOST_ISA_CLONES void uniform_row(std::uint64_t key, std::uint64_t base, double low, double span, T* out,
                                          std::size_t cols) {
#pragma omp simd
  for (std::size_t c = 0; c < cols; ++c) out[c] = static_cast<T>(parallax::detail::uniform_value(key, base + c, low, span));
}

}  // namespace detail

/// Throws parallax::error naming what is wrong with `op`; `what` starts the
/// message (the table's kind and name).
inline void check_options(const Options& op, const std::string& what) {
  if (op.capacity == 0 || op.capacity >= UINT32_MAX)
    throw error(what + "capacity must be in [1, 2^32 - 1) rows, got " + std::to_string(op.capacity));
  if (op.cols == 0) throw error(what + "cols must be positive");
  if (op.slots < 0 || op.slots > optim::max_slots)
    throw error(what + "slots must be 0, 1 or 2, got " + std::to_string(op.slots));
  if (!(op.max_load > 0.0 && op.max_load < 1.0))
    throw error(what + "max_load must be in (0, 1), got " + std::to_string(op.max_load));
  // The index stores each entry's distance from its home bucket in 32 bits.
  if (std::ceil(static_cast<double>(op.capacity) / op.max_load) >= static_cast<double>(UINT32_MAX))
    throw error(what + "capacity / max_load must stay below 2^32 - 1 index buckets, got " +
                std::to_string(op.capacity) + " / " + std::to_string(op.max_load));
  if (!(op.evict_fraction > 0.0 && op.evict_fraction <= 1.0))
    throw error(what + "evict_fraction must be in (0, 1], got " + std::to_string(op.evict_fraction));
  if (op.evict == Evict::score && !op.score) throw error(what + "Evict::score needs a score function");
  if (std::holds_alternative<init::Glorot>(op.init))
    throw error(what + "Glorot needs a row count, which a dynamic table has not; give init::Uniform its limit");
  if (const auto* p = std::get_if<admit::Probability>(&op.admission); p && !(p->p > 0.0 && p->p <= 1.0))
    throw error(what + "the admission probability must be in (0, 1], got " + std::to_string(p->p));
  if (const auto* c = std::get_if<admit::CountMin>(&op.admission)) {
    if (c->sightings < 1) throw error(what + "CountMin needs at least one sighting");
    if (c->width == 0 || c->depth < 1 || c->depth > 16)
      throw error(what + "CountMin needs a positive width and a depth in [1, 16], got width " +
                  std::to_string(c->width) + ", depth " + std::to_string(c->depth));
  }
}

/// Rank `rank` of `ranks`' share of a snapshot: the keys owner() gives it.
template <class T>
Snapshot<T> owned_share(const Snapshot<T>& all, int rank, int ranks) {
  Snapshot<T> out;
  out.cols = all.cols;
  out.slots = all.slots;
  const std::size_t cols = all.cols;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (owner(all.keys[i], ranks) != rank) continue;
    out.keys.push_back(all.keys[i]);
    out.rows.insert(out.rows.end(), all.rows.begin() + i * cols, all.rows.begin() + (i + 1) * cols);
    for (int k = 0; k < all.slots; ++k)
      out.state[k].insert(out.state[k].end(), all.state[k].begin() + i * cols, all.state[k].begin() + (i + 1) * cols);
    out.counts.push_back(all.counts[i]);
    out.last_steps.push_back(all.last_steps[i]);
  }
  return out;
}

/// One shard's dynamic table of T (float or double) values.
template <class T = float>
class Table {
  static_assert(std::is_floating_point_v<T>, "parallax::dynamic::Table holds float or double values");

 public:
  static constexpr std::uint32_t none = UINT32_MAX;

  explicit Table(Options o) : options_(std::move(o)) {
    const Options& op = options_;
    check_options(op, "parallax::dynamic::Table \"" + op.name + "\": ");
    if (const auto* c = std::get_if<admit::CountMin>(&op.admission)) sketch_ = CountMinSketch(*c);
    rule_ = parallax::detail::make_init_rule(op.init, op.name, Shape{op.capacity, op.cols});
    buckets_ = std::max<std::size_t>(op.capacity + 1,
                                     static_cast<std::size_t>(std::ceil(static_cast<double>(op.capacity) / op.max_load)));
    index_.assign(buckets_, Bucket{0, none, 0});
    values_.assign(op.capacity * op.cols, T(0));
    for (int k = 0; k < op.slots; ++k) state_[k].assign(op.capacity * op.cols, T(0));
    free_.resize(op.capacity);
    // Row 0 is handed out first.
    for (std::size_t r = 0; r < op.capacity; ++r) free_[r] = static_cast<std::uint32_t>(op.capacity - 1 - r);
    // LFU's and a score's eviction cache: a quarter of the rows (at least
    // one batch), so a full table scans its rows about once per capacity / 8
    // evictions.
    order_ = EvictionOrder(op.capacity, std::min(op.capacity, std::max(evict_batch(), (op.capacity + 3) / 4)),
                           op.evict, op.score);
    if (order_.takes_ahead()) victims_.resize(std::min<std::size_t>(evict_batch(), 256));
    stats_.capacity = op.capacity;
  }

  /// For each key, its row, created if the key is new and admitted (-1 where
  /// the admission filter refused it). Rows seen at `step` are not evicted
  /// while the table makes room for this batch's new keys, so every slot
  /// returned for one step stays valid until a call with a later step.
  /// A step whose distinct admitted keys exceed the capacity is an error
  /// (the keys before the one that found no row keep theirs).
  /// Steps must not decrease (LRU's score is the step).
  void find_or_insert(const std::uint64_t* keys, std::size_t n, std::uint64_t step, index_t* slots_out) {
    if (step < step_)
      throw error("parallax::dynamic::Table \"" + options_.name + "\": step " + std::to_string(step) +
                  " is before the last one seen, " + std::to_string(step_));
    step_ = step;
    // Two stages ahead: key i + 8's home bucket, then key i + 4's row
    // metadata (a hit's last step and count) from that bucket.
    constexpr std::size_t ahead = 8, near = 4;
    for (std::size_t i = 0; i < std::min(n, ahead); ++i) prefetch_home(keys[i]);
    for (std::size_t i = 0; i < std::min(n, near); ++i) prefetch_meta(keys[i]);
    for (std::size_t i = 0; i < n; ++i) {
      if (i + ahead < n) prefetch_home(keys[i + ahead]);
      if (i + near < n) prefetch_meta(keys[i + near]);
      slots_out[i] = find_or_insert_one(keys[i], step);
    }
  }

  /// The row of each key, or -1 (no insert, no statistics, no admission).
  void find(const std::uint64_t* keys, std::size_t n, index_t* slots_out) const {
    for (std::size_t i = 0; i < n; ++i) {
      const Place p = locate(keys[i]);
      slots_out[i] = p.found ? static_cast<index_t>(index_[p.bucket].row) : index_t{-1};
    }
  }

  /// out[i * cols, +cols) <- the row of slots[i], or, where slots[i] is -1,
  /// the default row of keys[i] (zeros or its initial row).
  void gather(const std::uint64_t* keys, const index_t* slots, std::size_t n, T* out) const {
    const std::size_t cols = options_.cols;
    constexpr std::size_t ahead = 4;  // the rows are scattered over the table
    for (std::size_t i = 0; i < n; ++i) {
      if (i + ahead < n && slots[i + ahead] >= 0)
        prefetch_bytes(values_.data() + static_cast<std::size_t>(slots[i + ahead]) * cols, cols * sizeof(T));
      if (slots[i] >= 0) std::copy_n(values_.data() + static_cast<std::size_t>(slots[i]) * cols, cols, out + i * cols);
      else if (options_.unadmitted == Unadmitted::initial) initial_row(keys[i], out + i * cols);
      else std::fill_n(out + i * cols, cols, T(0));
    }
  }

  /// The optimizer's update of the rows `slots` (unique) with gradient rows
  /// `grads` (cols each) times `scale`; entries of slot -1 (unadmitted keys)
  /// are dropped. Each row's state rows are its own.
  template <class O>
  void apply(const O& opt, std::uint64_t step, const index_t* slots, const T* grads, std::size_t n, T scale = T(1)) {
    static_assert(optim::check<O>());
    static_assert(!optim::is_groups_v<O>, "dynamic::Table takes one optimizer (a group's, e.g. optim::Adagrad), "
                                          "not optim::Groups");
    if (O::slots != options_.slots)
      throw error("parallax::dynamic::Table \"" + options_.name + "\": built for " + std::to_string(options_.slots) +
                  " optimizer slots, applied with " + O::name + " (" + std::to_string(O::slots) + ")");
    const std::size_t cols = options_.cols;
    T* s0 = options_.slots > 0 ? state_[0].data() : nullptr;
    T* s1 = options_.slots > 1 ? state_[1].data() : nullptr;
    T* const w = values_.data();
    // The rows are scattered over the table: ask for those a few entries ahead.
    constexpr std::size_t ahead = 4;
    auto prefetch_row = [&](std::size_t j) {
      if (slots[j] < 0) return;
      const std::size_t at = static_cast<std::size_t>(slots[j]) * cols;
      prefetch_bytes(w + at, cols * sizeof(T));
      if (s0) prefetch_bytes(s0 + at, cols * sizeof(T));
      if (s1) prefetch_bytes(s1 + at, cols * sizeof(T));
    };
    for (std::size_t j = 0; j < std::min(n, ahead); ++j) prefetch_row(j);
    optim::detail::with_decay_known<T>(opt.template rule<T>(step), [&](auto rule) {
      for (std::size_t j = 0; j < n; ++j) {
        if (j + ahead < n) prefetch_row(j + ahead);
        if (slots[j] < 0) continue;
        const std::size_t at = static_cast<std::size_t>(slots[j]) * cols;
        // One row's elements through row-local pointers, so that the loop vectorises.
        T* const wr = w + at;
        T* const s0r = s0 ? s0 + at : nullptr;
        T* const s1r = s1 ? s1 + at : nullptr;
        const T* const gr = grads + j * cols;
        for (std::size_t c = 0; c < cols; ++c) optim::detail::apply_rule<O::slots>(rule, wr[c], gr[c] * scale, s0r, s1r, c);
      }
    });
  }

  /// Evicts the `n` live rows of lowest score (all of them if fewer);
  /// returns how many went. Ties go by last step, then by key, so the same
  /// contents evict the same keys whatever their insertion order.
  std::size_t evict(std::size_t n) { return evict_lowest(n, false); }

  /// Removes these keys' rows (absent keys are ignored); returns how many went.
  std::size_t erase(const std::uint64_t* keys, std::size_t n) {
    std::size_t gone = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Place p = locate(keys[i]);
      if (!p.found) continue;
      remove_bucket(p.bucket);
      ++gone;
    }
    stats_.erased += gone;
    stats_.size = size_;
    return gone;
  }

  /// Every live row, in key order.
  Snapshot<T> export_rows() const {
    Snapshot<T> s;
    s.cols = options_.cols;
    s.slots = options_.slots;
    std::vector<std::uint32_t> rows;
    rows.reserve(size_);
    for (const Bucket& b : index_)
      if (b.row != none) rows.push_back(b.row);
    std::sort(rows.begin(), rows.end(), [&](std::uint32_t a, std::uint32_t b) { return order_.row(a).key < order_.row(b).key; });
    const std::size_t cols = options_.cols;
    s.keys.reserve(rows.size());
    s.rows.reserve(rows.size() * cols);
    for (int k = 0; k < s.slots; ++k) s.state[k].reserve(rows.size() * cols);
    for (std::uint32_t r : rows) {
      const RowRecord& x = order_.row(r);
      s.keys.push_back(x.key);
      s.rows.insert(s.rows.end(), values_.begin() + r * cols, values_.begin() + (r + 1) * cols);
      for (int k = 0; k < s.slots; ++k)
        s.state[k].insert(s.state[k].end(), state_[k].begin() + r * cols, state_[k].begin() + (r + 1) * cols);
      s.counts.push_back(x.count);
      s.last_steps.push_back(x.last);
    }
    return s;
  }

  /// Puts the snapshot's rows into the table (a key already present is
  /// overwritten), or, with `ranks` > 0, only those whose owner(key, ranks)
  /// is `rank`: a checkpoint of any rank count restores onto another. More
  /// rows than free ones is an error, and the table is then unchanged.
  std::size_t import_rows(const Snapshot<T>& s, int rank = 0, int ranks = 0) {
    const std::string what = "parallax::dynamic::Table \"" + options_.name + "\": import: ";
    const std::size_t cols = options_.cols, n = s.keys.size();
    if (s.cols != cols || s.slots != options_.slots)
      throw error(what + "the snapshot has " + std::to_string(s.cols) + " cols and " + std::to_string(s.slots) +
                  " slots, the table " + std::to_string(cols) + " and " + std::to_string(options_.slots));
    bool sizes = s.rows.size() == n * cols && s.counts.size() == n && s.last_steps.size() == n;
    for (int k = 0; k < s.slots; ++k) sizes = sizes && s.state[k].size() == n * cols;
    if (!sizes) throw error(what + "the snapshot's arrays do not hold one entry per key");
    if (std::adjacent_find(s.keys.begin(), s.keys.end(), std::greater_equal<>()) != s.keys.end())
      throw error(what + "the snapshot's keys are not strictly increasing (as export_rows() gives them)");
    auto mine = [&](std::uint64_t key) { return ranks <= 0 || owner(key, ranks) == rank; };
    std::size_t fresh = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (mine(s.keys[i]) && !locate(s.keys[i]).found) ++fresh;
    if (fresh > free_.size())
      throw error(what + std::to_string(fresh) + " new keys, " + std::to_string(free_.size()) + " free rows");
    order_.forget();  // imported rows may lie anywhere in the eviction order
    std::size_t taken = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = s.keys[i];
      if (!mine(key)) continue;
      const Place p = locate(key);
      const std::uint32_t r = p.found ? index_[p.bucket].row : take_row(p, key);
      std::copy_n(s.rows.begin() + i * cols, cols, values_.begin() + r * cols);
      for (int k = 0; k < s.slots; ++k) std::copy_n(s.state[k].begin() + i * cols, cols, state_[k].begin() + r * cols);
      order_.row(r).count = s.counts[i];
      order_.row(r).last = s.last_steps[i];
      step_ = std::max(step_, s.last_steps[i]);
      ++taken;
    }
    stats_.size = size_;
    return taken;
  }

  /// out[0, cols) <- the initial row of `key`: the rule's values of
  /// elements splitmix64(key) + c.
  void initial_row(std::uint64_t key, T* out) const {
    namespace pd = parallax::detail;
    const std::uint64_t base = pd::splitmix64(key);
    const std::size_t cols = options_.cols;
    if (rule_.kind == pd::InitRule::uniform) {
      detail::uniform_row(rule_.key, base, rule_.a, rule_.b - rule_.a, out, cols);
      return;
    }
    for (std::size_t c = 0; c < cols; ++c) out[c] = static_cast<T>(rule_.value(base + c));
  }

  /// Row r's values (cols of them), its state slot k, its key, and its
  /// metadata. r must be a live row.
  T* row(index_t r) noexcept { return values_.data() + static_cast<std::size_t>(r) * options_.cols; }
  const T* row(index_t r) const noexcept { return values_.data() + static_cast<std::size_t>(r) * options_.cols; }
  T* state(int k, index_t r) noexcept { return state_[k].data() + static_cast<std::size_t>(r) * options_.cols; }
  std::uint64_t key_of(index_t r) const noexcept { return order_.row(static_cast<std::size_t>(r)).key; }
  /// Whether row r (in [0, capacity)) is live and holds `key`.
  bool holds(index_t r, std::uint64_t key) const noexcept {
    return order_.live(static_cast<std::size_t>(r)) && order_.row(static_cast<std::size_t>(r)).key == key;
  }
  /// Asks for what holds(r, key) reads; a negative r asks for nothing.
  void prefetch_holds(index_t r) const noexcept {
    if (r < 0) return;
    order_.prefetch_row(static_cast<std::size_t>(r));
  }
  std::uint64_t count_of(index_t r) const noexcept { return order_.row(static_cast<std::size_t>(r)).count; }
  std::uint64_t last_step_of(index_t r) const noexcept { return order_.row(static_cast<std::size_t>(r)).last; }
  /// The whole value array (capacity x cols) and state slot k's, as a
  /// policy's row kernels address them by slot.
  T* values() noexcept { return values_.data(); }
  T* state_data(int k) noexcept { return k < options_.slots ? state_[k].data() : nullptr; }

  std::size_t size() const noexcept { return size_; }
  std::size_t capacity() const noexcept { return options_.capacity; }
  std::size_t cols() const noexcept { return options_.cols; }
  std::size_t buckets() const noexcept { return buckets_; }
  const Options& options() const noexcept { return options_; }
  const Stats& stats() const noexcept { return stats_; }
  const CountMinSketch& sketch() const noexcept { return sketch_; }

  /// The bytes the table holds, all allocated at construction.
  std::size_t bytes() const noexcept {
    std::size_t b = index_.capacity() * sizeof(Bucket) + values_.capacity() * sizeof(T) +
                    free_.capacity() * sizeof(std::uint32_t) + victims_.capacity() * sizeof(std::uint64_t) +
                    order_.bytes() + sketch_.bytes();
    for (const auto& s : state_) b += s.capacity() * sizeof(T);
    return b;
  }

  /// The bytes of `capacity` rows alone (values, state and records):
  /// bytes() less the index, the free list, the eviction order's queue or
  /// cache, the scratch and the sketch.
  std::size_t row_bytes() const noexcept {
    return options_.capacity *
           (options_.cols * (1 + static_cast<std::size_t>(options_.slots)) * sizeof(T) + sizeof(RowRecord));
  }

 private:
  struct Bucket {
    std::uint64_t key;
    std::uint32_t row;   // none: empty
    std::uint32_t dist;  // from the key's home bucket: deletion need not hash again
  };

  std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>(detail::reduce(detail::mix(key, detail::index_salt), buckets_));
  }
  /// The home bucket of `key` and the line after it: a probe for an absent
  /// key, and a deletion's backward shift, may run on past the home's line.
  void prefetch_home(std::uint64_t key) const noexcept {
    const std::size_t h = home(key);
    prefetch_bytes(&index_[h], sizeof(Bucket));
    if (h + 4 < buckets_) prefetch_bytes(&index_[h + 4], sizeof(Bucket));
  }
  /// The record of `key`'s row where its home bucket holds it (most hits:
  /// the probe run is short).
  void prefetch_meta(std::uint64_t key) const noexcept {
    const Bucket& b = index_[home(key)];
    if (b.row == none || b.key != key) return;
    order_.prefetch_row(b.row);
  }
  /// The arrays of the row an insert a few inserts from now takes (the
  /// free list hands rows out from its back).
  void prefetch_free_row() const noexcept {
    constexpr std::size_t ahead = 2;
    if (free_.size() <= ahead) return;
    const std::size_t r = free_[free_.size() - 1 - ahead], cols = options_.cols;
    prefetch_bytes(values_.data() + r * cols, cols * sizeof(T));
    for (int k = 0; k < options_.slots; ++k) prefetch_bytes(state_[k].data() + r * cols, cols * sizeof(T));
    order_.prefetch_row(r);
  }

  /// Where a key is, or where it would go: `dist` buckets from its home.
  struct Place {
    std::size_t bucket;
    std::uint32_t dist;
    bool found;
  };
  Place locate(std::uint64_t key) const noexcept {
    std::size_t b = home(key);
    for (std::uint32_t d = 0;; ++d) {
      const Bucket& e = index_[b];
      if (e.row == none) return Place{b, d, false};
      if (e.key == key) return Place{b, d, true};
      if (++b == buckets_) b = 0;
    }
  }

  index_t find_or_insert_one(std::uint64_t key, std::uint64_t step) {
    ++stats_.lookups;
    Place p = locate(key);
    std::uint32_t r = index_[p.bucket].row;
    if (p.found) {
      ++stats_.hits;
      RowRecord& x = order_.row(r);
      const bool fresh = x.last != step;
      x.last = step;
      ++x.count;
      order_.seen(r, fresh);
      return static_cast<index_t>(r);
    }
    if (!admit(key, step)) {
      ++stats_.admissions_refused;
      return -1;
    }
    if (free_.empty()) {
      if (evict_lowest(evict_batch(), true) == 0)
        throw error("parallax::dynamic::Table \"" + options_.name + "\": step " + std::to_string(step) +
                    " asks for more distinct keys than its capacity of " + std::to_string(options_.capacity) +
                    " rows, every one of them seen at this step");
      p = locate(key);  // eviction moved buckets
    }
    prefetch_free_row();
    r = take_row(p, key);
    const std::size_t cols = options_.cols;
    initial_row(key, values_.data() + r * cols);
    for (int k = 0; k < options_.slots; ++k)
      std::fill_n(state_[k].data() + r * cols, cols, static_cast<T>(options_.slot_initial[k]));
    RowRecord& x = order_.row(r);
    x.last = step;
    x.count = 1;
    order_.seen(r, true);
    ++stats_.inserts;
    stats_.size = size_;
    return static_cast<index_t>(r);
  }

  /// The rows a full table evicts at once: evict_fraction of the capacity, at least one.
  std::size_t evict_batch() const noexcept {
    const auto b = static_cast<std::size_t>(std::ceil(options_.evict_fraction * static_cast<double>(options_.capacity)));
    return std::max<std::size_t>(b, 1);
  }

  bool admit(std::uint64_t key, std::uint64_t step) {
    if (const auto* c = std::get_if<admit::CountMin>(&options_.admission)) return sketch_.add(key) >= c->sightings;
    if (const auto* p = std::get_if<admit::Probability>(&options_.admission)) return admitted(*p, key, step);
    return true;
  }

  /// A free row for `key`, absent, in the empty bucket p (locate's).
  std::uint32_t take_row(const Place& p, std::uint64_t key) {
    const std::uint32_t r = free_.back();
    free_.pop_back();
    index_[p.bucket] = Bucket{key, r, p.dist};
    order_.row(r).key = key;
    order_.set_live(r);
    ++size_;
    return r;
  }

  /// Empties bucket b and shifts later entries of its probe run back.
  void remove_bucket(std::size_t b) {
    free_.push_back(index_[b].row);
    order_.clear_live(index_[b].row);
    --size_;
    std::size_t hole = b, j = b;
    std::uint32_t gap = 0;  // from the hole to j
    for (;;) {
      if (++j == buckets_) j = 0;
      ++gap;
      const Bucket& e = index_[j];
      if (e.row == none) break;
      // Move j into the hole unless its home lies cyclically in (hole, j].
      if (e.dist >= gap) {
        index_[hole] = Bucket{e.key, e.row, e.dist - gap};
        hole = j;
        gap = 0;
      }
    }
    index_[hole].row = none;
  }

  /// Removes up to n live rows of lowest (score, last step, key); with
  /// `spare_current`, rows seen at the current step stay (EvictionOrder
  /// keeps its cache from call to call); without (evict()), a one-off cache.
  std::size_t evict_lowest(std::size_t n, bool spare_current) {
    std::size_t gone = 0;
    order_.begin(step_, spare_current);
    if (order_.takes_ahead()) {
      // The victims a batch at a time, their buckets asked for before the
      // first is removed: each lies anywhere in the index.
      for (bool more = true; more && gone < n;) {
        std::size_t k = 0;
        for (std::uint64_t key = 0; k < victims_.size() && gone + k < n; ++k) {
          if (!order_.next(step_, spare_current, n - gone - k, key)) {
            more = false;
            break;
          }
          victims_[k] = key;
          prefetch_home(key);
        }
        for (std::size_t i = 0; i < k; ++i) remove_bucket(locate(victims_[i]).bucket);
        gone += k;
      }
    } else {
      for (std::uint64_t key = 0; gone < n && order_.next(step_, spare_current, n - gone, key); ++gone)
        remove_bucket(locate(key).bucket);
    }
    order_.end(spare_current);
    stats_.evictions += gone;
    stats_.size = size_;
    return gone;
  }

  Options options_;
  parallax::detail::InitRule rule_{};
  std::size_t buckets_ = 0;
  std::vector<Bucket> index_;
  std::vector<T> values_;
  std::vector<T> state_[optim::max_slots];
  std::vector<std::uint32_t> free_;
  std::vector<std::uint64_t> victims_;  // evict_lowest's batch, where the order takes it ahead
  EvictionOrder order_;  // the rows' records (which are live), and which go first
  CountMinSketch sketch_;
  std::size_t size_ = 0;
  std::uint64_t step_ = 0;
  Stats stats_;
};

}  // namespace parallax::dynamic
