// trainer.hpp, lookup() of bags and bag_gradients(): N ranks training on
// pooled multi-hot lookups reach the model one process reaches with plain
// lookups pooled by hand, for every combiner and every architecture whose
// policy pools, and reruns are bit-identical. Tables stored in 16 bits pool
// at their owners too: bit for bit as by hand with exchanges in float, and
// within 16-bit rounding with compressed ones.
#include "support.hpp"

#include <algorithm>
#include <cmath>

namespace {

constexpr std::size_t kRows = 30, kDim = 4, kBags = 12, kSteps = 3;

// Bag b of step s: 0 to 4 ids (empty bags included), repeats allowed.
std::size_t bag_length(std::size_t s, std::size_t b) { return (b + s) % 5; }
px::index_t bag_id(std::size_t s, std::size_t b, std::size_t k) {
  return static_cast<px::index_t>((b * 5 + k * 7 + s * 3) % 29);
}
float bag_weight(std::size_t b, std::size_t k) { return 0.5f + 0.25f * static_cast<float>((b + k) % 4); }
float target(std::size_t s, std::size_t b, std::size_t d) { return std::sin(0.4f * static_cast<float>(b + 3 * s + 7 * d)); }

/// Trains a table whose pooled bags should match targets (squared error,
/// mean over the local batch) for kSteps steps on this rank's share of each
/// global batch of kBags bags: with lookup() of bags when `pooled`, else with
/// plain lookups pooled here, by hand.
template <class Arch, class Stored = float>
std::vector<float> train(px::Context& ctx, px::Combiner combiner, bool pooled, px::Pooling where,
                         px::Compression compress = px::Compression::none) {
  px::Variable<px::Sparse, Stored> emb(ctx, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 11});
  px::TrainerOptions o;
  o.compress = compress;
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.5f}, emb);
  const std::size_t n = static_cast<std::size_t>(ctx.size()), r = static_cast<std::size_t>(ctx.rank());
  const std::size_t local = kBags / n, first = r * local;
  for (std::size_t s = 0; s < kSteps; ++s) {
    std::vector<px::index_t> offsets{0}, ids;
    std::vector<float> weights;
    for (std::size_t b = first; b < first + local; ++b) {
      for (std::size_t k = 0; k < bag_length(s, b); ++k) {
        ids.push_back(bag_id(s, b, k));
        weights.push_back(bag_weight(b, k));
      }
      offsets.push_back(static_cast<px::index_t>(ids.size()));
    }
    const bool weighted = combiner == px::Combiner::weighted_sum;
    std::vector<float> pooled_rows(local * kDim, 0.f);
    std::vector<float> plain_rows;
    if (pooled) {
      const std::vector<float> no_weights;  // a Bags request points at its arrays: they outlive it
      px::Bags<decltype(emb)> request(emb, offsets, ids, combiner, weighted ? weights : no_weights);
      request.pooled_at(where);
      pooled_rows = test::to_host(trainer.lookup({request}).front());
    } else {
      plain_rows = test::to_host(trainer.lookup(emb, ids));
      for (std::size_t i = 0; i < local; ++i) {
        const auto from = static_cast<std::size_t>(offsets[i]), to = static_cast<std::size_t>(offsets[i + 1]);
        for (std::size_t j = from; j < to; ++j)
          for (std::size_t d = 0; d < kDim; ++d)
            pooled_rows[i * kDim + d] += (weighted ? weights[j] : 1.f) * plain_rows[j * kDim + d];
        if (combiner == px::Combiner::mean && to > from)
          for (std::size_t d = 0; d < kDim; ++d) pooled_rows[i * kDim + d] /= static_cast<float>(to - from);
      }
    }
    std::vector<float> g(local * kDim);
    for (std::size_t i = 0; i < local; ++i)
      for (std::size_t d = 0; d < kDim; ++d)
        g[i * kDim + d] = (pooled_rows[i * kDim + d] - target(s, first + i, d)) / static_cast<float>(local);
    if (pooled) {
      trainer.bag_gradients({px::BagGradient<decltype(emb)>(emb, g)});
    } else {  // each id's row gets its bag's gradient (times its weight; over the length for mean)
      std::vector<float> dh(ids.size() * kDim);
      for (std::size_t i = 0; i < local; ++i) {
        const auto from = static_cast<std::size_t>(offsets[i]), to = static_cast<std::size_t>(offsets[i + 1]);
        for (std::size_t j = from; j < to; ++j) {
          const float scale = combiner == px::Combiner::mean ? 1.f / static_cast<float>(to - from)
                              : weighted                    ? weights[j]
                                                            : 1.f;
          for (std::size_t d = 0; d < kDim; ++d) dh[j * kDim + d] = scale * g[i * kDim + d];
        }
      }
      emb.grad().add(ids, dh);
    }
    trainer.step();
  }
  return trainer.fetch(emb);
}

