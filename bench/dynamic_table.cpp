// The shard-local dynamic table (dynamic/table.hpp, issue 38): lookups/s of
// find_or_insert on a full table at index loads 0.5-0.9, against
// std::unordered_map doing the same work (find the key, or insert it; on a
// hit, bump its count and last step) at the same load, in the same run; and
// a stream of 4 million keys (Zipf head, once-seen tail) through a table of
// 2^20 rows, reporting how far the process's max RSS grew past the bytes
// the table allocated at construction; and 02_ctr --dynamic's 8 full
// tables without its model, inserting and evicting every step
// (full_tables). One process, one thread:
//
//   build/host/bench/bench_dynamic_table --benchmark_counters_tabular=true
#include <parallax/dynamic/table.hpp>
#include <parallax/optim/adagrad.hpp>

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

namespace px = parallax;
namespace pd = parallax::dynamic;

namespace {

constexpr std::size_t capacity = std::size_t{1} << 20;
constexpr std::size_t batch = 4096;

/// The keys a full table holds, and batches of lookups drawn uniformly
/// from them (every lookup a hit: the index's probe cost, cache misses
/// included, not the initializer's).
struct Workload {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> lookups;
  Workload() : keys(capacity), lookups(std::size_t{64} * batch) {
    std::mt19937_64 rng(5);
    for (auto& k : keys) k = rng();
    for (auto& k : lookups) k = keys[rng() % capacity];
  }
};
const Workload& workload() {
  static const Workload w;
  return w;
}

void table_find_or_insert(benchmark::State& st) {
  const double load = static_cast<double>(st.range(0)) / 100.0;
  const auto& w = workload();
  pd::Options o;
  o.capacity = capacity;
  o.cols = 16;
  o.max_load = load;
  pd::Table<float> t(o);
  std::vector<px::index_t> slots(batch);
  for (std::size_t b = 0; b < capacity; b += batch) t.find_or_insert(w.keys.data() + b, batch, 1, slots.data());
  std::uint64_t step = 2;
  std::size_t at = 0;
  for (auto _ : st) {
    t.find_or_insert(w.lookups.data() + at, batch, step++, slots.data());
    benchmark::DoNotOptimize(slots.data());
    at = (at + batch) % w.lookups.size();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * batch));
  // After the timed loop: every slot of the last batch holds its key.
  const std::size_t last = (at + w.lookups.size() - batch) % w.lookups.size();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < batch; ++i) wrong += slots[i] < 0 || t.key_of(slots[i]) != w.lookups[last + i];
  st.counters["wrong"] = static_cast<double>(wrong + (t.size() != capacity));
  st.counters["load"] = static_cast<double>(t.size()) / static_cast<double>(t.buckets());
  st.counters["index_MiB"] = static_cast<double>(t.buckets() * 16) / (1 << 20);
}

/// The baseline: the same find-or-insert with the same per-row metadata.
void unordered_map_find_or_insert(benchmark::State& st) {
  const float load = static_cast<float>(st.range(0)) / 100.0f;
  const auto& w = workload();
  struct Row {
    std::uint32_t row;
    std::uint64_t last, count;
  };
  std::unordered_map<std::uint64_t, Row> m;
  m.max_load_factor(load);
  m.reserve(capacity);
  std::vector<px::index_t> slots(batch);
  for (std::size_t i = 0; i < capacity; ++i) m.try_emplace(w.keys[i], Row{static_cast<std::uint32_t>(i), 1, 1});
  std::uint64_t step = 2;
  std::size_t at = 0;
  for (auto _ : st) {
    for (std::size_t i = 0; i < batch; ++i) {
      auto [it, fresh] = m.try_emplace(w.lookups[at + i], Row{static_cast<std::uint32_t>(m.size()), step, 0});
      it->second.last = step;
      ++it->second.count;
      slots[i] = it->second.row;
    }
    benchmark::DoNotOptimize(slots.data());
    ++step;
    at = (at + batch) % w.lookups.size();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * batch));
  const std::size_t last = (at + w.lookups.size() - batch) % w.lookups.size();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < batch; ++i) wrong += m.at(w.lookups[last + i]).row != static_cast<std::uint32_t>(slots[i]);
  st.counters["wrong"] = static_cast<double>(wrong + (m.size() != capacity));
  st.counters["load"] = m.load_factor();
}

