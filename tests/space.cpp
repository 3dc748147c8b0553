// space.hpp: Buffer ownership and growth, for_each coverage, host copies.
#include "support.hpp"

#include <thrust/sort.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include <omp.h>

TEMPLATE_TEST_CASE("Buffer round-trips host data and grows keeping contents", "[space]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  std::vector<int> src{1, 2, 3, 4, 5};
  auto b = px::Buffer<int, Space>::from_host(src);
  CHECK(b.size() == 5);
  CHECK(b.to_host() == src);
  b.resize(1000);
  auto back = b.to_host();
  CHECK(std::vector<int>(back.begin(), back.begin() + 5) == src);
  const int* before = b.data();
  b.resize(3);  // shrinking keeps the allocation
  CHECK(b.data() == before);
  CHECK(b.capacity() >= 1000);
  b.append(b.data(), 3);
  CHECK(b.to_host() == std::vector<int>{1, 2, 3, 1, 2, 3});
  b.zero();
  CHECK(b.to_host() == std::vector<int>(6, 0));

  // A source inside the buffer itself, when the append must grow it: the
  // copy read the freed storage (AddressSanitizer: heap-use-after-free).
  auto c = px::Buffer<int, Space>::from_host(std::vector<int>{7, 8, 9});
  REQUIRE(c.capacity() == 3);
  c.append(c.data() + 1, 2);
  CHECK(c.to_host() == std::vector<int>{7, 8, 9, 8, 9});
  c.append(c.data(), 5);
  CHECK(c.to_host() == std::vector<int>{7, 8, 9, 8, 9, 7, 8, 9, 8, 9});

  px::Buffer<int, Space> moved = std::move(b);
  CHECK(moved.size() == 6);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
}

/// Rounds floats into 16-bit storage in a space's kernel.
template <class H>
struct StoreHalf {
  const float* in;
  H* out;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { out[i] = H(in[i]); }
};

TEMPLATE_TEST_CASE("Buffer holds 16-bit floats, rounded by kernels in its space as on the host", "[space][half]",
                   PARALLAX_TEST_SPACES) {
  using Space = TestType;
  std::vector<float> values;
  for (int i = 0; i < 1001; ++i) values.push_back(std::ldexp(1.f + 0.0137f * static_cast<float>(i), i % 40 - 30) * (i & 1 ? -1.f : 1.f));
  values.insert(values.end(), {65520.f, std::ldexp(1.f, -25), 1.f + std::ldexp(1.f, -8), -0.f});
  auto in = px::Buffer<float, Space>::from_host(values);
  px::Buffer<px::bf16, Space> b(values.size());
  px::Buffer<px::fp16, Space> h(values.size());
  px::Exec<Space> ex;
  px::for_each(ex, values.size(), StoreHalf<px::bf16>{in.data(), b.data()});
  px::for_each(ex, values.size(), StoreHalf<px::fp16>{in.data(), h.data()});
  ex.synchronize();
  CHECK(b.bytes() == 2 * values.size());
  const auto got_b = b.to_host();
  const auto got_h = h.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i)
    wrong += got_b[i].bits != px::bf16(values[i]).bits || got_h[i].bits != px::fp16(values[i]).bits;
  CHECK(wrong == 0);
  // Copies and growth move the 16 bits unchanged.
  b.resize(3 * values.size());
  const auto copy = px::Buffer<px::bf16, Space>::from_host(got_b);
  b.append(copy.data(), copy.size());
  const auto grown = b.to_host();
  CHECK(std::memcmp(grown.data(), got_b.data(), got_b.size() * 2) == 0);
  CHECK(std::memcmp(grown.data() + 3 * values.size(), got_b.data(), got_b.size() * 2) == 0);
  h.zero();
  CHECK(h.to_host()[7].bits == 0);
}

TEST_CASE("Buffer grows by half its capacity at least, so creeping sizes settle", "[space]") {
  px::Buffer<float> b;
  b.resize_discard(1000);
  CHECK(b.capacity() == 1000);  // the first allocation is exact
  b.resize_discard(1001);
  CHECK(b.capacity() == 1500);
  const float* at = b.data();
  for (std::size_t n = 1002; n <= 1500; ++n) b.resize_discard(n);  // a new largest size each time
  CHECK(b.data() == at);  // no reallocation among them
  b.resize(1501);
  CHECK(b.capacity() == 2250);
  b.resize_discard(5000);
  CHECK(b.capacity() == 5000);  // a jump past 1.5x takes what was asked
}

