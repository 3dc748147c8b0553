// dynamic/table.hpp: rows keyed by 64-bit ids. Fresh rows depend on the key
// alone; the table never holds more than its capacity; LRU, LFU and a user
// score evict what a std::map model of the same policy evicts; admission
// needs k sightings and unadmitted keys push nothing; evicted rows lose
// their state; export/import round-trips, re-sharded by owner; and a stream
// of millions of keys keeps the memory where construction put it.
#include <parallax/dynamic/table.hpp>
#include <parallax/optim/adagrad.hpp>
#include <parallax/optim/sgd.hpp>

#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

namespace px = parallax;
namespace pd = parallax::dynamic;

namespace {

pd::Options small(std::size_t capacity, std::size_t cols = 4) {
  pd::Options o;
  o.capacity = capacity;
  o.cols = cols;
  o.init = px::init::Uniform{-0.5f, 0.5f, 7};
  o.name = "emb";
  return o;
}

std::vector<float> row_of(const pd::Table<float>& t, px::index_t slot) {
  return std::vector<float>(t.row(slot), t.row(slot) + t.cols());
}

std::vector<float> initial(const pd::Table<float>& t, std::uint64_t key) {
  std::vector<float> r(t.cols());
  t.initial_row(key, r.data());
  return r;
}

px::index_t one(pd::Table<float>& t, std::uint64_t key, std::uint64_t step) {
  px::index_t s = -2;
  t.find_or_insert(&key, 1, step, &s);
  return s;
}

}  // namespace

TEMPLATE_TEST_CASE("fresh rows are the initializer's values of splitmix64(key) + column, bit for bit", "[dynamic][table]",
                   float, double) {
  // The uniform rule's row is computed a column a lane (dynamic::detail::
  // uniform_row, built for each ISA level): it must give InitRule::value's
  // bits, whatever the width, tail lanes included.
  const std::size_t cols = GENERATE(std::size_t{1}, std::size_t{3}, std::size_t{8}, std::size_t{16}, std::size_t{37});
  const px::Init init = GENERATE(px::Init{px::init::Uniform{-0.5f, 0.5f, 7}}, px::Init{px::init::Uniform{0.0f, 3.0f, 1}},
                                 px::Init{px::init::Normal{0.0f, 0.1f, 3}});
  pd::Options o;
  o.capacity = 4;
  o.cols = cols;
  o.init = init;
  o.name = "emb";
  const pd::Table<TestType> t(o);
  const px::detail::InitRule rule = px::detail::make_init_rule(init, "emb", px::Shape{o.capacity, cols});
  std::vector<TestType> row(cols);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    const std::uint64_t key = i < 4 ? std::uint64_t{0} - static_cast<std::uint64_t>(i) : rng();  // ends of the range too
    t.initial_row(key, row.data());
    const std::uint64_t base = px::detail::splitmix64(key);
    for (std::size_t c = 0; c < cols; ++c) {
      const auto want = static_cast<TestType>(rule.value(base + c));
      INFO("key " << key << ", column " << c);
      REQUIRE(std::memcmp(&row[c], &want, sizeof want) == 0);
    }
  }
}

