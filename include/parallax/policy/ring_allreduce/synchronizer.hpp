#pragma once
/// @file
/// RingAllReduce's part of a trainer: dense variables replicated on every
/// rank, their gradients laid end to end in one arena and summed by tensor
/// fusion; sparse variables replicated too, their gradients scattered into a
/// dense buffer and summed whole.

#include <parallax/detail/algorithms.hpp>
#include <parallax/detail/timeline.hpp>
#include <parallax/error.hpp>
#include <parallax/options.hpp>
#include <parallax/policy/members.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/ring_allreduce/fusion.hpp>
#include <parallax/policy/ring_allreduce/reducer.hpp>
#include <parallax/space.hpp>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace parallax::policy {

template <class Engine, class Optimizer>
class RingSynchronizer final : public Synchronizer<Engine> {
 public:
  using space = engine::space_of_t<Engine>;

  RingSynchronizer(Engine& engine, const Optimizer& opt, const Common& common, const ring::Options& ring)
      : engine_(&engine), opt_(&opt), reducer_(engine, ring), update_when_ready_(common.update_when_ready),
        compress_(common.compress) {}
  RingSynchronizer(const RingSynchronizer&) = delete;
  RingSynchronizer& operator=(const RingSynchronizer&) = delete;
  /// Gives every dense variable its own gradient back, out of the arena.
  ~RingSynchronizer() override {
    for (Dense* d : dense_) d->give_back();
  }

  template <class Var>
  Member& add(Var var) {
    if constexpr (Var::is_sparse()) return sparse_.template add<SparseOf<Var>>(std::move(var), *engine_, *opt_);
    else return dense_.template add<DenseOf<Var>>(std::move(var), *engine_, *opt_);
  }

  /// Moves the dense gradients into one arena, end to end in registration
  /// order (each aligned for its elements), as PyTorch DDP's
  /// gradient_as_bucket_view does: the ring then finds a bucket's tensors
  /// adjacent and sends them in place, with no packing. The variables'
  /// grad() buffers borrow their slices; the buckets are planned here.
  void prepare() override {
    std::vector<TensorRef> tensors;
    std::vector<std::size_t> offsets;
    std::size_t bytes = 0;
    for (Dense* d : dense_) {
      const TensorRef t = d->gradient();
      const std::size_t align = size_of(t.type);
      bytes = (bytes + align - 1) / align * align;
      offsets.push_back(bytes);
      bytes += t.count * align;
      tensors.push_back(t);
    }
    arena_.resize_discard(bytes);
    for (std::size_t k = 0; k < dense_.size(); ++k) {
      tensors[k].data = arena_.data() + offsets[k];
      dense_[k]->move_gradient(tensors[k].data);
    }
    fusion_ = std::make_unique<FusedAllReducer<Engine>>(reducer_, std::move(tensors),
                                                        FusedAllReducer<Engine>::Order::back, compress_);
    ready_.assign(dense_.size(), false);
    waiting_.resize(fusion_->buckets().size());
    clear_ready();
  }

  /// A bucket starts, on the communication thread, once all its gradients
  /// are ready and every bucket before it has started (the buckets are cut
  /// from the last variable backwards, the order a backward pass finishes
  /// them in), so every rank starts the same buckets in the same order.
  /// Where the step checks for non-finite gradients, the work looks at the
  /// bucket's gradients there first, before they are summed (the step then
  /// reads the verdict instead of the sums). With update_when_ready, the
  /// optimizer is applied to the bucket's variables right after its sum,
  /// there, and their gradients are zeroed (update() and clear() skip them):
  /// the same arithmetic on the same sums as update() would do, bit for bit.
  void ready(const Member& variable, const StepInfo& info, Background& background) override {
    const std::size_t k = dense_.find(variable);
    if (k == dense_.size() || ready_[k]) return;
    ready_[k] = true;
    --waiting_[fusion_->bucket_of(k)];
    while (started_ < waiting_.size() && waiting_[started_] == 0) {
      const std::size_t b = started_++;
      if (!update_when_ready_) {
        background.post([this, b, check = info.check_finite] {
          if (check)
            for (std::size_t i = 0; i < dense_.size(); ++i)
              if (fusion_->bucket_of(i) == b) dense_[i]->check_finite_now();
          fusion_->run(b);
        });
        continue;
      }
      updated_ = started_;
      background.post([this, b, info] {
        fusion_->run(b);
        const auto span = detail::Span::named("parallax", "update bucket ", b);
        for (std::size_t i = 0; i < dense_.size(); ++i)
          if (fusion_->bucket_of(i) == b) dense_[i]->apply(info);
        engine_->exec().synchronize();  // the updates read the gradients before they are zeroed
        for (std::size_t i = 0; i < dense_.size(); ++i)
          if (fusion_->bucket_of(i) == b) dense_[i]->zero_gradient();
      });
    }
  }
  bool updated_early() const override { return updated_ > 0; }