TEST_CASE("A borrowed Buffer uses memory it does not free, until it grows", "[space]") {
  std::vector<float> arena(8, 1.f);
  {
    auto b = px::Buffer<float>::borrow(arena.data() + 2, 4);
    CHECK_FALSE(b.owned());
    CHECK(b.data() == arena.data() + 2);
    b.zero();
    px::Buffer<float> moved = std::move(b);
    CHECK_FALSE(moved.owned());
    CHECK(b.owned());  // NOLINT(bugprone-use-after-move): moved-from is empty and owning
    moved.resize(6);   // grows: into memory of its own, contents kept
    CHECK(moved.owned());
    CHECK(moved.data() != arena.data() + 2);
    CHECK(moved[0] == 0.f);
  }  // freeing the grown buffer leaves the arena alone
  CHECK(arena == std::vector<float>{1, 1, 0, 0, 0, 0, 1, 1});
}

TEST_CASE("Thrust's temporary storage comes from the context's pool and is reused", "[space]") {
  // Two threads: with more, the sort's merges take blocks concurrently, and
  // how many are live at once depends on timing (16 threads on a 16-core
  // machine held 42 blocks where 2 threads hold 29).
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  px::Exec<px::HostSpace> ex;
  auto sort = [&](std::size_t n) {
    std::vector<px::index_t> keys(n);
    std::vector<int> order(n);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = static_cast<px::index_t>((i * 7919) % 1013);
      order[i] = static_cast<int>(i);
    }
    thrust::stable_sort_by_key(ex.thrust_policy(), keys.data(), keys.data() + n, order.data());
    return std::is_sorted(keys.begin(), keys.end());
  };
  CHECK(sort(50000));  // the pool's blocks are real storage: the sort is right
  const std::size_t blocks = ex.temp_pool().blocks(), bytes = ex.temp_pool().bytes();
  CHECK(blocks > 0);
  // Sizes that creep up within the same power-of-two classes reuse the blocks.
  for (std::size_t n = 50001; n < 50400; n += 37) CHECK(sort(n));
  CHECK(ex.temp_pool().blocks() == blocks);
  CHECK(ex.temp_pool().bytes() == bytes);
  px::Exec<px::HostSpace> copy = ex;  // copies share the pool
  CHECK(&copy.temp_pool() == &ex.temp_pool());
  omp_set_num_threads(saved);
}

// Regression: Thrust's OpenMP stable sort merges in parallel, each thread
// allocating its temporaries from the pool at once. The pool had no lock, and
// with 8 threads the sort wrote through a block it had given twice (a crash in
// bench_end_to_end on a 16-core machine).
TEST_CASE("The temporary pool serves OpenMP threads allocating at once", "[space]") {
  const int threads = 8;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  px::detail::TempPool<px::HostSpace> pool;
  std::atomic<int> overlaps{0};
#pragma omp parallel num_threads(threads)
  {
    const int me = omp_get_thread_num();
    for (int round = 0; round < 2000; ++round) {
      const std::ptrdiff_t bytes = 256 << (round % 4);
      char* p = pool.allocate(bytes);
      std::memset(p, me + 1, static_cast<std::size_t>(bytes));
      for (std::ptrdiff_t i = 0; i < bytes; i += 61)
        if (p[i] != me + 1) ++overlaps;  // another thread holds the same block
      pool.deallocate(p, static_cast<std::size_t>(bytes));
    }
  }
  CHECK(overlaps == 0);
  CHECK(pool.blocks() <= static_cast<std::size_t>(threads) * 4);

  px::Exec<px::HostSpace> ex;
  const std::size_t n = 400000;
  for (int round = 0; round < 5; ++round) {
    std::vector<px::index_t> keys(n);
    std::vector<int> order(n);
    for (std::size_t i = 0; i < n; ++i) {
      keys[i] = static_cast<px::index_t>((i * 7919 + static_cast<std::size_t>(round)) % 100003);
      order[i] = static_cast<int>(i);
    }
    thrust::stable_sort_by_key(ex.thrust_policy(), keys.data(), keys.data() + n, order.data());
    CHECK(std::is_sorted(keys.begin(), keys.end()));
  }
  omp_set_num_threads(saved);
}

