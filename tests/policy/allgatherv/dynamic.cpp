// DynamicVariable under arch::AllReduce, which routes it to AllGatherv: a
// replica of the table on every rank. At 1-4 ranks, with eviction and
// count-min admission on (a small capacity) and without (probability
// admission), the rows lookups return, every rank's replica and its
// statistics equal, bit for bit, one process's trainer on the same global
// batch, under AllReduce and under Hybrid (DynamicPS); reruns are
// bit-identical; clipping by the global norm counts each summed row once;
// a lookup beyond the capacity throws on every rank; checkpoints
// (Trainer::save) taken under AllReduce restore under AllReduce and Hybrid
// at 1-N ranks, and those of Hybrid under AllReduce, with training going on
// as one process that never stopped.
#include "policy/dynamic_stream.hpp"
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace dynamic_test;
using dynamic_test::check_same;  // beside the overload for statistics below

static_assert(std::is_same_v<px::policy_for_t<px::arch::AllReduce, Var>, px::AllGatherv>);
static_assert(std::is_same_v<px::policy_for_t<px::arch::Hybrid, Var>, px::DynamicPS>);
static_assert(std::is_same_v<px::policy_for_t<px::arch::PS, Var>, px::DynamicPS>);
static_assert(std::is_same_v<px::policy_for_t<px::arch::Hybrid, px::DynamicVariable<float, px::HostSpace, px::AllGatherv>>,
                             px::AllGatherv>);
static_assert(!px::Trainer<px::arch::AllReduce, px::optim::Sgd>::can_prefetch<Var>);

px::TrainerOptions sum_options(double clip_norm = 0) {
  px::TrainerOptions to;
  to.reduction = px::Reduction::sum;
  to.clip_norm = clip_norm;
  return to;
}

void check_same(const px::dynamic::Stats& got, const px::dynamic::Stats& want) {
  CHECK(got.size == want.size);
  CHECK(got.capacity == want.capacity);
  CHECK(got.lookups == want.lookups);
  CHECK(got.hits == want.hits);
  CHECK(got.inserts == want.inserts);
  CHECK(got.evictions == want.evictions);
  CHECK(got.admissions_refused == want.admissions_refused);
}

// A dynamic variable and a dense one in a trainer of architecture Arch over
// ctx; rank 0 alone gives the dense gradient, so its sum is one process's.
template <class Arch, class Opt>
struct Model {
  using Policy = px::policy_for_t<Arch, Var>;
  Var emb;
  px::Variable<px::Dense, float> w;
  px::Trainer<Arch, Opt> trainer;
  Model(const px::Context& ctx, const Opt& opt, std::size_t capacity, bool small, double clip = 0)
      : emb(ctx, "emb", options(capacity, small)), w(ctx, "w", {2, 2}), trainer(ctx, sum_options(clip), opt, emb, w) {}
  auto& sync() { return trainer.template synchronizer<Policy>(); }
  px::dynamic::Snapshot<float> table() { return sync().table(emb).export_rows(); }
  // Steps [from, to] of the global batch (this rank's block); returns the
  // rows this rank read, and the gradient norm of each step into `norms`.
  std::vector<float> run(std::uint64_t from, std::uint64_t to, std::vector<double>* norms = nullptr) {
    const auto& ctx = trainer.context();
    std::vector<float> read;
    for (std::uint64_t s = from; s <= to; ++s) {
      look_up_and_push(trainer, emb, s, read);
      for (std::size_t i = 0; i < 4; ++i) w.grad().data()[i] = ctx.rank() == 0 ? 0.01f * static_cast<float>(s + i) : 0.0f;
      trainer.step();
      if (norms) norms->push_back(trainer.gradient_norm());
    }
    return read;
  }
};

