// Bags pooled at the owner (ShardedPS) and where they were looked up
// (AllGatherv): at 1-4 ranks the pooled rows and the updates their
// gradients make equal one process's pooling of plain rows of the same
// global batch (within 1e-5) and are bit-identical across reruns; a
// route carries one row per (bag, owner) pair each way, with exact bytes;
// a bad request or gradient throws one message on every rank.
#include "support.hpp"

#include <cmath>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Engine = px::engine::Mpi;
using Var = px::Variable<px::Sparse, float>;
using Sharded = px::policy::ShardedSynchronizer<Engine, px::optim::Sgd>;
using Gathered = px::policy::GatherSynchronizer<Engine, px::optim::Sgd>;
constexpr std::size_t R = 37, C = 5;
constexpr std::size_t G = 23;  // bags in the global batch
constexpr float lr = 0.5f;

// Global bag b: 0 to 7 ids (bag 4 and every ninth: none), repeats inside a
// bag and rows shared between bags.
std::vector<px::index_t> global_bag(std::size_t b) {
  const std::size_t k = b % 9 == 4 ? 0 : 1 + (b * 5) % 7;
  std::vector<px::index_t> ids;
  for (std::size_t j = 0; j < k; ++j) ids.push_back(static_cast<px::index_t>((b * 7 + 3 * (j % 4)) % R));
  return ids;
}
float weight_of(std::size_t b, std::size_t j) { return 0.5f + 0.25f * static_cast<float>((b + j) % 5); }
float grad_of(std::size_t b, std::size_t c) { return 0.01f * static_cast<float>(b + 1) - 0.003f * static_cast<float>(c); }

// This rank's share of the global batch: bags b with b % n == rank, in order.
struct Share {
  std::vector<std::size_t> bags;  // global numbers
  std::vector<px::index_t> offsets{0}, ids;
  std::vector<float> weights, grads;
};
Share share_of(int rank, int n) {
  Share s;
  for (std::size_t b = static_cast<std::size_t>(rank); b < G; b += static_cast<std::size_t>(n)) {
    const auto ids = global_bag(b);
    s.bags.push_back(b);
    for (std::size_t j = 0; j < ids.size(); ++j) {
      s.ids.push_back(ids[j]);
      s.weights.push_back(weight_of(b, j));
    }
    s.offsets.push_back(static_cast<px::index_t>(s.ids.size()));
    for (std::size_t c = 0; c < C; ++c) s.grads.push_back(grad_of(b, c));
  }
  return s;
}

// One process's pooling of plain rows (`table`: the whole variable), and the
// table after SGD on the gradients the pooled rows give back, in double.
std::vector<double> pooled_reference(const std::vector<float>& table, std::size_t b, px::Combiner combiner) {
  const auto ids = global_bag(b);
  std::vector<double> out(C, 0.0);
  for (std::size_t j = 0; j < ids.size(); ++j)
    for (std::size_t c = 0; c < C; ++c)
      out[c] += (combiner == px::Combiner::weighted_sum ? weight_of(b, j) : 1.0) *
                table[static_cast<std::size_t>(ids[j]) * C + c];
  if (combiner == px::Combiner::mean && !ids.empty())
    for (auto& x : out) x /= static_cast<double>(ids.size());
  return out;
}
std::vector<double> updated_reference(const std::vector<float>& table, px::Combiner combiner) {
  std::vector<double> out(table.begin(), table.end());
  for (std::size_t b = 0; b < G; ++b) {
    const auto ids = global_bag(b);
    for (std::size_t j = 0; j < ids.size(); ++j)
      for (std::size_t c = 0; c < C; ++c) {
        double g = grad_of(b, c);
        if (combiner == px::Combiner::mean) g /= static_cast<double>(ids.size());
        if (combiner == px::Combiner::weighted_sum) g *= weight_of(b, j);
        out[static_cast<std::size_t>(ids[j]) * C + c] -= lr * g;
      }
  }
  return out;
}

