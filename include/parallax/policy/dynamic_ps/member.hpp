#pragma once
/// @file
/// A dynamic variable as a synchronizer holds it, whichever policy places
/// its table (docs/design.md, "Dynamic tables"): DynamicPS shards it over
/// the ranks by dynamic::owner, AllGatherv keeps a whole replica on every
/// rank. What does not depend on that is here: the Member a trainer and its
/// checkpoints see, the sum of a step's pushed rows by table row in arrival
/// order, and the update. Both placements save the same files
/// (dynamic_ps/saves.hpp: one per rank, rank r's holding the keys that
/// owner(key, ranks) gives r), so a save of either restores into either, at
/// any rank count.

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/checkpoint_io.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/error.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/dynamic_ps/saves.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

/// Statistics of one dynamic variable over every rank. DynamicPS: `total`
/// sums each field (size and capacity too: the rows held and the rows
/// possible in the job), `max` is each field's largest value on one rank.
/// AllGatherv: both are the replica's, which every rank holds alike.
struct DynamicStats {
  dynamic::Stats total;
  dynamic::Stats max;
  double hit_rate() const noexcept { return total.hit_rate(); }
};

namespace dynamic_ps {

/// Where a dynamic variable's rows live.
enum class Placement : std::uint8_t {
  sharded,    ///< rank r holds the keys owner(key, ranks) gives it (DynamicPS)
  replicated  ///< every rank holds every key, in identical tables (AllGatherv)
};

/// A dynamic variable as a synchronizer holds it, whatever its element type.
template <class Engine, class Optimizer>
class Shard : public Member {
 public:
  virtual std::optional<std::string> problem() const = 0;
  virtual bool has_gradient() const = 0;
  /// Brings the step's gradient rows to where they are applied and sums
  /// them there. Collective.
  virtual void push(Engine& engine) = 0;
  /// The square sum of the summed rows this rank applies.
  virtual double square_sum() const = 0;
  /// Applies the optimizer to the summed rows. The one place the optimizer is used.
  virtual void apply(const Optimizer& opt, const StepInfo& info) = 0;
  virtual void clear() = 0;
  virtual const dynamic::Stats& local_stats() const = 0;
};

/// What a sharded and a replicated dynamic table share; a policy adds its
/// lookup and push(), which ends in sum_pushed().
template <class Engine, class Optimizer, class Var>
class TableMember : public Shard<Engine, Optimizer> {
 public:
  using T = typename Var::value_type;

  /// `step`: the synchronizer's lookup step, which a save records and a
  /// restore carries on. `policy`: the policy's name, for records and messages.
  TableMember(Var var, const Optimizer& opt, Engine& engine, std::uint64_t& step, const char* policy,
              Placement placement)
      : var_(std::move(var)), table_(table_options(var_, opt)), engine_(&engine), step_(&step), policy_(policy),
        placement_(placement) {
    var_.state().table = &table_;
  }
  ~TableMember() override { var_.state().table = nullptr; }
  TableMember(const TableMember&) = delete;
  TableMember& operator=(const TableMember&) = delete;