TEST_CASE("fresh rows depend on the key alone, not on order or capacity", "[dynamic][table]") {
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < 200; ++i) keys.push_back(px::detail::splitmix64(i) | (i << 60));
  auto reversed = keys;
  std::reverse(reversed.begin(), reversed.end());
  pd::Table<float> a(small(256)), b(small(1000));
  std::vector<px::index_t> sa(keys.size()), sb(keys.size());
  a.find_or_insert(keys.data(), keys.size(), 1, sa.data());
  b.find_or_insert(reversed.data(), reversed.size(), 1, sb.data());
  std::reverse(sb.begin(), sb.end());
  std::set<px::index_t> distinct;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(sa[i] >= 0);
    distinct.insert(sa[i]);
    REQUIRE(row_of(a, sa[i]) == row_of(b, sb[i]));
    REQUIRE(row_of(a, sa[i]) == initial(a, keys[i]));
    REQUIRE(a.key_of(sa[i]) == keys[i]);
  }
  REQUIRE(distinct.size() == keys.size());
  // Values are the initializer's: in range, and different across keys and columns.
  const auto r0 = row_of(a, sa[0]), r1 = row_of(a, sa[1]);
  REQUIRE(r0 != r1);
  REQUIRE(r0[0] != r0[1]);
  for (float v : r0) REQUIRE((v >= -0.5f && v < 0.5f));
  // A second lookup finds the same slots; find() agrees and inserts nothing.
  std::vector<px::index_t> again(keys.size()), found(keys.size());
  a.find_or_insert(keys.data(), keys.size(), 2, again.data());
  a.find(keys.data(), keys.size(), found.data());
  REQUIRE(again == sa);
  REQUIRE(found == sa);
  const std::uint64_t absent = 5;
  px::index_t s = 0;
  a.find(&absent, 1, &s);
  REQUIRE(s == -1);
  REQUIRE(a.stats().inserts == keys.size());
  REQUIRE(a.stats().hits == keys.size());
  REQUIRE(a.stats().lookups == 2 * keys.size());
  REQUIRE(a.stats().hit_rate() == Approx(0.5));
}

TEST_CASE("double values, empty batches, and the optimizer's update on the rows", "[dynamic][table]") {
  const px::optim::Adagrad opt{0.5f, 0.1f};
  pd::Options o;
  o.capacity = 8;
  o.cols = 3;
  o.init = px::init::Constant{2.0};
  o.with_optimizer(opt);
  pd::Table<double> t(o);
  t.find_or_insert(nullptr, 0, 1, nullptr);  // an empty batch: nothing happens
  REQUIRE(t.stats().lookups == 0);
  const std::uint64_t keys[2] = {10, 20};
  px::index_t slots[2];
  t.find_or_insert(keys, 2, 1, slots);
  const double grads[6] = {1, 2, 3, 4, 5, 6};
  t.apply(opt, 1, slots, grads, 2);
  // Adagrad: acc = 0.1 + g^2, w = 2 - 0.5 * g / (sqrt(acc) + eps), per element.
  for (int j = 0; j < 2; ++j)
    for (int c = 0; c < 3; ++c) {
      const double g = grads[j * 3 + c];
      REQUIRE(t.state(0, slots[j])[c] == Approx(0.1 + g * g));
      REQUIRE(t.row(slots[j])[c] == Approx(2.0 - 0.5 * g / (std::sqrt(0.1 + g * g) + 1e-7)));
    }
  double out[6];
  t.gather(keys, slots, 2, out);
  REQUIRE(out[5] == t.row(slots[1])[2]);
}

namespace {

/// The reference: a std::map of key -> (count, last step), evicting the
/// lowest (score, last step, key) in batches, sparing the current step.
struct Model {
  std::size_t capacity, batch;
  pd::Evict policy;
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> live;  // count, last
  static double user(std::uint64_t key, std::uint64_t count, std::uint64_t last) {
    return static_cast<double>(count) * 2.0 - static_cast<double>(last) + static_cast<double>(key % 3);
  }
  std::tuple<double, std::uint64_t, std::uint64_t> rank(std::uint64_t key) const {
    const auto [count, last] = live.at(key);
    const double s = policy == pd::Evict::lru   ? static_cast<double>(last)
                     : policy == pd::Evict::lfu ? static_cast<double>(count)
                                                : user(key, count, last);
    return {s, last, key};
  }
  void see(std::uint64_t key, std::uint64_t step) {
    auto it = live.find(key);
    if (it != live.end()) {
      ++it->second.first;
      it->second.second = step;
      return;
    }
    if (live.size() == capacity) {
      std::vector<std::tuple<double, std::uint64_t, std::uint64_t>> c;
      for (const auto& [k, v] : live)
        if (v.second != step) c.push_back(rank(k));
      std::sort(c.begin(), c.end());
      for (std::size_t i = 0; i < std::min(batch, c.size()); ++i) live.erase(std::get<2>(c[i]));
    }
    live[key] = {1, step};
  }
};

/// The table holds the model's keys, with its counts and last steps.
void require_model(const pd::Table<float>& t, const Model& m) {
  const auto snap = t.export_rows();
  std::vector<std::uint64_t> model_keys;
  for (const auto& kv : m.live) model_keys.push_back(kv.first);
  REQUIRE(snap.keys == model_keys);
  for (std::size_t i = 0; i < snap.size(); ++i) {
    REQUIRE(snap.counts[i] == m.live.at(snap.keys[i]).first);
    REQUIRE(snap.last_steps[i] == m.live.at(snap.keys[i]).second);
  }
}

}  // namespace