// The phases of a step, as a trainer calls them.
template <class S>
void take_step(S& sync) {
  const px::policy::StepInfo info{1, 1.0};
  sync.start_exchange(info);
  sync.finish_exchange(info);
  sync.update(info);
  sync.clear();
}

struct Outcome {
  std::vector<float> before, pooled, after;  // the table, this rank's pooled rows, the table after the step
};

// A step of bags through synchronizer S: lookup_bags, bag_gradients, the
// step's phases; the table fetched before and after.
template <class S>
Outcome run(px::Combiner combiner, px::TrainerOptions o = {}, px::Pooling pooling = px::Pooling::owner) {
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  // Made as a trainer makes it: the common settings, and ShardedPS its own.
  auto made = [&] {
    if constexpr (std::is_same_v<S, Sharded>) return std::make_unique<S>(mpi, opt, o, o.sharded);
    else return std::make_unique<S>(mpi, opt, o);
  }();
  S& sync = *made;
  Var emb(ctx, "emb", {R, C}, px::init::Uniform{-1.f, 1.f, 7});
  px::policy::Member& member = sync.add(emb);
  sync.prepare();
  Outcome out;
  out.before.resize(R * C);
  member.fetch(out.before.data());
  const Share s = share_of(mpi.rank(), mpi.size());
  const std::vector<float> none;
  px::Bags<Var> request(emb, s.offsets, s.ids, combiner, combiner == px::Combiner::weighted_sum ? s.weights : none);
  request.pooled_at(pooling);
  const auto rows = sync.lookup_bags(&request, 1);
  REQUIRE(rows.size() == 1);
  REQUIRE(rows[0].rows == s.bags.size());
  REQUIRE(rows[0].cols == C);
  out.pooled = test::to_host(rows[0]);
  const px::BagGradient<Var> grad(emb, s.grads);
  sync.bag_gradients(&grad, 1);
  REQUIRE(sync.has_gradient());
  take_step(sync);
  out.after.resize(R * C);
  member.fetch(out.after.data());
  return out;
}

template <class S>
void check_against_one_process(px::Combiner combiner, px::TrainerOptions o = {},
                               px::Pooling pooling = px::Pooling::owner) {
  const Outcome a = run<S>(combiner, o, pooling);
  const int n = test::world().size(), me = test::world().rank();
  const Share s = share_of(me, n);
  double worst = 0;
  for (std::size_t i = 0; i < s.bags.size(); ++i) {
    const auto want = pooled_reference(a.before, s.bags[i], combiner);
    for (std::size_t c = 0; c < C; ++c) worst = std::max(worst, std::abs(a.pooled[i * C + c] - want[c]));
  }
  INFO("combiner " << px::to_string(combiner) << ": worst pooled difference " << worst);
  CHECK(test::all_ranks(worst <= 1e-5));
  const auto want = updated_reference(a.before, combiner);
  double worst_update = 0;
  for (std::size_t i = 0; i < R * C; ++i) worst_update = std::max(worst_update, std::abs(a.after[i] - want[i]));
  INFO("worst updated difference " << worst_update);
  CHECK(test::all_ranks(worst_update <= 1e-5));
  CHECK(test::same_bits_everywhere(a.after));
  // Again, from scratch: the same bits.
  const Outcome b = run<S>(combiner, o, pooling);
  CHECK(test::all_ranks(std::memcmp(a.pooled.data(), b.pooled.data(), a.pooled.size() * sizeof(float)) == 0 &&
                        std::memcmp(a.after.data(), b.after.data(), a.after.size() * sizeof(float)) == 0));
}

}  // namespace

TEST_CASE("ShardedPS pools bags at the owners as one process pools plain rows", "[policy][sharded_ps][bags]") {
  const auto combiner = GENERATE(px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum);
  px::TrainerOptions o;
  o.sharded.shared_memory = GENERATE(true, false);
  const auto pooling = GENERATE(px::Pooling::owner, px::Pooling::local, px::Pooling::automatic);
  INFO("pooling " << px::to_string(pooling));
  check_against_one_process<Sharded>(combiner, o, pooling);
}