double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
  return worst;
}

template <class Arch>
void check_arch(px::Pooling where) {
  px::Context single(MPI_COMM_SELF);
  for (auto combiner : {px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum}) {
    const auto want = train<Arch>(single, combiner, false, where);
    const auto initial = [&] {
      px::Variable<px::Sparse, float> emb(single, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 11});
      px::Trainer<Arch, px::optim::Sgd> t(single, px::optim::Sgd{0.5f}, emb);
      return t.fetch(emb);
    }();
    const auto got = train<Arch>(test::world(), combiner, true, where);
    const auto again = train<Arch>(test::world(), combiner, true, where);
    INFO("architecture " << Arch::name << ", combiner " << px::to_string(combiner) << ", pooling "
                         << px::to_string(where));
    CHECK(max_relative_error(got, want) <= 1e-5);
    CHECK(max_relative_error(want, initial) > 1e-3);  // the table moved
    CHECK(got == again);                              // bit-identical reruns
  }
}

}  // namespace

TEST_CASE("bags looked up through the trainer train as plain lookups pooled by hand, at any rank count",
          "[trainer][bags]") {
  check_arch<px::arch::Hybrid>(px::Pooling::owner);
  check_arch<px::arch::Hybrid>(px::Pooling::local);
  check_arch<px::arch::Hybrid>(px::Pooling::automatic);
  check_arch<px::arch::PS>(px::Pooling::owner);
  check_arch<px::arch::AllReduce>(px::Pooling::automatic);
}

namespace {

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

}  // namespace

// The owners widen their 16-bit rows and pool them in float. A sum of a
// few rows of 8 (bf16) or 11 (fp16) significant bits, times weights of 3,
// is exact in float whatever its grouping while the values lie within 8
// binades of each other (24 bits hold 11 + 3 + 2 of carries; as this
// data's do), so pooling by owner
// gives one process's hand-pooled rows bit for bit, and the updates
// (rounded to 16 bits) follow. Compressed, each owner's partial sum and each bag's
// gradient row cross in 16 bits: within their rounding of the float run.
TEMPLATE_TEST_CASE("bags of a 16-bit table pool at the owners as one process pools them by hand",
                   "[trainer][bags][half]", px::bf16, px::fp16) {
  using Stored = TestType;
  px::Context single(MPI_COMM_SELF);
  for (auto combiner : {px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum}) {
    INFO("combiner " << px::to_string(combiner));
    const auto want = train<px::arch::Hybrid, Stored>(single, combiner, false, px::Pooling::owner);
    const auto got = train<px::arch::Hybrid, Stored>(test::world(), combiner, true, px::Pooling::owner);
    CHECK(got == want);
    CHECK(std::all_of(got.begin(), got.end(), [](float x) { return static_cast<float>(Stored(x)) == x; }));
    for (auto compress : {px::Compression::bf16, px::Compression::fp16}) {
      INFO("compress " << (compress == px::Compression::bf16 ? "bf16" : "fp16"));
      const auto packed = train<px::arch::Hybrid, Stored>(test::world(), combiner, true, px::Pooling::owner, compress);
      // A partial sum (|x| < 2.5) rounded by 2^-9 (bf16) relative moves the
      // loss gradient by that over the local batch; SGD at 0.5 over three
      // steps, a few bags per row.
      CHECK(max_abs_difference(packed, want) <= 0.03);
      CHECK(max_abs_difference(packed, want) > 0);  // the partial sums were rounded
      CHECK(packed == train<px::arch::Hybrid, Stored>(test::world(), combiner, true, px::Pooling::owner, compress));
    }
  }
}
