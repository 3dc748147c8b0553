#pragma once
/// @file
/// AllGatherv's part of a trainer: sparse variables replicated on every
/// rank; each step every rank gathers every rank's gradient rows and applies
/// the same lazy update to its replica. Dynamic variables keep a replica of
/// their table on every rank (allgatherv/dynamic.hpp).

#include <parallax/bags.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/policy/allgatherv.hpp>
#include <parallax/policy/allgatherv/dynamic.hpp>
#include <parallax/policy/allgatherv/gatherer.hpp>
#include <parallax/policy/dynamic_ps/member.hpp>
#include <parallax/policy/members.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace parallax::policy {

template <class Engine, class Optimizer>
class GatherSynchronizer final : public Synchronizer<Engine> {
 public:
  using space = engine::space_of_t<Engine>;

  GatherSynchronizer(Engine& engine, const Optimizer& opt, const Common&) : engine_(&engine), opt_(&opt) {}

  template <class Var>
  Member& add(Var var) {
    static_assert(Var::is_sparse(),
                  "parallax: AllGatherv synchronises sparse gradients (rows); a dense variable has none to gather. "
                  "Use RingAllReduce or ShardedPS for dense variables.");
    if constexpr (dynamic::is_dynamic_v<Var>) {
      static_assert(std::is_same_v<space, HostSpace>,
                    "parallax AllGatherv: dynamic tables live in host memory; use a HostSpace engine (engine::Mpi)");
      return dynamic_.template add<allgatherv::DynamicReplica<Engine, Optimizer, Var>>(std::move(var), *opt_,
                                                                                        *engine_, step_);
    } else {
      return members_.template add<Of<Var>>(std::move(var), *engine_, *opt_);
    }
  }

  std::optional<std::string> problem() override {
    for (Entry* m : members_)
      if (auto p = m->problem()) return p;
    for (Dynamic* d : dynamic_)
      if (auto p = d->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const Entry* m : members_)
      if (m->has_gradient()) return true;
    for (const Dynamic* d : dynamic_)
      if (d->has_gradient()) return true;
    return false;
  }
  void finish_exchange(const StepInfo&) override {
    for (Entry* m : members_) m->gather();
    for (Dynamic* d : dynamic_) d->push(*engine_);
  }
  /// Every rank holds the same gathered sums: rank 0 counts them.
  std::optional<double> gradient_square_sum() override {
    double sum = 0;
    if (engine_->rank() == 0) {
      for (Entry* m : members_) sum += m->square_sum();
      for (Dynamic* d : dynamic_) sum += d->square_sum();
    }
    return sum;
  }
  void update(const StepInfo& info) override {
    for (Entry* m : members_) m->apply(info);
    for (Dynamic* d : dynamic_) d->apply(*opt_, info);
    ++step_;
  }
  void clear() override {
    for (Entry* m : members_) m->clear();
    for (Dynamic* d : dynamic_) d->clear();
    bags_.clear();
  }
  void restored(std::uint64_t step) override { step_ = std::max(step_, step + 1); }

  /// A batch of dynamic variables' lookups: each request's rows, aligned to
  /// its keys (the ids' bits are the keys). Collective; valid until the step.
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  std::vector<Rows<typename V::value_type, HostSpace>> lookup(const Lookup<V>* batch, std::size_t n) {
    std::vector<Rows<typename V::value_type, HostSpace>> out(n);
    for (std::size_t i = 0; i < n; ++i)
      out[i] = replica_of(*batch[i].var).lookup(*engine_, reinterpret_cast<const std::uint64_t*>(batch[i].ids),
                                                batch[i].n, step_);
    return out;
  }
  /// This rank's replica of dynamic variable `var` (export_rows() is the serving export).
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  dynamic::Table<typename V::value_type>& table(const V& var) { return replica_of(var).table(); }
  /// `var`'s statistics: the replica's, which every rank holds alike.
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  DynamicStats stats(const V& var) {
    const dynamic::Stats& s = replica_of(var).local_stats();
    return DynamicStats{s, s};
  }
  /// Saves dynamic variable `var` alone under `dir`, in the files DynamicPS
  /// writes (each rank the keys dynamic::owner gives it), so either policy
  /// restores them at any rank count. Collective.
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  void save(const V& var, const std::string& dir) { dynamic_ps::save_alone(*engine_, replica_of(var), dir); }
  /// Replaces `var`'s replica on every rank with every key a save under
  /// `dir` holds. Collective; what fails the checks throws on every rank
  /// before any rank's table changes.
  template <class V, std::enable_if_t<dynamic::is_dynamic_v<V>, int> = 0>
  void restore(V& var, const std::string& dir) { replica_of(var).load_files(dir); }