TEST_CASE("LRU, LFU and a user score evict what the reference model evicts", "[dynamic][table]") {
  for (pd::Evict policy : {pd::Evict::lru, pd::Evict::lfu, pd::Evict::score}) {
    for (double fraction : {0.01, 0.1, 0.25}) {
      auto o = small(64);
      o.evict = policy;
      o.evict_fraction = fraction;
      o.score = &Model::user;
      pd::Table<float> t(o);
      Model m{64, static_cast<std::size_t>(std::ceil(fraction * 64)), policy, {}};
      std::mt19937_64 rng(static_cast<std::uint64_t>(policy) * 10 + static_cast<std::uint64_t>(fraction * 100));
      for (std::uint64_t step = 1; step <= 300; ++step) {
        std::vector<std::uint64_t> keys;
        for (int i = 0; i < 8; ++i) {
          // A skewed key space: small keys often, large ones rarely.
          const std::uint64_t u = rng() % 1000;
          keys.push_back(u * u % 997 < 200 ? u % 40 : u);
        }
        std::vector<px::index_t> slots(keys.size());
        t.find_or_insert(keys.data(), keys.size(), step, slots.data());
        for (std::size_t i = 0; i < keys.size(); ++i) {
          m.see(keys[i], step);
          REQUIRE(slots[i] >= 0);
          REQUIRE(t.key_of(slots[i]) == keys[i]);
        }
        REQUIRE(t.size() <= t.capacity());
        REQUIRE(t.size() == m.live.size());
      }
      INFO("policy " << static_cast<int>(policy) << " fraction " << fraction);
      require_model(t, m);
      REQUIRE(t.stats().evictions > 0);
      REQUIRE(t.stats().inserts - t.stats().evictions == t.size());
    }
  }
}

TEST_CASE("the eviction order stays exact across erase(), evict() and import between evictions",
          "[dynamic][table]") {
  for (pd::Evict policy : {pd::Evict::lru, pd::Evict::lfu, pd::Evict::score}) {
    auto o = small(200);
    o.evict = policy;
    o.evict_fraction = 0.02;  // 4 rows a batch; the cache holds 25
    o.score = &Model::user;
    pd::Table<float> t(o);
    Model m{200, 4, policy, {}};
    std::mt19937_64 rng(static_cast<std::uint64_t>(policy) + 40);
    for (std::uint64_t step = 1; step <= 400; ++step) {
      std::vector<std::uint64_t> keys;
      for (int i = 0; i < 6; ++i) {
        const std::uint64_t u = rng() % 3000;
        keys.push_back(u % 5 == 0 ? u % 60 : u);
      }
      std::vector<px::index_t> slots(keys.size());
      t.find_or_insert(keys.data(), keys.size(), step, slots.data());
      for (std::uint64_t k : keys) m.see(k, step);
      if (step % 7 == 0) {  // erase a live key and a missing one
        const std::uint64_t gone[2] = {keys[0], 1u << 30};
        REQUIRE(t.erase(gone, 2) == 1);
        m.live.erase(keys[0]);
      }
      if (step % 11 == 0) {  // evict() the lowest 3, the current step's included
        std::vector<std::tuple<double, std::uint64_t, std::uint64_t>> c;
        for (const auto& kv : m.live) c.push_back(m.rank(kv.first));
        std::sort(c.begin(), c.end());
        for (std::size_t i = 0; i < 3 && i < c.size(); ++i) m.live.erase(std::get<2>(c[i]));
        REQUIRE(t.evict(3) == std::min<std::size_t>(3, c.size()));
        // More keys at the same step: LRU's queue takes them behind the
        // current step's rows it has just sorted for evict().
        std::vector<std::uint64_t> more;
        for (int i = 0; i < 6; ++i) more.push_back(3000 + rng() % 3000);
        t.find_or_insert(more.data(), more.size(), step, slots.data());
        for (std::uint64_t k : more) m.see(k, step);
      }
      if (step % 50 == 0) {  // a round trip through a snapshot re-seats every row
        const auto snap = t.export_rows();
        REQUIRE(t.erase(snap.keys.data(), snap.size()) == snap.size());
        REQUIRE(t.import_rows(snap) == snap.size());
      }
      REQUIRE(t.size() == m.live.size());
    }
    INFO("policy " << static_cast<int>(policy));
    require_model(t, m);
    REQUIRE(t.stats().evictions > 100);
  }
}

