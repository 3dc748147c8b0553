// policy/policy.hpp: a policy defined here, in the test, trains a model
// beside the built-in ones with no change to parallax (the protocol is
// open); the contracts of policies, engines and optimizers are checkable
// traits.
#include "support.hpp"

#include <parallax/policy/members.hpp>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// ---------------------------------------------------------------- a policy of the test's own

template <class Engine, class Optimizer>
class EngineSumSynchronizer;

/// Sums every gradient with the engine's own all-reduce, one variable at a
/// time, dense gradients as they are and sparse ones scattered into a dense
/// buffer; every rank keeps a replica. The simplest policy there is.
struct EngineSum {
  static constexpr const char* name = "EngineSum";
  template <class Engine, class Optimizer>
  using synchronizer = EngineSumSynchronizer<Engine, Optimizer>;
};

template <class Engine, class Optimizer>
class EngineSumSynchronizer final : public px::policy::Synchronizer<Engine> {
 public:
  using space = px::engine::space_of_t<Engine>;

  EngineSumSynchronizer(Engine& engine, const Optimizer& opt, const px::policy::Common&) : engine_(&engine), opt_(opt) {}

  template <class Var>
  px::policy::Member& add(Var var) {
    return members_.template add<Of<Var>>(std::move(var), *engine_, opt_);
  }
  std::optional<std::string> problem() override {
    for (auto& m : members_)
      if (auto p = m->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const auto& m : members_)
      if (m->has_gradient()) return true;
    return false;
  }
  void finish_exchange(const px::policy::StepInfo&) override {
    for (auto& m : members_) m->sum();
  }
  void update(const px::policy::StepInfo& info) override {
    for (auto& m : members_) m->apply(info);
  }
  void clear() override {
    for (auto& m : members_) m->clear();
  }
  template <class V>
  std::vector<px::Rows<typename V::value_type, space>> lookup(const px::Lookup<V>* batch, std::size_t n) {
    return px::policy::lookup_replicas<V, space>(
        *engine_, batch, n, [&](V& var) -> Of<V>& { return members_.template of<Of<V>>(var, EngineSum::name); });
  }

 private:
  class Entry {
   public:
    virtual ~Entry() = default;
    virtual std::optional<std::string> problem() = 0;
    virtual bool has_gradient() const = 0;
    virtual void sum() = 0;
    virtual void apply(const px::policy::StepInfo&) = 0;
    virtual void clear() = 0;
  };
  template <class Var>
  using Replica = std::conditional_t<Var::is_sparse(), px::policy::SparseReplica<Var, Engine, Optimizer>,
                                     px::policy::DenseReplica<Var, Engine, Optimizer>>;
  template <class Var>
  class Of final : public Replica<Var>, public Entry {
    using T = typename Var::value_type;

   public:
    Of(Var var, Engine& engine, const Optimizer& opt) : Replica<Var>(std::move(var), engine, opt, EngineSum::name) {
      if constexpr (Var::is_sparse()) dense_.resize_discard(this->var_.shape().elements());
    }
    std::optional<std::string> problem() override {
      if constexpr (Var::is_sparse()) return Replica<Var>::problem();
      else return std::nullopt;
    }
    bool has_gradient() const override { return Replica<Var>::has_gradient(); }
    void sum() override {
      auto& engine = this->engine();
      auto scope = engine.stats().scope(this->var_.name(), EngineSum::name);
      T* g = gradient_data();
      engine.allreduce(g, g, this->var_.shape().elements(), px::data_type_of_v<T>, px::ReduceOp::sum);
    }
    void apply(const px::policy::StepInfo& info) override {
      if constexpr (Var::is_sparse()) Replica<Var>::apply_dense(info, dense_.data());
      else Replica<Var>::apply(info);
    }
    void clear() override { Replica<Var>::clear(); }

   private:
    T* gradient_data() {
      if constexpr (Var::is_sparse()) {
        auto& g = this->gradient();
        dense_.zero();
        const auto ids = test::to_host<space>(g.indices(), g.size());
        const auto values = test::to_host<space>(g.values(), g.size() * this->var_.cols());
        auto sums = dense_.to_host();
        for (std::size_t i = 0; i < ids.size(); ++i)
          for (std::size_t c = 0; c < this->var_.cols(); ++c)
            sums[static_cast<std::size_t>(ids[i]) * this->var_.cols() + c] += values[i * this->var_.cols() + c];
        test::copy_from_host<space>(dense_.data(), sums);
        return dense_.data();
      } else {
        return this->grad().data();
      }
    }
    px::Buffer<T, space> dense_;
  };

  Engine* engine_;
  Optimizer opt_;
  px::policy::Members<Entry> members_;
};

constexpr std::size_t kRows = 24, kDim = 3, kBatch = 12, kSteps = 4;

struct Model {
  std::vector<float> emb, w;
  std::vector<std::string> policies;  // of emb, w
  std::uint64_t emb_calls = 0, w_calls = 0;  // engine calls booked to each under its policy
};

