// Trainer::prefetch with bags: training whose every step takes its plain
// rows and pooled bags from a prefetch started during the step before
// equals training with lookup() of each, bit for bit, at every rank count,
// whichever pooling (owner, local, automatic) and combiner, with and
// without the communication thread, rows read in place or asked of their
// owners; a bad bag fails rows() on every rank; misuses are named.
#include "support.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace {

using Table = px::Variable<px::Sparse, float>;
using Bags = px::Bags<Table>;

/// Rank r's bags of table t at step s: 0 to 5 ids each (empty bags too),
/// repeats, a different number of bags per rank.
struct BagData {
  std::vector<px::index_t> offsets{0}, ids;
  std::vector<float> weights;
};
BagData bags_of(std::size_t t, std::size_t s, int rank, std::size_t rows) {
  const auto r = static_cast<std::size_t>(rank);
  BagData d;
  const std::size_t bags = 3 + (r + s + t) % 3;
  for (std::size_t b = 0; b < bags; ++b) {
    for (std::size_t k = 0; k < (b + s + r + t) % 6; ++k) {
      d.ids.push_back(static_cast<px::index_t>((b * 5 + k * 7 + s * 3 + r * 11 + t) % rows));
      d.weights.push_back(0.5f + 0.25f * static_cast<float>((b + k) % 4));
    }
    d.offsets.push_back(static_cast<px::index_t>(d.ids.size()));
  }
  return d;
}
std::vector<px::index_t> ids_of(std::size_t s, int rank, std::size_t rows) {
  const auto r = static_cast<std::size_t>(rank);
  std::vector<px::index_t> ids(2 + (r + s) % 3);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<px::index_t>((i * 7 + s * 5 + r * 3) % rows);
  return ids;
}

struct Run {
  std::vector<std::vector<float>> rows;   // every step's rows and pooled blocks, as the model read them
  std::vector<std::vector<float>> model;  // every variable at the end
};

/// A plain table e, tables f (mean) and h (sum) of width 4 (one group) and
/// g (weighted sum, width 2: another group), f and g pooled at `where`, h
/// at the owners; `steps` steps under Arch. With `ahead`, each step
/// prefetches the next batch (e's lookup and the bags) before its
/// gradients and takes it after step(), the caller's arrays overwritten
/// once prefetch() returns.
template <class Arch>
Run train(px::Context& ctx, bool ahead, px::TrainerOptions o, px::Pooling where, std::size_t steps = 4) {
  Table e(ctx, "e", {30, 4}, px::init::Uniform{-1.f, 1.f, 1});
  Table f(ctx, "f", {23, 4}, px::init::Uniform{-1.f, 1.f, 2});
  Table g(ctx, "g", {19, 2}, px::init::Uniform{-1.f, 1.f, 3});
  Table h(ctx, "h", {17, 4}, px::init::Uniform{-1.f, 1.f, 4});
  o.partitions["f"] = 2 * ctx.size() + 1;  // owners interleave over f's rows
  px::Trainer<Arch, px::optim::Adagrad> trainer(ctx, o, px::optim::Adagrad{0.2f}, e, f, g, h);
  std::vector<px::index_t> plain_ids;
  BagData data[3];
  const px::Combiner combiners[3] = {px::Combiner::mean, px::Combiner::weighted_sum, px::Combiner::sum};
  Table* tables[3] = {&f, &g, &h};
  auto batch = [&](std::size_t s) {
    plain_ids = ids_of(s, ctx.rank(), e.rows());
    std::vector<Bags> bags;
    for (std::size_t t = 0; t < 3; ++t) {
      data[t] = bags_of(t, s, ctx.rank(), tables[t]->rows());
      const std::vector<float> none;
      bags.push_back(Bags(*tables[t], data[t].offsets, data[t].ids, combiners[t],
                          combiners[t] == px::Combiner::weighted_sum ? data[t].weights : none)
                         .pooled_at(t == 2 ? px::Pooling::owner : where));
    }
    return bags;
  };
  Run run;
  std::vector<Bags> bags = batch(0);
  auto rows = trainer.lookup({px::Lookup{e, plain_ids}});
  auto pooled = trainer.lookup(bags.data(), bags.size());
  rows.insert(rows.end(), pooled.begin(), pooled.end());
  std::vector<px::index_t> used = plain_ids;
  for (std::size_t s = 0; s < steps; ++s) {
    px::Prefetched<Table> next;
    if (ahead && s + 1 < steps) {
      const auto upcoming = batch(s + 1);
      next = trainer.prefetch({px::Lookup{e, plain_ids}}, upcoming);
      std::fill(plain_ids.begin(), plain_ids.end(), px::index_t{-1});  // prefetch() copied them
      for (auto& d : data) {
        std::fill(d.ids.begin(), d.ids.end(), px::index_t{-1});
        std::fill(d.offsets.begin(), d.offsets.end(), px::index_t{-1});
        std::fill(d.weights.begin(), d.weights.end(), 99.f);
      }
    }
    std::vector<float> seen;
    for (const auto& r : rows) seen.insert(seen.end(), r.data, r.data + r.size());
    run.rows.push_back(seen);
    // Gradients: functions of the rows each request gave.
    std::vector<float> grad(rows[0].size());
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(rows[0].data[i] + 0.01f * i);
    e.grad().add(used, grad);
    std::vector<std::vector<float>> bag_grads(3);
    std::vector<px::BagGradient<Table>> given;
    for (std::size_t t = 0; t < 3; ++t) {
      const auto& r = rows[1 + t];
      bag_grads[t].resize(r.size());
      for (std::size_t i = 0; i < r.size(); ++i) bag_grads[t][i] = std::cos(r.data[i] + 0.02f * i + t);
      given.emplace_back(*tables[t], bag_grads[t].data(), r.rows);
    }
    trainer.bag_gradients(given);
    trainer.step();
    if (s + 1 < steps) {
      if (ahead) {
        rows = trainer.rows(next);
        used = ids_of(s + 1, ctx.rank(), e.rows());
      } else {
        bags = batch(s + 1);
        rows = trainer.lookup({px::Lookup{e, plain_ids}});
        pooled = trainer.lookup(bags.data(), bags.size());
        rows.insert(rows.end(), pooled.begin(), pooled.end());
        used = plain_ids;
      }
    }
  }
  run.model = {trainer.fetch(e), trainer.fetch(f), trainer.fetch(g), trainer.fetch(h)};
  return run;
}