TEST_CASE("LRU: rows that arrive at a step evict() has reached go by key with that step's others",
          "[dynamic][table]") {
  auto keys_of = [](const pd::Table<float>& t) { return t.export_rows().keys; };
  auto insert = [](pd::Table<float>& t, std::vector<std::uint64_t> keys, std::uint64_t step) {
    std::vector<px::index_t> slots(keys.size());
    t.find_or_insert(keys.data(), keys.size(), step, slots.data());
  };
  for (std::uint64_t later : {0, 1}) {  // the second evict() at the same step, or at the next
    INFO("second evict() " << later << " steps later");
    pd::Table<float> t(small(16));
    insert(t, {100, 101, 102, 103}, 1);
    insert(t, {50, 51, 52, 53, 54, 55}, 2);
    REQUIRE(t.evict(6) == 6);  // step 1's four, then 50 and 51 of step 2, sorted by key
    REQUIRE(keys_of(t) == std::vector<std::uint64_t>{52, 53, 54, 55});
    insert(t, {10, 11}, 2);  // step 2 again: they come first among its rows
    if (later) insert(t, {7}, 3);
    REQUIRE(t.evict(3) == 3);
    REQUIRE(keys_of(t) == (later ? std::vector<std::uint64_t>{7, 53, 54, 55} : std::vector<std::uint64_t>{53, 54, 55}));
  }
}

