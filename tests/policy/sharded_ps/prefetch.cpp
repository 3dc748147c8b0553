// Trainer::prefetch and rows(): training that takes the next batch's rows
// from a prefetch equals training with plain lookups, bit for bit, for
// every architecture, with and without the communication thread, with
// table groups, rows read in place or asked of their owners; a bad id or
// ranks that prefetch differently fail on every rank; the lifecycle's
// misuses are named.
#include "support.hpp"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace {

using Table = px::Variable<px::Sparse, float>;

/// Rank r's ids for table `t` (of `rows` rows) at step s: unsorted, with
/// repeats, a different count per rank, none for table 2 on rank 1.
std::vector<px::index_t> ids_of(std::size_t t, std::size_t s, int rank, std::size_t rows) {
  const auto r = static_cast<std::size_t>(rank);
  if (t == 2 && r == 1) return {};
  const std::size_t n = 3 + (r + s + t) % 4;
  std::vector<px::index_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<px::index_t>((i * 7 + s * 5 + r * 3 + t) % (i % 3 == 2 ? 2 : rows));
  return ids;
}

struct Run {
  std::vector<std::vector<float>> rows;   // every batch's rows, as the model read them
  std::vector<std::vector<float>> model;  // every variable at the end
  std::uint64_t calls = 0;                 // the trainer's engine calls
};

/// Three tables (e and f of width 4: one group; g of width 2: another) and
/// a dense layer, trained for `steps` steps under Arch. With `ahead`, each
/// step prefetches the next batch before its compute and takes its rows
/// after step(); a plain lookup comes between (the prefetch survives it);
/// `mark` says each gradient is ready as it is made.
template <class Arch>
Run train(px::Context& ctx, bool ahead, px::TrainerOptions o, bool mark, std::size_t steps = 4) {
  Table e(ctx, "e", {30, 4}, px::init::Uniform{-1.f, 1.f, 1});
  Table f(ctx, "f", {17, 4}, px::init::Uniform{-1.f, 1.f, 2});
  Table g(ctx, "g", {13, 2}, px::init::Uniform{-1.f, 1.f, 3});
  px::Variable<px::Dense, float> w(ctx, "w", {4, 2}, px::init::Glorot{4});
  o.partitions["f"] = 2 * ctx.size() + 1;  // owners interleave over f's rows
  px::Trainer<Arch, px::optim::Adam> trainer(ctx, o, px::optim::Adam{0.05f}, e, w, f, g);
  Table* tables[3] = {&e, &f, &g};
  std::vector<std::vector<px::index_t>> ids(3);
  auto batch = [&](std::size_t s) {
    for (std::size_t t = 0; t < 3; ++t) ids[t] = ids_of(t, s, ctx.rank(), tables[t]->rows());
    return std::vector<px::Lookup<Table>>{px::Lookup{e, ids[0]}, px::Lookup{f, ids[1]}, px::Lookup{g, ids[2]}};
  };
  Run run;
  auto rows = trainer.lookup(batch(0));
  std::vector<std::vector<px::index_t>> used = ids;
  for (std::size_t s = 0; s < steps; ++s) {
    px::Prefetched<Table> next;
    if (ahead && s + 1 < steps) {
      next = trainer.prefetch(batch(s + 1));
      for (auto& v : ids) std::fill(v.begin(), v.end(), px::index_t{-1});  // prefetch() copied them
    }
    std::vector<float> seen;
    for (const auto& r : rows) seen.insert(seen.end(), r.data, r.data + r.size());
    run.rows.push_back(seen);
    // A plain lookup between a prefetch and its rows.
    const std::vector<px::index_t> extra{static_cast<px::index_t>((s + 3) % 30), 1};
    const auto side = trainer.lookup(e, extra);
    // Gradients: functions of the rows each table gave.
    const float scale = side.data[0];
    for (std::size_t t = 0; t < 3; ++t) {
      std::vector<float> grad(rows[t].size());
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(rows[t].data[i] + 0.1f * scale + 0.01f * i);
      tables[t]->grad().add(used[t], grad);
      if (mark) trainer.ready(*tables[t]);
    }
    for (std::size_t i = 0; i < w.grad().size(); ++i) w.grad()[i] = std::cos(0.3f * i + s + scale);
    if (mark) trainer.ready(w);
    trainer.step();
    if (s + 1 < steps) {
      if (ahead) {
        rows = trainer.rows(next);
        used.clear();
        for (std::size_t t = 0; t < 3; ++t) used.push_back(ids_of(t, s + 1, ctx.rank(), tables[t]->rows()));
      } else {
        rows = trainer.lookup(batch(s + 1));
        used = ids;
      }
    }
  }
  run.calls = trainer.stats().total().calls;
  run.model = {trainer.fetch(e), trainer.fetch(f), trainer.fetch(g), trainer.fetch(w)};
  return run;
}