TEST_CASE("with_thrust runs small host inputs sequentially and large ones on the OpenMP policy", "[space]") {
  px::Exec<px::HostSpace> ex;
  using Omp = decltype(ex.thrust_policy());
  auto parallel = [&](std::size_t n) {
    return px::with_thrust(ex, n, [](auto policy) { return std::is_same_v<decltype(policy), Omp>; });
  };
  CHECK_FALSE(parallel(0));
  CHECK_FALSE(parallel(240));
  CHECK_FALSE(parallel(px::detail::thrust_parallel_threshold - 1));
  CHECK(parallel(px::detail::thrust_parallel_threshold));
  // Both draw their temporary storage from the context's pool.
  std::vector<px::index_t> keys(5000);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<px::index_t>((i * 7919) % 1013);
  std::vector<int> order(keys.size(), 0);
  px::with_thrust(ex, keys.size(), [&](auto policy) {
    thrust::stable_sort_by_key(policy, keys.data(), keys.data() + keys.size(), order.data());
  });
  CHECK(std::is_sorted(keys.begin(), keys.end()));
  CHECK(ex.temp_pool().blocks() > 0);
}

TEST_CASE("for_each runs a short loop of heavy items on the OpenMP team when told its cost", "[space][needs-threads]") {
  // A one-thread team is never active, so nothing could tell it from the calling thread.
  if (test::skip_unless(omp_get_max_threads() >= 2, "OpenMP has one thread (omp_get_max_threads() < 2)")) return;
  px::Exec<px::HostSpace> ex;
  std::vector<int> in_team(8, -1);
  auto record = [&](std::size_t i) { in_team[i] = omp_in_parallel() ? 1 : 0; };
  px::for_each(ex, in_team.size(), record);  // 8 cheap items: the calling thread
  CHECK(std::count(in_team.begin(), in_team.end(), 0) == 8);
  px::for_each(ex, in_team.size(), record, px::Cost{1u << 20});  // 8 heavy items: the team
  CHECK(std::count(in_team.begin(), in_team.end(), 1) == 8);
  px::for_each(ex, 1, record, px::Cost{1u << 30});  // one item is never worth a team
  CHECK(in_team[0] == 0);
}

namespace {
struct CountVisit {
  int* hits;
  std::size_t cols;
  PARALLAX_HOST_DEVICE void operator()(std::size_t r, std::size_t c) const { hits[r * cols + c] += 1; }
};
}  // namespace

TEMPLATE_TEST_CASE("for_each_rows visits every element of every row exactly once", "[space]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  const auto shape = GENERATE(std::pair<std::size_t, std::size_t>{0, 5}, std::pair<std::size_t, std::size_t>{7, 0},
                              std::pair<std::size_t, std::size_t>{1, 1}, std::pair<std::size_t, std::size_t>{1000, 3},
                              std::pair<std::size_t, std::size_t>{37, 64}, std::pair<std::size_t, std::size_t>{5, 300},
                              std::pair<std::size_t, std::size_t>{70000, 1});
  const std::size_t rows = shape.first, cols = shape.second;
  auto hits = px::Buffer<int, Space>::from_host(std::vector<int>(rows * cols, 0));
  px::Exec<Space> ex;
  px::for_each_rows(ex, rows, cols, CountVisit{hits.data(), cols});
  ex.synchronize();
  const auto got = hits.to_host();
  INFO(rows << " rows x " << cols << " cols");
  CHECK(std::count(got.begin(), got.end(), 1) == static_cast<std::ptrdiff_t>(rows * cols));
}

namespace {
/// A row kernel with a prefetch hook that logs, in order, "p r" for each
/// prefetch(r) and "r" when row r's first element runs (one thread: the loops
/// below are under the OpenMP threshold).
struct LogRows {
  std::vector<std::string>* log;
  const float* table;
  std::size_t cols;
  void operator()(std::size_t r, std::size_t c) const {
    if (c == 0) log->push_back(std::to_string(r));
  }
  void prefetch(std::size_t r) const {
    px::prefetch_bytes(table + r * cols, cols * sizeof(float));
    log->push_back("p " + std::to_string(r));
  }
};
}  // namespace