template <class Opt>
void check_one_process(const Opt& opt, std::size_t capacity, bool small) {
  const auto& ctx = test::world();
  px::Context single(MPI_COMM_SELF);  // one process, the whole global batch
  Model<px::arch::Hybrid, Opt> ps(single, opt, capacity, small);
  const auto want_read = ps.run(1, steps);
  const auto want = ps.table();
  const auto want_stats = ps.sync().stats(ps.emb).total;
  Model<px::arch::AllReduce, Opt> one(single, opt, capacity, small);
  CHECK(same_bits(one.run(1, steps), want_read));
  check_same(one.table(), want);

  Model<px::arch::AllReduce, Opt> got(ctx, opt, capacity, small);
  const auto read = got.run(1, steps);
  CHECK(same_bits(read, rows_of_block(want_read, ctx.rank(), ctx.size())));
  check_same(got.table(), want);  // every rank's replica is the whole table
  const px::policy::DynamicStats s = got.sync().stats(got.emb);
  check_same(s.total, want_stats);
  check_same(s.max, want_stats);
  CHECK(got.emb.local_stats().lookups == steps * G);
  CHECK(s.total.admissions_refused > 0);
  if (small) {
    CHECK(s.total.evictions > 0);
    CHECK(s.total.size <= capacity);
  }
  CHECK(same_bits(got.trainer.fetch(got.w), ps.trainer.fetch(ps.w)));

  Model<px::arch::AllReduce, Opt> again(ctx, opt, capacity, small);
  CHECK(same_bits(again.run(1, steps), read));
  check_same(again.table(), got.table());
}

}  // namespace

TEST_CASE("AllGatherv's dynamic replicas at N ranks equal one process on the same global batch, bit for bit",
          "[allgatherv][dynamic]") {
  SECTION("sgd, no eviction") { check_one_process(px::optim::Sgd{0.5f}, 1000, false); }
  SECTION("adagrad, no eviction") { check_one_process(px::optim::Adagrad{0.3f}, 1000, false); }
  SECTION("sgd, eviction and count-min admission") { check_one_process(px::optim::Sgd{0.5f}, 16, true); }
  SECTION("adagrad, eviction and count-min admission") { check_one_process(px::optim::Adagrad{0.3f}, 16, true); }
}