template <class Arch>
void check_same_training(bool shared_memory, bool group_tables) {
  auto& ctx = test::world();
  for (bool overlap : {true, false})
    for (bool mark : {false, true}) {
      px::TrainerOptions o;
      o.overlap = overlap;
      o.overlap_needs_spare_core = false;  // the thread itself, on any host
      o.sharded.shared_memory = shared_memory;
      o.sharded.group_tables = group_tables;
      INFO(Arch::name << ", overlap " << overlap << ", ready() " << mark << ", shared memory " << shared_memory
                      << ", grouped " << group_tables << ", " << ctx.size() << " ranks");
      const Run plain = train<Arch>(ctx, false, o, mark);
      const Run ahead = train<Arch>(ctx, true, o, mark);
      CHECK(test::all_ranks(ahead.rows == plain.rows));
      CHECK(test::all_ranks(ahead.model == plain.model));
      // The model moved, and the rows with it.
      CHECK(plain.rows.front() != plain.rows.back());
    }
}

}  // namespace

TEMPLATE_TEST_CASE("training on prefetched rows equals training on lookups, bit for bit", "[prefetch]",
                   px::arch::Hybrid, px::arch::AllReduce, px::arch::PS) {
  using Arch = TestType;
  SECTION("rows asked of their owners") { check_same_training<Arch>(false, true); }
  SECTION("rows read in place where shared") { check_same_training<Arch>(true, true); }
  SECTION("one group per table") { check_same_training<Arch>(false, false); }
}

TEST_CASE("ready() pushes every group in one route with push_together: the same training, fewer calls",
          "[prefetch][push_together][np2+]") {
  // One rank: a push moves no rows, and a route makes no engine call.
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  for (bool group_tables : {true, false})
    for (bool overlap : {true, false}) {
      px::TrainerOptions o;
      o.overlap = overlap;
      o.overlap_needs_spare_core = false;
      o.sharded.shared_memory = false;
      o.sharded.group_tables = group_tables;
      // Grouped: {e, f} and {g}; one group per table: three.
      const std::uint64_t groups = group_tables ? 2 : 3, steps = 4;
      INFO("overlap " << overlap << ", grouped " << group_tables << ", " << ctx.size() << " ranks");
      o.sharded.push_together = false;
      const Run each = train<px::arch::Hybrid>(ctx, true, o, true, steps);
      o.sharded.push_together = true;
      const Run together = train<px::arch::Hybrid>(ctx, true, o, true, steps);
      CHECK(test::all_ranks(together.rows == each.rows));
      CHECK(test::all_ranks(together.model == each.model));
      // One push route a step instead of one per group.
      CHECK(each.calls - together.calls == steps * (groups - 1) * test::route_calls<px::engine::Mpi>);
    }
}

namespace {

using RingTable = px::Variable<px::Sparse, float, px::HostSpace, px::RingAllReduce>;

std::vector<float> train_ring(px::Context& ctx, bool ahead) {
  RingTable e(ctx, "e", {20, 3}, px::init::Uniform{-1.f, 1.f, 5});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.5f}, e);
  auto ids_at = [&](std::size_t s) { return ids_of(0, s, ctx.rank(), 20); };
  auto ids = ids_at(0);
  auto rows = trainer.lookup({px::Lookup{e, ids}});
  std::vector<float> seen;
  for (std::size_t s = 0; s < 3; ++s) {
    px::Prefetched<RingTable> next;
    std::vector<px::index_t> upcoming = ids_at(s + 1);
    if (ahead) next = trainer.prefetch({px::Lookup{e, upcoming}});
    seen.insert(seen.end(), rows[0].data, rows[0].data + rows[0].size());
    std::vector<float> grad(rows[0].size());
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = rows[0].data[i] * 0.5f + 0.1f;
    e.grad().add(ids, grad);
    trainer.step();
    rows = ahead ? trainer.rows(next) : trainer.lookup({px::Lookup{e, upcoming}});
    ids = upcoming;
  }
  seen.insert(seen.end(), rows[0].data, rows[0].data + rows[0].size());
  const auto model = trainer.fetch(e);
  seen.insert(seen.end(), model.begin(), model.end());
  return seen;
}

}  // namespace