TEST_CASE("a step with more distinct keys than the capacity is an error; evict() and erase()", "[dynamic][table]") {
  pd::Table<float> t(small(4));
  std::vector<std::uint64_t> keys{1, 2, 3, 4, 5};
  std::vector<px::index_t> slots(5);
  REQUIRE_THROWS_WITH(t.find_or_insert(keys.data(), 5, 1, slots.data()),
                      Catch::Contains("more distinct keys than its capacity of 4"));
  REQUIRE(t.size() == 4);
  REQUIRE_THROWS_WITH(t.find_or_insert(keys.data(), 1, 0, slots.data()), Catch::Contains("before the last one"));
  REQUIRE(t.evict(1) == 1);  // the lowest: key 1 (all at step 1)
  px::index_t s = 0;
  t.find(keys.data(), 1, &s);
  REQUIRE(s == -1);
  REQUIRE(t.erase(keys.data() + 1, 2) == 2);
  REQUIRE(t.erase(keys.data() + 1, 2) == 0);
  REQUIRE(t.size() == 1);
  REQUIRE(t.stats().erased == 2);
  REQUIRE(t.evict(10) == 1);
  REQUIRE(t.size() == 0);
  auto bad = small(4);
  bad.init = px::init::Glorot{};
  REQUIRE_THROWS_WITH(pd::Table<float>(bad), Catch::Contains("Glorot"));
  bad = small(0);
  REQUIRE_THROWS_WITH(pd::Table<float>(bad), Catch::Contains("capacity"));
  bad = small(4);
  bad.evict = pd::Evict::score;
  REQUIRE_THROWS_WITH(pd::Table<float>(bad), Catch::Contains("score function"));
  bad = small(3'100'000'000);  // a valid capacity, but 0.5 load needs 2^32 buckets: refused before allocating
  REQUIRE_THROWS_WITH(pd::Table<float>(bad), Catch::Contains("index buckets"));
}

TEST_CASE("the index stays consistent under random inserts, erases and evictions", "[dynamic][table]") {
  auto o = small(500, 1);
  o.max_load = 0.9;  // long probe runs: backward-shift deletion is exercised
  pd::Table<float> t(o);
  std::set<std::uint64_t> live;
  std::mt19937_64 rng(3);
  for (std::uint64_t step = 1; step <= 2000; ++step) {
    std::uint64_t key = rng() % 2000;
    if (rng() % 3 == 0) {
      t.erase(&key, 1);
      live.erase(key);
    } else {
      const px::index_t s = one(t, key, step);
      REQUIRE(t.key_of(s) == key);
      live.insert(key);
      if (live.size() > t.size()) {  // an eviction happened: read back what is left
        std::set<std::uint64_t> now;
        for (std::uint64_t k : t.export_rows().keys) now.insert(k);
        REQUIRE(std::includes(live.begin(), live.end(), now.begin(), now.end()));
        live = now;
      }
    }
    REQUIRE(t.size() == live.size());
  }
  for (std::uint64_t k = 0; k < 2000; ++k) {
    px::index_t s = 0;
    t.find(&k, 1, &s);
    REQUIRE((s >= 0) == (live.count(k) == 1));
    if (s >= 0) REQUIRE(t.key_of(s) == k);
  }
}

TEST_CASE("admission: a row after k sightings; unadmitted keys read a default row and push nothing",
          "[dynamic][table]") {
  for (pd::Unadmitted u : {pd::Unadmitted::zeros, pd::Unadmitted::initial}) {
    auto o = small(16);
    o.admission = pd::admit::CountMin{3, 1024, 4, 0};
    o.unadmitted = u;
    const px::optim::Adagrad opt{0.5f};
    o.with_optimizer(opt);
    pd::Table<float> t(o);
    const std::uint64_t key = 99;
    const std::vector<float> grad(4, 1.0f);
    for (std::uint64_t step = 1; step <= 2; ++step) {
      const px::index_t s = one(t, key, step);
      REQUIRE(s == -1);
      std::vector<float> read(4);
      t.gather(&key, &s, 1, read.data());
      REQUIRE(read == (u == pd::Unadmitted::zeros ? std::vector<float>(4, 0.0f) : initial(t, key)));
      t.apply(opt, step, &s, grad.data(), 1);  // dropped
    }
    REQUIRE(t.size() == 0);
    REQUIRE(t.stats().admissions_refused == 2);
    const px::index_t s = one(t, key, 3);
    REQUIRE(s >= 0);
    REQUIRE(row_of(t, s) == initial(t, key));  // the dropped gradients left no trace
    REQUIRE(*t.state(0, s) == Approx(opt.slot_initial<float>(0)));
  }
  auto o = small(16);
  o.admission = pd::admit::Probability{0.5, 1};
  pd::Table<float> t(o), u(o);
  std::vector<std::uint64_t> keys(1000);
  for (std::uint64_t i = 0; i < keys.size(); ++i) keys[i] = i;
  std::vector<px::index_t> st(1000), su(1000);
  // Over-capacity admitted keys in one step are an error, so ask 20 at a time.
  for (std::size_t b = 0; b < 1000; b += 20) {
    t.find_or_insert(keys.data() + b, 20, 1 + b, st.data() + b);
    u.find_or_insert(keys.data() + b, 20, 1 + b, su.data() + b);
  }
  for (std::size_t i = 0; i < 1000; ++i) REQUIRE((st[i] >= 0) == (su[i] >= 0));
  REQUIRE(t.stats().admissions_refused == u.stats().admissions_refused);
  REQUIRE(std::abs(static_cast<int>(t.stats().admissions_refused) - 500) < 80);
}

TEST_CASE("an evicted row's state leaves with it: the key comes back fresh", "[dynamic][table]") {
  const px::optim::Adagrad opt{0.1f, 0.25f};
  auto o = small(2);
  o.with_optimizer(opt);
  o.evict_fraction = 0.5;  // one row at a time
  pd::Table<float> t(o);
  const std::uint64_t key = 1234;
  px::index_t s = one(t, key, 1);
  const std::vector<float> grad(4, 2.0f);
  t.apply(opt, 1, &s, grad.data(), 1);
  REQUIRE(row_of(t, s) != initial(t, key));
  REQUIRE(*t.state(0, s) != Approx(0.25f));
  one(t, 1, 2);
  one(t, 2, 3);  // full at step 3: key 1234 (LRU) goes
  px::index_t f = 0;
  t.find(&key, 1, &f);
  REQUIRE(f == -1);
  s = one(t, key, 4);
  REQUIRE(row_of(t, s) == initial(t, key));
  for (std::size_t c = 0; c < 4; ++c) REQUIRE(t.state(0, s)[c] == 0.25f);
  REQUIRE(t.count_of(s) == 1);
  // apply() refuses an optimizer of another slot count.
  REQUIRE_THROWS_WITH(t.apply(px::optim::Sgd{0.1f}, 5, &s, grad.data(), 1), Catch::Contains("optimizer slots"));
}

TEST_CASE("export/import round-trips, and re-shards by owner onto any rank count", "[dynamic][table]") {
  const px::optim::Adagrad opt{0.1f};
  auto o = small(300);
  o.with_optimizer(opt);
  pd::Table<float> t(o);
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < 250; ++i) keys.push_back(px::detail::splitmix64(i + 1000));
  std::vector<px::index_t> slots(keys.size());
  t.find_or_insert(keys.data(), keys.size(), 5, slots.data());
  std::vector<float> grads(keys.size() * 4);
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i % 7) - 3.0f;
  t.apply(opt, 5, slots.data(), grads.data(), keys.size());
  const auto snap = t.export_rows();
  REQUIRE(snap.size() == 250);
  REQUIRE(std::is_sorted(snap.keys.begin(), snap.keys.end()));

  pd::Table<float> back(o);
  REQUIRE(back.import_rows(snap) == 250);
  const auto again = back.export_rows();
  REQUIRE(again.keys == snap.keys);
  REQUIRE(again.rows == snap.rows);
  REQUIRE(again.state[0] == snap.state[0]);
  REQUIRE(again.counts == snap.counts);
  REQUIRE(again.last_steps == snap.last_steps);

  for (int ranks = 1; ranks <= 4; ++ranks) {
    std::size_t total = 0;
    std::map<std::uint64_t, std::vector<float>> merged;
    for (int r = 0; r < ranks; ++r) {
      pd::Table<float> shard(o);
      total += shard.import_rows(snap, r, ranks);
      const auto part = shard.export_rows();
      for (std::size_t i = 0; i < part.size(); ++i) {
        REQUIRE(pd::owner(part.keys[i], ranks) == r);
        merged[part.keys[i]] = std::vector<float>(part.rows.begin() + i * 4, part.rows.begin() + (i + 1) * 4);
      }
    }
    REQUIRE(total == 250);
    REQUIRE(merged.size() == 250);
    for (std::size_t i = 0; i < snap.size(); ++i)
      REQUIRE(merged.at(snap.keys[i]) == std::vector<float>(snap.rows.begin() + i * 4, snap.rows.begin() + (i + 1) * 4));
  }
  pd::Table<float> tiny(small(10));
  auto plain = snap;
  plain.slots = 0;
  plain.state[0].clear();
  REQUIRE_THROWS_WITH(tiny.import_rows(plain), Catch::Contains("250 new keys, 10 free rows"));
  REQUIRE(tiny.size() == 0);
  REQUIRE_THROWS_WITH(tiny.import_rows(snap), Catch::Contains("slots"));
  auto shuffled = snap;
  std::swap(shuffled.keys[0], shuffled.keys[1]);
  REQUIRE_THROWS_WITH(back.import_rows(shuffled), Catch::Contains("not strictly increasing"));
}

