#pragma once
/// @file
/// Readers for the examples' real data: a whitespace tokenizer with a top-V
/// vocabulary (01_word_lm --corpus) and the Criteo click-log TSV format
/// (02_ctr --data).
///
/// Pure functions over std::string_view / std::istream with no MPI and no
/// parallax dependency, so they can be unit-tested and fuzzed alone. Malformed
/// input throws ReadError (a std::runtime_error) whose message starts with
/// "line N:".

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace examples {

/// Malformed input: the message names the 1-based line number.
class ReadError : public std::runtime_error {
 public:
  ReadError(std::size_t line, const std::string& what)
      : std::runtime_error("line " + std::to_string(line) + ": " + what), line_(line) {}
  std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

// ---------------------------------------------------------------- text corpus

/// Space, tab, CR, LF, vertical tab and form feed separate words.
constexpr bool is_space(char c) noexcept {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

/// Longest word a corpus may hold; longer runs of non-space bytes are taken
/// as a sign that the file is not text.
inline constexpr std::size_t max_word_bytes = 1024;

/// Calls `f(word)` for every whitespace-separated word of `line`, in order.
/// Throws ReadError (naming `line_number`) on a NUL byte or a word longer
/// than max_word_bytes: a binary file is not a corpus.
template <class F>
void for_each_word(std::string_view line, std::size_t line_number, F&& f) {
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    const std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) {
      if (line[i] == '\0') throw ReadError(line_number, "NUL byte at column " + std::to_string(i + 1) + " (not a text file?)");
      ++i;
    }
    if (i == start) break;
    if (i - start > max_word_bytes)
      throw ReadError(line_number, "a word of " + std::to_string(i - start) + " bytes (more than " +
                                       std::to_string(max_word_bytes) + "; not a text file?)");
    f(line.substr(start, i - start));
  }
}

/// The words of one line, as views into it.
inline std::vector<std::string_view> tokenize(std::string_view line, std::size_t line_number = 1) {
  std::vector<std::string_view> out;
  for_each_word(line, line_number, [&](std::string_view w) { out.push_back(w); });
  return out;
}

/// Calls `f(line, line_number)` for every line of `text` (LF-separated; a
/// final line without LF counts).
template <class F>
void for_each_line(std::string_view text, F&& f) {
  std::size_t line_number = 1, at = 0;
  while (at < text.size()) {
    const std::size_t eol = text.find('\n', at);
    const std::size_t end = eol == std::string_view::npos ? text.size() : eol;
    f(text.substr(at, end - at), line_number);
    if (eol == std::string_view::npos) break;
    at = eol + 1;
    ++line_number;
  }
}

/// Word ids ordered by frequency: id 0 is the most frequent word, as TF's
/// log-uniform candidate sampler assumes. Words outside the vocabulary map
/// to "<unk>", which takes its place in the order by the count of all of them.
class Vocabulary {
 public:
  static constexpr std::string_view unknown = "<unk>";

  /// The `size` most frequent words of `text` (ties broken by byte order, so
  /// the result is deterministic), "<unk>" among them. `size` must be >= 1.
  static Vocabulary build(std::string_view text, std::size_t size) {
    if (size == 0) throw std::invalid_argument("Vocabulary::build: the vocabulary size must be at least 1");
    std::unordered_map<std::string_view, std::uint64_t> counts;
    for_each_line(text, [&](std::string_view line, std::size_t n) {
      for_each_word(line, n, [&](std::string_view w) { ++counts[w]; });
    });
    std::vector<std::pair<std::string_view, std::uint64_t>> ranked(counts.begin(), counts.end());
    auto by_count = [](const auto& a, const auto& b) { return a.second != b.second ? a.second > b.second : a.first < b.first; };
    std::sort(ranked.begin(), ranked.end(), by_count);
    // The "<unk>" token of the text, if any, is merged with the words left out.
    auto it = std::find_if(ranked.begin(), ranked.end(), [](const auto& e) { return e.first == unknown; });
    std::uint64_t unk = 0;
    if (it != ranked.end()) {
      unk = it->second;
      ranked.erase(it);
    }
    const std::size_t keep = std::min(ranked.size(), size - 1);
    for (std::size_t i = keep; i < ranked.size(); ++i) unk += ranked[i].second;
    ranked.resize(keep);
    ranked.emplace_back(unknown, unk);
    std::stable_sort(ranked.begin(), ranked.end(), by_count);

    Vocabulary v;
    v.words_.reserve(ranked.size());
    v.counts_.reserve(ranked.size());
    for (const auto& [w, c] : ranked) {
      v.words_.emplace_back(w);
      v.counts_.push_back(c);
    }
    v.index();
    return v;
  }

  Vocabulary() = default;
  // The index holds views of words_: a copy indexes its own words; a move
  // keeps the words where they are.
  Vocabulary(const Vocabulary& o) : words_(o.words_), counts_(o.counts_) { index(); }
  Vocabulary& operator=(const Vocabulary& o) {
    if (this != &o) {
      words_ = o.words_;
      counts_ = o.counts_;
      index();
    }
    return *this;
  }
  Vocabulary(Vocabulary&&) noexcept = default;
  Vocabulary& operator=(Vocabulary&&) noexcept = default;

  std::size_t size() const noexcept { return words_.size(); }
  /// The id of a word; unknown_id() for words outside the vocabulary.
  std::int32_t id(std::string_view word) const {
    auto it = ids_.find(word);
    return it == ids_.end() ? unknown_id_ : it->second;
  }
  const std::string& word(std::int32_t id) const { return words_.at(static_cast<std::size_t>(id)); }
  /// Occurrences of word `id` in the text it was built from.
  std::uint64_t count(std::int32_t id) const { return counts_.at(static_cast<std::size_t>(id)); }
  std::int32_t unknown_id() const noexcept { return unknown_id_; }

 private:
  void index() {
    ids_.clear();
    for (std::size_t i = 0; i < words_.size(); ++i) ids_.emplace(words_[i], static_cast<std::int32_t>(i));
    unknown_id_ = ids_.at(unknown);
  }

  std::vector<std::string> words_;
  std::vector<std::uint64_t> counts_;
  std::unordered_map<std::string_view, std::int32_t> ids_;  // views of words_
  std::int32_t unknown_id_ = 0;
};

/// The words of `text` as vocabulary ids, in order.
inline std::vector<std::int32_t> encode(std::string_view text, const Vocabulary& vocab) {
  std::vector<std::int32_t> out;
  for_each_line(text, [&](std::string_view line, std::size_t n) {
    for_each_word(line, n, [&](std::string_view w) { out.push_back(vocab.id(w)); });
  });
  return out;
}

/// A tokenized text: its vocabulary and its words as ids.
struct Corpus {
  Vocabulary vocab;
  std::vector<std::int32_t> tokens;
};

/// Reads a whole text (whitespace-separated words) with a vocabulary of its
/// `vocab_size` most frequent words. Throws ReadError on binary input and
/// when the text holds no word.
inline Corpus read_corpus(std::istream& in, std::size_t vocab_size) {
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Corpus c{Vocabulary::build(text, vocab_size), {}};
  c.tokens = encode(text, c.vocab);
  if (c.tokens.empty()) throw ReadError(1, "the corpus holds no words");
  return c;
}

// ---------------------------------------------------------------- Criteo TSV

/// One line of a Criteo click log (Kaggle Display Advertising / Terabyte):
/// a 0/1 label, 13 integer features and 26 categorical features (32-bit
/// values as 8 hex digits), tab-separated. Any feature may be empty (missing).
struct CriteoRecord {
  static constexpr std::size_t dense_features = 13;
  static constexpr std::size_t categorical_features = 26;
  static constexpr std::size_t fields = 1 + dense_features + categorical_features;

  int label = 0;
  std::array<std::int64_t, dense_features> dense{};  ///< 0 where missing
  std::array<bool, dense_features> dense_missing{};
  std::array<std::uint32_t, categorical_features> categorical{};  ///< 0 where missing
  std::array<bool, categorical_features> categorical_missing{};
};

namespace detail {

inline std::int64_t parse_integer(std::string_view s, std::size_t line, std::size_t field) {
  std::size_t i = 0;
  const bool negative = !s.empty() && (s[0] == '-' || s[0] == '+') ? (i = 1, s[0] == '-') : false;
  if (i == s.size()) throw ReadError(line, "field " + std::to_string(field) + ": '" + std::string(s) + "' is not an integer");
  std::uint64_t v = 0;
  constexpr std::uint64_t limit = std::uint64_t{1} << 62;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c < '0' || c > '9')
      throw ReadError(line, "field " + std::to_string(field) + ": '" + std::string(s) + "' is not an integer");
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
    if (v >= limit) throw ReadError(line, "field " + std::to_string(field) + ": integer '" + std::string(s) + "' is out of range");
  }
  return negative ? -static_cast<std::int64_t>(v) : static_cast<std::int64_t>(v);
}

