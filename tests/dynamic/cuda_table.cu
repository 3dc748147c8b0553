// dynamic/cuda_table.cuh (CUDA builds, [gpu]): the device table against the
// host Table fed each batch sorted by key (stable), over steps of a stream
// with duplicates, a popular head and new keys, with LRU and LFU eviction,
// always, count-min and probability admission, Sgd and Adagrad: the same
// slots refused, keys, counts, last steps and statistics; rows read and
// rows and state after the updates equal to the host's up to the device's
// contraction of the optimizer's rule; export and import round-trip; a
// step beyond the capacity and Evict::score are refused by name. Skips
// where no CUDA device is visible.
#include "support.hpp"

#include <parallax/dynamic/cuda_table.cuh>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace pd = px::dynamic;
constexpr std::size_t C = 4;

bool has_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The keys of step s: a head of 8 keys seen often, keys that come back,
// and keys new at each step (each twice).
std::vector<std::uint64_t> batch_of(std::uint64_t s, std::size_t n) {
  std::vector<std::uint64_t> keys;
  for (std::size_t j = 0; j < n; ++j) {
    if (j % 3 == 0) keys.push_back(1000 + j % 8);
    else if (j % 3 == 1) keys.push_back(px::detail::splitmix64((s * 7 + j) % 97));
    else keys.push_back(px::detail::splitmix64(s * 100000 + j / 2) | 1);
  }
  return keys;
}

pd::Options options(std::size_t capacity, pd::Evict evict, int admission) {
  pd::Options o;
  o.name = "emb";
  o.capacity = capacity;
  o.cols = C;
  o.init = px::init::Uniform{-0.5f, 0.5f, 7};
  o.evict = evict;
  o.evict_fraction = 0.05;
  if (admission == 1) {
    pd::admit::CountMin cm;
    cm.sightings = 2;
    cm.width = 4096;
    cm.halve_every = 500;
    o.admission = cm;
  } else if (admission == 2) {
    o.admission = pd::admit::Probability{0.6, 3};
  }
  o.unadmitted = pd::Unadmitted::initial;
  return o;
}

bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-5f * std::max(1.0f, std::abs(b[i]))) return false;
  return true;
}

