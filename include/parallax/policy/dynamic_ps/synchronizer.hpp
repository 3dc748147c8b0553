#pragma once
/// @file
/// DynamicSynchronizer: the DynamicPS policy's part of a trainer
/// (docs/design.md, "Dynamic tables"). Each rank holds one dynamic::Table
/// per dynamic variable: the keys dynamic::owner(key, ranks) gives it.
///
///   * lookup: every rank sends each key (duplicates too, so a key's count
///     and its admission sightings are what one process would see) to its
///     owner; the owner calls find_or_insert on what it received, in source
///     rank order, at the lookup step (1 + the updates this synchronizer
///     made, or what a restore carried on), and sends the rows back (default
///     rows for unadmitted keys), which land aligned to the caller's keys.
///   * step: the gradient rows go to the owners uncoalesced; the owner sums
///     each key's rows in arrival order (source rank, then the order they
///     were added), so the sum is bit for bit what one process summing the
///     global batch gets, and applies the optimizer to the keys that hold a
///     row (a key never looked up, refused or evicted pushes nothing).

#include <parallax/detail/agreement.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/dynamic_ps.hpp>
#include <parallax/policy/dynamic_ps/member.hpp>
#include <parallax/policy/dynamic_ps/saves.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

namespace dynamic_ps {

/// Keys routed to their owners: this rank's keys grouped by owner (stable),
/// and what every rank sent this one, in source rank order.
struct Route {
  std::vector<std::size_t> send_counts, send_displs, recv_counts, recv_displs;  // in keys
  std::vector<std::size_t> order;  // order[j]: the caller's index of the j-th key sent
  std::vector<std::uint64_t> send_keys, recv_keys;

  /// Groups keys[0, n) by owner and exchanges them, with `cols` values per
  /// key from `rows` (none when null) landing in `recv_rows`, aligned to
  /// recv_keys. Collective: one alltoallv_unsized where the engine has it
  /// (the sizes ride in the messages), else a round of counts first and an
  /// alltoallv each for the keys and the rows.
  template <class Engine, class T = float>
  void build(Engine& engine, const std::uint64_t* keys, std::size_t n, const T* rows = nullptr, std::size_t cols = 0,
             std::vector<T>* recv_rows = nullptr) {
    const int ranks = engine.size();
    const auto un = static_cast<std::size_t>(ranks);
    std::vector<int> owners(n);
    send_counts.assign(un, 0);
    for (std::size_t i = 0; i < n; ++i) {
      owners[i] = dynamic::owner(keys[i], ranks);
      ++send_counts[static_cast<std::size_t>(owners[i])];
    }
    send_displs = displacements(send_counts);
    order.resize(n);
    send_keys.resize(n);
    std::vector<std::size_t> at = send_displs;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t j = at[static_cast<std::size_t>(owners[i])]++;
      order[j] = i;
      send_keys[j] = keys[i];
    }
    if (!rows) cols = 0;
    // memcpy with a null pointer is undefined even for 0 bytes, and an empty
    // vector's data() may be null.
    const auto copy = [](void* to, const void* from, std::size_t bytes) {
      if (bytes != 0) std::memcpy(to, from, bytes);
    };
    if constexpr (engine::supports_v<Engine, engine::op_alltoallv_unsized>) {
      // Per destination: its keys, then their rows.
      const std::size_t width = sizeof(std::uint64_t) + cols * sizeof(T);
      std::vector<std::size_t> sbytes(un), sdispls(un), rbytes(un), rdispls(un);
      packed_.resize(n * width);
      for (std::size_t p = 0; p < un; ++p) {
        sbytes[p] = send_counts[p] * width;
        sdispls[p] = send_displs[p] * width;
        std::byte* out = packed_.data() + sdispls[p];
        copy(out, send_keys.data() + send_displs[p], send_counts[p] * sizeof(std::uint64_t));
        out += send_counts[p] * sizeof(std::uint64_t);
        if (rows != nullptr)  // a lookup sends keys alone
          for (std::size_t j = send_displs[p]; j < send_displs[p] + send_counts[p]; ++j, out += cols * sizeof(T))
            copy(out, rows + order[j] * cols, cols * sizeof(T));
      }
      engine.alltoallv_unsized(packed_.data(), sbytes.data(), sdispls.data(), rbytes.data(), rdispls.data(),
                               [&](std::size_t total) {
                                 received_.resize(total);
                                 return received_.data();
                               });
      recv_counts.resize(un);
      for (std::size_t p = 0; p < un; ++p) recv_counts[p] = rbytes[p] / width;
      recv_displs = displacements(recv_counts);
      recv_keys.resize(recv_displs.back() + recv_counts.back());
      if (recv_rows) recv_rows->resize(recv_keys.size() * cols);
      for (std::size_t p = 0; p < un; ++p) {
        const std::byte* in = received_.data() + rdispls[p];
        copy(recv_keys.data() + recv_displs[p], in, recv_counts[p] * sizeof(std::uint64_t));
        if (recv_rows)
          copy(recv_rows->data() + recv_displs[p] * cols, in + recv_counts[p] * sizeof(std::uint64_t),
               recv_counts[p] * cols * sizeof(T));
      }
    } else {
      std::vector<std::uint64_t> sc(send_counts.begin(), send_counts.end()), rc(un);
      engine.alltoall(sc.data(), rc.data(), 1, DataType::i64);
      recv_counts.assign(rc.begin(), rc.end());
      recv_displs = displacements(recv_counts);
      recv_keys.resize(recv_displs.back() + recv_counts.back());
      engine.alltoallv(send_keys.data(), send_counts.data(), send_displs.data(), recv_keys.data(), recv_counts.data(),
                       recv_displs.data(), DataType::i64);
      if (recv_rows) {
        std::vector<T> send(n * cols);
        for (std::size_t j = 0; j < n; ++j) std::copy_n(rows + order[j] * cols, cols, send.data() + j * cols);
        recv_rows->resize(recv_keys.size() * cols);
        move_rows(engine, send.data(), recv_rows->data(), cols, false);
      }
    }
  }

