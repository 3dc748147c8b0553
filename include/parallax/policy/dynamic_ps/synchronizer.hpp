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
///
/// A batched lookup routes the keys of all its tables in one exchange and
/// their rows back in one; a step pushes every table's rows in one
/// (policy/dynamic_ps/routes.hpp). At one rank nothing is routed.

#include <parallax/detail/agreement.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/optim/optimizer.hpp>
#include <parallax/policy/dynamic_ps.hpp>
#include <parallax/policy/dynamic_ps/member.hpp>
#include <parallax/policy/dynamic_ps/routes.hpp>
#include <parallax/policy/dynamic_ps/saves.hpp>
#include <parallax/policy/members.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/space.hpp>
#include <parallax/types.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

namespace dynamic_ps {

/// What the synchronizer batches of a shard: its part of the step's push.
class Pushes {
 public:
  /// Fills `lane` with the step's gradient rows (their keys left out when
  /// they are those of the shard's last lookup, in its order).
  virtual void push_lane(Lane& lane) = 0;
  /// Sums what the push brought (the lane push_lane() filled, exchanged).
  virtual void pushed(const Lane& lane) = 0;

 protected:
  ~Pushes() = default;
};

/// A dynamic variable's shard on this rank: its keys' rows, lookups and pushes
/// routed to their owners (the synchronizer batches every shard's routes).
template <class Engine, class Optimizer, class Var>
class ShardOf final : public TableMember<Engine, Optimizer, Var>, public Pushes {
  using Base = TableMember<Engine, Optimizer, Var>;

 public:
  using T = typename Var::value_type;

  ShardOf(Var var, const Optimizer& opt, Engine& engine, std::uint64_t& step)
      : Base(std::move(var), opt, engine, step, DynamicPS::name, Placement::sharded) {}

  /// Inserts the keys a lookup brought this owner (find_or_insert's error
  /// is kept for the agreement).
  void request(const std::uint64_t* received, std::size_t n, std::uint64_t step, index_t* slots,
               std::optional<std::string>& problem) {
    try {
      this->insert(received, n, step, slots);
    } catch (const error& e) {
      if (!problem) problem = detail::concat("dynamic variable '", this->var_.name(), "': ", e.what());
    }
  }
  /// Keeps `rows` (rows of keys[0, n), in the caller's order) until clear().
  Rows<T, HostSpace> keep(std::vector<T> rows, std::size_t n) {
    std::vector<T>& kept = results_.emplace_back(std::move(rows));
    return Rows<T, HostSpace>{kept.data(), n, this->var_.cols()};
  }
  /// The route of the step's last lookup, whose keys a push of the same keys leaves out.
  void looked_up(Route route) { last_ = std::move(route), has_last_ = true; }

  void push(Engine& engine) override {
    const auto& g = this->var_.state().grad;
    if (engine.size() == 1) {  // the rows are summed in place: no route
      this->sum_pushed(g.keys(), g.values(), g.size());
      return;
    }
    Lane lane;
    push_lane(lane);
    exchange(engine, &lane, 1, buffers_);
    pushed(lane);
  }
  void push_lane(Lane& lane) override {
    const auto& g = this->var_.state().grad;
    lane.keys = !(has_last_ && last_.carries(g.keys(), g.size()));
    if (lane.keys) pushing_.plan(g.keys(), g.size(), this->engine_->size());
    lane.send = lane.keys ? &pushing_ : &last_;
    lane.recv = &pushing_;
    lane.last = has_last_ ? &last_ : nullptr;
    lane.rows = reinterpret_cast<const std::byte*>(g.values());
    lane.row_bytes = this->var_.cols() * sizeof(T);
    lane.land = [this](std::size_t n) -> void* {
      arrived_.resize(n * this->var_.cols());
      return arrived_.data();
    };
  }
  void pushed(const Lane& lane) override { this->sum_pushed(lane.recv->recv_keys.data(), arrived_.data(), lane.recv->received()); }

  void clear() override {
    Base::clear();
    results_.clear();
    has_last_ = false;
  }

 private:
  std::deque<std::vector<T>> results_;  // this step's looked-up rows, valid until clear()
  Route last_, pushing_;
  bool has_last_ = false;
  std::vector<T> arrived_;  // the pushed rows this owner received
  Buffers buffers_;
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
    auto& shard = shards_.template add<dynamic_ps::ShardOf<Engine, Optimizer, Var>>(std::move(var), opt_, engine_, step_);
    pushes_.push_back(&shard);
    return shard;
  }