  // ---- Member
  const void* identity() const override { return &var_.state(); }
  const std::string& name() const override { return var_.name(); }
  const char* policy() const override { return policy_; }
  detail::VarRecord record() const override {
    return detail::VarRecord::make(var_.name(), var_.shape(), data_type_of_v<T>, true, policy_);
  }
  std::size_t stored_rows() const override { return table_.size(); }
  void fetch(void*) override {
    throw error(detail::concat("dynamic variable '", var_.name(), "' has no row-major whole to fetch; ",
                               "read its rows with Trainer::lookup"));
  }
  std::optional<std::string> non_finite_gradient() override {
    const auto& g = var_.state().grad;
    const std::size_t cols = g.cols(), n = g.size() * cols;
    if (all_finite(g.values(), n)) return std::nullopt;
    for (std::size_t i = 0; i < n; ++i)
      if (!std::isfinite(g.values()[i]))
        return detail::concat("gradient of dynamic variable '", var_.name(), "' holds ",
                              std::isnan(g.values()[i]) ? "NaN" : g.values()[i] > 0 ? "+Inf" : "-Inf",
                              " in the row for key ", g.keys()[i / cols], " (row ", i / cols, " of the ", g.size(),
                              " added this step), column ", i % cols);
    return std::nullopt;
  }
  // Checkpoints: no fixed row layout, so files of its own
  // (policy/dynamic_ps/saves.hpp), which Trainer::save, Checkpoints and
  // the synchronizers' save() all write.
  int saved_partitions() const override { throw fixed_layout(); }
  void save(detail::AtomicFile&) override { throw fixed_layout(); }
  void load(detail::CheckpointReader&, std::size_t) override { throw fixed_layout(); }
  bool saves_files() const override { return true; }

  /// Writes this rank's share (the live keys owner(key, ranks) gives it, in
  /// key order, with counts, last steps, rows and optimizer state) into
  /// `dir`, then rank 0 the description naming each file's size and
  /// CRC-32C; returns them all on rank 0. A replica writes the share of its
  /// whole table, so both placements write the same files. Collective; a
  /// failure on any rank throws on every rank.
  std::vector<detail::ManifestFile> save_files(const std::string& dir) override {
    Engine& engine = *engine_;
    const int me = engine.rank(), n = engine.size();
    std::optional<std::string> problem;
    std::uint64_t mine[2] = {0, 0};
    try {
      const auto rows = placement_ == Placement::sharded ? table_.export_rows()
                                                         : dynamic::owned_share(table_.export_rows(), me, n);
      const auto f = write_shard(shard_path(dir, var_.name(), me), rows);
      mine[0] = f.first;
      mine[1] = f.second;
    } catch (const std::exception& e) {
      problem = e.what();
    }
    detail::agree(engine, problem);
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(n));
    engine.allgather(mine, all.data(), 2, DataType::i64);
    std::vector<detail::ManifestFile> files;
    if (me == 0) {
      try {
        SavedTable m;
        m.name = var_.name();
        m.ranks = n;
        m.step = *step_;
        m.cols = var_.cols();
        m.slots = Optimizer::slots;
        m.value_bytes = sizeof(T);
        for (int r = 0; r < n; ++r) {
          const std::size_t at = 2 * static_cast<std::size_t>(r);
          m.files.emplace_back(all[at], static_cast<std::uint32_t>(all[at + 1]));
          files.push_back({file_name(shard_path(dir, var_.name(), r)), all[at], static_cast<std::uint32_t>(all[at + 1])});
        }
        const std::string text = m.serialize();
        const std::string path = manifest_path(dir, var_.name());
        detail::AtomicFile f(path);
        f.write(text.data(), text.size());
        f.commit();
        detail::fsync_directory(dir);
        files.push_back({file_name(path), f.size(), f.crc()});
      } catch (const std::exception& e) {
        problem = e.what();
      }
    }
    detail::agree(engine, problem);
    return files;
  }

