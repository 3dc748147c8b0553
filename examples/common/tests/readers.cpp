// Unit tests of the examples' readers (examples/common/readers.hpp: the text
// tokenizer and top-V vocabulary, the Criteo TSV parser) and of the synthetic
// data they stand in for (examples/common/synthetic.hpp). No MPI.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include "common/readers.hpp"
#include "common/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using examples::CriteoRecord;
using examples::ReadError;

namespace {

/// The message of the ReadError `f` throws ("" if none).
template <class F>
std::string read_error(F&& f) {
  try {
    f();
  } catch (const ReadError& e) {
    return e.what();
  }
  return "";
}

/// A valid Criteo line: label, 13 integers, 26 hex values, with `missing`
/// dense / categorical fields left empty.
std::string criteo_line(int label = 1, std::set<std::size_t> missing = {}) {
  std::string s = std::to_string(label);
  for (std::size_t j = 0; j < 13; ++j) s += "\t" + (missing.count(1 + j) ? std::string() : std::to_string(j * 7));
  for (std::size_t f = 0; f < 26; ++f) {
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", static_cast<unsigned>(0x1000 * f + 0xabc));
    s += "\t" + (missing.count(14 + f) ? std::string() : std::string(hex));
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------- tokenizer

TEST_CASE("tokenize splits on any whitespace and keeps nothing empty", "[readers][text]") {
  CHECK(examples::tokenize("  the cat\tsat \r\n") == std::vector<std::string_view>{"the", "cat", "sat"});
  CHECK(examples::tokenize("").empty());
  CHECK(examples::tokenize(" \t\v\f\r ").empty());
  CHECK(examples::tokenize("one") == std::vector<std::string_view>{"one"});
  CHECK(examples::tokenize("a  b") == std::vector<std::string_view>{"a", "b"});
  CHECK(examples::tokenize("caf\xc3\xa9 na\xc3\xafve") == std::vector<std::string_view>{"caf\xc3\xa9", "na\xc3\xafve"});
}

TEST_CASE("binary input is an error that names the line", "[readers][text]") {
  CHECK_THAT(read_error([] { examples::tokenize(std::string_view("ab\0cd", 5), 7); }),
             Catch::Contains("line 7") && Catch::Contains("NUL byte at column 3"));
  const std::string long_word(examples::max_word_bytes + 1, 'x');
  CHECK_THAT(read_error([&] { examples::tokenize("ok " + long_word, 2); }),
             Catch::Contains("line 2") && Catch::Contains("1025 bytes"));
  CHECK(examples::tokenize(std::string(examples::max_word_bytes, 'y')).size() == 1);
  static const char text[] = "fine line\nsecond\nbad\0line\n";
  std::istringstream in(std::string(text, sizeof text - 1));
  CHECK_THAT(read_error([&] { examples::read_corpus(in, 10); }), Catch::StartsWith("line 3:"));
}

TEST_CASE("the vocabulary keeps the most frequent words, by frequency, with <unk> for the rest", "[readers][text]") {
  const std::string text = "b a b c\nc b d\n\ne a b\nz";  // b:4, a:2, c:2, d:1, e:1, z:1
  SECTION("room for everything") {
    const auto v = examples::Vocabulary::build(text, 100);
    REQUIRE(v.size() == 7);  // 6 words and <unk> (count 0, last)
    CHECK(v.word(0) == "b");
    CHECK(v.word(1) == "a");  // ties by byte order
    CHECK(v.word(2) == "c");
    CHECK(v.count(0) == 4);
    CHECK(v.word(v.unknown_id()) == "<unk>");
    CHECK(v.count(v.unknown_id()) == 0);
    CHECK(v.id("z") == 5);
    CHECK(v.id("never") == v.unknown_id());
  }
  SECTION("a top-4 vocabulary: <unk> takes the count of the words left out") {
    const auto v = examples::Vocabulary::build(text, 4);
    REQUIRE(v.size() == 4);
    CHECK(v.word(0) == "b");
    CHECK(v.word(1) == "<unk>");  // d + e + z = 3 occurrences: more than a and c
    CHECK(v.count(1) == 3);
    CHECK(v.word(2) == "a");
    CHECK(v.word(3) == "c");
    CHECK(v.id("d") == v.unknown_id());
    const auto ids = examples::encode(text, v);
    CHECK(ids == std::vector<std::int32_t>{0, 2, 0, 3, 3, 0, 1, 1, 2, 0, 1});
  }
  SECTION("size 1 is <unk> alone; the text's own <unk> merges with it") {
    const auto v = examples::Vocabulary::build("x <unk> y", 1);
    REQUIRE(v.size() == 1);
    CHECK(v.count(0) == 3);
    const auto w = examples::Vocabulary::build("x <unk> <unk> y", 5);
    CHECK(w.size() == 3);  // x, y and <unk> once
    CHECK(w.word(0) == "<unk>");
    CHECK(w.count(0) == 2);
  }
  SECTION("copies index their own words") {
    auto* original = new examples::Vocabulary(examples::Vocabulary::build(text, 100));
    const examples::Vocabulary copy = *original;
    delete original;
    CHECK(copy.id("c") == 2);
    examples::Vocabulary moved = examples::Vocabulary::build(text, 3);
    moved = copy;
    CHECK(moved.id("z") == 5);
  }
  CHECK_THROWS_AS(examples::Vocabulary::build(text, 0), std::invalid_argument);
}

TEST_CASE("read_corpus tokenizes a stream with a top-V vocabulary", "[readers][text]") {
  std::istringstream in("the cat sat on the mat\nthe end");
  const auto c = examples::read_corpus(in, 3);
  CHECK(c.vocab.size() == 3);
  CHECK(c.tokens.size() == 8);
  CHECK(c.tokens[0] == c.vocab.id("the"));
  CHECK(c.vocab.word(c.tokens[0]) == "the");
  std::istringstream empty("  \n\n ");
  CHECK_THAT(read_error([&] { examples::read_corpus(empty, 3); }), Catch::Contains("no words"));
}

// ---------------------------------------------------------------- Criteo

TEST_CASE("a Criteo line parses into label, integers and 32-bit categorical values", "[readers][criteo]") {
  const CriteoRecord r = examples::parse_criteo_line(criteo_line(1), 1);
  CHECK(r.label == 1);
  for (std::size_t j = 0; j < 13; ++j) {
    CHECK(r.dense[j] == static_cast<std::int64_t>(j * 7));
    CHECK_FALSE(r.dense_missing[j]);
  }
  for (std::size_t f = 0; f < 26; ++f) {
    CHECK(r.categorical[f] == 0x1000 * f + 0xabc);
    CHECK_FALSE(r.categorical_missing[f]);
  }
  CHECK(examples::parse_criteo_line(criteo_line(0) + "\r", 1).label == 0);  // CRLF files
  CHECK(examples::parse_criteo_line("0\t-1\t+2" + criteo_line().substr(criteo_line().find('\t', 4)), 1).dense[0] == -1);
  CHECK(examples::parse_criteo_line(criteo_line(0, {14}), 1).categorical_missing[0]);
}

TEST_CASE("missing Criteo values are empty fields", "[readers][criteo]") {
  const CriteoRecord r = examples::parse_criteo_line(criteo_line(0, {1, 5, 13, 14, 20, 39}), 4);
  CHECK(r.dense_missing[0]);
  CHECK(r.dense[0] == 0);
  CHECK(r.dense_missing[4]);
  CHECK(r.dense_missing[12]);
  CHECK_FALSE(r.dense_missing[1]);
  CHECK(r.categorical_missing[0]);
  CHECK(r.categorical[0] == 0);
  CHECK(r.categorical_missing[6]);
  CHECK(r.categorical_missing[25]);
  CHECK_FALSE(r.categorical_missing[1]);
  // Every feature missing: 39 tabs after the label.
  const CriteoRecord empty = examples::parse_criteo_line("1" + std::string(39, '\t'), 1);
  CHECK(empty.label == 1);
  CHECK(empty.categorical_missing[25]);
  // Mixed-case hex.
  std::string mixed = criteo_line(1);
  mixed.replace(mixed.rfind('\t') + 1, std::string::npos, "DeadBeeF");
  CHECK(examples::parse_criteo_line(mixed, 1).categorical[25] == 0xdeadbeefu);
}

TEST_CASE("malformed Criteo lines are errors naming the line and the field", "[readers][criteo]") {
  const std::string good = criteo_line(1);
  auto error_of = [](const std::string& line) { return read_error([&] { examples::parse_criteo_line(line, 12); }); };
  CHECK_THAT(error_of(""), Catch::Contains("line 12") && Catch::Contains("label"));
  CHECK_THAT(error_of(good.substr(0, good.rfind('\t'))),
             Catch::Contains("line 12") && Catch::Contains("39 tab-separated fields, expected 40"));
  CHECK_THAT(error_of(good + "\t00000001"), Catch::Contains("41 tab-separated fields, expected 40"));
  CHECK_THAT(error_of(good + "\t"), Catch::Contains("41 tab-separated fields"));
  CHECK_THAT(error_of("2" + good.substr(1)), Catch::Contains("field 1") && Catch::Contains("'2' is not 0 or 1"));
  CHECK_THAT(error_of("x" + good.substr(1)), Catch::Contains("field 1"));
  std::string bad_int = good;
  bad_int.replace(2, 1, "1a");  // field 2
  CHECK_THAT(error_of(bad_int), Catch::Contains("field 2") && Catch::Contains("not an integer"));
  CHECK_THAT(error_of("1\t-" + good.substr(good.find('\t', 2))), Catch::Contains("field 2") && Catch::Contains("not an integer"));
  CHECK_THAT(error_of("1\t99999999999999999999" + good.substr(good.find('\t', 2))), Catch::Contains("out of range"));
  std::string long_hex = good;
  long_hex.replace(long_hex.rfind('\t') + 1, std::string::npos, "123456789");
  CHECK_THAT(error_of(long_hex), Catch::Contains("field 40") && Catch::Contains("more than 8 hex digits"));
  std::string not_hex = good;
  not_hex.replace(not_hex.rfind('\t') + 1, std::string::npos, "12g4");
  CHECK_THAT(error_of(not_hex), Catch::Contains("field 40") && Catch::Contains("not hexadecimal"));
  CHECK_THAT(error_of(std::string("1\0", 2) + good.substr(1)), Catch::Contains("field 1"));
}

TEST_CASE("read_criteo reads a stream, skips empty lines and reports bad ones by number", "[readers][criteo]") {
  std::istringstream in(criteo_line(1) + "\n\n" + criteo_line(0, {3}) + "\r\n" + criteo_line(1) + "\n");
  const auto records = examples::read_criteo(in);
  REQUIRE(records.size() == 3);
  CHECK(records[1].label == 0);
  CHECK(records[1].dense_missing[2]);
  std::istringstream limited(criteo_line(1) + "\n" + criteo_line(0) + "\n" + criteo_line(1) + "\n");
  CHECK(examples::read_criteo(limited, 2).size() == 2);
  std::istringstream bad(criteo_line(1) + "\n\n" + criteo_line(1) + "\n1\t2\n");
  CHECK_THAT(read_error([&] { examples::read_criteo(bad); }), Catch::StartsWith("line 4:"));
}

// ---------------------------------------------------------------- synthetic data

TEST_CASE("Zipf draws follow 1/(k+1)^s", "[synthetic]") {
  const examples::Zipf z(1000, 1.0);
  double total = 0;
  for (std::size_t k = 0; k < 1000; ++k) total += z.probability(k);
  CHECK(total == Approx(1.0).epsilon(1e-9));
  CHECK(z.probability(0) / z.probability(9) == Approx(10.0).epsilon(1e-9));
  std::vector<int> hist(1000);
  for (std::uint64_t i = 0; i < 200000; ++i) ++hist[z.draw(examples::uniform(examples::hash(3, i)))];
  CHECK(hist[0] / 200000.0 == Approx(z.probability(0)).epsilon(0.03));
  CHECK(z.draw(0.0) == 0);
  CHECK(z.draw(0.9999999999) < 1000);
}

TEST_CASE("Zipf's guided draw is the whole table's search", "[synthetic]") {
  const examples::Zipf z(100000, 1.05);
  std::vector<double> cdf(100000);
  for (std::size_t k = 0; k < cdf.size(); ++k) cdf[k] = (k ? cdf[k - 1] : 0.0) + z.probability(k);
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const double u = i < 4097 ? static_cast<double>(i) / 4096 * 0.9999999999 : examples::uniform(examples::hash(5, i));
    // The first k whose cumulative probability exceeds u, up to rounding at the table's edges.
    const std::size_t k = z.draw(u);
    REQUIRE(k < 100000);
    CHECK((k == 0 || z.probability(k) > 0));
    CHECK((k == 0 || cdf[k - 1] <= u + 1e-9));
    CHECK(cdf[k] > u - 1e-9);
  }
}

TEST_CASE("multi-hot synthetic clicks: bags of 1-100 ids, a mean near 19, the one-hot id first", "[synthetic]") {
  const std::vector<std::size_t> rows{1000, 50000, 50000};
  const examples::SyntheticClicks one_hot(rows, 4, 9);
  examples::SyntheticClicks multi(rows, 4, 9);
  multi.set_multi_hot({false, true, true});
  examples::ClickExample a, b;
  double total = 0;
  std::size_t longest = 0;
  for (std::uint64_t i = 0; i < 2000; ++i) {
    one_hot.make(i, a);
    multi.make(i, b);
    REQUIRE(b.bag_ends.size() == 2);
    CHECK(b.ids == a.ids);
    CHECK(b.bag_ids[0] == a.ids[1]);
    CHECK(b.bag_ids[b.bag_ends[0]] == a.ids[2]);
    const std::size_t first = b.bag_ends[0], second = b.bag_ends[1] - b.bag_ends[0];
    CHECK(first >= 1);
    CHECK(second >= 1);
    longest = std::max({longest, first, second});
    total += static_cast<double>(first + second);
    for (auto id : b.bag_ids) CHECK((id >= 0 && id < 50000));
  }
  CHECK(longest <= 100);
  CHECK(total / 4000 == Approx(19.3).epsilon(0.15));
  CHECK_THROWS_AS(multi.set_multi_hot({true}), std::invalid_argument);
}

TEST_CASE("the log-uniform sampler gives distinct, reproducible samples and inclusion probabilities", "[synthetic]") {
  const examples::LogUniformSampler s(50000);
  const auto a = s.sample(500, 7), b = s.sample(500, 7), c = s.sample(500, 8);
  CHECK(a.ids == b.ids);  // the same key: the same sample (every rank agrees)
  CHECK(a.ids != c.ids);
  CHECK(std::set<std::int64_t>(a.ids.begin(), a.ids.end()).size() == 500);
  CHECK(a.tries >= 500);
  for (auto id : a.ids) {
    CHECK(id >= 0);
    CHECK(id < 50000);
  }
  // Expected counts: inclusion probabilities, higher for frequent (low) ids.
  CHECK(s.expected_count(0, a.tries) > s.expected_count(1000, a.tries));
  CHECK(s.expected_count(0, a.tries) <= 1.0);
  CHECK(s.expected_count(49999, a.tries) > 0.0);
  double sum = 0;  // the expected sample size is the number of distinct ids
  for (std::int64_t k = 0; k < 50000; ++k) sum += s.expected_count(k, a.tries);
  CHECK(sum == Approx(500).epsilon(0.05));
  CHECK_THROWS_AS(s.sample(50001, 1), std::invalid_argument);
  const examples::LogUniformSampler all(10);
  CHECK(all.sample(10, 3).ids == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("the log-uniform sampler's ids are ascending whether it scans its bitmap or sorts", "[synthetic]") {
  // 500 of 50,000: the bitmap (782 words) is scanned. 20 of 10,000,000: the
  // draws are sorted. Either way: ascending, distinct, and the draws' set.
  for (const auto& [range, count] : {std::pair<std::size_t, std::size_t>{50000, 500}, {10000000, 20}, {64, 64}, {65, 3}}) {
    CAPTURE(range, count);
    const examples::LogUniformSampler s(range);
    for (std::uint64_t key = 1; key <= 3; ++key) {
      const auto a = s.sample(count, key);
      REQUIRE(a.ids.size() == count);
      CHECK(std::adjacent_find(a.ids.begin(), a.ids.end(), std::greater_equal<>()) == a.ids.end());
      CHECK(a.ids.front() >= 0);
      CHECK(a.ids.back() < static_cast<std::int64_t>(range));
      CHECK(s.sample(count, key).ids == a.ids);  // the scratch bitmap was left clear
      // The ids are exactly the distinct values of the first `tries` draws.
      std::set<std::int64_t> drawn;
      for (std::uint64_t t = 0; t < a.tries; ++t) {
        const double u = examples::uniform(examples::hash(key, t));
        const auto k = static_cast<std::int64_t>(std::exp(u * std::log(static_cast<double>(range) + 1.0))) - 1;
        drawn.insert(std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(range) - 1));
      }
      CHECK(std::vector<std::int64_t>(drawn.begin(), drawn.end()) == a.ids);
    }
  }
}

TEST_CASE("synthetic data is a pure function of the seed and the index", "[synthetic]") {
  const auto a = examples::SyntheticCorpus{1000, 5000, 1.0, 0.5, 9}.make();
  CHECK(a == examples::SyntheticCorpus{1000, 5000, 1.0, 0.5, 9}.make());
  CHECK(a != examples::SyntheticCorpus{1000, 5000, 1.0, 0.5, 10}.make());
  CHECK(*std::max_element(a.begin(), a.end()) < 1000);

  const examples::SyntheticClicks clicks({10, 1000, 3}, 4, 5);
  examples::ClickExample e1, e2;
  clicks.make(123, e1);
  clicks.make(123, e2);
  CHECK(e1.ids == e2.ids);
  CHECK(e1.dense == e2.dense);
  CHECK(e1.label == e2.label);
  CHECK(e1.ids[0] < 10);
  CHECK(e1.ids[2] < 3);

  const examples::TeacherData teacher(8, 5, 2);
  std::vector<float> x1(8), x2(8);
  CHECK(teacher.make(77, x1.data()) == teacher.make(77, x2.data()));
  CHECK(x1 == x2);
}