  std::optional<std::string> problem() override {
    for (Sparse* s : sparse_)
      if (auto p = s->problem()) return p;
    return std::nullopt;
  }
  bool has_gradient() const override {
    for (const Dense* d : dense_)
      if (d->has_gradient()) return true;
    for (const Sparse* s : sparse_)
      if (s->has_gradient()) return true;
    return false;
  }
  /// The buckets ready() did not start.
  void start_exchange(const StepInfo&) override {
    while (started_ < waiting_.size()) fusion_->run(started_++);
  }
  void finish_exchange(const StepInfo&) override {
    for (Sparse* s : sparse_) s->sum(reducer_);
  }
  /// Every rank holds the same sums: rank 0 counts them.
  std::optional<double> gradient_square_sum() override {
    double sum = 0;
    if (engine_->rank() != 0) return sum;
    for (Dense* d : dense_) sum += d->square_sum();
    for (Sparse* s : sparse_) sum += s->square_sum();
    return sum;
  }
  /// With a helper (StepInfo::helper), the dense variables are updated and
  /// their gradients zeroed on two threads: the helper takes the first
  /// variables, 1 / (the caller's OpenMP threads + 1) of the bytes, the
  /// caller the rest, each variable's update whole on one of them.
  void update(const StepInfo& info) override {
    std::vector<std::size_t> todo;
    for (std::size_t i = 0; i < dense_.size(); ++i)
      if (fusion_->bucket_of(i) >= updated_) todo.push_back(i);
    if constexpr (std::is_same_v<space, HostSpace>) {
      if (info.helper != nullptr && todo.size() > 1) {
        std::size_t total = 0;
        for (std::size_t i : todo) total += dense_[i]->gradient_bytes();
        const std::size_t share = total / (static_cast<std::size_t>(omp_get_max_threads()) + 1);
        std::size_t cut = 0;
        for (std::size_t taken = 0; cut + 1 < todo.size() && taken < share; ++cut)
          taken += dense_[todo[cut]]->gradient_bytes();
        auto update_and_zero = [this, &info, &todo](std::size_t from, std::size_t to) {
          const auto span = detail::Span::named("parallax", "update variables ", from, "-", to);
          for (std::size_t j = from; j < to; ++j) {
            dense_[todo[j]]->apply(info);
            dense_[todo[j]]->zero_gradient();
          }
        };
        info.helper->share([&] { update_and_zero(0, cut); }, [&] { update_and_zero(cut, todo.size()); });
        zeroed_ = true;
        todo.clear();
      }
    }
    for (std::size_t i : todo) dense_[i]->apply(info);
    for (Sparse* s : sparse_) s->apply(info);
    engine_->exec().synchronize();
  }
  void clear() override {
    for (std::size_t i = 0; i < dense_.size(); ++i)
      dense_[i]->clear(/*zero=*/!zeroed_ && fusion_->bucket_of(i) >= updated_);
    for (Sparse* s : sparse_) s->clear();
    clear_ready();
  }

  template <class V>
  std::vector<Rows<typename V::value_type, space>> lookup(const Lookup<V>* batch, std::size_t n) {
    return lookup_replicas<V, space>(*engine_, batch, n, [&](V& var) -> SparseOf<V>& { return sparse_of(var); });
  }
  /// Trainer::prefetch: replicas have nothing to route; the ids are kept
  /// and the rows gathered by finish_lookup().
  template <class V>
  void start_lookup(const Lookup<V>* batch, std::size_t n, Background&) {
    ahead_.start(batch, n);
  }
  template <class V>
  std::vector<Rows<typename V::value_type, space>> finish_lookup() {
    return ahead_.template finish<V>(*engine_, [&](V& var) -> SparseOf<V>& { return sparse_of(var); });
  }
  void cancel_lookup() override { ahead_.cancel(); }

  /// The fusion plan (its buckets), for tests and benchmarks.
  const FusedAllReducer<Engine>& fusion() const noexcept { return *fusion_; }

 private:
  void clear_ready() {
    std::fill(ready_.begin(), ready_.end(), false);
    std::fill(waiting_.begin(), waiting_.end(), std::size_t{0});
    for (std::size_t k = 0; k < dense_.size(); ++k) ++waiting_[fusion_->bucket_of(k)];
    started_ = 0;
    updated_ = 0;
    zeroed_ = false;
  }

  /// What the synchronizer does with a dense member, whatever its type.
  class Dense {
   public:
    virtual ~Dense() = default;
    virtual TensorRef gradient() = 0;
    virtual void move_gradient(void* at) = 0;
    virtual void give_back() noexcept = 0;
    virtual bool has_gradient() const = 0;
    virtual double square_sum() = 0;
    virtual void apply(const StepInfo&) = 0;
    virtual void zero_gradient() = 0;
    virtual std::size_t gradient_bytes() const = 0;
    /// Looks for a non-finite value in the gradient now (before its sum) and
    /// keeps the verdict for non_finite_gradient() until clear().
    virtual void check_finite_now() = 0;
    /// Forgets the step's gradient; `zero`: false where zero_gradient() did.
    virtual void clear(bool zero) = 0;
  };
  template <class Var>
  class DenseOf final : public DenseReplica<Var, Engine, Optimizer>, public Dense {
    using Base = DenseReplica<Var, Engine, Optimizer>;
    using T = typename Var::value_type;