template <class Arch>
void check_same_training(bool shared_memory) {
  auto& ctx = test::world();
  for (px::Pooling where : {px::Pooling::owner, px::Pooling::local, px::Pooling::automatic})
    for (bool overlap : {true, false}) {
      px::TrainerOptions o;
      o.overlap = overlap;
      o.overlap_needs_spare_core = false;  // the thread itself, on any host
      o.sharded.shared_memory = shared_memory;
      INFO(Arch::name << ", pooling " << static_cast<int>(where) << ", overlap " << overlap << ", shared memory "
                      << shared_memory << ", " << ctx.size() << " ranks");
      const Run plain = train<Arch>(ctx, false, o, where);
      const Run ahead = train<Arch>(ctx, true, o, where);
      CHECK(test::all_ranks(ahead.rows == plain.rows));
      CHECK(test::all_ranks(ahead.model == plain.model));
      CHECK(plain.rows.front() != plain.rows.back());  // the model moved, and the rows with it
    }
}

}  // namespace

TEMPLATE_TEST_CASE("training on prefetched bags equals training on lookups of bags, bit for bit", "[prefetch][bags]",
                   px::arch::Hybrid, px::arch::PS) {
  SECTION("rows asked of their owners") { check_same_training<TestType>(false); }
  SECTION("rows read in place where shared") { check_same_training<TestType>(true); }
}

TEST_CASE("a bad prefetched bag fails rows() on every rank; the step between is unaffected",
          "[prefetch][bags][errors]") {
  auto& ctx = test::world();
  const int last = ctx.size() - 1;
  px::Pooling where = px::Pooling::owner;
  SECTION("pooled at the owners") { where = px::Pooling::owner; }
  SECTION("pooled here") { where = px::Pooling::local; }
  SECTION("pooling chosen") { where = px::Pooling::automatic; }
  for (bool overlap : {true, false}) {
      INFO("pooling " << static_cast<int>(where) << ", overlap " << overlap);
      Table e(ctx, "e", {10, 2});
      Table f(ctx, "f", {7, 2});
      px::TrainerOptions o;
      o.overlap = overlap;
      o.overlap_needs_spare_core = false;
      px::Trainer<px::arch::Hybrid, px::optim::Sgd> t(ctx, o, px::optim::Sgd{0.1f}, e, f);
      const std::vector<px::index_t> good{0, 9}, offsets{0, 1, 2}, bad{1, ctx.rank() == last ? 7 : 6};
      auto next = t.prefetch({px::Lookup{e, good}}, {Bags(f, offsets, bad).pooled_at(where)});
      e.grad().add(std::vector<px::index_t>{2}, std::vector<float>{1.f, 1.f});
      CHECK_NOTHROW(t.step());
      CHECK(t.steps() == 1);
      const std::string msg = test::error_of([&] { t.rows(next); });
      CHECK_THAT(msg, Catch::Contains("bags of variable 'f': id 7 (entry 1, bag 1) is outside [0, 7)"));
      CHECK(test::same_on_every_rank(msg));
      // The prefetch was taken; the next one works, and its bags take their gradient.
      const std::vector<px::index_t> fixed{1, 6};
      auto again = t.prefetch({px::Lookup{e, good}}, {Bags(f, offsets, fixed).pooled_at(where)});
      const auto rows = t.rows(again);
      REQUIRE(rows.size() == 2);
      CHECK(rows[1].rows == 2);
      CHECK(test::to_host(rows[0]) == test::to_host(t.lookup(e, good)));
      const std::vector<float> grad(4, 1.f);
      CHECK_NOTHROW(t.bag_gradients({px::BagGradient<Table>(f, grad.data(), 2)}));
      CHECK_NOTHROW(t.step());
    }
}

TEST_CASE("a variable both looked up and in bags of one prefetch is refused, naming it", "[prefetch][bags][errors]") {
  auto& ctx = test::world();
  Table e(ctx, "e", {10, 2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> t(ctx, px::optim::Sgd{0.1f}, e);
  const std::vector<px::index_t> ids{0, 1}, offsets{0, 2};
  const std::string msg = test::error_of([&] { t.prefetch({px::Lookup{e, ids}}, {Bags(e, offsets, ids)}); });
  CHECK_THAT(msg, Catch::Contains("variable 'e' appears twice in one batched prefetch"));
  // Nothing is in flight: a prefetch of its bags alone works.
  auto next = t.prefetch(std::vector<px::Lookup<Table>>{}, {Bags(e, offsets, ids)});
  const auto rows = t.rows(next);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].rows == 1);
}
