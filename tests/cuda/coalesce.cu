// cuda/coalesce.cuh (CUDA builds, [gpu]): the CUB coalesce gives the same
// bits as the Thrust path on the device and as the host path, on inputs
// with many duplicates, and keeps its scratch across calls.
#include "support.hpp"

#include <parallax/cuda/coalesce.cuh>

#include <cstdint>
#include <random>
#include <vector>

namespace {

struct Input {
  std::vector<px::index_t> ids;
  std::vector<float> values;
};

/// n rows of `cols` values; ids in [0, rows) with about `dup` of them repeats.
/// Values are not integers, so a different summation order would show.
Input make_input(std::size_t n, std::size_t cols, std::size_t rows, double dup, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<px::index_t> any(0, static_cast<px::index_t>(rows) - 1);
  std::uniform_real_distribution<float> val(-1.f, 1.f);
  std::bernoulli_distribution repeat(dup);
  Input in;
  in.ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && repeat(rng)) {
      std::uniform_int_distribution<std::size_t> earlier(0, i - 1);
      in.ids.push_back(in.ids[earlier(rng)]);
    } else {
      in.ids.push_back(any(rng));
    }
  }
  in.values.resize(n * cols);
  for (auto& v : in.values) v = val(rng) * 1000.f;
  return in;
}

template <class Space>
std::pair<std::vector<px::index_t>, std::vector<float>> coalesce(const Input& in, std::size_t cols, bool cub) {
  px::Exec<Space> ex;
  auto ids = px::Buffer<px::index_t, Space>::from_host(in.ids);
  auto values = px::Buffer<float, Space>::from_host(in.values);
  px::Buffer<px::index_t, Space> out_ids;
  px::Buffer<float, Space> out_values;
  px::detail::CoalesceScratch<Space> scratch;
  std::size_t m = 0;
  for (int round = 0; round < 2; ++round) {  // the second call reuses the scratch
    if constexpr (std::is_same_v<Space, px::CudaSpace>) {
      m = cub ? px::detail::coalesce_rows_cub(ex, ids.data(), values.data(), in.ids.size(), cols, out_ids, out_values,
                                              scratch)
              : px::detail::coalesce_rows_thrust(ex, ids.data(), values.data(), in.ids.size(), cols, out_ids,
                                                 out_values, scratch);
    } else {
      m = px::detail::coalesce_rows(ex, ids.data(), values.data(), in.ids.size(), cols, out_ids, out_values, scratch);
    }
  }
  ex.synchronize();
  REQUIRE(out_ids.size() == m);
  REQUIRE(out_values.size() == m * cols);
  return {out_ids.to_host(), out_values.to_host()};
}

}  // namespace

TEST_CASE("CUB coalesce equals the Thrust and host paths bit for bit", "[gpu][cuda][coalesce]") {
  const std::size_t n = GENERATE(0u, 1u, 2u, 1000u, 100003u);
  const std::size_t cols = GENERATE(1u, 64u);
  const auto in = make_input(n, cols, n < 10 ? 4 : n / 2, 0.1, 17 + static_cast<unsigned>(n));
  const auto cub = coalesce<px::CudaSpace>(in, cols, true);
  const auto thrust = coalesce<px::CudaSpace>(in, cols, false);
  const auto host = coalesce<px::HostSpace>(in, cols, false);
  CHECK(cub.first == host.first);
  CHECK(cub.first == thrust.first);
  CHECK(cub.second == host.second);  // float vectors compared exactly
  CHECK(cub.second == thrust.second);
  for (std::size_t i = 1; i < cub.first.size(); ++i) REQUIRE(cub.first[i - 1] < cub.first[i]);
}

// The CUB path sorts only the bits the largest id uses: ids far from zero
// (41 bits) and negative ids (all 64 bits) must come out the same.
TEST_CASE("CUB coalesce sorts ids of any range, negative ones too", "[gpu][cuda][coalesce]") {
  const px::index_t offset = GENERATE(px::index_t{0}, px::index_t{1} << 40, px::index_t{-5000});
  auto in = make_input(20000, 8, 10000, 0.2, 5);
  for (auto& id : in.ids) id += offset;
  const auto cub = coalesce<px::CudaSpace>(in, 8, true);
  const auto host = coalesce<px::HostSpace>(in, 8, false);
  CHECK(cub.first == host.first);
  CHECK(cub.second == host.second);
  REQUIRE(!cub.first.empty());
  CHECK(cub.first.front() >= offset);
}

TEST_CASE("SparseGrad<CudaSpace>::coalesce sums duplicates in the order added", "[gpu][cuda][coalesce]") {
  px::SparseGrad<float, px::CudaSpace> g({10, 2}, "emb");
  g.add(std::vector<px::index_t>{7, 2, 7, 0, 2, 7}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  g.coalesce();
  CHECK(g.index_buffer().to_host() == std::vector<px::index_t>{0, 2, 7});
  CHECK(g.value_buffer().to_host() == std::vector<float>{7, 8, 3 + 9, 4 + 10, 1 + 5 + 11, 2 + 6 + 12});
}