  /// Each request's rows, aligned to its keys (the ids' bits are the keys).
  /// Collective; valid until the step. A step whose distinct admitted keys
  /// exceed an owner's capacity throws on every rank.
  template <class V>
  std::vector<Rows<typename V::value_type, HostSpace>> lookup(const Lookup<V>* batch, std::size_t n) {
    using T = typename V::value_type;
    const bool alone = engine_.size() == 1;  // one rank owns every key: no routes
    auto keys_of = [&](std::size_t i) { return reinterpret_cast<const std::uint64_t*>(batch[i].ids); };
    std::vector<dynamic_ps::Route> routes(alone ? 0 : n);
    std::vector<dynamic_ps::Lane> lanes(routes.size());
    for (std::size_t i = 0; i < routes.size(); ++i) {
      routes[i].plan(keys_of(i), batch[i].n, engine_.size());
      lanes[i].send = lanes[i].recv = &routes[i];
    }
    if (!alone) dynamic_ps::exchange(engine_, lanes.data(), n, buffers_);
    std::optional<std::string> problem;
    std::vector<std::vector<index_t>> slots(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t* keys = alone ? keys_of(i) : routes[i].recv_keys.data();
      slots[i].resize(alone ? batch[i].n : routes[i].received());
      shard_of(*batch[i].var).request(keys, slots[i].size(), step_, slots[i].data(), problem);
    }
    detail::agree(engine_, problem);
    // The rows of what each owner received, then back to the callers.
    std::vector<std::vector<T>> owned(n), back(n);
    std::vector<std::size_t> row_bytes(n);
    std::vector<const std::byte*> from(n);
    std::vector<std::byte*> to(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto& shard = shard_of(*batch[i].var);
      const std::size_t cols = batch[i].var->cols();
      const std::uint64_t* keys = alone ? keys_of(i) : routes[i].recv_keys.data();
      owned[i].resize(slots[i].size() * cols);
      shard.table().gather(keys, slots[i].data(), slots[i].size(), owned[i].data());
      if (alone) continue;
      back[i].resize(batch[i].n * cols);
      row_bytes[i] = cols * sizeof(T);
      from[i] = reinterpret_cast<const std::byte*>(owned[i].data());
      to[i] = reinterpret_cast<std::byte*>(back[i].data());
    }
    if (!alone) dynamic_ps::reply(engine_, lanes.data(), n, row_bytes.data(), from.data(), to.data(), buffers_);
    std::vector<Rows<T, HostSpace>> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      auto& shard = shard_of(*batch[i].var);
      out[i] = shard.keep(std::move(alone ? owned[i] : back[i]), batch[i].n);
      if (!alone) shard.looked_up(std::move(routes[i]));  // a later lookup of the same table replaces it
    }
    return out;
  }

  std::optional<std::string> problem() override {
    for (const ShardBase* s : shards_)
      if (auto p = s->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const ShardBase* s : shards_)
      if (s->has_gradient()) return true;
    return false;
  }
  /// Every shard's gradient rows travel in one exchange.
  void finish_exchange(const StepInfo&) override {
    if (engine_.size() == 1 || shards_.empty()) {  // nothing to route
      for (ShardBase* s : shards_) s->push(engine_);
      return;
    }
    std::vector<dynamic_ps::Lane> lanes(pushes_.size());
    for (std::size_t k = 0; k < pushes_.size(); ++k) pushes_[k]->push_lane(lanes[k]);
    dynamic_ps::exchange(engine_, lanes.data(), lanes.size(), buffers_);
    for (std::size_t k = 0; k < pushes_.size(); ++k) pushes_[k]->pushed(lanes[k]);
  }
  std::optional<double> gradient_square_sum() override {
    double sum = 0.0;
    for (const ShardBase* s : shards_) sum += s->square_sum();
    return sum;
  }
  void update(const StepInfo& info) override {
    for (ShardBase* s : shards_) s->apply(opt_, info);
    ++step_;
  }
  void clear() override {
    for (ShardBase* s : shards_) s->clear();
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
    return shards_.template of<dynamic_ps::ShardOf<Engine, Optimizer, V>>(var, "DynamicPS");
  }

  Engine& engine_;
  const Optimizer& opt_;
  Members<ShardBase> shards_;                // registration order
  std::vector<dynamic_ps::Pushes*> pushes_;  // shards_, as their pushes
  dynamic_ps::Buffers buffers_;              // the lookups' exchanges
  std::uint64_t step_ = 1;  // the step lookups insert at: the trainer's next
};

}  // namespace parallax::policy