/// embedding -> linear layer -> squared error against a target; `Emb` and
/// `W` are the variables' types, so their policies are the test's choice.
template <class Emb, class W, class Arch = px::arch::Hybrid>
Model train(px::Context& ctx) {
  Emb emb(ctx, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 3});
  W w(ctx, "w", {kDim, 1}, px::init::Glorot{4});
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.3f}, emb, w);
  const std::size_t n = static_cast<std::size_t>(ctx.size()), local = kBatch / n;
  const std::size_t first = static_cast<std::size_t>(ctx.rank()) * local;
  for (std::size_t s = 0; s < kSteps; ++s) {
    std::vector<px::index_t> ids(local);
    for (std::size_t i = 0; i < local; ++i) ids[i] = static_cast<px::index_t>(((first + i) * 5 + s * 3) % kRows);
    const auto rows = trainer.lookup(emb, ids);
    std::vector<float> d_rows(local * kDim);
    for (std::size_t i = 0; i < local; ++i) {
      float y = 0;
      for (std::size_t d = 0; d < kDim; ++d) y += rows.data[i * kDim + d] * w.value()[d];
      const float err = (y - std::sin(0.4f * static_cast<float>(first + i + s))) / static_cast<float>(local);
      for (std::size_t d = 0; d < kDim; ++d) {
        w.grad()[d] += err * rows.data[i * kDim + d];
        d_rows[i * kDim + d] = err * w.value()[d];
      }
    }
    emb.grad().add(ids, d_rows);
    trainer.step();
  }
  Model m{trainer.fetch(emb), trainer.fetch(w), {trainer.policy_of(emb), trainer.policy_of(w)}};
  m.emb_calls = trainer.stats().get("emb", m.policies[0]).calls;
  m.w_calls = trainer.stats().get("w", m.policies[1]).calls;
  return m;
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
  return worst;
}

using SparseEngineSum = px::Variable<px::Sparse, float, px::HostSpace, EngineSum>;
using DenseEngineSum = px::Variable<px::Dense, float, px::HostSpace, EngineSum>;
using SparseDefault = px::Variable<px::Sparse, float>;
using DenseDefault = px::Variable<px::Dense, float>;

}  // namespace

TEST_CASE("a policy defined outside parallax trains a model beside the built-in ones", "[policy][open]") {
  static_assert(px::policy::check<EngineSum, DenseEngineSum, px::engine::Mpi, px::optim::Sgd>());
  static_assert(px::policy::is_policy_for_v<EngineSum, SparseEngineSum, px::engine::Mpi, px::optim::Sgd>);

  px::Context single(MPI_COMM_SELF);
  // Both variables under the test's policy, and one of each beside a
  // built-in policy (the architecture's choice for the other).
  const Model base = train<SparseDefault, DenseDefault>(single);
  const Model both = train<SparseEngineSum, DenseEngineSum>(test::world());
  CHECK(both.policies == std::vector<std::string>{"EngineSum", "EngineSum"});
  const Model dense_only = train<SparseDefault, DenseEngineSum>(test::world());
  CHECK(dense_only.policies == std::vector<std::string>{"ShardedPS", "EngineSum"});
  const Model sparse_only = train<SparseEngineSum, DenseDefault>(test::world());
  CHECK(sparse_only.policies == std::vector<std::string>{"EngineSum", "RingAllReduce"});
  // N ranks equal one process under the built-in policies (SGD: a dense
  // update of untouched rows leaves them as the lazy one does).
  for (const Model* m : {&both, &dense_only, &sparse_only}) {
    CHECK(max_relative_error(m->emb, base.emb) <= 1e-5);
    CHECK(max_relative_error(m->w, base.w) <= 1e-5);
  }
  // The model moved.
  px::Context again(MPI_COMM_SELF);
  px::Variable<px::Sparse, float> fresh(again, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 3});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> idle(again, px::optim::Sgd{}, fresh);
  CHECK(max_relative_error(both.emb, idle.fetch(fresh)) > 1e-3);

  // Its calls are booked under its name and the variables': one
  // all-reduce a step each.
  CHECK(both.w_calls == kSteps);
  CHECK(both.emb_calls == kSteps);
}

// ---------------------------------------------------------------- contracts