   public:
    DenseOf(Var var, Engine& engine, const Optimizer& opt) : Base(std::move(var), engine, opt, RingAllReduce::name) {}
    TensorRef gradient() override {
      auto& g = this->grad();
      return TensorRef{g.data(), g.size(), data_type_of_v<T>, this->var_.name().c_str()};
    }
    void move_gradient(void* at) override {
      auto& g = this->grad();
      T* to = static_cast<T*>(at);
      space_traits<space>::copy(to, g.data(), g.bytes());
      g = Buffer<T, space>::borrow(to, g.size());
    }
    void give_back() noexcept override {
      auto& g = this->grad();
      if (g.owned()) return;
      try {
        Buffer<T, space> own(g.size());
        space_traits<space>::copy(own.data(), g.data(), g.bytes());
        g = std::move(own);
      } catch (...) {
        g = Buffer<T, space>();  // out of memory: the next step's grad() starts empty
      }
    }
    bool has_gradient() const override { return Base::has_gradient(); }
    double square_sum() override {
      return detail::sum_of_squares(this->engine().exec(), this->grad().data(), this->grad().size());
    }
    void apply(const StepInfo& info) override { Base::apply(info); }
    void zero_gradient() override { this->grad().zero(); }
    std::size_t gradient_bytes() const override { return this->var_.state().grad.bytes(); }
    void check_finite_now() override {
      verdict_ = Base::non_finite_gradient();
      checked_ = true;
    }
    std::optional<std::string> non_finite_gradient() override {
      return checked_ ? verdict_ : Base::non_finite_gradient();
    }
    void clear(bool zero) override {
      checked_ = false;
      verdict_.reset();
      Base::clear(zero);
    }

   private:
    bool checked_ = false;                  // check_finite_now() ran this step
    std::optional<std::string> verdict_;    // what it found
  };

  /// What the synchronizer does with a sparse member, whatever its type.
  class Sparse : public SparseReplicaKind {
   public:
    virtual void sum(RingAllReducer<Engine>& reducer) = 0;
  };
  /// The gradient is scattered into a dense buffer and all-reduced whole
  /// (the baseline a dense-only framework gives a sparse variable); the
  /// update is dense too.
  template <class Var>
  class SparseOf final : public SparseReplicaAs<Var, Engine, Optimizer, Sparse> {
    using Replica = SparseReplicaAs<Var, Engine, Optimizer, Sparse>;
    using T = typename Var::value_type;

   public:
    SparseOf(Var var, Engine& engine, const Optimizer& opt)
        : Replica(std::move(var), engine, opt, RingAllReduce::name), dense_grad_(this->value_.size()) {}
    void sum(RingAllReducer<Engine>& reducer) override {
      auto scope = this->engine_->stats().scope(this->var_.name(), RingAllReduce::name);
      auto& ex = this->ex();
      auto& g = this->gradient();
      g.coalesce(ex);
      dense_grad_.zero();
      const std::size_t cols = this->var_.cols();
      for_each_rows(ex, g.size(), cols, detail::ScatterAddRows<T>{dense_grad_.data(), g.indices(), g.values(), cols});
      ex.synchronize();
      reducer.allreduce(dense_grad_.data(), dense_grad_.size());
    }
    double square_sum() override { return detail::sum_of_squares(this->ex(), dense_grad_.data(), dense_grad_.size()); }
    void apply(const StepInfo& info) override { this->apply_dense(info, dense_grad_.data()); }

   private:
    Buffer<T, space> dense_grad_;
  };

  template <class V>
  SparseOf<V>& sparse_of(V& var) {
    return sparse_.template of<SparseOf<V>>(var, RingAllReduce::name);
  }

  Engine* engine_;
  const Optimizer* opt_;  // the trainer's: its learning rate changes between steps
  RingAllReducer<Engine> reducer_;
  Buffer<std::byte, space> arena_;  // the dense gradients; outlives the members that borrow it
  Members<Dense> dense_;  // in registration order (the fusion plan's)
  Members<Sparse> sparse_;
  std::unique_ptr<FusedAllReducer<Engine>> fusion_;
  std::vector<bool> ready_;            // per dense member: ready() this step
  std::vector<std::size_t> waiting_;   // per bucket: gradients not ready yet
  std::size_t started_ = 0;            // buckets started this step (in order)
  std::size_t updated_ = 0;            // buckets [0, updated_) are updated by the work ready() posted
  bool zeroed_ = false;                // update() zeroed the gradients it updated (with a helper)
  bool update_when_ready_;             // Common::update_when_ready
  Compression compress_;  // Common::compress: dense float buckets on the wire in 16 bits
  ReplicaLookupsAhead<space> ahead_;   // start_lookup() to finish_lookup()
};

}  // namespace parallax::policy