TEST_CASE("AllGatherv pools bags where they were looked up as one process does", "[policy][allgatherv][bags]") {
  const auto combiner = GENERATE(px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum);
  check_against_one_process<Gathered>(combiner);
}

TEST_CASE("ShardedPS: several tables and requests in one batch, pooled at the owners and here, and plain rows too",
          "[policy][sharded_ps][bags]") {
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  Sharded sync(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
  Var a(ctx, "a", {R, C}, px::init::Uniform{-1.f, 1.f, 1}), b(ctx, "b", {11, C}, px::init::Uniform{-1.f, 1.f, 2});
  px::policy::Member& ma = sync.add(a);
  px::policy::Member& mb = sync.add(b);
  sync.prepare();
  std::vector<float> ta(R * C), tb(11 * C);
  ma.fetch(ta.data());
  mb.fetch(tb.data());
  const int me = mpi.rank();
  // Table a twice (sum, then mean) and b once (weighted); the last request is empty on rank 1.
  const std::vector<px::index_t> oa{0, 2, 2, 5}, ia{1, 1, static_cast<px::index_t>(me), 36, 0};
  const std::vector<px::index_t> ob = me == 1 ? std::vector<px::index_t>{0} : std::vector<px::index_t>{0, 3, 4};
  const std::vector<px::index_t> ib = me == 1 ? std::vector<px::index_t>{} : std::vector<px::index_t>{10, 4, 10, 9};
  const std::vector<float> wb = me == 1 ? std::vector<float>{} : std::vector<float>{2.f, -1.f, 0.5f, 3.f};
  // Pooled at the owners, as the bytes say, and here: one batch.
  const std::vector<px::Bags<Var>> batch{px::Bags<Var>(a, oa, ia).pooled_at(px::Pooling::owner),
                                         px::Bags<Var>(b, ob, ib, px::Combiner::weighted_sum, wb),
                                         px::Bags<Var>(a, oa, ia, px::Combiner::mean).pooled_at(px::Pooling::local)};
  const auto rows = sync.lookup_bags(batch.data(), batch.size());
  REQUIRE(rows.size() == 3);
  bool exact = true;
  auto expect = [&](const std::vector<float>& t, const std::vector<px::index_t>& off, const std::vector<px::index_t>& ids,
                    const std::vector<float>& w, bool mean, const px::Rows<float, px::HostSpace>& got) {
    REQUIRE(got.rows == off.size() - 1);
    for (std::size_t bag = 0; bag + 1 < off.size(); ++bag)
      for (std::size_t c = 0; c < C; ++c) {
        double want = 0;
        for (auto j = off[bag]; j < off[bag + 1]; ++j)
          want += (w.empty() ? 1.0 : w[static_cast<std::size_t>(j)]) * t[static_cast<std::size_t>(ids[static_cast<std::size_t>(j)]) * C + c];
        const auto k = off[bag + 1] - off[bag];
        if (mean && k) want /= static_cast<double>(k);
        exact = exact && std::abs(got.data[bag * C + c] - want) <= 1e-5;
      }
  };
  expect(ta, oa, ia, {}, false, rows[0]);
  expect(tb, ob, ib, wb, false, rows[1]);
  expect(ta, oa, ia, {}, true, rows[2]);
  CHECK(test::all_ranks(exact));
  // Gradients of the bags, and a plain row of a besides: all summed at a's owners.
  std::vector<float> ga(3 * C, 1.f), gb((ob.size() - 1) * C, 2.f), gm(3 * C, 3.f);
  const std::vector<px::BagGradient<Var>> grads{px::BagGradient<Var>(a, ga), px::BagGradient<Var>(b, gb),
                                                px::BagGradient<Var>(a, gm)};
  sync.bag_gradients(grads.data(), grads.size());
  a.grad().add(std::vector<px::index_t>{7}, std::vector<float>(C, 4.f));
  take_step(sync);
  std::vector<float> ua(R * C), ub(11 * C);
  ma.fetch(ua.data());
  mb.fetch(ub.data());
  // Every rank gave the same bags of a (ia, but for its own rank's id) and,
  // but rank 1, of b.
  const int n = mpi.size();
  std::vector<double> wa(ta.begin(), ta.end()), wbt(tb.begin(), tb.end());
  for (int r = 0; r < n; ++r) {
    const std::vector<px::index_t> ir{1, 1, static_cast<px::index_t>(r), 36, 0};
    for (std::size_t bag = 0; bag < 3; ++bag)
      for (auto j = oa[bag]; j < oa[bag + 1]; ++j)
        for (std::size_t c = 0; c < C; ++c) {
          const auto row = static_cast<std::size_t>(ir[static_cast<std::size_t>(j)]);
          wa[row * C + c] -= lr * (1.0 + 3.0 / static_cast<double>(oa[bag + 1] - oa[bag]));
        }
    for (std::size_t c = 0; c < C; ++c) wa[7 * C + c] -= lr * 4.0;
    if (r == 1) continue;
    const std::vector<px::index_t> obr{0, 3, 4}, ibr{10, 4, 10, 9};
    const std::vector<float> wbr{2.f, -1.f, 0.5f, 3.f};
    for (std::size_t bag = 0; bag < 2; ++bag)
      for (auto j = obr[bag]; j < obr[bag + 1]; ++j)
        for (std::size_t c = 0; c < C; ++c)
          wbt[static_cast<std::size_t>(ibr[static_cast<std::size_t>(j)]) * C + c] -= lr * 2.0 * wbr[static_cast<std::size_t>(j)];
  }
  double worst = 0;
  for (std::size_t i = 0; i < ua.size(); ++i) worst = std::max(worst, std::abs(ua[i] - wa[i]));
  for (std::size_t i = 0; i < ub.size(); ++i) worst = std::max(worst, std::abs(ub[i] - wbt[i]));
  INFO("worst difference " << worst);
  CHECK(test::all_ranks(worst <= 1e-5));
}

// Tables stored in float or bf16 (rows pooled in float either way), with
// exchanges compressed or not: compressed, the replies and gradient rows
// travel in 2 bytes a value and the ids and counts in 4 bytes.
TEMPLATE_TEST_CASE("ShardedPS: a bag lookup carries one row per (bag, owner) each way, with exact bytes",
                   "[policy][sharded_ps][bags]", float, px::bf16) {
  using Table = px::Variable<px::Sparse, TestType>;
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  const auto compress = GENERATE(px::Compression::none, px::Compression::bf16);
  px::TrainerOptions o;
  o.compress = compress;
  Sharded sync(mpi, opt, o, o.sharded);
  Table emb(ctx, "emb", {R, C}, px::init::Uniform{-1.f, 1.f, 7});
  sync.add(emb);
  sync.prepare();
  const int n = mpi.size(), me = mpi.rank();
  const bool weighted = GENERATE(false, true);
  INFO("compress " << (compress == px::Compression::none ? "none" : "bf16") << ", weighted " << weighted);
  const px::PartitionMap map(R, n, n);
  const Share s = share_of(me, n);
  const std::vector<float> none;
  px::Bags<Table> request(emb, s.offsets, s.ids, weighted ? px::Combiner::weighted_sum : px::Combiner::sum,
                          weighted ? s.weights : none);
  request.pooled_at(px::Pooling::owner);
  // Ids and (bag, owner) pairs rank r sends rank p.
  auto counts = [&](int r, int p, std::uint64_t& ids, std::uint64_t& pairs) {
    ids = pairs = 0;
    for (std::size_t b = static_cast<std::size_t>(r); b < G; b += static_cast<std::size_t>(n)) {
      bool any = false;
      for (auto id : global_bag(b))
        if (map.owner(id) == p) {
          ++ids;
          any = true;
        }
      pairs += any;
    }
  };
  auto pad8 = [](std::uint64_t x) { return (x + 7) / 8 * 8; };
  const bool packed = compress != px::Compression::none;
  const std::uint64_t id = packed ? 4 : 8, value = packed ? 2 : 4;  // an id, a row's value
  const std::uint64_t count = 4;  // a segment's count: 4 bytes with float rows, compressed or not
  const std::uint64_t id_bytes = id + (weighted ? 4 : 0);  // the weight is a float either way
  std::uint64_t sent = 0, recv = 0, push_sent = 0, push_recv = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    std::uint64_t ids_to, pairs_to, ids_from, pairs_from;
    counts(me, p, ids_to, pairs_to);
    counts(p, me, ids_from, pairs_from);
    // The route: a header of 4 words (shape, rest, a count per lane), the
    // ids (and weights), a count per pair; the reply: a row per pair.
    sent += 32 + pad8(id_bytes * ids_to) + pad8(count * pairs_to) + value * C * pairs_from;
    recv += 32 + pad8(id_bytes * ids_from) + pad8(count * pairs_from) + value * C * pairs_to;
    // The gradients: a header of 3 words and a row per pair (no ids: the
    // owner knows the pairs from the route).
    push_sent += 24 + pad8(value * C * pairs_to);
    push_recv += 24 + pad8(value * C * pairs_from);
  }
  mpi.stats().reset();
  sync.lookup_bags(&request, 1);
  const auto t = mpi.stats().policy("ShardedPS");
  CHECK(t.sent() == sent);
  CHECK(t.received() == recv);
  CHECK(mpi.stats().total().calls == 2);  // the route (which carries the check), the reply
  mpi.stats().reset();
  const px::BagGradient<Table> grad(emb, s.grads);
  sync.bag_gradients(&grad, 1);
  const auto g = mpi.stats().policy("ShardedPS");
  CHECK(g.sent() == push_sent);
  CHECK(g.received() == push_recv);
  CHECK(mpi.stats().total().calls == 1);  // the route, which carries the check
  sync.clear();
}