TEST_CASE("a sparse variable all-reduced as a replica prefetches too", "[prefetch]") {
  auto& ctx = test::world();
  CHECK(test::all_ranks(train_ring(ctx, true) == train_ring(ctx, false)));
}

namespace {

/// The loop docs/tutorial.md quotes ("Lookups ahead"), and the same loop
/// with plain lookups: a table and a dense layer in `Space`, mean squared
/// error computed on the host.
template <class Arch, class Space>
std::vector<float> tutorial_loop(px::Context& ctx, bool ahead) {
  px::Variable<px::Sparse, float, Space> emb(ctx, "emb", {50, 4}, px::init::Uniform{-1.f, 1.f, 11});
  px::Variable<px::Dense, float, Space> w(ctx, "w", {4}, px::init::Constant{0.5});
  px::Trainer<Arch, px::optim::Adagrad, test::engine_for<Space>> trainer(ctx, px::optim::Adagrad{0.2f}, emb, w);
  const std::size_t steps = 4;
  auto batch_ids = [&](std::size_t s) { return px::Buffer<px::index_t, Space>::from_host(ids_of(0, s, ctx.rank(), 50)); };
  std::size_t step = 0;
  auto forward_backward = [&](const auto& rows) {
    const auto ids = ids_of(0, step++, ctx.rank(), 50);
    const auto x = test::to_host(rows[0]);
    const auto wv = w.value().to_host();
    auto dw = w.grad().to_host();
    std::vector<float> grad(x.size());
    for (std::size_t i = 0; i < rows[0].rows; ++i)
      for (std::size_t d = 0; d < 4; ++d) {
        const float err = x[i * 4 + d] * wv[d] - 0.25f * static_cast<float>(d);
        grad[i * 4 + d] = err * wv[d];
        dw[d] += err * x[i * 4 + d];
      }
    emb.grad().add(ids, grad);
    test::copy_from_host<Space>(w.grad().data(), dw);
  };
  if (!ahead) {
    for (std::size_t s = 0; s < steps; ++s) {
      forward_backward(trainer.lookup({px::Lookup{emb, batch_ids(s)}}));
      trainer.step();
    }
  } else {
    // example-begin prefetch_loop
    auto rows = trainer.lookup({px::Lookup{emb, batch_ids(0)}});
    for (std::size_t s = 0; s < steps; ++s) {
      // The next batch's ids travel to their owners while this one computes.
      px::Prefetched<decltype(emb)> next;
      if (s + 1 < steps) next = trainer.prefetch({px::Lookup{emb, batch_ids(s + 1)}});
      forward_backward(rows);  // adds emb's and w's gradients
      trainer.step();
      // Its rows, read after this step's update: what lookup() would return now.
      if (s + 1 < steps) rows = trainer.rows(next);
    }
    // example-end
  }
  auto out = trainer.fetch(emb);
  const auto wv = trainer.fetch(w);
  out.insert(out.end(), wv.begin(), wv.end());
  return out;
}

template <class Space>
void check_tutorial_loop() {
  auto& ctx = test::world();
  const auto hybrid = tutorial_loop<px::arch::Hybrid, Space>(ctx, false);
  CHECK(test::all_ranks(tutorial_loop<px::arch::Hybrid, Space>(ctx, true) == hybrid));
  const auto allreduce = tutorial_loop<px::arch::AllReduce, Space>(ctx, false);
  CHECK(test::all_ranks(tutorial_loop<px::arch::AllReduce, Space>(ctx, true) == allreduce));
  const auto ps = tutorial_loop<px::arch::PS, Space>(ctx, false);
  CHECK(test::all_ranks(tutorial_loop<px::arch::PS, Space>(ctx, true) == ps));
}

}  // namespace

TEMPLATE_TEST_CASE("the tutorial's loop ahead trains as its loop of lookups, in every memory space",
                   "[prefetch][docs]", PARALLAX_TEST_SPACES) {
  check_tutorial_loop<TestType>();
}

// ---------------------------------------------------------------- errors