  /// Moves `cols` values per key the way the keys went (`back`: the other
  /// way, from owners to callers). Collective.
  template <class Engine, class T>
  void move_rows(Engine& engine, const T* send, T* recv, std::size_t cols, bool back) const {
    auto scale = [&](const std::vector<std::size_t>& v) {
      std::vector<std::size_t> out(v);
      for (auto& x : out) x *= cols;
      return out;
    };
    const auto& sc = back ? recv_counts : send_counts;
    const auto& sd = back ? recv_displs : send_displs;
    const auto& rc = back ? send_counts : recv_counts;
    const auto& rd = back ? send_displs : recv_displs;
    const auto scc = scale(sc), sdd = scale(sd), rcc = scale(rc), rdd = scale(rd);
    engine.alltoallv(send, scc.data(), sdd.data(), recv, rcc.data(), rdd.data(), data_type_of_v<T>);
  }

  std::size_t received() const noexcept { return recv_keys.size(); }

 private:
  std::vector<std::byte> packed_, received_;
  static std::vector<std::size_t> displacements(const std::vector<std::size_t>& counts) {
    std::vector<std::size_t> d(counts.size(), 0);
    for (std::size_t p = 1; p < counts.size(); ++p) d[p] = d[p - 1] + counts[p - 1];
    return d;
  }
};

/// A dynamic variable's shard on this rank: its keys' rows, lookups and pushes
/// routed to their owners.
template <class Engine, class Optimizer, class Var>
class ShardOf final : public TableMember<Engine, Optimizer, Var> {
  using Base = TableMember<Engine, Optimizer, Var>;

 public:
  using T = typename Var::value_type;

  ShardOf(Var var, const Optimizer& opt, Engine& engine, std::uint64_t& step)
      : Base(std::move(var), opt, engine, step, DynamicPS::name, Placement::sharded) {}

