// space.hpp: Buffer ownership and growth, for_each coverage, host copies.
#include "support.hpp"

#include <atomic>

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

  px::Buffer<int, Space> moved = std::move(b);
  CHECK(moved.size() == 6);
  CHECK(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
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