namespace {

struct NoSynchronizer {
  static constexpr const char* name = "NoSynchronizer";
};
struct NotASynchronizer {
  static constexpr const char* name = "NotASynchronizer";
  template <class Engine, class Optimizer>
  using synchronizer = int;
};
/// Takes dense variables only: no lookup.
template <class Engine, class Optimizer>
class DenseOnlySynchronizer : public px::policy::Synchronizer<Engine> {
 public:
  DenseOnlySynchronizer(Engine&, const Optimizer&, const px::policy::Common&) {}
  template <class Var>
  px::policy::Member& add(Var);
  std::optional<std::string> problem() override { return std::nullopt; }
  bool has_gradient() const override { return false; }
  void finish_exchange(const px::policy::StepInfo&) override {}
  void update(const px::policy::StepInfo&) override {}
  void clear() override {}
};
struct DenseOnly {
  static constexpr const char* name = "DenseOnly";
  template <class Engine, class Optimizer>
  using synchronizer = DenseOnlySynchronizer<Engine, Optimizer>;
};
/// A tag that lists settings of its own: its synchronizer must take them
/// after the common ones, in the listed order.
struct WantsRingOptions {
  static constexpr const char* name = "WantsRingOptions";
  using options = std::tuple<px::policy::ring::Options>;
  template <class Engine, class Optimizer>
  using synchronizer = DenseOnlySynchronizer<Engine, Optimizer>;  // takes (Engine&, const Optimizer&, const Common&)
};
template <class Engine, class Optimizer>
class RingOptionsSynchronizer : public DenseOnlySynchronizer<Engine, Optimizer> {
 public:
  RingOptionsSynchronizer(Engine& e, const Optimizer& o, const px::policy::Common& c, const px::policy::ring::Options&)
      : DenseOnlySynchronizer<Engine, Optimizer>(e, o, c) {}
};
struct TakesRingOptions {
  static constexpr const char* name = "TakesRingOptions";
  using options = std::tuple<px::policy::ring::Options>;
  template <class Engine, class Optimizer>
  using synchronizer = RingOptionsSynchronizer<Engine, Optimizer>;
};

/// An engine that has only some of the contract.
struct HalfEngine {
  using space = px::HostSpace;
  int rank() const { return 0; }
  int size() const { return 1; }
};

struct ThreeSlots {
  static constexpr const char* name = "three";
  static constexpr int slots = 3;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
  template <class T>
  struct Rule {
    PARALLAX_HOST_DEVICE void operator()(T&, T, T&, T&) const {}
  };
  template <class T>
  Rule<T> rule(std::uint64_t) const {
    return {};
  }
};
struct NoRule {
  static constexpr const char* name = "norule";
  static constexpr int slots = 0;
  template <class T>
  T slot_initial(int) const {
    return T(0);
  }
};

}  // namespace

TEST_CASE("the contracts of policies, engines and optimizers are traits", "[policy][contracts]") {
  using M = px::engine::Mpi;
  using Sgd = px::optim::Sgd;
  STATIC_REQUIRE(px::policy::is_policy_for_v<px::ShardedPS, SparseDefault, M, Sgd>);
  STATIC_REQUIRE(px::policy::is_policy_for_v<px::ShardedPS, DenseDefault, M, Sgd>);
  STATIC_REQUIRE(px::policy::is_policy_for_v<px::RingAllReduce, SparseDefault, M, Sgd>);
  STATIC_REQUIRE(px::policy::is_policy_for_v<px::AllGatherv, SparseDefault, M, Sgd>);
  STATIC_REQUIRE_FALSE(px::policy::is_policy_for_v<NoSynchronizer, DenseDefault, M, Sgd>);
  STATIC_REQUIRE_FALSE(px::policy::is_policy_for_v<NotASynchronizer, DenseDefault, M, Sgd>);
  STATIC_REQUIRE(px::policy::is_policy_for_v<DenseOnly, DenseDefault, M, Sgd>);
  STATIC_REQUIRE_FALSE(px::policy::is_policy_for_v<DenseOnly, SparseDefault, M, Sgd>);  // no lookup()
  // A synchronizer receives the common settings and those its tag lists.
  STATIC_REQUIRE(px::policy::is_policy_for_v<TakesRingOptions, DenseDefault, M, Sgd>);
  STATIC_REQUIRE_FALSE(px::policy::is_policy_for_v<WantsRingOptions, DenseDefault, M, Sgd>);
  STATIC_REQUIRE(std::is_same_v<px::policy::own_options_t<DenseOnly>, std::tuple<>>);
  STATIC_REQUIRE(std::is_same_v<px::policy::own_options_t<px::AsyncPS>,
                                std::tuple<px::policy::async::Options, px::policy::sharded::Options>>);

  STATIC_REQUIRE(px::engine::is_engine_v<px::engine::Mpi>);
  STATIC_REQUIRE_FALSE(px::engine::is_engine_v<HalfEngine>);

  STATIC_REQUIRE(px::optim::is_optimizer_v<px::optim::Sgd>);
  STATIC_REQUIRE(px::optim::is_optimizer_v<px::optim::Momentum>);
  STATIC_REQUIRE(px::optim::is_optimizer_v<px::optim::Adagrad>);
  STATIC_REQUIRE(px::optim::is_optimizer_v<px::optim::Adam>);
  STATIC_REQUIRE_FALSE(px::optim::is_optimizer_v<ThreeSlots>);
  STATIC_REQUIRE_FALSE(px::optim::is_optimizer_v<NoRule>);
}