TEST_CASE("bad bags and gradients throw one message on every rank", "[policy][sharded_ps][allgatherv][bags][errors]") {
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  const int n = mpi.size(), me = mpi.rank(), odd = n - 1;
  const bool sharded = GENERATE(true, false);
  Sharded s1(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
  Gathered s2(mpi, opt, px::TrainerOptions{});
  Var emb(ctx, "emb", {R, C});
  if (sharded) s1.add(emb);
  else s2.add(emb);
  if (sharded) s1.prepare();
  auto lookup = [&](const px::Bags<Var>& q) {
    if (sharded) s1.lookup_bags(&q, 1);
    else s2.lookup_bags(&q, 1);
  };
  const std::vector<px::index_t> offsets{0, 2, 3}, ids{1, 2, 3};
  const std::vector<float> w{1.f, 2.f, 3.f};
  struct Case {
    std::vector<px::index_t> offsets, ids;
    px::Combiner combiner;
    std::vector<float> weights;
    std::string message;
  };
  const std::string at = "rank " + std::to_string(odd) + ": bags of variable 'emb': ";
  const std::vector<Case> cases{
      {{}, ids, px::Combiner::sum, {}, "no offsets: give one per bag and one more (the first 0, the last the number of ids)"},
      {{1, 2, 3}, ids, px::Combiner::sum, {}, "the offsets start at 1, not 0"},
      {{0, 2, 1, 3}, ids, px::Combiner::sum, {}, "the offsets are not ascending: offset 2 is 1, after 2"},
      {{0, 2}, ids, px::Combiner::sum, {}, "the offsets end at 2 but there are 3 ids"},
      {offsets, {1, 40, 3}, px::Combiner::mean, {}, "id 40 (entry 1, bag 0) is outside [0, 37)"},
      {offsets, {1, 2, -1}, px::Combiner::sum, {}, "id -1 (entry 2, bag 1) is outside [0, 37)"},
      {offsets, ids, px::Combiner::weighted_sum, {}, "combiner weighted_sum needs a weight per id; none were given"},
      {offsets, ids, px::Combiner::mean, w, "weights were given with combiner mean (they are for weighted_sum)"},
  };
  // Pooled at the owners, the check travels in the route; otherwise it is
  // agreed on first. The words are the same.
  for (const px::Pooling pooling : {px::Pooling::automatic, px::Pooling::owner})
    for (const Case& c : cases) {
      // Only the last rank's request is bad.
      px::Bags<Var> q = me == odd ? px::Bags<Var>(emb, c.offsets, c.ids, c.combiner, c.weights)
                                  : px::Bags<Var>(emb, offsets, ids);
      q.pooled_at(pooling);
      const std::string msg = test::error_of([&] { lookup(q); });
      INFO(msg << (pooling == px::Pooling::owner ? " (at the owners)" : " (automatic)"));
      CHECK(msg == at + c.message);
      CHECK(test::same_on_every_rank(msg));
    }
  // A gradient of the wrong shape, and one for no lookup.
  px::Bags<Var> good(emb, offsets, ids);
  good.pooled_at(GENERATE(px::Pooling::automatic, px::Pooling::owner, px::Pooling::local));
  lookup(good);
  std::vector<float> g(me == odd ? 3 * C : 2 * C, 1.f);
  const px::BagGradient<Var> grad(emb, g);
  const std::string msg = test::error_of([&] {
    if (sharded) s1.bag_gradients(&grad, 1);
    else s2.bag_gradients(&grad, 1);
  });
  CHECK(msg == "rank " + std::to_string(odd) +
                   ": gradient of the bags of variable 'emb' has 3 x 5 values; the lookup pooled 2 bags of 5 columns");
  CHECK(test::same_on_every_rank(msg));
  if (sharded) s1.clear();
  else s2.clear();
  const std::vector<float> g2(2 * C, 1.f);
  const px::BagGradient<Var> late(emb, g2);
  const std::string none = test::error_of([&] {
    if (sharded) s1.bag_gradients(&late, 1);
    else s2.bag_gradients(&late, 1);
  });
  CHECK(none == "rank 0: gradient of the bags of variable 'emb': no lookup of its bags awaits a gradient this "
                "step");
  CHECK(test::same_on_every_rank(none));
}

TEST_CASE("ranks that pool other variables or combiners all throw one message naming them", "[policy][sharded_ps][bags][errors][np2+]") {
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  Sharded sync(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
  Var emb(ctx, "emb", {R, C});
  sync.add(emb);
  sync.prepare();
  const int odd = mpi.size() - 1;
  const std::vector<px::index_t> offsets{0, 1}, ids{3};
  // Pooled at the owners: the route names what each rank carried.
  px::Bags<Var> q(emb, offsets, ids, mpi.rank() == odd ? px::Combiner::mean : px::Combiner::sum);
  q.pooled_at(px::Pooling::owner);
  const std::string msg = test::error_of([&] { sync.lookup_bags(&q, 1); });
  INFO(msg);
  CHECK(msg.find("parallax: ranks make different batched lookups: ") == 0);
  CHECK(msg.find(": bags of 'emb' (sum); rank " + std::to_string(odd) + ": bags of 'emb' (mean).") != std::string::npos);
  CHECK(test::same_on_every_rank(msg));
  // Pooling::automatic: the ranks compare their batches before they weigh them.
  q.pooled_at(px::Pooling::automatic);
  const std::string automatic = test::error_of([&] { sync.lookup_bags(&q, 1); });
  CHECK(automatic ==
        "parallax: ranks make different batched lookups of bags: every rank must look up the same sparse variables, "
        "with the same combiners and pooling, in the same order, in each batch (the ids may differ, and may be none)");
  CHECK(test::same_on_every_rank(automatic));
  // In step again.
  const px::Bags<Var> same(emb, offsets, ids, px::Combiner::mean);
  CHECK(sync.lookup_bags(&same, 1)[0].rows == 1);
  sync.clear();
}

// Pooling::automatic: whichever moves fewer bytes in the step (lookup, bag
// gradients, push), over every rank. Wide rows and bags of many distinct
// ids: at the owners; bags of one id among few: here.
TEST_CASE("ShardedPS: automatic pooling picks what moves fewer bytes", "[policy][sharded_ps][bags][np2+]") {
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  const bool wide = GENERATE(true, false);
  const std::size_t rows = 1000, cols = wide ? 64 : 2, bags = 40;
  std::vector<px::index_t> offsets{0}, ids;
  for (std::size_t b = 0; b < bags; ++b) {
    const std::size_t k = wide ? 20 : 1;
    for (std::size_t j = 0; j < k; ++j)
      ids.push_back(static_cast<px::index_t>(wide ? (b * 37 + j * 11 + static_cast<std::size_t>(ctx.rank())) % rows : b % 3));
    offsets.push_back(static_cast<px::index_t>(ids.size()));
  }
  const std::vector<float> grads(bags * cols, 0.5f);
  auto step_bytes = [&](px::Pooling pooling) {
    Engine mpi(ctx);
    const px::optim::Sgd opt{lr};
    Sharded sync(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
    Var emb(ctx, "emb", {rows, cols});
    sync.add(emb);
    sync.prepare();
    mpi.stats().reset();
    px::Bags q{emb, offsets, ids};  // CTAD, as the tutorial writes it
    q.pooled_at(pooling);
    sync.lookup_bags(&q, 1);
    const px::BagGradient g{emb, grads};
    sync.bag_gradients(&g, 1);
    take_step(sync);
    std::uint64_t sent = mpi.stats().policy("ShardedPS").sent();
    MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return sent;
  };
  const auto owner = step_bytes(px::Pooling::owner), local = step_bytes(px::Pooling::local),
             automatic = step_bytes(px::Pooling::automatic);
  INFO("bytes sent over all ranks: at the owners " << owner << ", here " << local << ", automatic " << automatic);
  CHECK((wide ? owner < local : local < owner));
  CHECK(automatic == std::min(owner, local));
}

// Pooling::automatic chooses per request, from this batch: in one batch a
// table whose bags are long runs of distinct ids pools at the owners while
// one whose bags are single ids among few rows pools here, and when the
// next batch swaps the two kinds of bags between the tables, the choices
// swap with them. Each choice is seen in the bytes: automatic moves exactly
// what the per-table choice written out by hand moves, and less than either
// pooling for both tables.
TEST_CASE("ShardedPS: automatic pooling chooses per table, from each batch", "[policy][sharded_ps][bags][np2+]") {
  if (test::skip_below_ranks(2)) return;
  auto& ctx = test::world();
  constexpr std::size_t rows = 1000, cols = 16, bags = 40;
  struct Request {
    std::vector<px::index_t> offsets{0}, ids;
  };
  auto bags_of = [&](bool spread) {  // spread: 20 distinct ids a bag; else 1 id among 3 rows
    Request q;
    for (std::size_t b = 0; b < bags; ++b) {
      for (std::size_t j = 0; j < (spread ? 20u : 1u); ++j)
        q.ids.push_back(static_cast<px::index_t>(
            spread ? (b * 37 + j * 11 + static_cast<std::size_t>(ctx.rank()) * 401) % rows : b % 3));
      q.offsets.push_back(static_cast<px::index_t>(q.ids.size()));
    }
    return q;
  };
  const std::vector<float> grads(bags * cols, 0.5f);
  const bool a_spread = GENERATE(true, false);  // the batch: table a's bags spread, b's shared, or swapped
  const Request qa = bags_of(a_spread), qb = bags_of(!a_spread);
  auto step_bytes = [&](px::Pooling pa, px::Pooling pb) {
    Engine mpi(ctx);
    const px::optim::Sgd opt{lr};
    Sharded sync(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
    Var a(ctx, "a", {rows, cols}), b(ctx, "b", {rows, cols});
    sync.add(a);
    sync.add(b);
    sync.prepare();
    mpi.stats().reset();
    std::vector<px::Bags<Var>> batch{px::Bags<Var>(a, qa.offsets, qa.ids), px::Bags<Var>(b, qb.offsets, qb.ids)};
    batch[0].pooled_at(pa);
    batch[1].pooled_at(pb);
    sync.lookup_bags(batch.data(), batch.size());
    const std::vector<px::BagGradient<Var>> g{px::BagGradient<Var>(a, grads), px::BagGradient<Var>(b, grads)};
    sync.bag_gradients(g.data(), g.size());
    take_step(sync);
    std::uint64_t sent = mpi.stats().policy("ShardedPS").sent();
    MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    return sent;
  };
  using P = px::Pooling;
  const P want_a = a_spread ? P::owner : P::local, want_b = a_spread ? P::local : P::owner;
  const auto chosen = step_bytes(want_a, want_b), automatic = step_bytes(P::automatic, P::automatic),
             owners = step_bytes(P::owner, P::owner), here = step_bytes(P::local, P::local);
  INFO("table a's bags " << (a_spread ? "spread" : "shared") << "; bytes sent over all ranks: automatic "
                         << automatic << ", a " << px::to_string(want_a) << " and b " << px::to_string(want_b) << " "
                         << chosen << ", both at the owners " << owners << ", both here " << here);
  CHECK(automatic == chosen);
  CHECK(chosen < owners);
  CHECK(chosen < here);
}

// Which policies take bags, as a trainer would ask before forwarding.
static_assert(px::policy::looks_up_bags_v<px::ShardedPS, Var, Engine, px::optim::Sgd>);
static_assert(px::policy::looks_up_bags_v<px::AllGatherv, Var, Engine, px::optim::Sgd>);
static_assert(px::policy::looks_up_bags_v<px::AsyncPS, Var, Engine, px::optim::Sgd>);

// The tutorial's bags (docs/tutorial.md, "Multi-hot features: bags"),
// pooled at the owners, here, and as AllGatherv does: the same rows.
TEST_CASE("the tutorial's bags pool as it says", "[policy][sharded_ps][allgatherv][bags]") {
  auto& ctx = test::world();
  Engine mpi(ctx);
  const px::optim::Sgd opt{lr};
  const auto pooling = GENERATE(px::Pooling::owner, px::Pooling::local, px::Pooling::automatic);
  const bool gathered = GENERATE(false, true);
  Sharded sharded(mpi, opt, px::TrainerOptions{}, px::TrainerOptions{}.sharded);
  Gathered replicas(mpi, opt, px::TrainerOptions{});
  Var items(ctx, "items", {10, C}, px::init::Uniform{-1.f, 1.f, 3});
  px::policy::Member& member = gathered ? replicas.add(items) : sharded.add(items);
  sharded.prepare();
  std::vector<float> table(10 * C);
  member.fetch(table.data());
  // example-begin bags_request
  // Sample 0 clicked items 3 and 9, sample 1 nothing, sample 2 item 3 twice.
  std::vector<px::index_t> offsets{0, 2, 2, 4}, ids{3, 9, 3, 3};
  px::Bags clicks{items, offsets, ids, px::Combiner::mean};
  // example-end
  clicks.pooled_at(pooling);
  const auto rows = gathered ? replicas.lookup_bags(&clicks, 1) : sharded.lookup_bags(&clicks, 1);
  const auto got = test::to_host(rows[0]);
  bool ok = rows[0].rows == 3;
  for (std::size_t c = 0; c < C; ++c) {
    ok = ok && std::abs(got[c] - (table[3 * C + c] + table[9 * C + c]) / 2) <= 1e-6f;
    ok = ok && got[C + c] == 0.f && std::abs(got[2 * C + c] - table[3 * C + c]) <= 1e-6f;
  }
  CHECK(test::all_ranks(ok));
}