  /// Replaces the table on every rank with what save_files() wrote into
  /// `dir`, whatever rank count and placement wrote it: each rank reads
  /// every file and keeps the keys dynamic::owner gives it here (a replica:
  /// all of them); lookups then insert at the saved step or later.
  /// Collective; a missing or corrupt file, another variable's save, or
  /// more saved keys than a rank's capacity throws on every rank, before
  /// any rank's table changes.
  void load_files(const std::string& dir) override {
    Engine& engine = *engine_;
    const int me = engine.rank(), n = engine.size();
    const bool sharded = placement_ == Placement::sharded;
    std::optional<std::string> problem;
    std::uint64_t saved_step = 0;
    std::vector<dynamic::Snapshot<T>> shards;
    const auto fail = [&](const std::exception& e) {
      problem = detail::concat("restoring dynamic variable '", var_.name(), "': ", e.what());
    };
    try {
      const std::string mpath = manifest_path(dir, var_.name());
      std::ifstream in(mpath, std::ios::binary);
      if (!in) throw error(detail::concat("dynamic table manifest ", mpath, " cannot be opened"));
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto m = SavedTable::parse(mpath, text);
      if (m.name != var_.name() || m.cols != var_.cols() || m.slots != Optimizer::slots || m.value_bytes != sizeof(T))
        throw error(detail::concat("dynamic table manifest ", mpath, " holds '", m.name, "' of ", m.cols, " columns, ",
                                   m.slots, " optimizer slots and ", m.value_bytes, "-byte values; this variable is '",
                                   var_.name(), "' of ", var_.cols(), ", ", Optimizer::slots, " and ", sizeof(T)));
      for (int r = 0; r < m.ranks; ++r)
        shards.push_back(read_shard<T>(shard_path(dir, var_.name(), r), m.files[static_cast<std::size_t>(r)]));
      std::size_t keys = 0;
      for (const auto& sh : shards)
        for (std::uint64_t k : sh.keys) keys += !sharded || dynamic::owner(k, n) == me ? 1 : 0;
      if (keys > table_.capacity())
        throw error(sharded ? detail::concat(keys, " saved keys belong to rank ", me, " of ", n, ", whose capacity is ",
                                             table_.capacity(), " rows")
                            : detail::concat(keys, " saved keys, a replica's capacity is ", table_.capacity(), " rows"));
      saved_step = m.step;
    } catch (const std::exception& e) {
      fail(e);
    }
    detail::agree(engine, problem);  // every file read and fits: now the tables change
    try {
      const auto live = table_.export_rows().keys;
      table_.erase(live.data(), live.size());
      for (const auto& sh : shards) table_.import_rows(sh, sharded ? me : 0, sharded ? n : 0);
    } catch (const std::exception& e) {
      fail(e);
    }
    detail::agree(engine, problem);
    *step_ = std::max(*step_, saved_step);
  }

  // ---- Shard
  std::optional<std::string> problem() const override { return var_.state().grad.problem(); }
  bool has_gradient() const override { return var_.state().grad_touched || var_.state().grad.touched(); }
  double square_sum() const override {
    const std::size_t cols = var_.cols();
    double s = 0.0;
    for (std::size_t i = 0; i < push_slots_.size() * cols; ++i) s += static_cast<double>(sums_[i]) * sums_[i];
    return s;
  }
  void apply(const Optimizer& opt, const StepInfo& info) override {
    table_.apply(opt, info.step, push_slots_.data(), sums_.data(), push_slots_.size(), static_cast<T>(info.scale));
  }
  void clear() override {
    var_.state().grad.clear();
    var_.state().grad_touched = false;
    sums_.clear();
    push_slots_.clear();
    looked_keys_.clear();
    looked_slots_.clear();
  }
  const dynamic::Stats& local_stats() const override { return table_.stats(); }
  dynamic::Table<T>& table() noexcept { return table_; }

 protected:
  /// find_or_insert on the table; the step's last such keys and rows are
  /// kept, so that a push of the same keys finds its rows without hashing
  /// them again (sum_pushed).
  void insert(const std::uint64_t* keys, std::size_t n, std::uint64_t step, index_t* slots) {
    looked_keys_.clear();
    looked_slots_.clear();
    table_.find_or_insert(keys, n, step, slots);
    looked_keys_.assign(keys, keys + n);
    looked_slots_.assign(slots, slots + n);
  }

