#pragma once
/// @file
/// The storage of a ShardedPS table group (TableGroup, table_group.hpp,
/// exchanges it): its tables, their layout over the ranks, the keys that
/// name their rows, and the group shard this rank holds (in a shared window
/// where every rank is on one machine).
///
/// Layout: owner o's group shard is its shard of table 0, then of table 1,
/// and so on; table t starts at row base(t, o) there. A row's key is
/// o * span + base(t, o) + its row in o's shard of t, where span (the
/// group's total rows) bounds every shard: keys sort by owner, are distinct
/// across tables, and an owner finds the row from the key alone.

#include <parallax/detail/agreement.hpp>
#include <parallax/detail/shared_window.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/partition.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy::sharded {


/// An engine whose ranks can share host memory (an MPI communicator over
/// host buffers): a group may keep its shard where peers read it.
template <class Engine, class = void>
struct shares_host_memory : std::false_type {};
template <class Engine>
struct shares_host_memory<Engine, std::void_t<decltype(std::declval<Engine&>().comm())>>
    : std::bool_constant<std::is_same_v<engine::space_of_t<Engine>, HostSpace> &&
                         std::is_same_v<decltype(std::declval<Engine&>().comm()), MPI_Comm>> {};


/// A table group's tables and this rank's shard of them (see the file
/// comment); TableGroup adds their lookups and pushes. The shard holds S:
/// T, or bf16 / fp16 for tables of T = float stored in 16 bits.
template <class T, class Engine, class S = T>
class TableLayout {
 public:
  using space = engine::space_of_t<Engine>;

  TableLayout(Engine& engine, std::size_t cols, bool shared)
      : engine_(&engine), cols_(cols), want_shared_(shared) {}
  TableLayout(const TableLayout&) = delete;
  TableLayout& operator=(const TableLayout&) = delete;

  /// Adds a table (before build()); returns its index in the group.
  std::size_t add(std::string name, PartitionMap map) {
    PARALLAX_EXPECTS(!built_, "TableGroup: table '", name, "' added after build()");
    PARALLAX_EXPECTS(map.ranks == engine_->size(), "sharded variable '", name, "': partition map is for ", map.ranks,
                     " ranks but the engine has ", engine_->size());
    tables_.push_back(Table{std::move(name), map});
    return tables_.size() - 1;
  }

  std::size_t tables() const noexcept { return tables_.size(); }
  std::size_t cols() const noexcept { return cols_; }
  const std::string& name(std::size_t t) const noexcept { return tables_[t].name; }
  const PartitionMap& map(std::size_t t) const noexcept { return tables_[t].map; }
  /// The group's total rows: a key's owner is key / span().
  std::size_t span() const noexcept { return span_; }
  /// The group key of row `id` of table t (host; see the file comment).
  index_t key_of(std::size_t t, index_t id) const noexcept {
    const PartitionMap& map = tables_[t].map;
    const int o = map.owner(id);
    return static_cast<index_t>(static_cast<std::size_t>(o) * span_ +
                                static_cast<std::size_t>(host_base_[t * static_cast<std::size_t>(engine_->size()) +
                                                                    static_cast<std::size_t>(o)]) +
                                map.local_row(id));
  }
  /// Where table t starts in this rank's group shard (rows).
  std::size_t base(std::size_t t) const noexcept {
    return static_cast<std::size_t>(host_base_[t * static_cast<std::size_t>(engine_->size()) +
                                               static_cast<std::size_t>(engine_->rank())]);
  }
  /// Rows of table t on this rank.
  std::size_t shard_rows(std::size_t t) const noexcept { return tables_[t].map.shard_rows(engine_->rank()); }
  /// This rank's group shard: every table's rows here, table by table.
  Buffer<S, space>& shard() noexcept { return shard_; }
  const Buffer<S, space>& shard() const noexcept { return shard_; }
  /// Table t's rows on this rank (shard_rows(t) x cols).
  S* shard_of(std::size_t t) noexcept { return shard_.data() + base(t) * cols_; }
  const S* shard_of(std::size_t t) const noexcept { return shard_.data() + base(t) * cols_; }
  /// Whether the shard lives in shared memory, so lookups read the owners'
  /// shards directly (ShardedOptions::shared_memory).
  bool shared() const noexcept { return static_cast<bool>(window_); }
  /// Whether lookups read every row where it lies: shared shards, or one
  /// rank (which owns every row). Their route carries headers alone.
  bool reads_directly() const noexcept { return shared() || engine_->size() == 1; }

