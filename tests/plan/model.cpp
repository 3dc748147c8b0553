// plan/model.hpp: the bytes plan::Model predicts for a step equal, exactly,
// what a Trainer's engine books (CommStats) for each variable, per rank,
// intra and inter host, under every architecture, with the job as one host
// and as one host per rank; and the times and choice behave as the model says.
#include "support.hpp"

#include <parallax/plan/model.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr std::size_t kRows = 97, kCols = 6, kDenseRows = 13, kDenseCols = 5;

/// Rank r's ids of one step: distinct, unevenly spread over the owners, and
/// overlapping the other ranks'.
std::vector<px::index_t> ids_of(int r) {
  std::vector<px::index_t> ids;
  for (std::size_t j = 0; j < 9 + 4 * static_cast<std::size_t>(r); ++j)
    ids.push_back(static_cast<px::index_t>((j * (3 + r) + 7 * r) % kRows));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

/// One step of a sparse and a dense variable; the engine's bytes per variable.
template <class Arch>
std::pair<px::Traffic, px::Traffic> measured(px::Context& ctx, int partitions, bool* shared) {
  px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kCols});
  px::Variable<px::Dense, float> w(ctx, "w", {kDenseRows, kDenseCols});
  px::TrainerOptions o;
  o.sharded.partitions = partitions;
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, emb, w);
  *shared = trainer.in_shared_memory(emb);
  const auto ids = ids_of(ctx.rank());
  trainer.lookup(emb, ids);
  emb.grad().add(ids, std::vector<float>(ids.size() * kCols, 1.f));
  for (std::size_t i = 0; i < kDenseRows * kDenseCols; ++i) w.grad()[i] = 1.f;
  trainer.step();
  return {trainer.stats().variable("emb"), trainer.stats().variable("w")};
}

px::plan::Cluster cluster_of(const px::Context& ctx, int per_host) {
  px::plan::Cluster c;
  c.ranks_per_host = per_host;
  c.hosts = ctx.size() / per_host;
  return c;
}

bool same_bytes(const px::Traffic& a, const px::Traffic& b) {
  return a.sent_intra == b.sent_intra && a.sent_inter == b.sent_inter && a.recv_intra == b.recv_intra &&
         a.recv_inter == b.recv_inter;
}

template <class Arch>
void check_bytes(int per_host, int partitions, bool check_sparse = true) {
  auto& ctx = test::hosts_of(per_host);
  bool shared = false;
  const auto [emb, w] = measured<Arch>(ctx, partitions, &shared);
  auto sparse = px::plan::Variable::sparse_of("emb", kRows, kCols);
  sparse.partitions = partitions;
  for (int r = 0; r < ctx.size(); ++r) sparse.ids.push_back(ids_of(r));
  auto dense = px::plan::Variable::dense_of("w", kDenseRows, kDenseCols);
  dense.partitions = partitions;  // TrainerOptions::sharded.partitions: arch::PS's dense shards too
  const auto cluster = cluster_of(ctx, per_host);
  const auto me = static_cast<std::size_t>(ctx.rank());
  const px::Traffic predicted_emb = px::plan::Model(cluster, {sparse}).estimate(Arch::name).bytes[me];
  const px::Traffic predicted_w = px::plan::Model(cluster, {dense}).estimate(Arch::name).bytes[me];
  INFO(Arch::name << ", " << per_host << " ranks per host, P " << partitions << ", rank " << me);
  INFO("emb measured sent " << emb.sent_intra << "/" << emb.sent_inter << " recv " << emb.recv_intra << "/"
                            << emb.recv_inter << "; predicted sent " << predicted_emb.sent_intra << "/"
                            << predicted_emb.sent_inter << " recv " << predicted_emb.recv_intra << "/"
                            << predicted_emb.recv_inter);
  INFO("w measured sent " << w.sent_intra << "/" << w.sent_inter << "; predicted " << predicted_w.sent_intra << "/"
                          << predicted_w.sent_inter);
  // The model assumes shared shards exactly where the library makes them.
  if (std::string(Arch::name) != "allreduce") REQUIRE(shared == (cluster.hosts == 1 && ctx.size() > 1));
  if (check_sparse) CHECK(test::all_ranks(same_bytes(emb, predicted_emb)));
  CHECK(test::all_ranks(same_bytes(w, predicted_w)));
}

}  // namespace