TEST_CASE("for_each_rows on the host prefetches each row once, rows ahead of it, where the kernel can", "[space]") {
  static_assert(px::detail::has_prefetch<LogRows>::value);
  static_assert(!px::detail::has_prefetch<CountVisit>::value);
  static_assert(px::detail::has_prefetch<px::detail::GatherRows<float>>::value);
  static_assert(px::detail::has_prefetch<px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float, 1>>::value);
  // About 8 KiB of 4-byte elements ahead, at least one row, at most 64.
  CHECK(px::detail::prefetch_rows_ahead(128) == 16);
  CHECK(px::detail::prefetch_rows_ahead(1024) == 2);
  CHECK(px::detail::prefetch_rows_ahead(4096) == 1);
  CHECK(px::detail::prefetch_rows_ahead(8) == 64);
  CHECK(px::detail::prefetch_rows_ahead(0) == 64);

  const std::size_t wide = 1024;  // two rows ahead
  std::vector<float> table(4 * wide, 1.0f);
  std::vector<std::string> log;
  px::for_each_rows(px::Exec<px::HostSpace>{}, 4, wide, LogRows{&log, table.data(), wide});
  CHECK(log == std::vector<std::string>{"p 0", "p 1", "p 2", "0", "p 3", "1", "2", "3"});
  log.clear();
  px::for_each_rows(px::Exec<px::HostSpace>{}, 4, 8, LogRows{&log, table.data(), 8});  // all rows ahead at once
  CHECK(log == std::vector<std::string>{"p 0", "p 1", "p 2", "p 3", "0", "1", "2", "3"});
  log.clear();
  px::for_each_rows(px::Exec<px::HostSpace>{}, 1, 8, LogRows{&log, table.data(), 8});
  CHECK(log == std::vector<std::string>{"p 0", "0"});  // no row past the end
  px::prefetch_bytes(nullptr, 0);                     // a hint of nothing is no access
}

namespace {
/// Counts each row's prefetches and runs (a team of threads: atomics).
struct CountRows {
  std::atomic<int>* prefetched;
  std::atomic<int>* ran;
  void operator()(std::size_t r, std::size_t c) const {
    if (c == 0) ran[r].fetch_add(1, std::memory_order_relaxed);
  }
  void prefetch(std::size_t r) const { prefetched[r].fetch_add(1, std::memory_order_relaxed); }
};
}  // namespace

TEST_CASE("for_each_rows over a team prefetches and runs each row once, in blocks of rows", "[space]") {
  const int saved = omp_get_max_threads();
  const int threads = GENERATE(1, 3);
  omp_set_num_threads(threads);
  const std::size_t rows = GENERATE(std::size_t{1000}, std::size_t{1001}), cols = 64;  // over the team threshold
  std::vector<std::atomic<int>> prefetched(rows), ran(rows);
  px::for_each_rows(px::Exec<px::HostSpace>{}, rows, cols, CountRows{prefetched.data(), ran.data()});
  omp_set_num_threads(saved);
  INFO(threads << " threads, " << rows << " rows");
  CHECK(std::all_of(prefetched.begin(), prefetched.end(), [](const std::atomic<int>& n) { return n.load() == 1; }));
  CHECK(std::all_of(ran.begin(), ran.end(), [](const std::atomic<int>& n) { return n.load() == 1; }));
}

TEST_CASE("Buffer allocations are 64-byte aligned on the host", "[space]") {
  px::Buffer<float> b(3);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
  px::Buffer<float> empty;
  CHECK(empty.data() == nullptr);
  CHECK(empty.to_host().empty());
}

TEST_CASE("for_each visits every index exactly once, serial and parallel", "[space]") {
  const std::size_t n = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{1000},
                                 px::detail::host_parallel_threshold * 3 + 7);
  std::vector<std::atomic<int>> hits(n);
  px::for_each(px::Exec<px::HostSpace>{}, n, [&](std::size_t i) { hits[i].fetch_add(1); });
  bool once = true;
  for (auto& h : hits) once = once && h.load() == 1;
  CHECK(once);
}