  /// A batch of bag lookups (docs/design.md, "Bags"): every rank holds every
  /// row, so each rank pools the rows of its own bags. A bad request throws
  /// on every rank. Collective (one small all-reduce).
  template <class V, std::enable_if_t<!dynamic::is_dynamic_v<V>, int> = 0>
  std::vector<Rows<typename V::value_type, space>> lookup_bags(const Bags<V>* batch, std::size_t n) {
    return bags_.template of<typename V::value_type>().lookup(*engine_, batch, n, [&] {
      std::vector<Lookup<V>> plain;
      for (std::size_t i = 0; i < n; ++i) plain.emplace_back(*batch[i].var, batch[i].ids, batch[i].n);
      return lookup(plain.data(), plain.size());
    });
  }
  /// The gradients of the pooled rows, one per request: each id gets its
  /// bag's row (times its weight; divided by the bag's ids for mean) in its
  /// variable's sparse gradient, gathered at the step like any other.
  /// Collective (one small all-reduce).
  template <class V, std::enable_if_t<!dynamic::is_dynamic_v<V>, int> = 0>
  void bag_gradients(const BagGradient<V>* grads, std::size_t n) {
    bags_.template of<typename V::value_type>().gradients(*engine_, grads, n);
  }

  template <class V, std::enable_if_t<!dynamic::is_dynamic_v<V>, int> = 0>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t n) {
    return lookup_replicas<V, space>(*engine_, batch, n, [&](V& var) -> Of<V>& { return member_of(var); });
  }
  /// Trainer::prefetch: replicas have nothing to route; the ids are kept
  /// and the rows gathered by finish_lookup().
  template <class V, std::enable_if_t<!dynamic::is_dynamic_v<V>, int> = 0>
  void start_lookup(const Lookup<V>* batch, std::size_t n, Background&) {
    ahead_.start(batch, n);
  }
  template <class V, std::enable_if_t<!dynamic::is_dynamic_v<V>, int> = 0>
  std::vector<Rows<typename V::value_type, space>> finish_lookup() {
    return ahead_.template finish<V>(*engine_, [&](V& var) -> Of<V>& { return member_of(var); });
  }
  void cancel_lookup() override { ahead_.cancel(); }

 private:
  /// What the synchronizer does with a replica, whatever its type.
  class Entry : public SparseReplicaKind {
   public:
    virtual void gather() = 0;
  };
  template <class Var>
  class Of final : public SparseReplicaAs<Var, Engine, Optimizer, Entry> {
    using T = typename Var::value_type;

   public:
    Of(Var var, Engine& engine, const Optimizer& opt)
        : SparseReplicaAs<Var, Engine, Optimizer, Entry>(std::move(var), engine, opt, AllGatherv::name),
          gatherer_(engine, this->var_.cols()) {}
    /// Every rank's coalesced rows, summed by row then by rank.
    void gather() override {
      auto scope = this->engine_->stats().scope(this->var_.name(), AllGatherv::name);
      auto& g = this->gradient();
      g.coalesce(this->ex());
      rows_ = gatherer_.gather(g.indices(), g.values(), g.size(), ids_, sums_);
    }
    double square_sum() override { return detail::sum_of_squares(this->ex(), sums_.data(), rows_ * this->var_.cols()); }
    void apply(const StepInfo& info) override { this->apply_rows(info, ids_.data(), sums_.data(), rows_); }

   private:
    SparseAllGatherer<T, Engine> gatherer_;
    Buffer<index_t, space> ids_;
    Buffer<T, space> sums_;
    std::size_t rows_ = 0;
  };

  template <class V>
  Of<V>& member_of(V& var) {
    return members_.template of<Of<V>>(var, AllGatherv::name);
  }
  template <class V>
  allgatherv::DynamicReplica<Engine, Optimizer, V>& replica_of(const V& var) {
    return dynamic_.template of<allgatherv::DynamicReplica<Engine, Optimizer, V>>(var, AllGatherv::name);
  }

  Engine* engine_;
  const Optimizer* opt_;  // the trainer's: its learning rate changes between steps
  using Dynamic = dynamic_ps::Shard<Engine, Optimizer>;
  Members<Entry> members_;
  Members<Dynamic> dynamic_;  // replicated dynamic tables
  std::uint64_t step_ = 1;  // the step dynamic lookups insert at: the trainer's next
  ReplicaLookupsAhead<space> ahead_;  // start_lookup() to finish_lookup()
  LocalBagsOfEachType<space> bags_;   // this step's bag lookups, for their gradients
};

}  // namespace parallax::policy