TEST_CASE("plan::Model's bytes equal the engine's, one host", "[plan][needs-shm]") {
  if (test::skip_without_shm_room()) return;
  const int n = test::world().size();
  for (int p : {0, 2 * n + 1}) {
    check_bytes<px::arch::Hybrid>(n, p);
    check_bytes<px::arch::AllReduce>(n, p);
    check_bytes<px::arch::PS>(n, p);
  }
}

TEST_CASE("plan::Model's bytes equal the engine's, one host per rank", "[plan]") {
  const int n = test::world().size();
  for (int p : {0, 2 * n + 1}) {
    check_bytes<px::arch::Hybrid>(1, p);
    check_bytes<px::arch::AllReduce>(1, p);
    check_bytes<px::arch::PS>(1, p);
  }
}

// Two hosts of two ranks: the hybrid's push sums a host's rows before they
// cross (local aggregation, two hops).
TEST_CASE("plan::Model's bytes equal the engine's, two hosts of two ranks", "[plan][np4+]") {
  if (test::skip_below_ranks(4)) return;
  if (test::world().size() != 4) return;
  for (int p : {0, 9}) {
    check_bytes<px::arch::Hybrid>(2, p);
    check_bytes<px::arch::AllReduce>(2, p);
    check_bytes<px::arch::PS>(2, p);
  }
}

TEST_CASE("plan::Model's times follow its links and pick the fastest", "[plan]") {
  // 4 hosts of 2 ranks; a 1M x 64 table, 20,000 rows touched per rank, and
  // a dense 4 MB variable.
  px::plan::Cluster c;
  c.hosts = 4;
  c.ranks_per_host = 2;
  c.inter = {1.25e9, 20e-6};
  const auto emb = px::plan::Variable::sparse_of("emb", 1000000, 64, 20000);
  const auto w = px::plan::Variable::dense_of("w", 1000, 1000);
  const px::plan::Model m(c, {emb, w});
  // A dense variable of fewer rows than ranks: arch::PS gives it one partition per row.
  CHECK(px::plan::Model(c, {px::plan::Variable::dense_of("b", 1, 16)}).estimate("ps").bytes[0].sent() > 0);
  const auto all = m.candidates();
  REQUIRE(all.size() == 3);
  // Sharding moves each touched row to its owner and back; gathering moves
  // it to all 7 others: the hybrid wins on a slow link.
  CHECK(px::plan::Model::best(all).arch == "hybrid");
  CHECK(all[1].comm_s > 2 * all[0].comm_s);
  // The dense ring alone, on an idle cluster: 2(N-1) latencies and 2(N-1)/N
  // of the 4 MB over the host link (one ring edge crosses each host's link).
  const px::plan::Model dense_only(c, {w});
  const double ring = 14 * 20e-6 + 2.0 * 7 / 8 * 4e6 / 1.25e9;
  CHECK(dense_only.estimate("hybrid").comm_s == Approx(ring).epsilon(1e-9));
  // Memory: the hybrid keeps an eighth of the table, all-reduce all of it.
  CHECK(all[1].memory_bytes > 7 * (all[0].memory_bytes - 2 * 4000000));
  // A partition sweep: hybrid and ps at each count, then allreduce.
  const auto sweep = m.candidates({8, 64, 512});
  REQUIRE(sweep.size() == 7);
  CHECK(sweep[2].arch == "hybrid");
  CHECK(sweep[2].partitions == 512);
  CHECK(sweep[6].arch == "allreduce");
  CHECK(px::plan::Model::best(sweep).arch != "allreduce");
  // Bad input names the field.
  CHECK_THAT(test::error_of([&] { px::plan::Model(c, {emb}).estimate("horovod"); }),
             Catch::Contains("unknown architecture 'horovod'"));
  px::plan::Variable bad = emb;
  bad.ids.assign(3, {});
  CHECK_THAT(test::error_of([&] { px::plan::Model(c, {bad}); }),
             Catch::Contains("'emb' has ids of 3 ranks") && Catch::Contains("has 8"));
}