  /// Routes keys to owners and inserts them there; the rows go back in
  /// reply(). Collective (find_or_insert's error is kept for the agreement).
  void request(Engine& engine, const std::uint64_t* keys, std::size_t n, std::uint64_t step,
               std::optional<std::string>& problem) {
    Route& r = lookups_.emplace_back();
    // One rank owns every key: the caller's keys are what it receives.
    const bool alone = engine.size() == 1;
    if (alone) r.send_keys.assign(keys, keys + n);
    else r.build(engine, keys, n);
    const std::uint64_t* received = alone ? keys : r.recv_keys.data();
    std::vector<index_t>& slots = requested_slots_.emplace_back(alone ? n : r.received());
    try {
      this->insert(received, slots.size(), step, slots.data());
    } catch (const error& e) {
      if (!problem) problem = detail::concat("dynamic variable '", this->var_.name(), "': ", e.what());
    }
  }
  /// Sends the rows of the last request() back; returns them aligned to its keys. Collective.
  Rows<T, HostSpace> reply(Engine& engine) {
    const Route& r = lookups_.back();
    const std::vector<index_t>& slots = requested_slots_.back();
    const std::size_t cols = this->var_.cols();
    if (engine.size() == 1) {  // the rows land in place: no route
      std::vector<T>& rows = results_.emplace_back(slots.size() * cols);
      this->table_.gather(r.send_keys.data(), slots.data(), slots.size(), rows.data());
      lookups_.pop_back();
      requested_slots_.pop_back();
      return Rows<T, HostSpace>{rows.data(), slots.size(), cols};
    }
    std::vector<T> out_rows(r.received() * cols), back(r.send_keys.size() * cols);
    this->table_.gather(r.recv_keys.data(), slots.data(), r.received(), out_rows.data());
    r.move_rows(engine, out_rows.data(), back.data(), cols, true);
    std::vector<T>& rows = results_.emplace_back(back.size());
    for (std::size_t j = 0; j < r.order.size(); ++j)
      std::copy_n(back.data() + j * cols, cols, rows.data() + r.order[j] * cols);
    lookups_.pop_back();  // the route's keys are not needed after the reply
    requested_slots_.pop_back();
    return Rows<T, HostSpace>{rows.data(), r.order.size(), cols};
  }

  /// Forgets the last request() (its lookup failed on some rank).
  void drop_request() {
    lookups_.pop_back();
    requested_slots_.pop_back();
  }

  /// The gradient rows go to their owners uncoalesced and are summed there
  /// in arrival order (source rank, then the order added).
  void push(Engine& engine) override {
    const auto& g = this->var_.state().grad;
    if (engine.size() == 1) {
      this->sum_pushed(g.keys(), g.values(), g.size());
      return;
    }
    Route r;
    std::vector<T> recv;
    r.build(engine, g.keys(), g.size(), g.values(), this->var_.cols(), &recv);
    this->sum_pushed(r.recv_keys.data(), recv.data(), r.received());
  }
  void clear() override {
    Base::clear();
    results_.clear();
    lookups_.clear();
    requested_slots_.clear();
  }

 private:
  std::deque<std::vector<T>> results_;  // this step's looked-up rows, valid until clear()
  std::deque<Route> lookups_;
  std::deque<std::vector<index_t>> requested_slots_;
};

}  // namespace dynamic_ps

template <class Engine, class Optimizer>
class DynamicSynchronizer final : public Synchronizer<Engine> {
  static_assert(std::is_same_v<engine::space_of_t<Engine>, HostSpace>,
                "parallax DynamicPS: dynamic tables live in host memory; use a HostSpace engine (engine::Mpi)");
  using ShardBase = dynamic_ps::Shard<Engine, Optimizer>;

 public:
  using space = HostSpace;

  DynamicSynchronizer(Engine& engine, const Optimizer& opt, const Common&) : engine_(engine), opt_(opt) {}

  template <class Var>
  Member& add(Var var) {
    static_assert(dynamic::is_dynamic_v<Var>,
                  "parallax DynamicPS: synchronises DynamicVariables only; a fixed Variable goes to another policy");
    shards_.push_back(std::make_unique<dynamic_ps::ShardOf<Engine, Optimizer, Var>>(std::move(var), opt_, engine_, step_));
    return *shards_.back();
  }

