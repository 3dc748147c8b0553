// policy/async_ps/bags.hpp: bags under AsyncPS (arch::Async, AsyncHybrid).
// At one rank they train bit for bit as the synchronous trainer's bags do;
// at 1-4 ranks the pooled rows are one process's pooling of the table by
// hand, every pooled gradient is applied exactly once whatever the
// interleaving (SGD on exact gradients: the table ends at its initial value
// minus the sum of every rank's expanded rows), and a bad request or
// gradient throws on the rank that made it only.
#include "support.hpp"

#include <parallax/policy/async_ps/bags.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

namespace {

using Table = px::Variable<px::Sparse, float>;
constexpr std::size_t R = 23, C = 3, kBags = 6, kSteps = 4;

// Rank r's bag b at step s: 0 to 5 ids, repeats inside a bag, rows shared
// between bags and ranks.
std::vector<px::index_t> bag_of(int r, std::size_t s, std::size_t b) {
  const std::size_t n = (b + s + static_cast<std::size_t>(r)) % 6;
  std::vector<px::index_t> ids;
  for (std::size_t k = 0; k < n; ++k)
    ids.push_back(static_cast<px::index_t>((b * 5 + (k % 3) * 7 + s * 3 + static_cast<std::size_t>(r) * 2) % R));
  return ids;
}
float weight_of(std::size_t b, std::size_t k) { return 0.5f * static_cast<float>(1 + (b + k) % 4); }
// Integers (times the bag's length for mean, so that each id's share is one).
float grad_of(int r, std::size_t s, std::size_t b, std::size_t c) {
  return static_cast<float>(1 + (static_cast<std::size_t>(r) + s + b + c) % 3);
}

struct Batch {
  std::vector<px::index_t> offsets{0}, ids;
  std::vector<float> weights, grads;
};
Batch batch_of(int r, std::size_t s, px::Combiner combiner) {
  Batch out;
  for (std::size_t b = 0; b < kBags; ++b) {
    const auto ids = bag_of(r, s, b);
    for (std::size_t k = 0; k < ids.size(); ++k) {
      out.ids.push_back(ids[k]);
      if (combiner == px::Combiner::weighted_sum) out.weights.push_back(weight_of(b, k));
    }
    out.offsets.push_back(static_cast<px::index_t>(out.ids.size()));
    const float length = combiner == px::Combiner::mean ? static_cast<float>(std::max<std::size_t>(ids.size(), 1)) : 1.f;
    for (std::size_t c = 0; c < C; ++c) out.grads.push_back(length * grad_of(r, s, b, c));
  }
  return out;
}

/// Batch `q`'s bags pooled by hand from `table` (R x C).
std::vector<float> by_hand(const Batch& q, const std::vector<float>& table, px::Combiner combiner) {
  std::vector<float> out(kBags * C, 0.f);
  for (std::size_t b = 0; b < kBags; ++b) {
    const auto from = static_cast<std::size_t>(q.offsets[b]), to = static_cast<std::size_t>(q.offsets[b + 1]);
    for (std::size_t j = from; j < to; ++j)
      for (std::size_t c = 0; c < C; ++c)
        out[b * C + c] += (q.weights.empty() ? 1.f : q.weights[j]) * table[static_cast<std::size_t>(q.ids[j]) * C + c];
    if (combiner == px::Combiner::mean && to > from)
      for (std::size_t c = 0; c < C; ++c) out[b * C + c] /= static_cast<float>(to - from);
  }
  return out;
}

px::TrainerOptions options(px::AsyncOptions::Route route = px::AsyncOptions::Route::automatic) {
  px::TrainerOptions o;
  o.async.route = route;
  o.reduction = px::Reduction::sum;
  o.async.staleness = 1;
  o.engine.timeout = std::chrono::seconds(60);
  return o;
}

/// kSteps steps of this rank's bags at learning rate `lr` on a table of
/// uniform random values, or of zeros where `zeros`; checks every lookup's
/// pooled rows against the initial table pooled by hand where
/// `check_rows` (lr 0). Returns the table.
template <class Arch, class Stored = float>
std::vector<float> train(px::Context& ctx, px::Combiner combiner, float lr, bool check_rows, bool zeros = false,
                         px::AsyncOptions::Route route = px::AsyncOptions::Route::automatic) {
  px::Variable<px::Sparse, Stored> emb = zeros ? px::Variable<px::Sparse, Stored>(ctx, "emb", {R, C})
                                               : px::Variable<px::Sparse, Stored>(ctx, "emb", {R, C},
                                                                                  px::init::Uniform{-0.5f, 0.5f, 5});
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, options(route), px::optim::Sgd{lr}, emb);
  const std::vector<float> initial = trainer.fetch(emb);
  for (std::size_t s = 0; s < kSteps; ++s) {
    const Batch q = batch_of(ctx.rank(), s, combiner);
    const px::Bags<decltype(emb)> request(emb, q.offsets, q.ids, combiner, q.weights);
    const auto pooled = test::to_host(trainer.lookup({request}).front());
    REQUIRE(pooled.size() == kBags * C);
    if (check_rows) {  // lr 0: the table stays as it started
      const auto want = by_hand(q, initial, combiner);
      double worst = 0;  // the same sums in the same order: equal but for contractions into FMAs
      for (std::size_t e = 0; e < want.size(); ++e)
        worst = std::max(worst, std::abs(double(pooled[e]) - want[e]) / std::max(1e-3, std::abs(double(want[e]))));
      CHECK(worst <= 1e-6);
    }
    trainer.bag_gradients({px::BagGradient<decltype(emb)>(emb, q.grads)});
    trainer.step();
  }
  return trainer.fetch(emb);
}