inline std::uint32_t parse_hex32(std::string_view s, std::size_t line, std::size_t field) {
  if (s.size() > 8)
    throw ReadError(line, "field " + std::to_string(field) + ": '" + std::string(s) + "' has more than 8 hex digits");
  std::uint32_t v = 0;
  for (char c : s) {
    std::uint32_t d;
    if (c >= '0' && c <= '9') d = static_cast<std::uint32_t>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<std::uint32_t>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<std::uint32_t>(c - 'A' + 10);
    else throw ReadError(line, "field " + std::to_string(field) + ": '" + std::string(s) + "' is not hexadecimal");
    v = (v << 4) | d;
  }
  return v;
}

}  // namespace detail

/// Parses one Criteo line (without its LF; a trailing CR is ignored).
/// Throws ReadError naming `line_number` and the 1-based field on a wrong
/// field count, a label other than 0/1, a non-integer dense value or a
/// categorical value that is not up to 8 hex digits.
inline CriteoRecord parse_criteo_line(std::string_view line, std::size_t line_number) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  CriteoRecord r;
  std::size_t field = 0, at = 0;
  for (;;) {
    const std::size_t tab = line.find('\t', at);
    const std::string_view f = line.substr(at, tab == std::string_view::npos ? std::string_view::npos : tab - at);
    if (field >= CriteoRecord::fields) {
      const auto count = static_cast<std::size_t>(std::count(line.begin(), line.end(), '\t')) + 1;
      throw ReadError(line_number, std::to_string(count) + " tab-separated fields, expected " +
                                       std::to_string(CriteoRecord::fields));
    }
    if (field == 0) {
      if (f != "0" && f != "1") throw ReadError(line_number, "field 1: the label '" + std::string(f) + "' is not 0 or 1");
      r.label = f == "1" ? 1 : 0;
    } else if (field <= CriteoRecord::dense_features) {
      const std::size_t j = field - 1;
      r.dense_missing[j] = f.empty();
      if (!f.empty()) r.dense[j] = detail::parse_integer(f, line_number, field + 1);
    } else {
      const std::size_t j = field - 1 - CriteoRecord::dense_features;
      r.categorical_missing[j] = f.empty();
      if (!f.empty()) r.categorical[j] = detail::parse_hex32(f, line_number, field + 1);
    }
    ++field;
    if (tab == std::string_view::npos) break;
    at = tab + 1;
  }
  if (field != CriteoRecord::fields)
    throw ReadError(line_number, std::to_string(field) + " tab-separated fields, expected " +
                                     std::to_string(CriteoRecord::fields));
  return r;
}

/// Reads up to `max_records` records (0: all) of a Criteo file. Empty lines
/// are skipped; any other malformed line throws ReadError with its number.
inline std::vector<CriteoRecord> read_criteo(std::istream& in, std::size_t max_records = 0) {
  std::vector<CriteoRecord> out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line == "\r") continue;
    out.push_back(parse_criteo_line(line, n));
    if (max_records && out.size() == max_records) break;
  }
  return out;
}

}  // namespace examples
