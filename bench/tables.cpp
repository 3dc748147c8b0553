// Many sharded tables against one: T sparse tables of equal total rows and
// equal total lookups, in one batched lookup and one step, with the tables
// in one group (ShardedOptions::group_tables) or each in a group of its own.
//
//   mpiexec -n 4 build/host/bench/bench_tables --benchmark_format=json
//   bench/run_tables.sh       # the table of docs/benchmarks.md ("Table groups")
//
// Tables/T:<t>/<grouping>/<lookups>: one training step of t tables of
// 1,048,576 / t rows x 16 floats (a CTR model's embedding width) and every
// rank looking up 8,192 ids a step, 8,192 / t per table, Zipf-distributed
// (s = 1.1: CTR features are power-law), under arch::Hybrid with Adagrad:
// a batched lookup of every table, a gradient row per id, step(). So the
// bytes and the rows touched are the same for every t; what t changes is
// the work per table. <grouping>: grouped (one group) or one_group_each;
// <lookups>: shared (rows read from the owners' shards in shared memory,
// the default on one machine) or messages (ShardedOptions::shared_memory
// off: the path across machines). Counters, per step and rank:
//   calls       engine calls (the busiest rank)
//   bytes_sent  bytes sent (the busiest rank)
// The learning rate is zero, so after the timed loop every looked-up row can
// be checked against its initial value (`wrong`); every kernel still runs.
//
// RouteHeaders/words:<w>: one engine::Mpi::alltoallv_unsized of w 8-byte
// words to every rank and nothing else: a route's headers alone, as a
// lookup over shared shards sends them. w = 2 and 3 are one group's header
// without and with the shape word (docs/design.md, section 2), 27 and 28 26
// groups' (one_group_each above), side by side in one run; `wrong` counts
// words that arrived other than sent.
#include "common/harness.hpp"

#include <parallax/parallax.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;

namespace {

constexpr std::size_t kTotalRows = std::size_t{1} << 20, kCols = 16, kIds = 8192;

using Table = px::Variable<px::Sparse, float>;

/// Zipf(s = 1.1) row ids in [0, rows), by inverse transform on the
/// continuous approximation of the CDF; repeats kept, as in a real batch.
std::vector<px::index_t> zipf_ids(std::mt19937_64& rng, std::size_t rows, std::size_t n) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double a = 1.0 - 1.1, hi = std::pow(double(rows) + 1, a) - 1;
  std::vector<px::index_t> ids(n);
  for (auto& id : ids)
    id = std::min<px::index_t>(static_cast<px::index_t>(std::pow(1 + u(rng) * hi, 1 / a) - 1),
                               static_cast<px::index_t>(rows) - 1);
  return ids;
}

template <std::size_t T, std::size_t... I>
auto make_trainer(px::Context& ctx, px::TrainerOptions o, std::array<std::unique_ptr<Table>, T>& tables,
                  std::index_sequence<I...>) {
  return std::make_unique<px::Trainer<px::arch::Hybrid, px::optim::Adagrad>>(ctx, std::move(o), px::optim::Adagrad{0.f},
                                                                               *tables[I]...);
}