  /// Each request's rows, aligned to its keys (the ids' bits are the keys).
  /// Collective; valid until the step. A step whose distinct admitted keys
  /// exceed an owner's capacity throws on every rank.
  template <class V>
  std::vector<Rows<typename V::value_type, HostSpace>> lookup(const Lookup<V>* batch, std::size_t n) {
    std::optional<std::string> problem;
    for (std::size_t i = 0; i < n; ++i)
      shard_of(*batch[i].var).request(engine_, reinterpret_cast<const std::uint64_t*>(batch[i].ids), batch[i].n, step_,
                                      problem);
    try {
      detail::agree(engine_, problem);
    } catch (...) {
      for (std::size_t i = 0; i < n; ++i) shard_of(*batch[i].var).drop_request();
      throw;
    }
    std::vector<Rows<typename V::value_type, HostSpace>> out(n);
    for (std::size_t i = n; i-- > 0;) out[i] = shard_of(*batch[i].var).reply(engine_);
    return out;
  }

  std::optional<std::string> problem() override {
    for (const auto& s : shards_)
      if (auto p = s->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const auto& s : shards_)
      if (s->has_gradient()) return true;
    return false;
  }
  void finish_exchange(const StepInfo&) override {
    for (auto& s : shards_) s->push(engine_);
  }
  std::optional<double> gradient_square_sum() override {
    double sum = 0.0;
    for (const auto& s : shards_) sum += s->square_sum();
    return sum;
  }
  void update(const StepInfo& info) override {
    for (auto& s : shards_) s->apply(opt_, info);
    ++step_;
  }
  void clear() override {
    for (auto& s : shards_) s->clear();
  }
  void restored(std::uint64_t step) override { step_ = std::max(step_, step + 1); }

  /// This rank's shard of `var` (its table: export_rows() is the serving export).
  template <class V>
  dynamic::Table<typename V::value_type>& table(const V& var) { return shard_of(var).table(); }

  /// Saves `var` alone under `dir` (created if missing): its files as a
  /// checkpoint holds them (Trainer::save saves it with the rest).
  /// Collective; a failure on any rank throws on every rank.
  template <class V>
  void save(const V& var, const std::string& dir) {
    dynamic_ps::save_alone(engine_, shard_of(var), dir);
  }

  /// Replaces `var`'s rows on every rank with those a save() under `dir`
  /// (or a checkpoint's directory) holds, whatever rank count saved them.
  /// Collective; what fails the checks throws on every rank before any
  /// rank's table changes.
  template <class V>
  void restore(V& var, const std::string& dir) {
    shard_of(var).load_files(dir);
  }

  /// `var`'s statistics over every rank. Collective.
  template <class V>
  DynamicStats stats(const V& var) {
    const dynamic::Stats& s = shard_of(var).local_stats();
    std::uint64_t mine[8] = {s.size, s.capacity, s.lookups, s.hits, s.inserts, s.evictions, s.erased,
                             s.admissions_refused};
    std::uint64_t sum[8], max[8];
    engine_.allreduce(mine, sum, 8, DataType::i64, ReduceOp::sum);
    engine_.allreduce(mine, max, 8, DataType::i64, ReduceOp::max);
    auto unpack = [](const std::uint64_t* v) {
      dynamic::Stats o;
      o.size = v[0];
      o.capacity = v[1];
      o.lookups = v[2];
      o.hits = v[3];
      o.inserts = v[4];
      o.evictions = v[5];
      o.erased = v[6];
      o.admissions_refused = v[7];
      return o;
    };
    return DynamicStats{unpack(sum), unpack(max)};
  }

 private:
  template <class V>
  dynamic_ps::ShardOf<Engine, Optimizer, V>& shard_of(const V& var) {
    for (auto& s : shards_)
      if (s->identity() == &var.state()) return static_cast<dynamic_ps::ShardOf<Engine, Optimizer, V>&>(*s);
    throw error(detail::concat("dynamic variable '", var.name(), "' is not registered with this Trainer"));
  }

  Engine& engine_;
  const Optimizer& opt_;
  std::vector<std::unique_ptr<ShardBase>> shards_;
  std::uint64_t step_ = 1;  // the step lookups insert at: the trainer's next
};

}  // namespace parallax::policy