namespace {
long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}
}  // namespace

namespace {

/// 2.5 million lookups, 4096 a step: half from a Zipf(1.1) head of 50,000
/// keys, half a tail of keys seen once. Checks the size never passes the
/// capacity and the process grows by no more than 10% over bytes().
pd::Stats stream(const pd::Options& o) {
  const long rss_before = max_rss_kib();
  pd::Table<float> t(o);
  const std::size_t bytes = t.bytes();
  std::vector<double> cdf(50000);
  double sum = 0;
  for (std::size_t i = 0; i < cdf.size(); ++i) cdf[i] = sum += 1.0 / std::pow(static_cast<double>(i + 1), 1.1);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const std::size_t batch = 4096, steps = 600;
  std::vector<std::uint64_t> keys(batch);
  std::vector<px::index_t> slots(batch);
  std::uint64_t tail = 1ull << 40;
  for (std::uint64_t step = 1; step <= steps; ++step) {
    for (auto& k : keys) {
      if (rng() % 2 == 0) k = tail++;
      else k = static_cast<std::uint64_t>(std::lower_bound(cdf.begin(), cdf.end(), u01(rng) * sum) - cdf.begin());
    }
    t.find_or_insert(keys.data(), batch, step, slots.data());
    if (t.size() > t.capacity()) FAIL("size " << t.size() << " over the capacity at step " << step);
  }
  const long rss_after = max_rss_kib();
  const auto& s = t.stats();
  INFO("size " << s.size << " inserts " << s.inserts << " evictions " << s.evictions << " refused "
       << s.admissions_refused << " hit rate " << s.hit_rate() << " bytes " << bytes << " rss growth KiB "
       << rss_after - rss_before);
  REQUIRE(t.bytes() == bytes);
  REQUIRE(s.evictions > 0);
  // What the process grew by while the table lived: within 10% of its bytes
  // (max RSS only grows: a later, smaller table passes trivially).
  REQUIRE(static_cast<double>(rss_after - rss_before) * 1024.0 <= 1.1 * static_cast<double>(bytes));
  // The head's hottest keys are in the table.
  std::vector<std::uint64_t> hot{0, 1, 2, 3, 4};
  std::vector<px::index_t> found(hot.size());
  t.find(hot.data(), hot.size(), found.data());
  for (px::index_t f : found) REQUIRE(f >= 0);
  return s;
}

}  // namespace

TEST_CASE("a stream of millions of keys (Zipf head, long tail) keeps memory at the capacity's bytes",
          "[dynamic][table][stress]") {
  auto o = small(100000, 16);
  o.with_optimizer(px::optim::Adagrad{0.05f});
  const pd::Stats s = stream(o);  // every key admitted: the tail churns the table
  REQUIRE(s.inserts > 1000000);
  REQUIRE(s.admissions_refused == 0);
}

TEST_CASE("count-min admission keeps a once-seen tail out of the table", "[dynamic][table][stress]") {
  auto o = small(20000, 16);  // below the head's admitted keys: evictions run
  o.with_optimizer(px::optim::Adagrad{0.05f});
  o.admission = pd::admit::CountMin{2, 1 << 20, 4, 1 << 19};  // width: 2x the keys between halvings
  const pd::Stats s = stream(o);
  REQUIRE(s.admissions_refused > s.lookups / 2);  // the tail (half the lookups), seen once
  REQUIRE(s.inserts < s.lookups / 20);
  REQUIRE(s.hit_rate() > 0.4);  // the head stays
}