template <class Opt>
void compare(const Opt& opt, std::size_t capacity, pd::Evict evict, int admission) {
  auto o = options(capacity, evict, admission);
  o.with_optimizer(opt);
  pd::Table<float> host(o);
  pd::CudaTable<float> dev(o);
  const std::size_t n = 96;
  px::Buffer<std::uint64_t, px::CudaSpace> dkeys;
  px::Buffer<px::index_t, px::CudaSpace> dslots(n);
  px::Buffer<float, px::CudaSpace> drows(n * C), dgrads;
  for (std::uint64_t s = 1; s <= 12; ++s) {
    INFO("step " << s);
    const auto keys = batch_of(s, n);
    // The host table gets the batch sorted by key, stably.
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
    std::vector<std::uint64_t> sorted(n);
    for (std::size_t i = 0; i < n; ++i) sorted[i] = keys[order[i]];
    std::vector<px::index_t> sorted_slots(n), host_slots(n);
    host.find_or_insert(sorted.data(), n, s, sorted_slots.data());
    for (std::size_t i = 0; i < n; ++i) host_slots[order[i]] = sorted_slots[i];
    std::vector<float> host_rows(n * C);
    host.gather(keys.data(), host_slots.data(), n, host_rows.data());

    dkeys.assign_from_host(keys.data(), n);
    dev.find_or_insert(dkeys.data(), n, s, dslots.data());
    dev.gather(dkeys.data(), dslots.data(), n, drows.data());
    const auto dev_slots = dslots.to_host();
    for (std::size_t i = 0; i < n; ++i) CHECK((dev_slots[i] < 0) == (host_slots[i] < 0));
    CHECK(close(drows.to_host(), host_rows));

    // Each key's gradient summed over its occurrences, in position order.
    std::vector<std::uint64_t> unique;
    std::vector<float> sums;
    for (std::size_t i = 0; i < n; ++i) {
      if (host_slots[i] < 0) continue;
      auto at = std::find(unique.begin(), unique.end(), keys[i]);
      std::size_t k = static_cast<std::size_t>(at - unique.begin());
      if (at == unique.end()) {
        unique.push_back(keys[i]);
        sums.resize(sums.size() + C, 0.0f);
      }
      for (std::size_t c = 0; c < C; ++c) sums[k * C + c] += 0.3f * host_rows[i * C + c] - 0.01f * float(c);
    }
    std::vector<px::index_t> hs(unique.size());
    host.find(unique.data(), unique.size(), hs.data());
    host.apply(opt, s, hs.data(), sums.data(), unique.size());
    dkeys.assign_from_host(unique.data(), unique.size());
    px::Buffer<px::index_t, px::CudaSpace> ds(unique.size());
    dev.find(dkeys.data(), unique.size(), ds.data());
    dgrads.assign_from_host(sums.data(), sums.size());
    dev.apply(opt, s, ds.data(), dgrads.data(), unique.size());

    const auto want = host.export_rows(), got = dev.export_rows();
    REQUIRE(got.keys == want.keys);
    CHECK(got.counts == want.counts);
    CHECK(got.last_steps == want.last_steps);
    CHECK(close(got.rows, want.rows));
    for (int k = 0; k < want.slots; ++k) CHECK(close(got.state[k], want.state[k]));
    const auto a = dev.stats(), b = host.stats();
    CHECK(a.size == b.size);
    CHECK(a.lookups == b.lookups);
    CHECK(a.hits == b.hits);
    CHECK(a.inserts == b.inserts);
    CHECK(a.evictions == b.evictions);
    CHECK(a.admissions_refused == b.admissions_refused);
  }
  if (capacity < 100) CHECK(host.stats().evictions > 0);
  if (admission != 0) CHECK(host.stats().admissions_refused > 0);

  // Export and import round-trip onto a fresh device table.
  pd::CudaTable<float> again(o);
  again.import_rows(dev.export_rows());
  const auto x = again.export_rows(), y = dev.export_rows();
  CHECK(x.keys == y.keys);
  CHECK(x.rows == y.rows);
  CHECK(x.counts == y.counts);
}

}  // namespace

TEST_CASE("the CUDA dynamic table equals the host table fed each batch sorted by key", "[gpu][needs-gpu][dynamic]") {
  if (test::skip_unless(has_device(), "no CUDA device visible")) return;
  // A step of batch_of brings 72 distinct keys (8 head, 32 returning, 32
  // new), all admitted here: the capacity must hold one step's.
  SECTION("sgd, lru, always") { compare(px::optim::Sgd{0.5f}, 80, pd::Evict::lru, 0); }
  SECTION("adagrad, lfu, count-min") { compare(px::optim::Adagrad{0.3f}, 64, pd::Evict::lfu, 1); }
  SECTION("adagrad, lru, probability") { compare(px::optim::Adagrad{0.3f}, 64, pd::Evict::lru, 2); }
  SECTION("sgd, no eviction") { compare(px::optim::Sgd{0.5f}, 4000, pd::Evict::lru, 2); }
}

TEST_CASE("the CUDA dynamic table refuses a step beyond its capacity and Evict::score", "[gpu][needs-gpu][dynamic]") {
  if (test::skip_unless(has_device(), "no CUDA device visible")) return;
  auto o = options(8, pd::Evict::lru, 0);
  pd::CudaTable<float> dev(o);
  std::vector<std::uint64_t> keys(9);
  std::iota(keys.begin(), keys.end(), 1);
  auto dkeys = px::Buffer<std::uint64_t, px::CudaSpace>::from_host(keys);
  px::Buffer<px::index_t, px::CudaSpace> slots(keys.size());
  REQUIRE_THROWS_WITH(dev.find_or_insert(dkeys.data(), keys.size(), 1, slots.data()),
                      Catch::Contains("capacity of 8 rows"));
  o.evict = pd::Evict::score;
  o.score = [](std::uint64_t, std::uint64_t c, std::uint64_t) { return double(c); };
  REQUIRE_THROWS_WITH(pd::CudaTable<float>(o), Catch::Contains("Evict::score takes a host function"));
}
