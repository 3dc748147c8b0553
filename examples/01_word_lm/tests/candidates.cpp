// Unit tests of word_lm's candidate sets (examples/01_word_lm/model.hpp,
// make_candidates): checked against a plain construction from sets, for
// batches whose labels repeat, are sampled too, or sit at the ends of the
// vocabulary. No MPI.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "01_word_lm/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace lm = examples::word_lm;
namespace px = parallax;

namespace {

lm::Batch batch_of(const std::vector<px::index_t>& labels) {
  lm::Batch b;
  b.rows = labels.size();
  b.labels = labels;
  b.context.assign(2 * labels.size(), 0);
  return b;
}

// The candidates as the model defines them, built the slow, obvious way.
void check_against_sets(const examples::LogUniformSampler& sampler, std::size_t count, std::uint64_t seed,
                        std::uint64_t step, const lm::Batch& batch) {
  const lm::Candidates c = lm::make_candidates(sampler, count, seed, step, batch);
  const auto s = sampler.sample(count, examples::hash(seed, 0x5A3F, step));
  std::set<px::index_t> all(s.ids.begin(), s.ids.end());
  all.insert(batch.labels.begin(), batch.labels.end());
  REQUIRE(c.ids == std::vector<px::index_t>(all.begin(), all.end()));
  CHECK(c.sampled == count);
  REQUIRE(c.sampled_row.size() == count);
  REQUIRE(c.column.size() == c.ids.size());
  std::vector<std::int32_t> column(c.ids.size(), 0);
  for (std::size_t j = 0; j < count; ++j) {
    CHECK(c.ids[static_cast<std::size_t>(c.sampled_row[j])] == s.ids[j]);
    column[static_cast<std::size_t>(c.sampled_row[j])] = static_cast<std::int32_t>(j + 1);
  }
  CHECK(c.column == column);
  REQUIRE(c.label_row.size() == batch.rows);
  for (std::size_t b = 0; b < batch.rows; ++b) CHECK(c.ids[static_cast<std::size_t>(c.label_row[b])] == batch.labels[b]);
  REQUIRE(c.log_q.size() == c.ids.size());
  for (std::size_t i = 0; i < c.ids.size(); ++i)
    CHECK(c.log_q[i] == static_cast<float>(std::log(sampler.expected_count(c.ids[i], s.tries))));
}

}  // namespace

TEST_CASE("make_candidates: the sampled words and this rank's labels, ascending, with their rows", "[word_lm]") {
  const examples::LogUniformSampler sampler(1000);
  const auto sampled = sampler.sample(50, examples::hash(7, 0x5A3F, 3)).ids;
  SECTION("labels outside the sample") { check_against_sets(sampler, 50, 7, 3, batch_of({999, 998, 997})); }
  SECTION("labels that were sampled too, and repeated labels") {
    check_against_sets(sampler, 50, 7, 3, batch_of({sampled[0], sampled[49], 999, sampled[10], 999, sampled[0]}));
  }
  SECTION("the first and last words of the vocabulary") { check_against_sets(sampler, 50, 7, 3, batch_of({0, 999})); }
  SECTION("no rows") { check_against_sets(sampler, 50, 7, 3, batch_of({})); }
  SECTION("every word sampled") { check_against_sets(sampler, 1000, 7, 3, batch_of({5, 500})); }
  SECTION("a vocabulary the sampler sorts instead of scanning") {
    check_against_sets(examples::LogUniformSampler(5000000), 30, 7, 3, batch_of({4999999, 17, 17, 2}));
  }
  SECTION("many steps") {
    for (std::uint64_t step = 0; step < 20; ++step) check_against_sets(sampler, 200, 11, step, batch_of({1, 2, 3, 400}));
  }
}