  /// Table t, for a message: 'name', or with `detailed` its rows and
  /// partitions too.
  std::string label(std::size_t t, bool detailed) const {
    const Table& tb = tables_[t];
    return detailed ? detail::concat("'", tb.name, "' (", tb.map.rows, " rows, ", tb.map.parts, " partitions)")
                    : detail::concat("'", tb.name, "'");
  }
  /// The group's tables, for a message: ['a', 'b'], or with `detailed`
  /// each table's rows and partitions, the element type and width, and how
  /// lookups read.
  std::string describe(bool detailed) const {
    std::string out = "[";
    for (std::size_t t = 0; t < tables_.size(); ++t) out += (t ? ", " : "") + label(t, detailed);
    out += "]";
    if (detailed)
      out += detail::concat(" of ", cols_, " x ", to_string(data_type_of_v<S>),
                            reads_directly() ? ", rows read in place" : ", rows asked of their owners");
    return out;
  }

  /// Fills table t's rows on this rank: fill(global rows (in space), k, out).
  template <class Fill>
  void initialize(std::size_t t, Fill&& fill) {
    const std::size_t k = shard_rows(t);
    std::vector<index_t> rows(k);
    for (std::size_t i = 0; i < k; ++i) rows[i] = tables_[t].map.global_row(engine_->rank(), i);
    auto dev = Buffer<index_t, space>::from_host(rows);
    fill(dev.data(), k, shard_of(t));
  }

  /// Makes this rank's writes to its shard visible to the peers that read
  /// it (shared memory), before a collective that tells them they may.
  void sync_shard() {
    if constexpr (shares_host_memory<Engine>::value)
      if (window_) window_.sync();
  }

 protected:
  ~TableLayout() = default;

  /// build()'s first part: lays the tables out and allocates this rank's
  /// group shard (in a shared window when every rank is on one machine).
  /// Collective.
  void lay_out() {
    PARALLAX_EXPECTS(!built_, "TableGroup: build() called twice");
    built_ = true;
    const int n = engine_->size(), me = engine_->rank();
    const auto un = static_cast<std::size_t>(n);
    span_ = 0;
    for (const Table& t : tables_) span_ += t.map.rows;
    host_base_.assign(tables_.size() * un, 0);
    shard_rows_.assign(un, 0);
    for (std::size_t t = 0; t < tables_.size(); ++t)
      for (int o = 0; o < n; ++o) {
        const auto uo = static_cast<std::size_t>(o);
        host_base_[t * un + uo] = static_cast<index_t>(shard_rows_[uo]);
        shard_rows_[uo] += tables_[t].map.shard_rows(o);
      }
    base_ = Buffer<index_t, space>::from_host(host_base_);
    const std::size_t elements = shard_rows_[static_cast<std::size_t>(me)] * cols_;
    if constexpr (shares_host_memory<Engine>::value) {
      const bool shared = want_shared_;  // PARALLAX_SHARED_SHARDS=0 turned it off in TrainerOptions::resolve()
      // Every rank on one host: the hosts of the topology (real or emulated
      // for tests) and the machine's own say so (SharedWindow checks).
      if (shared && n > 1 && engine_->topology().num_hosts() == 1) {
        window_ = detail::SharedWindow<S>::create(engine_->comm(), elements);
        if (window_) shard_ = Buffer<S, space>::borrow(window_.local(), elements);
      }
    }
    if (!window_) shard_.resize_discard(elements);
  }

  struct Table {
    std::string name;
    PartitionMap map;
  };

  /// Where table t starts in each owner's group shard (in space, for kernels).
  const index_t* base_of(std::size_t t) const noexcept {
    return base_.data() + t * static_cast<std::size_t>(engine_->size());
  }

  Engine* engine_;
  std::size_t cols_;
  bool want_shared_;
  bool built_ = false;
  std::vector<Table> tables_;
  std::size_t span_ = 0;                // rows of every table: bounds any group shard
  std::vector<index_t> host_base_;      // [table][owner]: where the table starts in the owner's group shard
  std::vector<std::size_t> shard_rows_;  // [owner]: rows of its group shard
  Buffer<index_t, space> base_;         // host_base_, in space
  detail::SharedWindow<S> window_;      // the shard's memory, when shared
  Buffer<S, space> shard_;
};

}  // namespace parallax::policy::sharded
