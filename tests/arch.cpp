// arch.hpp: an architecture is a type; one defined here, in the test, with
// no edit to parallax, routes each variable to the policy it names, trains,
// and is found by name in a list of architectures as arch::all's are
// (docs/tutorial.md, "Adding an architecture").
#include "support.hpp"

#include <string>
#include <type_traits>
#include <vector>

namespace {

/// Dense variables sharded (as arch::PS), sparse ones all-gathered (as
/// arch::AllReduce): a mix no built-in architecture offers.
struct DenseSharded {
  static constexpr const char* name = "dense-sharded";
  static constexpr const char* about = "dense variables sharded, sparse ones all-gathered";
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, px::Sparse>, px::AllGatherv, px::ShardedPS>;
};
using Archs = px::arch::List<px::arch::Hybrid, px::arch::AllReduce, px::arch::PS, DenseSharded>;

constexpr std::size_t kRows = 24, kDim = 3, kBatch = 12;  // 12 ids split over 1, 2, 3 or 4 ranks

struct Trained {
  std::vector<float> emb0, w0;  // before the step
  std::vector<float> emb, w;
  std::string emb_policy, w_policy;
};

/// One step of a toy model (a looked-up row times a dense vector, squared
/// error) on this rank's share of a global batch of kBatch ids.
template <class Arch>
Trained train_one_step(px::Context& ctx) {
  px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 11});
  px::Variable<px::Dense, float> w(ctx, "w", {kDim}, px::init::Uniform{-0.5f, 0.5f, 12});
  const std::size_t n = static_cast<std::size_t>(ctx.size()), local = kBatch / n;
  const std::size_t first = static_cast<std::size_t>(ctx.rank()) * local;
  std::vector<px::index_t> ids(local);
  for (std::size_t i = 0; i < local; ++i) ids[i] = static_cast<px::index_t>(((first + i) * 5) % kRows);
  px::Trainer<Arch, px::optim::Sgd> t(ctx, px::optim::Sgd{0.5}, emb, w);
  const auto emb0 = t.fetch(emb), w0 = t.fetch(w);
  const auto rows = test::to_host(t.lookup(emb, ids));
  const auto W = w.value().to_host();
  auto dW = w.grad().to_host();
  std::vector<float> dh(local * kDim, 0.f);
  for (std::size_t i = 0; i < local; ++i) {
    float out = 0;
    for (std::size_t d = 0; d < kDim; ++d) out += rows[i * kDim + d] * W[d];
    const float g = (out - 1.0f) / static_cast<float>(local);
    for (std::size_t d = 0; d < kDim; ++d) {
      dW[d] += rows[i * kDim + d] * g;
      dh[i * kDim + d] = W[d] * g;
    }
  }
  test::copy_from_host<px::HostSpace>(w.grad().data(), dW);
  emb.grad().add(ids, dh);
  t.step();
  return Trained{emb0, w0, t.fetch(emb), t.fetch(w), t.policy_of(emb), t.policy_of(w)};
}

}  // namespace

TEST_CASE("an architecture defined outside parallax routes, trains and is found by name", "[arch]") {
  auto& ctx = test::world();
  const Trained mine = train_one_step<DenseSharded>(ctx);
  CHECK(mine.w_policy == "ShardedPS");
  CHECK(mine.emb_policy == "AllGatherv");
  // After one step each variable is what the built-in architecture that
  // gives it the same policy makes of it, bit for bit.
  const Trained ps = train_one_step<px::arch::PS>(ctx), allreduce = train_one_step<px::arch::AllReduce>(ctx);
  CHECK(mine.w == ps.w);
  CHECK(mine.emb == allreduce.emb);
  CHECK(mine.w != mine.w0);  // the step changed both, so the comparisons above have something to see
  CHECK(mine.emb != mine.emb0);
}

TEST_CASE("a list with a test-only architecture is read like arch::all", "[arch]") {
  STATIC_REQUIRE(Archs::size == px::arch::all::size + 1);
  CHECK(px::arch::names(Archs{}) == "hybrid, allreduce, ps or dense-sharded");
  CHECK(px::arch::has(Archs{}, "dense-sharded"));
  CHECK_FALSE(px::arch::has(px::arch::all{}, "dense-sharded"));
  const auto key = [](auto a) { return std::string_view(decltype(a)::name); };
  CHECK(px::arch::pick(Archs{}, "dense-sharded", key, [](auto a) { return std::is_same_v<decltype(a), DenseSharded>; },
                       [] { return std::string("unknown"); }));
  CHECK_THAT(test::error_of([&] { px::arch::pick(Archs{}, "horovod", key, [](auto) { return 0; },
                                                 [] { return std::string("no architecture 'horovod'"); }); }),
             Catch::Contains("no architecture 'horovod'"));
}
