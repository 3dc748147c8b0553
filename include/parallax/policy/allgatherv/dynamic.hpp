#pragma once
/// @file
/// AllGatherv's dynamic variables (docs/design.md, "Dynamic tables"): every
/// rank holds a whole replica of the table, of the variable's capacity, and
/// applies the same inserts, evictions and updates in the same order, so the
/// replicas stay identical.
///
///   * lookup: every rank's keys are gathered in rank order (duplicates
///     too); every rank runs find_or_insert on all of them at the lookup
///     step, which is what one process does with the global batch, and reads
///     the rows of its own keys locally;
///   * step: every rank's (key, gradient row) pairs are gathered in rank
///     order, uncoalesced, and each rank sums each key's rows in that order
///     and applies the optimizer: the same sums, bit for bit, as one process
///     summing the global batch, and as DynamicPS's owners.
/// A lookup that overflows the capacity throws on every rank alike, since
/// every replica sees the same keys in the same state.

#include <parallax/dynamic/table.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/policy/allgatherv.hpp>
#include <parallax/policy/dynamic_ps/member.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

namespace parallax::policy::allgatherv {

/// Every rank's keys, with `cols` values per key, gathered everywhere in
/// rank order. Collective: an allgather of the counts and an allgatherv of
/// the keys and values, packed per rank.
template <class T>
class KeyGather {
 public:
  std::vector<std::uint64_t> keys;  ///< every rank's, in rank order
  std::vector<T> rows;              ///< `cols` values per key, aligned to keys
  std::size_t mine = 0;             ///< where this rank's keys start in keys

  template <class Engine>
  void gather(Engine& engine, const std::uint64_t* send_keys, std::size_t n, const T* send_rows, std::size_t cols) {
    const auto un = static_cast<std::size_t>(engine.size());
    const std::size_t width = sizeof(std::uint64_t) + cols * sizeof(T);
    const auto count = static_cast<std::int64_t>(n);
    counts_.resize(un);
    engine.allgather(&count, counts_.data(), 1, DataType::i64);
    bytes_.resize(un);
    displs_.resize(un);
    std::size_t total = 0, before = 0;
    for (std::size_t r = 0; r < un; ++r) {
      const auto kr = static_cast<std::size_t>(counts_[r]);
      if (r == static_cast<std::size_t>(engine.rank())) before = total;
      bytes_[r] = kr * width;
      displs_[r] = total * width;
      total += kr;
    }
    // memcpy with a null pointer is undefined even for 0 bytes.
    const auto copy = [](void* to, const void* from, std::size_t b) {
      if (b != 0) std::memcpy(to, from, b);
    };
    send_.resize(n * width);
    copy(send_.data(), send_keys, n * sizeof(std::uint64_t));
    copy(send_.data() + n * sizeof(std::uint64_t), send_rows, n * cols * sizeof(T));
    recv_.resize(total * width);
    engine.allgatherv(send_.data(), send_.size(), recv_.data(), bytes_.data(), displs_.data(), DataType::u8);
    keys.resize(total);
    rows.resize(total * cols);
    for (std::size_t r = 0, at = 0; r < un; ++r) {
      const auto kr = static_cast<std::size_t>(counts_[r]);
      const std::byte* in = recv_.data() + displs_[r];
      copy(keys.data() + at, in, kr * sizeof(std::uint64_t));
      copy(rows.data() + at * cols, in + kr * sizeof(std::uint64_t), kr * cols * sizeof(T));
      at += kr;
    }
    mine = before;
  }

 private:
  std::vector<std::int64_t> counts_;
  std::vector<std::size_t> bytes_, displs_;
  std::vector<std::byte> send_, recv_;
};

/// A dynamic variable's replica on this rank.
template <class Engine, class Optimizer, class Var>
class DynamicReplica final : public dynamic_ps::TableMember<Engine, Optimizer, Var> {
  using Base = dynamic_ps::TableMember<Engine, Optimizer, Var>;

 public:
  using T = typename Var::value_type;

  DynamicReplica(Var var, const Optimizer& opt, Engine& engine, std::uint64_t& step)
      : Base(std::move(var), opt, engine, step, AllGatherv::name, dynamic_ps::Placement::replicated) {}

  /// The rows of this rank's `n` keys, aligned to them, valid until clear().
  /// Collective.
  Rows<T, HostSpace> lookup(Engine& engine, const std::uint64_t* keys, std::size_t n, std::uint64_t step) {
    gathered_.gather(engine, keys, n, static_cast<const T*>(nullptr), 0);
    slots_.resize(gathered_.keys.size());
    try {
      this->insert(gathered_.keys.data(), gathered_.keys.size(), step, slots_.data());
    } catch (const error& e) {
      throw error(detail::concat("dynamic variable '", this->var_.name(), "': ", e.what()));
    }
    const std::size_t cols = this->var_.cols();
    std::vector<T>& rows = results_.emplace_back(n * cols);
    this->table_.gather(keys, slots_.data() + gathered_.mine, n, rows.data());
    return Rows<T, HostSpace>{rows.data(), n, cols};
  }

  void push(Engine& engine) override {
    const auto& g = this->var_.state().grad;
    gathered_.gather(engine, g.keys(), g.size(), g.values(), this->var_.cols());
    this->sum_pushed(gathered_.keys.data(), gathered_.rows.data(), gathered_.keys.size());
  }
  void clear() override {
    Base::clear();
    results_.clear();
  }

 private:
  KeyGather<T> gathered_;
  std::vector<index_t> slots_;
  std::deque<std::vector<T>> results_;  // this step's looked-up rows, valid until clear()
};

}  // namespace parallax::policy::allgatherv