/// Table and baseline side by side at each load, so a busy machine's drift
/// falls on both.
const bool registered = [] {
  for (int load = 50; load <= 90; load += 10) {
    benchmark::RegisterBenchmark("table_find_or_insert", table_find_or_insert)->Arg(load)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("unordered_map_find_or_insert", unordered_map_find_or_insert)
        ->Arg(load)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

/// 4 million lookups, 4096 a step, half from a Zipf(1.1) head of a million
/// keys and half a tail of keys seen once, into 2^20 rows of 16 floats with
/// Adagrad's state: evictions run throughout. rss_over_bytes is the growth
/// of max RSS while the table lived over the bytes it allocated at
/// construction (the bar: at most 1.1).
void stream(benchmark::State& st) {
  for (auto _ : st) {
    const long before = max_rss_kib();
    pd::Options o;
    o.capacity = capacity;
    o.cols = 16;
    o.init = px::init::Uniform{-0.05f, 0.05f, 1};
    o.with_optimizer(px::optim::Adagrad{});
    pd::Table<float> t(o);
    std::vector<double> cdf(1000000);
    double sum = 0;
    for (std::size_t i = 0; i < cdf.size(); ++i) cdf[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), 1.1);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u01(0.0, 1.0);
    std::vector<std::uint64_t> keys(batch);
    std::vector<px::index_t> slots(batch);
    std::uint64_t tail = 1ull << 40;
    for (std::uint64_t step = 1; step <= 1000; ++step) {
      for (auto& k : keys)
        k = rng() % 2 == 0 ? tail++
                           : static_cast<std::uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u01(rng) * sum) -
                                                        cdf.begin());
      t.find_or_insert(keys.data(), batch, step, slots.data());
    }
    const long after = max_rss_kib();
    st.counters["table_MiB"] = static_cast<double>(t.bytes()) / (1 << 20);
    st.counters["rows_MiB"] = static_cast<double>(t.row_bytes()) / (1 << 20);
    st.counters["rss_over_bytes"] = static_cast<double>(after - before) * 1024.0 / static_cast<double>(t.bytes());
    st.counters["inserts"] = static_cast<double>(t.stats().inserts);
    st.counters["evictions"] = static_cast<double>(t.stats().evictions);
    st.counters["hit_rate"] = t.stats().hit_rate();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * 1000 * batch));
}
BENCHMARK(stream)->Iterations(1)->Unit(benchmark::kMillisecond);

/// 02_ctr --dynamic's tables without its model: 8 tables of 12,500 rows of
/// 16 floats with Adagrad's state (its 100,000 rows a rank), 1,024 keys a
/// table a step, 60% from a Zipf(1.1) pool of 100,000 keys that gains 1,000
/// a step and 40% seen once, so that a full table inserts and evicts about
/// 580 rows a table every step. An iteration is one step of all 8 tables:
/// find_or_insert, gather and an Adagrad apply of the step's rows (unique,
/// in order of first sighting, as DynamicPS's push-sum gives them). The
/// keys are drawn before the timed loop, the first 40 steps fill the
/// tables untimed; the counters are per step.
void full_tables(benchmark::State& st) {
  constexpr std::size_t tables = 8, per_table = 12500, keys_per_step = 1024, cols = 16;
  constexpr std::uint64_t warm = 40, steps = 440;
  std::vector<std::uint64_t> keys(steps * tables * keys_per_step);
  std::mt19937_64 rng(17);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uint64_t once = 1ull << 40;
  for (std::uint64_t s = 0; s < steps; ++s) {
    const double pool = 100000.0 + 1000.0 * static_cast<double>(s), top = std::pow(pool + 1, 1 - 1.1);
    for (std::size_t i = 0; i < tables * keys_per_step; ++i) {
      const std::uint64_t f = i / keys_per_step;
      std::uint64_t k = once++;
      if (u01(rng) < 0.6) k = static_cast<std::uint64_t>(std::max(std::pow(1 + u01(rng) * (top - 1), 1 / (1 - 1.1)), 1.0));
      keys[s * tables * keys_per_step + i] = px::detail::splitmix64(k ^ (f << 56));
    }
  }
  std::vector<pd::Table<float>> t;
  for (std::size_t f = 0; f < tables; ++f) {
    pd::Options o;
    o.capacity = per_table;
    o.cols = cols;
    o.init = px::init::Uniform{-0.05f, 0.05f, 3};
    o.with_optimizer(px::optim::Adagrad{});
    t.emplace_back(o);
  }
  std::vector<px::index_t> slots(keys_per_step), unique;
  std::vector<float> rows(keys_per_step * cols), grads(keys_per_step * cols, 0.01f);
  std::vector<std::uint8_t> seen(per_table, 0);
  const px::optim::Adagrad opt;
  auto step = [&](std::uint64_t s) {
    for (std::size_t f = 0; f < tables; ++f) {
      const std::uint64_t* k = keys.data() + (s * tables + f) * keys_per_step;
      t[f].find_or_insert(k, keys_per_step, s + 1, slots.data());
      t[f].gather(k, slots.data(), keys_per_step, rows.data());
      unique.clear();
      for (px::index_t r : slots)
        if (!seen[static_cast<std::size_t>(r)]) seen[static_cast<std::size_t>(r)] = 1, unique.push_back(r);
      for (px::index_t r : unique) seen[static_cast<std::size_t>(r)] = 0;
      t[f].apply(opt, s + 1, unique.data(), grads.data(), unique.size());
    }
  };
  for (std::uint64_t s = 0; s < warm; ++s) step(s);
  std::uint64_t s = warm;
  for (auto _ : st) {
    step(s++);
    benchmark::DoNotOptimize(rows.data());
  }
  std::uint64_t inserts = 0, evictions = 0;
  for (const auto& x : t) inserts += x.stats().inserts, evictions += x.stats().evictions;
  const double timed = static_cast<double>(s - warm);
  st.counters["inserts_per_step"] = static_cast<double>(inserts) / static_cast<double>(s);
  st.counters["evictions_per_step"] = static_cast<double>(evictions) / static_cast<double>(s);
  st.counters["bytes_per_row"] = static_cast<double>(t[0].bytes()) / per_table;
  st.SetItemsProcessed(static_cast<std::int64_t>(timed * tables * keys_per_step));
}
BENCHMARK(full_tables)->Iterations(400)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