TEST_CASE("a bad prefetched id fails rows() on every rank; the step between is unaffected", "[prefetch][errors]") {
  auto& ctx = test::world();
  const int last = ctx.size() - 1;
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    Table e(ctx, "e", {10, 2});
    Table f(ctx, "f", {7, 2});
    px::TrainerOptions o;
    o.overlap = overlap;
    o.overlap_needs_spare_core = false;  // the thread itself, on any host
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> t(ctx, o, px::optim::Sgd{0.1f}, e, f);
    const std::vector<px::index_t> good{0, 9}, bad{1, ctx.rank() == last ? 7 : 6};
    auto next = t.prefetch({px::Lookup{e, good}, px::Lookup{f, bad}});
    e.grad().add(std::vector<px::index_t>{2}, std::vector<float>{1.f, 1.f});
    CHECK_NOTHROW(t.step());
    CHECK(t.steps() == 1);
    const std::string msg = test::error_of([&] { t.rows(next); });
    CHECK(msg == "variable 'f': lookup id 7 is outside [0, 7) on rank " + std::to_string(last));
    CHECK(test::same_on_every_rank(msg));
    // The prefetch was taken; the next one works.
    const std::vector<px::index_t> fixed{1, 6};
    auto again = t.prefetch({px::Lookup{e, good}, px::Lookup{f, fixed}});
    const auto rows = t.rows(again);
    CHECK(test::to_host(rows[1]) == test::to_host(t.lookup(f, fixed)));
    CHECK(test::to_host(rows[0]) == test::to_host(t.lookup(e, good)));
  }
}

TEST_CASE("a bad prefetched id of a replica throws at rows() on every rank, like a lookup's", "[prefetch][errors]") {
  auto& ctx = test::world();
  const int last = ctx.size() - 1;
  Table e(ctx, "e", {10, 2});
  px::Trainer<px::arch::AllReduce, px::optim::Sgd> t(ctx, px::optim::Sgd{0.1f}, e);
  const std::vector<px::index_t> ids{ctx.rank() == last ? -1 : 3};
  auto next = t.prefetch({px::Lookup{e, ids}});
  e.grad().add(std::vector<px::index_t>{2}, std::vector<float>{1.f, 1.f});
  CHECK_NOTHROW(t.step());  // the step before rows() is not this batch's
  const std::string msg = test::error_of([&] { t.rows(next); });
  CHECK_THAT(msg, Catch::Contains("rank " + std::to_string(last)) && Catch::Contains("lookup id -1") &&
                      Catch::Contains("'e'"));
  CHECK(test::same_on_every_rank(msg));
  // The failed batch left nothing behind: the next step and lookup work.
  e.grad().add(std::vector<px::index_t>{2}, std::vector<float>{1.f, 1.f});
  CHECK_NOTHROW(t.step());
  CHECK(t.steps() == 2);
  CHECK(t.lookup(e, std::vector<px::index_t>{3}).rows == 1);
}

TEST_CASE("ranks that prefetch different variables, or prefetch where others look up, fail together",
          "[prefetch][errors]") {
  auto& ctx = test::world();
  if (ctx.size() == 1) return;  // nothing to disagree with
  Table e(ctx, "e", {10, 2});
  Table f(ctx, "f", {7, 2});
  for (bool overlap : {true, false}) {
    INFO("overlap " << overlap);
    px::TrainerOptions o;
    o.overlap = overlap;
    o.overlap_needs_spare_core = false;  // the thread itself, on any host
    o.sharded.shared_memory = false;
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> t(ctx, o, px::optim::Sgd{0.1f}, e, f);
    const std::vector<px::index_t> ids{1};
    {
      auto next = ctx.rank() == 0 ? t.prefetch({px::Lookup{e, ids}}) : t.prefetch({px::Lookup{f, ids}});
      const std::string msg = test::error_of([&] { t.rows(next); });
      CHECK(msg == "parallax: ranks make different batched lookups: rank 0: prefetch of 'e'; " +
                       std::string(ctx.size() == 2 ? "rank 1" : ctx.size() == 3 ? "ranks 1, 2" : "ranks 1, 2, 3") +
                       ": prefetch of 'f'. Every rank must look up the same sparse variables, in the same order, in "
                       "each batched lookup (the ids may differ, and may be none).");
      CHECK(test::same_on_every_rank(msg));
    }
    {
      // Rank 0 prefetches where the others look up: they throw at once,
      // rank 0 at rows(); every rank names both calls.
      std::string msg;
      if (ctx.rank() == 0) {
        auto next = t.prefetch({px::Lookup{e, ids}});
        msg = test::error_of([&] { t.rows(next); });
      } else {
        msg = test::error_of([&] { t.lookup({px::Lookup{e, ids}}); });
      }
      CHECK_THAT(msg, Catch::Contains("ranks make different batched lookups") &&
                          Catch::Contains("rank 0: prefetch of 'e'") && Catch::Contains(": 'e'"));
      CHECK(test::same_on_every_rank(msg));
    }
    // The trainer is still usable.
    auto next = t.prefetch({px::Lookup{f, ids}});
    CHECK(t.rows(next)[0].rows == 1);
  }
}