template <std::size_t T>
void run(benchmark::State& state, pb::Session& session, bool grouped, bool shared) {
  px::Context& ctx = session.context();
  const MPI_Comm comm = ctx.comm();
  constexpr std::size_t rows = kTotalRows / T, per_table = kIds / T;
  std::array<std::unique_ptr<Table>, T> tables;
  for (std::size_t t = 0; t < T; ++t)
    tables[t] = std::make_unique<Table>(ctx, "t" + std::to_string(t), px::Shape{rows, kCols},
                                        px::init::Uniform{-0.1f, 0.1f, static_cast<std::uint64_t>(7 + t)});
  px::TrainerOptions o;
  o.sharded.group_tables = grouped;
  o.sharded.shared_memory = shared;
  auto trainer = make_trainer<T>(ctx, o, tables, std::make_index_sequence<T>{});
  // Initial values, to check the rows after the timed loop.
  std::vector<std::vector<float>> initial(T);
  for (std::size_t t = 0; t < T; ++t) initial[t] = trainer->fetch(*tables[t]);

  std::mt19937_64 rng(4242 + static_cast<unsigned>(ctx.rank()));
  std::vector<std::vector<px::index_t>> ids(T);
  std::vector<px::Lookup<Table>> batch;
  const std::vector<float> grad(per_table * kCols, 1e-3f);
  std::vector<px::Rows<float>> rows_out;
  auto before = [&] {
    batch.clear();
    for (std::size_t t = 0; t < T; ++t) {
      ids[t] = zipf_ids(rng, rows, per_table);
      batch.emplace_back(*tables[t], ids[t]);
    }
  };
  auto step = [&] {
    rows_out = trainer->lookup(batch);
    for (std::size_t t = 0; t < T; ++t) tables[t]->grad().add(ids[t], grad);
    trainer->step();
  };
  const px::Traffic start = trainer->stats().total();
  std::uint64_t timed = 0;
  pb::timed_loop(state, comm, 2, before, [&] {
    step();
    ++timed;
  });
  const px::Traffic spent = trainer->stats().total() - start;
  double calls = static_cast<double>(spent.calls) / static_cast<double>(timed);
  MPI_Allreduce(MPI_IN_PLACE, &calls, 1, MPI_DOUBLE, MPI_MAX, comm);
  state.counters["calls"] = calls;
  pb::set_bytes_sent(state, spent.sent(), timed, comm);
  state.counters["tables"] = static_cast<double>(T);

  // The last step's rows are the tables' initial rows (learning rate 0).
  before();
  rows_out = trainer->lookup(batch);
  std::uint64_t wrong = 0;
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t i = 0; i < ids[t].size(); ++i)
      for (std::size_t c = 0; c < kCols; ++c)
        wrong += rows_out[t].data[i * kCols + c] != initial[t][static_cast<std::size_t>(ids[t][i]) * kCols + c];
  pb::set_wrong(state, wrong, comm);
}

template <std::size_t T>
void add(pb::Session& session) {
  for (const bool shared : {true, false})
    for (const bool grouped : {true, false}) {
      const std::string name = "Tables/T:" + std::to_string(T) + (grouped ? "/grouped" : "/one_group_each") +
                               (shared ? "/shared" : "/messages");
      session.add(name, kIds * kCols * sizeof(float), [&session, grouped, shared](benchmark::State& st) {
        run<T>(st, session, grouped, shared);
      });
    }
}

void route_headers(benchmark::State& state, pb::Session& session, std::size_t words) {
  px::Context& ctx = session.context();
  px::engine::Mpi engine(ctx);
  const auto n = static_cast<std::size_t>(ctx.size()), me = static_cast<std::size_t>(ctx.rank());
  std::vector<std::int64_t> send(words * n), recv;
  std::vector<std::size_t> sbytes(n, words * 8), sdispls(n), rbytes(n), rdispls(n);
  for (std::size_t p = 0; p < n; ++p) {
    sdispls[p] = p * words * 8;
    for (std::size_t w = 0; w < words; ++w) send[p * words + w] = static_cast<std::int64_t>(1000 * me + 10 * p + w);
  }
  auto route = [&] {
    engine.alltoallv_unsized(send.data(), sbytes.data(), sdispls.data(), rbytes.data(), rdispls.data(),
                             [&](std::size_t total) {
                               recv.resize(total / 8);
                               return reinterpret_cast<std::byte*>(recv.data());
                             });
  };
  pb::timed_loop(state, ctx.comm(), 10, [] {}, route);
  std::uint64_t wrong = 0;
  for (std::size_t p = 0; p < n; ++p)
    for (std::size_t w = 0; w < words; ++w)
      wrong += recv[rdispls[p] / 8 + w] != static_cast<std::int64_t>(1000 * p + 10 * me + w);
  pb::set_wrong(state, wrong, ctx.comm());
}

}  // namespace

int main(int argc, char** argv) {
  pb::Session session(argc, argv);
  add<1>(session);
  add<8>(session);
  add<26>(session);
  add<64>(session);
  for (const std::size_t words : {2, 3, 27, 28})
    session.add("RouteHeaders/words:" + std::to_string(words), words * 8,
                [&session, words](benchmark::State& st) { route_headers(st, session, words); });
  return session.run();
}