/// The table of zeros after every rank's kSteps steps at lr 1: minus each
/// id's share of its bag's gradient (integers, halves: exact in any order).
std::vector<float> expected(int ranks, px::Combiner combiner) {
  std::vector<double> t(R * C, 0.0);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t s = 0; s < kSteps; ++s) {
      const Batch q = batch_of(r, s, combiner);
      for (std::size_t b = 0; b < kBags; ++b) {
        const auto from = static_cast<std::size_t>(q.offsets[b]), to = static_cast<std::size_t>(q.offsets[b + 1]);
        for (std::size_t j = from; j < to; ++j)
          for (std::size_t c = 0; c < C; ++c) {
            const double g = q.grads[b * C + c] / (combiner == px::Combiner::mean ? double(to - from) : 1.0);
            t[static_cast<std::size_t>(q.ids[j]) * C + c] -= (q.weights.empty() ? 1.0 : q.weights[j]) * g;
          }
      }
    }
  return std::vector<float>(t.begin(), t.end());
}

}  // namespace

TEST_CASE("a request's ids are read once each", "[async][bags]") {
  px::policy::async::DistinctIds d;
  const std::vector<px::index_t> ids{5, 2, 5, 7, 2, 2};
  d.assign(ids.data(), ids.size(), 4);
  CHECK(d.distinct == std::vector<px::index_t>{2, 5, 7});
  CHECK(d.at == std::vector<px::index_t>{4, 0, 4, 8, 0, 0});
  d.assign(ids.data(), 0, 4);
  CHECK(d.distinct.empty());
}

TEST_CASE("AsyncPS bags at one rank train as the synchronous trainer's", "[async][bags]") {
  px::Context single(MPI_COMM_SELF);
  for (auto combiner : {px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum}) {
    INFO("combiner " << px::to_string(combiner));
    const auto want = train<px::arch::Hybrid>(single, combiner, 0.25f, false);
    CHECK(train<px::arch::Async>(single, combiner, 0.25f, false) == want);
    CHECK(train<px::arch::AsyncHybrid>(single, combiner, 0.25f, false) == want);
  }
}

TEMPLATE_TEST_CASE("AsyncPS bags of a 16-bit table at one rank train as the synchronous trainer's",
                   "[async][bags][half]", px::bf16, px::fp16) {
  px::Context single(MPI_COMM_SELF);
  for (auto combiner : {px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum}) {
    INFO("combiner " << px::to_string(combiner));
    CHECK(train<px::arch::Async, TestType>(single, combiner, 0.25f, false) ==
          train<px::arch::Hybrid, TestType>(single, combiner, 0.25f, false));
  }
}

TEST_CASE("AsyncPS pools bags as one process pools the table by hand, and applies every gradient once",
          "[async][bags]") {
  auto& ctx = test::world();
  for (auto combiner : {px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum}) {
    INFO("combiner " << px::to_string(combiner) << ", " << ctx.size() << " ranks");
    train<px::arch::Async>(ctx, combiner, 0.f, true);
    train<px::arch::AsyncHybrid>(ctx, combiner, 0.f, true);
    CHECK(train<px::arch::Async>(ctx, combiner, 1.f, false, true) == expected(ctx.size(), combiner));
    CHECK(train<px::arch::AsyncHybrid>(ctx, combiner, 1.f, false, true) == expected(ctx.size(), combiner));
  }
}

// The route across hosts (RMA gets of each owner's distinct rows), forced on
// one machine; one combiner, as the route is slow on an oversubscribed one.
TEST_CASE("AsyncPS bags through RMA pool as by hand and apply every gradient once", "[async][bags][rma]") {
  auto& ctx = test::world();
  const auto rma = px::AsyncOptions::Route::rma;
  const auto combiner = px::Combiner::weighted_sum;
  train<px::arch::Async>(ctx, combiner, 0.f, true, false, rma);
  CHECK(train<px::arch::Async>(ctx, combiner, 1.f, false, true, rma) == expected(ctx.size(), combiner));
}

TEST_CASE("AsyncPS: a bad bag request or gradient throws on the rank that made it", "[async][bags][errors]") {
  auto& ctx = test::world();
  Table emb(ctx, "emb", {R, C});
  px::Trainer<px::arch::Async, px::optim::Sgd> trainer(ctx, options(), px::optim::Sgd{1.f}, emb);
  const std::vector<float> grads(C, 1.f);
  const std::string rank = "rank " + std::to_string(ctx.rank()) + ": ";
  CHECK(test::error_of([&] { trainer.bag_gradients({px::BagGradient<Table>(emb, grads)}); }) ==
        rank + "gradient of the bags of variable 'emb': no lookup of its bags awaits a gradient this step");
  if (ctx.rank() == ctx.size() - 1) {  // the others go on
    const std::vector<px::index_t> offsets{0, 2}, ids{1, static_cast<px::index_t>(R)};
    CHECK(test::error_of([&] { trainer.lookup({px::Bags<Table>(emb, offsets, ids)}); }) ==
          rank + "bags of variable 'emb': id 23 (entry 1, bag 0) is outside [0, 23)");
  }
  const std::vector<px::index_t> offsets{0, 1}, ids{2};
  trainer.lookup({px::Bags<Table>(emb, offsets, ids)});
  CHECK(test::error_of([&] { trainer.bag_gradients({px::BagGradient<Table>(emb, std::vector<float>(2 * C))}); }) ==
        rank + "gradient of the bags of variable 'emb' has 2 x 3 values; the lookup pooled 1 bags of 3 columns");
  trainer.bag_gradients({px::BagGradient<Table>(emb, grads)});
  trainer.step();
  CHECK(trainer.fetch(emb)[2 * C] <= 0.5f - static_cast<float>(ctx.size()) + 1e-6f);  // Uniform{-0.5, 0.5}
}