TEST_CASE("prefetch's lifecycle: one at a time, rows taken once, misuse named", "[prefetch][errors]") {
  auto& ctx = test::world();
  Table e(ctx, "e", {10, 2}, px::init::Uniform{-1.f, 1.f, 9});
  Table other(ctx, "other", {5, 2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> t(ctx, px::optim::Sgd{0.1f}, e);
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> u(ctx, px::optim::Sgd{0.1f}, other);
  const std::vector<px::index_t> ids{3, 1, 3};

  SECTION("a second prefetch before rows()") {
    auto first = t.prefetch({px::Lookup{e, ids}});
    CHECK(first.pending());
    CHECK(test::error_of([&] { t.prefetch({px::Lookup{e, ids}}); }) ==
          "prefetch(): the prefetch of 'e' is in flight; take its rows with rows() first (one prefetch at a time)");
    CHECK(test::to_host(t.rows(first)[0]) == test::to_host(t.lookup(e, ids)));
    CHECK_FALSE(first.pending());
  }
  SECTION("rows() twice") {
    auto p = t.prefetch({px::Lookup{e, ids}});
    t.rows(p);
    CHECK_THAT(test::error_of([&] { t.rows(p); }), Catch::Contains("taken already"));
  }
  SECTION("an empty or moved-from Prefetched, or another trainer's") {
    px::Prefetched<Table> empty;
    CHECK_FALSE(empty.pending());
    CHECK_THAT(test::error_of([&] { t.rows(empty); }), Catch::Contains("holds no prefetch"));
    auto p = u.prefetch({px::Lookup{other, ids}});
    auto moved = std::move(p);
    CHECK_THAT(test::error_of([&] { u.rows(p); }), Catch::Contains("holds no prefetch"));
    CHECK_THAT(test::error_of([&] { t.rows(moved); }), Catch::Contains("made by another Trainer"));
    CHECK(u.rows(moved)[0].rows == 3);
  }
  SECTION("a variable twice, or one the trainer does not hold") {
    CHECK(test::error_of([&] { t.prefetch({px::Lookup{e, ids}, px::Lookup{e, ids}}); }) ==
          "variable 'e' appears twice in one batched prefetch; give it all its ids in one request");
    CHECK_THAT(test::error_of([&] { t.prefetch({px::Lookup{other, ids}}); }), Catch::Contains("'other' is not registered"));
    // Neither started a prefetch.
    auto p = t.prefetch({px::Lookup{e, ids}});
    CHECK(t.rows(p)[0].rows == 3);
  }
  SECTION("a step that throws leaves the prefetch valid") {
    auto p = t.prefetch({px::Lookup{e, ids}});
    CHECK_THAT(test::error_of([&] { t.step(); }), Catch::Contains("no variable was given a gradient"));
    CHECK(test::to_host(t.rows(p)[0]) == test::to_host(t.lookup(e, ids)));
  }
}

TEMPLATE_TEST_CASE("a prefetch survives save(); restore() cancels it", "[prefetch][checkpoint]", px::arch::Hybrid,
                   px::arch::AllReduce) {
  auto& ctx = test::world();
  test::TempDir dir("parallax-prefetch");
  Table e(ctx, "e", {10, 2}, px::init::Uniform{-1.f, 1.f, 9});
  px::Trainer<TestType, px::optim::Sgd> t(ctx, px::optim::Sgd{0.5f}, e);
  const std::vector<px::index_t> ids{3, 1, 3, static_cast<px::index_t>(ctx.rank())};
  auto give = [&] { e.grad().add(std::vector<px::index_t>{1, 3}, std::vector<float>{1.f, 2.f, 3.f, 4.f}); };

  auto p = t.prefetch({px::Lookup{e, ids}});
  const std::string path = t.save(dir.path);
  give();
  t.step();
  const auto rows = t.rows(p);
  CHECK(test::to_host(rows[0]) == test::to_host(t.lookup(e, ids)));
  give();
  t.step();

  auto q = t.prefetch({px::Lookup{e, ids}});
  t.restore(path);
  CHECK(t.steps() == 0);
  CHECK(test::error_of([&] { t.rows(q); }) ==
        "rows(): this prefetch (of 'e') was cancelled by restore(\"" + path + "\"); prefetch its batch again");
  // A new prefetch reads the restored rows.
  auto r = t.prefetch({px::Lookup{e, ids}});
  CHECK(test::to_host(t.rows(r)[0]) == test::to_host(t.lookup(e, ids)));
}