namespace {
/// An architecture the library does not have, over built-in policies: dense
/// variables sharded (as arch::PS), sparse ones all-gathered (as
/// arch::AllReduce), written as it would be in arch.hpp (docs/tutorial.md,
/// "Adding an architecture", quotes it). The planner prices it with no
/// change of its own.
using px::AllGatherv;
using px::ShardedPS;
using px::Sparse;
// example-begin new_arch
/// Dense variables sharded, sparse ones all-gathered.
struct DensePS {
  static constexpr const char* name = "dense-ps";
  static constexpr const char* about = "dense variables sharded, sparse ones all-gathered";
  template <class Sparsity>
  using policy = std::conditional_t<std::is_same_v<Sparsity, Sparse>, AllGatherv, ShardedPS>;
};
// example-end
}  // namespace

TEST_CASE("plan::Model prices arch::all's architectures, and any other, by the policies they route to", "[plan]") {
  px::plan::Cluster c;
  c.hosts = 2;
  c.ranks_per_host = 2;
  const auto emb = px::plan::Variable::sparse_of("emb", 100000, 16, 500);
  const auto w = px::plan::Variable::dense_of("w", 300, 200);
  const px::plan::Model m(c, {emb, w});
  // One candidate per architecture of arch::all, in its order, each equal
  // to the estimate by type.
  const auto all = m.candidates();
  REQUIRE(all.size() == px::arch::all::size);
  std::size_t i = 0;
  px::arch::for_each(px::arch::all{}, [&](auto a) {
    using A = decltype(a);
    CHECK(all[i].arch == A::name);
    CHECK(all[i].comm_s == m.estimate<A>().comm_s);
    CHECK(all[i].busiest().sent() == m.estimate<A>().busiest().sent());
    ++i;
  });
  // The new architecture: its dense bytes are arch::PS's, its sparse bytes
  // arch::AllReduce's.
  const auto bytes = [](const px::plan::Estimate& e) {
    std::vector<std::uint64_t> b;
    for (const auto& t : e.bytes) b.insert(b.end(), {t.sent_intra, t.sent_inter, t.recv_intra, t.recv_inter});
    return b;
  };
  const px::plan::Model dense(c, {w}), sparse(c, {emb});
  CHECK(bytes(dense.estimate<DensePS>()) == bytes(dense.estimate("ps")));
  CHECK(bytes(dense.estimate<DensePS>()) != bytes(dense.estimate("hybrid")));
  CHECK(bytes(sparse.estimate<DensePS>()) == bytes(sparse.estimate("allreduce")));
  CHECK(bytes(sparse.estimate<DensePS>()) != bytes(sparse.estimate("ps")));
  CHECK(m.estimate<DensePS>().arch == "dense-ps");
  STATIC_REQUIRE(px::plan::priced<DensePS>());
  // A policy the planner has no model of is named, and such an architecture
  // is no candidate.
  STATIC_REQUIRE_FALSE(px::plan::priced<px::arch::Async>());
  CHECK_THAT(test::error_of([&] { m.estimate<px::arch::Async>(); }),
             Catch::Contains("'ps+async' routes dense variables to a policy the planner does not price"));
}

TEST_CASE("plan::Model: the tables of one group share ShardedPS's calls and their latencies", "[plan]") {
  // Links so fast that only latencies count: a group of 26 tables (as
  // 02_ctr's) moves in the calls of one table (ShardedOptions::group_tables),
  // so the hybrid pays the same latencies; AllGatherv moves each table in
  // calls of its own, so the all-reduce architecture pays 26 times as many.
  px::plan::Cluster c;
  c.hosts = 2;
  c.ranks_per_host = 2;
  c.intra = {1e30, 2e-6};
  c.inter = {1e30, 20e-6};
  const auto table = [](int k) { return px::plan::Variable::sparse_of("t" + std::to_string(k), 1000, 16, 64); };
  std::vector<px::plan::Variable> one{table(0)}, many;
  for (int k = 0; k < 26; ++k) many.push_back(table(k));
  const px::plan::Model m1(c, one), m26(c, many);
  CHECK(m26.estimate("hybrid").comm_s == Approx(m1.estimate("hybrid").comm_s).epsilon(1e-9));
  CHECK(m26.estimate("allreduce").comm_s == Approx(26 * m1.estimate("allreduce").comm_s).epsilon(1e-9));
  // Tables of another width are a group of their own, with calls of its own.
  many.push_back(px::plan::Variable::sparse_of("wide", 1000, 32, 64));
  CHECK(px::plan::Model(c, many).estimate("hybrid").comm_s == Approx(2 * m1.estimate("hybrid").comm_s).epsilon(1e-9));
}
