// The pooling kernels of bags.hpp: pool_bags sums (times weights, divided by
// the count for mean) each bag's rows in bag order, an empty bag pools to
// zeros; expand_bags gives each id its bag's gradient row (times its weight,
// divided by the bag's count for mean), in host and device memory.
#include "support.hpp"

#include <cmath>
#include <vector>

namespace {
constexpr std::size_t C = 3;
// Rows j of a looked-up request: row j's values.
float row_value(std::size_t j, std::size_t c) { return 0.5f * static_cast<float>(j) - static_cast<float>(c); }
}  // namespace

TEMPLATE_TEST_CASE("pool_bags and expand_bags follow the combiner", "[bags]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  const px::Exec<Space> ex;
  // Bags {0, 1, 2}, {}, {3}, {4, 5}.
  const std::vector<px::index_t> offsets{0, 3, 3, 4, 6}, ids{7, 1, 7, 2, 0, 5};
  const std::vector<float> weights{1.f, -2.f, 0.5f, 4.f, 3.f, 0.25f};
  const std::size_t bags = offsets.size() - 1, n = ids.size();
  std::vector<float> rows(n * C), grads(bags * C);
  for (std::size_t j = 0; j < n; ++j)
    for (std::size_t c = 0; c < C; ++c) rows[j * C + c] = row_value(j, c);
  for (std::size_t b = 0; b < bags; ++b)
    for (std::size_t c = 0; c < C; ++c) grads[b * C + c] = 1.f + static_cast<float>(b) + 0.125f * static_cast<float>(c);
  const auto d_offsets = px::Buffer<px::index_t, Space>::from_host(offsets);
  const auto d_ids = px::Buffer<px::index_t, Space>::from_host(ids);
  const auto d_weights = px::Buffer<float, Space>::from_host(weights);
  const auto d_rows = px::Buffer<float, Space>::from_host(rows);
  const auto d_grads = px::Buffer<float, Space>::from_host(grads);
  const auto combiner = GENERATE(px::Combiner::sum, px::Combiner::mean, px::Combiner::weighted_sum);
  const bool weighted = combiner == px::Combiner::weighted_sum;
  INFO("combiner " << px::to_string(combiner));

  px::Buffer<float, Space> pooled(bags * C);
  px::pool_bags(ex, d_rows.data(), d_offsets.data(), bags, weighted ? d_weights.data() : nullptr, combiner, C,
                pooled.data());
  const auto got = pooled.to_host();
  for (std::size_t b = 0; b < bags; ++b)
    for (std::size_t c = 0; c < C; ++c) {
      float want = 0.f;  // the same additions, in bag order
      for (auto j = offsets[b]; j < offsets[b + 1]; ++j) {
        const auto uj = static_cast<std::size_t>(j);
        want += weighted ? weights[uj] * rows[uj * C + c] : rows[uj * C + c];
      }
      const auto k = offsets[b + 1] - offsets[b];
      if (combiner == px::Combiner::mean && k) want /= static_cast<float>(k);
      CHECK(std::abs(got[b * C + c] - want) <= 1e-6f * (1.f + std::abs(want)));  // FMA contraction may differ
    }
  CHECK(got[1 * C + 0] == 0.f);  // the empty bag

  px::Buffer<px::index_t, Space> out_ids(n);
  px::Buffer<float, Space> out(n * C);
  px::expand_bags(ex, d_grads.data(), d_offsets.data(), bags, d_ids.data(), weighted ? d_weights.data() : nullptr,
                  combiner, C, out_ids.data(), out.data());
  const auto gid = out_ids.to_host();
  const auto gval = out.to_host();
  CHECK(gid == ids);
  for (std::size_t b = 0; b < bags; ++b)
    for (auto j = offsets[b]; j < offsets[b + 1]; ++j)
      for (std::size_t c = 0; c < C; ++c) {
        const auto uj = static_cast<std::size_t>(j);
        float want = grads[b * C + c];
        if (combiner == px::Combiner::mean) want = want / static_cast<float>(offsets[b + 1] - offsets[b]);
        if (weighted) want = weights[uj] * want;
        CHECK(gval[uj * C + c] == want);
      }
}

TEST_CASE("bag_problem names what is wrong with a request", "[bags][errors]") {
  const px::Exec<px::HostSpace> ex;
  const std::vector<px::index_t> ids{1, 2, 3};
  const std::vector<float> w{1.f, 1.f, 1.f};
  auto problem = [&](std::vector<px::index_t> offsets, std::vector<px::index_t> i, px::Combiner c, const float* weights) {
    return px::detail::bag_problem(ex, "emb", 10, offsets, i.data(), i.size(), weights, c).value_or("");
  };
  CHECK(problem({0, 1, 3}, ids, px::Combiner::sum, nullptr).empty());
  CHECK(problem({0, 1, 3}, ids, px::Combiner::weighted_sum, w.data()).empty());
  CHECK(problem({0}, {}, px::Combiner::mean, nullptr).empty());  // no bags at all
  CHECK(problem({0, 0, 0}, {}, px::Combiner::weighted_sum, nullptr).empty());  // empty bags need no weights
  CHECK(problem({0, 3}, {1, 10, 2}, px::Combiner::sum, nullptr) ==
        "bags of variable 'emb': id 10 (entry 1, bag 0) is outside [0, 10)");
  CHECK(problem({0, 2, 2, 3}, {1, 2, 10}, px::Combiner::sum, nullptr) ==
        "bags of variable 'emb': id 10 (entry 2, bag 2) is outside [0, 10)");
}