TEST_CASE("clipping by the global norm counts each replicated dynamic row once, at any rank count",
          "[allgatherv][dynamic]") {
  const auto& ctx = test::world();
  px::Context single(MPI_COMM_SELF);
  const px::optim::Sgd opt{0.5f};
  std::vector<double> want_norms, got_norms;
  Model<px::arch::Hybrid, px::optim::Sgd> want(single, opt, 1000, false, 0.05);
  want.run(1, steps, &want_norms);
  Model<px::arch::AllReduce, px::optim::Sgd> got(ctx, opt, 1000, false, 0.05);
  got.run(1, steps, &got_norms);
  REQUIRE(got_norms.size() == want_norms.size());
  for (std::size_t s = 0; s < want_norms.size(); ++s) {
    INFO("step " << s + 1 << ": norm " << got_norms[s] << " against one process's " << want_norms[s]);
    CHECK(want_norms[s] > 0.05);  // every step clips
    CHECK(std::abs(got_norms[s] - want_norms[s]) <= 1e-9 * want_norms[s]);
  }
  const auto a = got.table(), b = want.table();
  REQUIRE(a.keys == b.keys);
  double worst = 0;
  for (std::size_t i = 0; i < b.rows.size(); ++i)
    worst = std::max(worst, std::abs(double(a.rows[i]) - b.rows[i]) / std::max(1e-3, std::abs(double(b.rows[i]))));
  INFO("max relative error " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("a lookup beyond a replica's capacity throws on every rank", "[allgatherv][dynamic]") {
  const auto& ctx = test::world();
  std::vector<std::uint64_t> keys;
  if (ctx.rank() == ctx.size() - 1)
    for (std::uint64_t k = 0; k < 5; ++k) keys.push_back(k);
  const std::string what = over_capacity_error<px::arch::AllReduce>(keys);
  INFO(what);
  CHECK(what.find("dynamic variable 'emb'") != std::string::npos);
  CHECK(what.find("capacity of 4 rows") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
}

TEST_CASE("a wrong-width dynamic gradient under AllGatherv throws on every rank", "[allgatherv][dynamic]") {
  check_wrong_width<px::arch::AllReduce>();
}

TEST_CASE("checkpoints of replicated dynamic tables restore at 1-N ranks under AllGatherv and DynamicPS alike",
          "[allgatherv][dynamic][checkpoint]") {
  const int n = test::world().size(), me = test::world().rank();
  const px::optim::Adagrad opt{0.3f};
  px::Context single(MPI_COMM_SELF);
  Model<px::arch::Hybrid, px::optim::Adagrad> ref(single, opt, 1000, false);
  ref.run(1, 3);
  const auto at3 = ref.table();
  const auto read_after = ref.run(4, 5);
  const auto at5 = ref.table();
  const auto w5 = ref.trainer.fetch(ref.w);
  const int saving = std::min(n, 2);

  // Saved by `Saver` at `saving` ranks, restored by `Restorer` at 1-N.
  auto round_trip = [&](auto saver, auto restorer) {
    using Saver = typename decltype(saver)::type;
    using Restorer = typename decltype(restorer)::type;
    const test::TempDir dir("parallax_allgatherv_dynamic_ckpt");
    on_first(saving, [&](px::Context& ctx) {
      Model<Saver, px::optim::Adagrad> a(ctx, opt, 1000, false);
      a.run(1, 3);
      a.trainer.save(dir.path);
    });
    MPI_Barrier(MPI_COMM_WORLD);
    const auto saved = px::latest_checkpoint(dir.path);
    REQUIRE(saved);
    for (int m = 1; m <= n; ++m)
      on_first(m, [&](px::Context& ctx) {
        INFO(Saver::name << " at " << saving << " ranks, restored by " << Restorer::name << " at " << m);
        Model<Restorer, px::optim::Adagrad> b(ctx, opt, 1000, false);
        b.run(1, 1);  // rows that the restore replaces
        b.trainer.restore(saved->path);
        const bool replica = std::is_same_v<typename Model<Restorer, px::optim::Adagrad>::Policy, px::AllGatherv>;
        check_same(b.table(), replica ? at3 : px::dynamic::owned_share(at3, me, m));
        CHECK(same_bits(b.run(4, 5), rows_of_block(read_after, me, m)));
        check_same(b.table(), replica ? at5 : px::dynamic::owned_share(at5, me, m));
        CHECK(same_bits(b.trainer.fetch(b.w), w5));
      });
    MPI_Barrier(MPI_COMM_WORLD);
  };
  using AR = std::common_type<px::arch::AllReduce>;
  using HY = std::common_type<px::arch::Hybrid>;
  SECTION("AllGatherv to AllGatherv") { round_trip(AR{}, AR{}); }
  SECTION("AllGatherv to DynamicPS") { round_trip(AR{}, HY{}); }
  SECTION("DynamicPS to AllGatherv") { round_trip(HY{}, AR{}); }
}

TEST_CASE("AllGatherv's synchronizer saves and restores a dynamic variable alone", "[allgatherv][dynamic]") {
  const auto& ctx = test::world();
  const px::optim::Adagrad opt{0.3f};
  const test::TempDir dir("parallax_allgatherv_dynamic_alone");
  Model<px::arch::AllReduce, px::optim::Adagrad> a(ctx, opt, 16, true);
  a.run(1, 3);
  a.sync().save(a.emb, dir.path + "/emb");
  Model<px::arch::AllReduce, px::optim::Adagrad> b(ctx, opt, 16, true);
  b.sync().restore(b.emb, dir.path + "/emb");
  check_same(b.table(), a.table());
  // A replica smaller than the saved keys is refused on every rank, and keeps its rows.
  Model<px::arch::AllReduce, px::optim::Adagrad> c(ctx, opt, 4, true);
  std::string what;
  try {
    c.sync().restore(c.emb, dir.path + "/emb");
  } catch (const px::error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("a replica's capacity is 4 rows") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
  CHECK(c.table().keys.empty());
}
