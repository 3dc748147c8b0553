// ShardedOptions::early_rows: a prefetch's rows served in two parts (the
// rows the step is not expected to change at once, the rest at rows())
// train bit for bit as rows served whole at rows() and as plain lookups,
// including pushes to rows nobody looked up (which an owner served early
// and must send again), rows read in place, and a second group (double
// rows) looked up and pushed beside the prefetched one.
#include "support.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace {

using Table = px::Variable<px::Sparse, float>;
using Wide = px::Variable<px::Sparse, double>;

/// Rank r's ids at step s for a table of 40 rows: rows 10 x (s % 4) on
/// (none of the previous batch's but 0 and 1), with a repeat, and rows 0
/// and 1, asked at every step.
std::vector<px::index_t> ids_of(std::size_t s, int rank) {
  const auto r = static_cast<px::index_t>(rank);
  const auto at = static_cast<px::index_t>(10 * (s % 4) + 2);
  return {at + r % 8, 0, at + (r + 3) % 8, at + r % 8, 1, at + (r + 5) % 8};
}

struct Run {
  std::vector<std::vector<double>> rows;   // every batch's rows, as the model read them
  std::vector<std::vector<double>> model;  // every variable at the end
  std::uint64_t calls = 0;
};

/// Two groups (e, f: float width 3; g: double width 2), trained under Arch
/// for `steps` steps. `ahead`: the next batch is prefetched before the
/// compute and taken after step(). `outside`: each step also pushes
/// gradient rows to the next batch's rows, which nobody looked up this
/// step (so an owner that served them early must send them again).
template <class Arch>
Run train(px::Context& ctx, bool ahead, bool outside, px::TrainerOptions o, bool mark, std::size_t steps = 5) {
  Table e(ctx, "e", {40, 3}, px::init::Uniform{-1.f, 1.f, 1});
  Table f(ctx, "f", {40, 3}, px::init::Uniform{-1.f, 1.f, 2});
  Wide g(ctx, "g", {40, 2}, px::init::Uniform{-1.0, 1.0, 3});
  o.partitions["f"] = 2 * ctx.size() + 1;  // owners interleave over f's rows
  px::Trainer<Arch, px::optim::Adam> trainer(ctx, o, px::optim::Adam{0.05f}, e, f, g);
  std::vector<px::index_t> ids = ids_of(0, ctx.rank());
  Run run;
  auto rows = trainer.lookup({px::Lookup{e, ids}, px::Lookup{f, ids}});
  auto wide = trainer.lookup(g, ids);
  for (std::size_t s = 0; s < steps; ++s) {
    const std::vector<px::index_t> next_ids = ids_of(s + 1, ctx.rank());
    px::Prefetched<Table> next;
    if (ahead && s + 1 < steps) next = trainer.prefetch({px::Lookup{e, next_ids}, px::Lookup{f, next_ids}});
    std::vector<double> seen;
    for (const auto& r : rows) seen.insert(seen.end(), r.data, r.data + r.size());
    seen.insert(seen.end(), wide.data, wide.data + wide.size());
    run.rows.push_back(seen);
    Table* tables[2] = {&e, &f};
    for (std::size_t t = 0; t < 2; ++t) {
      std::vector<float> grad(rows[t].size());
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(rows[t].data[i] + 0.01f * static_cast<float>(i + t));
      tables[t]->grad().add(ids, grad);
      if (outside) {
        std::vector<float> more(next_ids.size() * 3);
        for (std::size_t i = 0; i < more.size(); ++i) more[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
        tables[t]->grad().add(next_ids, more);
      }
      if (mark) trainer.ready(*tables[t]);
    }
    std::vector<double> wgrad(wide.size());
    for (std::size_t i = 0; i < wgrad.size(); ++i) wgrad[i] = std::cos(wide.data[i]);
    g.grad().add(ids, wgrad);
    if (mark) trainer.ready(g);
    trainer.step();
    if (s + 1 < steps) {
      rows = ahead ? trainer.rows(next) : trainer.lookup({px::Lookup{e, next_ids}, px::Lookup{f, next_ids}});
      wide = trainer.lookup(g, next_ids);
      ids = next_ids;
    }
  }
  run.calls = trainer.stats().total().calls;
  const auto fe = trainer.fetch(e), ff = trainer.fetch(f);
  run.model = {std::vector<double>(fe.begin(), fe.end()), std::vector<double>(ff.begin(), ff.end()), trainer.fetch(g)};
  return run;
}

template <class Arch>
void check_parts(bool shared_memory) {
  auto& ctx = test::world();
  for (bool outside : {false, true})
    for (bool overlap : {true, false})
      for (bool mark : {false, true}) {
        px::TrainerOptions o;
        o.overlap = overlap;
        o.overlap_needs_spare_core = false;
        o.sharded.shared_memory = shared_memory;
        INFO(Arch::name << ", outside " << outside << ", overlap " << overlap << ", ready() " << mark
                        << ", shared memory " << shared_memory << ", " << ctx.size() << " ranks");
        o.sharded.early_rows = false;
        const Run plain = train<Arch>(ctx, false, outside, o, mark);
        const Run whole = train<Arch>(ctx, true, outside, o, mark);
        o.sharded.early_rows = true;
        const Run parts = train<Arch>(ctx, true, outside, o, mark);
        CHECK(test::all_ranks(parts.rows == plain.rows));
        CHECK(test::all_ranks(parts.model == plain.model));
        CHECK(test::all_ranks(whole.rows == plain.rows));
        CHECK(plain.rows.front() != plain.rows.back());
        // Rows asked of owners: each prefetch's early part is a route of its own.
        if (!shared_memory || ctx.size() == 1) {
          const std::uint64_t prefetches = 4;
          CHECK(parts.calls - whole.calls == prefetches * test::route_calls<px::engine::Mpi> * (ctx.size() > 1));
        }
      }
}

}  // namespace

TEMPLATE_TEST_CASE("prefetched rows served early train as rows served at rows(), bit for bit",
                   "[prefetch][early_rows]", px::arch::Hybrid, px::arch::PS) {
  using Arch = TestType;
  SECTION("rows asked of their owners") { check_parts<Arch>(false); }
  SECTION("rows read in place where shared") { check_parts<Arch>(true); }
}

TEST_CASE("a push outside the looked-up rows changes what a prefetch returns", "[prefetch][early_rows]") {
  // The correction path has something to correct: the outside pushes move
  // the next batch's rows between the early part and rows().
  auto& ctx = test::world();
  px::TrainerOptions o;
  o.overlap_needs_spare_core = false;
  o.sharded.shared_memory = false;
  const Run inside = train<px::arch::Hybrid>(ctx, true, false, o, false);
  const Run outside = train<px::arch::Hybrid>(ctx, true, true, o, false);
  CHECK(inside.rows[1] != outside.rows[1]);
}