  /// The step's pushed rows, `n` keys with `cols` values each in arrival
  /// order, summed by the key's row in that order (so the sum is bit for
  /// bit what one process summing the global batch in rank order gets);
  /// a key without a row (never looked up, refused or evicted) pushes nothing.
  void sum_pushed(const std::uint64_t* keys, const T* rows, std::size_t n) {
    const std::size_t cols = var_.cols();
    // Rows lie anywhere in the table: what each loop reads of them is asked
    // for this many entries ahead.
    constexpr std::size_t ahead = 8;
    arrived_.resize(n);
    if (n != 0 && looked_keys_.size() == n && std::equal(keys, keys + n, looked_keys_.begin())) {
      // The keys of this step's last lookup, in its order: its rows, where
      // they still hold the key (a key refused then may hold one now).
      for (std::size_t j = 0; j < n; ++j) {
        if (j + ahead < n) table_.prefetch_holds(looked_slots_[j + ahead]);
        const index_t s = looked_slots_[j];
        if (s >= 0 && table_.holds(s, keys[j])) arrived_[j] = s;
        else table_.find(keys + j, 1, arrived_.data() + j);
      }
    } else {
      table_.find(keys, n, arrived_.data());
    }
    if (at_.size() != table_.capacity()) at_.assign(table_.capacity(), unseen);
    push_slots_.clear();
    sums_.clear();
    for (std::size_t j = 0; j < n; ++j) {
      if (j + ahead < n && arrived_[j + ahead] >= 0)
        prefetch_bytes(&at_[static_cast<std::size_t>(arrived_[j + ahead])], sizeof(std::uint32_t));
      if (arrived_[j] < 0) continue;
      std::uint32_t& k = at_[static_cast<std::size_t>(arrived_[j])];
      if (k == unseen) {
        k = static_cast<std::uint32_t>(push_slots_.size());
        push_slots_.push_back(arrived_[j]);
        sums_.insert(sums_.end(), rows + j * cols, rows + (j + 1) * cols);
      } else {
        T* sum = sums_.data() + static_cast<std::size_t>(k) * cols;
        for (std::size_t c = 0; c < cols; ++c) sum[c] += rows[j * cols + c];
      }
    }
    for (index_t slot : push_slots_) at_[static_cast<std::size_t>(slot)] = unseen;
  }

  Var var_;
  dynamic::Table<T> table_;
  Engine* engine_;
  std::uint64_t* step_;

 private:
  static dynamic::Options table_options(const Var& var, const Optimizer& opt) {
    dynamic::Options o = var.options();
    o.name = var.name();
    o.with_optimizer(opt);
    return o;
  }
  error fixed_layout() const {
    return error(detail::concat("dynamic variable '", var_.name(), "' has no fixed row layout; it saves files of its own"));
  }
  /// Whether none of v[0, n) is NaN or infinite: an exponent of all ones,
  /// tested on the bits so that the loop vectorises (it runs every step).
  static bool all_finite(const T* v, std::size_t n) noexcept {
    using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr Bits exponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
    Bits bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      Bits b;
      std::memcpy(&b, v + i, sizeof b);
      bad |= static_cast<Bits>((b & exponent) == exponent);
    }
    return bad == 0;
  }
  static std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

  const char* policy_;
  Placement placement_;
  static constexpr std::uint32_t unseen = UINT32_MAX;
  std::vector<index_t> arrived_;     // the row of each pushed key, or -1
  std::vector<std::uint64_t> looked_keys_;  // the step's last lookup (insert()) and its rows
  std::vector<index_t> looked_slots_;
  std::vector<std::uint32_t> at_;    // per row: its place in push_slots_ this step, or unseen
  std::vector<index_t> push_slots_;  // this step's pushed rows, in first-arrival order
  std::vector<T> sums_;              // and their summed gradients
};

/// Saves one dynamic variable's files alone under `dir` (created if
/// missing), as a checkpoint holds them. Collective; a failure on any rank
/// throws on every rank.
template <class Engine>
void save_alone(Engine& engine, Member& member, const std::string& dir) {
  std::optional<std::string> problem;
  if (engine.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) problem = detail::concat("cannot create directory ", dir, ": ", ec.message());
  }
  detail::agree(engine, problem);
  member.save_files(dir);
}

}  // namespace dynamic_ps
}  // namespace parallax::policy
