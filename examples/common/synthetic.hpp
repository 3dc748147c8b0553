#pragma once
/// @file
/// Seeded synthetic data for the examples, made in memory so they run with no
/// download: a counter-based random stream, Zipf and log-uniform samplers, a
/// Zipf-distributed text corpus with learnable bigrams, click logs with a
/// planted signal, and a teacher-labelled classification set.
///
/// Every example is a pure function of (seed, global example index), so any
/// rank can make any slice of a global batch and N ranks see exactly the
/// examples one process sees.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

// ---------------------------------------------------------------- random stream

/// SplitMix64's finaliser: a bijective 64-bit mix.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// A random 64-bit value for a tuple of counters.
constexpr std::uint64_t hash(std::uint64_t a, std::uint64_t b) noexcept { return mix64(a ^ mix64(b ^ 0x5851F42D4C957F2Dull)); }
constexpr std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept { return hash(hash(a, b), c); }
constexpr std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) noexcept {
  return hash(hash(a, b, c), d);
}
/// Uniform in [0, 1) from 53 bits of h.
constexpr double uniform(std::uint64_t h) noexcept { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }
/// Standard normal from h (Box-Muller).
inline double normal(std::uint64_t h) {
  const double u1 = 1.0 - uniform(mix64(h));
  const double u2 = uniform(mix64(h ^ 0xD1B54A32D192ED03ull));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

/// n floats uniform in [-1, 1), a function of the seed: test and benchmark
/// operands.
inline std::vector<float> uniform_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(2.0 * uniform(hash(seed, 0xF10A7, i)) - 1.0);
  return v;
}

/// Asks the caches for the line at p (a hint; nothing where the compiler
/// has no prefetch): the samplers read their tables at random.
inline void prefetch([[maybe_unused]] const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#endif
}

// ---------------------------------------------------------------- samplers

/// Zipf's law on [0, n): P(k) proportional to 1 / (k + 1)^s. Draws by
/// inverting a cumulative table (n doubles), the search narrowed by a guide
/// table: guide_[i] is the draw for u = i / guide_size, so a draw for u in
/// [i, i + 1) / guide_size lies in [guide_[i], guide_[i + 1]] (the same value
/// a search of the whole table finds, at a few cache lines' cost).
class Zipf {
 public:
  Zipf() = default;
  Zipf(std::size_t n, double s) : cdf_(n) {
    if (n == 0) throw std::invalid_argument("Zipf: the range must not be empty");
    double sum = 0;
    for (std::size_t k = 0; k < n; ++k) cdf_[k] = (sum += std::pow(static_cast<double>(k + 1), -s));
    for (double& c : cdf_) c /= sum;
    cdf_.back() = 1.0;
    guide_.resize(guide_size + 1);
    for (std::size_t i = 0; i <= guide_size; ++i)  // i / guide_size is exact: a power of two
      guide_[i] = static_cast<std::uint32_t>(search(0, n, static_cast<double>(i) / guide_size));
  }
  std::size_t size() const noexcept { return cdf_.size(); }
  /// The value for a uniform u in [0, 1).
  std::size_t draw(double u) const {
    const auto i = guide_index(u);
    return search(guide_[i], guide_[i + 1], u);
  }
  /// Asks for the guide entries draw(u) reads first.
  void prefetch_guide(double u) const noexcept { prefetch(&guide_[guide_index(u)]); }
  /// Asks for the middle of the table range draw(u) searches (its guide
  /// entries read: after prefetch_guide(u) had time to bring them).
  void prefetch_range(double u) const noexcept {
    const auto i = guide_index(u);
    const std::size_t mid = (static_cast<std::size_t>(guide_[i]) + guide_[i + 1]) / 2;
    if (mid < cdf_.size()) prefetch(&cdf_[mid]);
  }
  double probability(std::size_t k) const { return k == 0 ? cdf_[0] : cdf_[k] - cdf_[k - 1]; }

 private:
  static constexpr std::size_t guide_size = 4096;
  static std::size_t guide_index(double u) noexcept {
    return std::min(static_cast<std::size_t>(u * guide_size), guide_size - 1);
  }
  /// The first k in [from, to) with cdf_[k] > u, else `to`.
  std::size_t search(std::size_t from, std::size_t to, double u) const {
    return static_cast<std::size_t>(std::upper_bound(cdf_.begin() + static_cast<std::ptrdiff_t>(from),
                                                     cdf_.begin() + static_cast<std::ptrdiff_t>(std::min(to, cdf_.size())), u) -
                                    cdf_.begin());
  }
  std::vector<double> cdf_;
  std::vector<std::uint32_t> guide_;
};

/// TensorFlow's log-uniform (Zipfian) candidate sampler over [0, range):
/// P(k) = log((k + 2) / (k + 1)) / log(range + 1), for ids sorted by
/// decreasing frequency. Sampling is "unique": draws are repeated until
/// `count` distinct ids are found, and expected_count() gives each id's
/// inclusion probability for the logQ correction (as TF's RangeSampler).
class LogUniformSampler {
 public:
  /// What one call to sample() drew.
  struct Sample {
    std::vector<std::int64_t> ids;  ///< `count` distinct ids, ascending
    std::uint64_t tries = 0;        ///< draws it took
  };

  explicit LogUniformSampler(std::size_t range) : range_(range), log_range_(std::log(static_cast<double>(range) + 1.0)) {
    if (range == 0) throw std::invalid_argument("LogUniformSampler: the range must not be empty");
  }
  std::size_t range() const noexcept { return range_; }

  double probability(std::int64_t k) const {
    const double x = static_cast<double>(k);
    return (std::log(x + 2.0) - std::log(x + 1.0)) / log_range_;
  }
  /// Probability that id k is among the distinct ids of a sample that took `tries` draws.
  double expected_count(std::int64_t k, std::uint64_t tries) const {
    return -std::expm1(static_cast<double>(tries) * std::log1p(-probability(k)));
  }

  /// `count` distinct ids in ascending order, a pure function of `key` (so
  /// every rank that uses the same key, e.g. the step number, gets the same
  /// sample). Draws are marked in a bitmap of the range; when the bitmap is
  /// small next to the sample (at most 16 words of it a sampled id, e.g. 8192
  /// of 800,000 words) the ids come out of one scan of it, already in order,
  /// which costs a tenth of sorting them; otherwise the draws are sorted.
  Sample sample(std::size_t count, std::uint64_t key) const {
    if (count > range_)
      throw std::invalid_argument("LogUniformSampler: " + std::to_string(count) + " distinct samples from a range of " +
                                  std::to_string(range_));
    Sample s;
    s.ids.reserve(count);
    seen_.resize((range_ + 63) / 64);
    const bool scan = seen_.size() <= 16 * count;
    std::size_t found = 0;
    while (found < count) {
      const double u = uniform(hash(key, s.tries++));
      auto k = static_cast<std::int64_t>(std::exp(u * log_range_)) - 1;
      k = std::clamp<std::int64_t>(k, 0, static_cast<std::int64_t>(range_) - 1);
      std::uint64_t& word = seen_[static_cast<std::size_t>(k) / 64];
      const std::uint64_t bit = std::uint64_t{1} << (static_cast<std::size_t>(k) % 64);
      if (!(word & bit)) {
        word |= bit;
        ++found;
        if (!scan) s.ids.push_back(k);
      }
    }
    if (scan) {
      for (std::size_t w = 0; w < seen_.size(); ++w) {
        if (!seen_[w]) continue;
        for (std::uint64_t bits = seen_[w]; bits; bits &= bits - 1)
          s.ids.push_back(static_cast<std::int64_t>(64 * w + static_cast<std::size_t>(count_trailing_zeros(bits))));
        seen_[w] = 0;
      }
    } else {
      for (auto k : s.ids) seen_[static_cast<std::size_t>(k) / 64] = 0;
      std::sort(s.ids.begin(), s.ids.end());
    }
    return s;
  }

 private:
  static int count_trailing_zeros(std::uint64_t x) noexcept {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int n = 0;
    for (; !(x & 1); x >>= 1) ++n;
    return n;
#endif
  }
  std::size_t range_;
  double log_range_;
  mutable std::vector<std::uint64_t> seen_;  // scratch bitmap, all zero between calls
};

// ---------------------------------------------------------------- text

/// A corpus of `tokens` words over a vocabulary of `vocab` ids (id 0 the most
/// frequent). Each word follows its predecessor's fixed successor with
/// probability `follow` and is otherwise a fresh Zipf(s) draw; successors are
/// Zipf draws too, so the unigram law stays Zipf-like while frequent bigrams
/// give a language model something to learn.
struct SyntheticCorpus {
  std::size_t vocab = 100000;
  std::size_t tokens = 1000000;
  double zipf_s = 1.0;
  double follow = 0.5;
  std::uint64_t seed = 1;

  std::vector<std::int32_t> make() const {
    const Zipf zipf(vocab, zipf_s);
    std::vector<std::int32_t> out(tokens);
    std::int32_t prev = static_cast<std::int32_t>(zipf.draw(uniform(hash(seed, 0xC0, 0))));
    for (std::size_t i = 0; i < tokens; ++i) {
      std::int32_t w;
      if (i > 0 && uniform(hash(seed, 0xF0, i)) < follow)
        w = static_cast<std::int32_t>(zipf.draw(uniform(hash(seed, 0x5C, static_cast<std::uint64_t>(prev)))));
      else
        w = static_cast<std::int32_t>(zipf.draw(uniform(hash(seed, 0xC0, i))));
      out[i] = prev = w;
    }
    return out;
  }
};

// ---------------------------------------------------------------- clicks

/// One click-log example: dense features, one id per categorical feature, a
/// label; a multi-hot feature's ids (its bag) in `bag_ids`, bag_ends[m] the
/// end of the m-th multi-hot feature's bag there, and its first id in `ids`.
struct ClickExample {
  std::vector<float> dense;
  std::vector<std::int64_t> ids;
  std::vector<std::int64_t> bag_ids;
  std::vector<std::size_t> bag_ends;
  int label = 0;
};

/// Click logs with a planted signal: ids are Zipf(s) over each feature's
/// table (hot ids scattered over the table, as after hashing), every id and
/// every dense feature carries a fixed hidden weight, and the label is drawn
/// from sigmoid(sum of the weights). A model that learns the weights of the
/// frequent ids and of the dense features predicts clearly above chance.
///
/// Multi-hot features (set_multi_hot) hold a bag of 1 to max_bag ids instead
/// of one: its length a power law, P(L) proportional to 1 / L (a mean of
/// about 19 for 100), each id a Zipf draw as above (so bags share their hot
/// rows), and the bag adds the mean of its ids' weights to the logit. Their
/// hidden weights are tabulated once, so that a record costs no
/// transcendental function per id; the first id of a bag is the id the
/// feature would have one-hot.
class SyntheticClicks {
 public:
  SyntheticClicks(std::vector<std::size_t> table_rows, std::size_t dense_features, std::uint64_t seed,
                  double zipf_s = 1.05, double id_weight = 1.5, double dense_weight = 1.0)
      : rows_(std::move(table_rows)), dense_(dense_features), seed_(seed), id_weight_(id_weight),
        dense_weight_(dense_weight), multi_(rows_.size(), false) {
    for (std::size_t r : rows_) zipf_.emplace_back(r, zipf_s);
  }

  /// Makes the features marked in `multi_hot` (one flag per feature) bags of 1 to `max_bag` ids.
  void set_multi_hot(const std::vector<bool>& multi_hot, std::size_t max_bag = 100) {
    if (multi_hot.size() != rows_.size() || max_bag == 0)
      throw std::invalid_argument("SyntheticClicks::set_multi_hot: one flag per feature and a bag of 1 id or more");
    multi_ = multi_hot;
    lengths_ = Zipf(max_bag, 1.0);
    weights_.assign(rows_.size(), {});
    for (std::size_t f = 0; f < rows_.size(); ++f)
      if (multi_[f]) {
        weights_[f].resize(rows_[f]);
        for (std::size_t id = 0; id < rows_[f]; ++id) weights_[f][id] = normal(hash(seed_, 0x3E, f, id));
      }
  }
  bool multi_hot(std::size_t f) const { return multi_.at(f); }

  std::size_t features() const noexcept { return rows_.size(); }
  std::size_t dense_features() const noexcept { return dense_; }
  const std::vector<std::size_t>& table_rows() const noexcept { return rows_; }

  /// Global example `index` (training: any index; held-out: indices the training never reaches).
  void make(std::uint64_t index, ClickExample& e) const {
    e.dense.resize(dense_);
    e.ids.resize(rows_.size());
    double logit = 0;
    for (std::size_t j = 0; j < dense_; ++j) {
      const double x = normal(hash(seed_, 0xD0, index, j));
      e.dense[j] = static_cast<float>(x);
      logit += dense_weight_ * normal(hash(seed_, 0xDE, j)) * x / std::sqrt(static_cast<double>(dense_));
    }
    e.bag_ids.clear();
    e.bag_ends.clear();
    for (std::size_t f = 0; f < rows_.size(); ++f) {
      const std::size_t k = zipf_[f].draw(uniform(hash(seed_, 0x1D, index, f)));
      const auto id = static_cast<std::int64_t>((k * 2654435761ull) % rows_[f]);  // scatter hot ids
      e.ids[f] = id;
      if (!multi_[f]) {
        logit += id_weight_ * normal(hash(seed_, 0x3E, f, static_cast<std::uint64_t>(id))) /
                 std::sqrt(static_cast<double>(rows_.size()));
        continue;
      }
      const std::size_t length = 1 + lengths_.draw(uniform(hash(seed_, 0xB7, index, f)));
      // The bag's draws, then its ids, then the sum of their weights, each
      // pass asking for what the next reads a few ids ahead (the tables are
      // read at random): the same ids and sum as one id at a time.
      const std::size_t first = e.bag_ids.size();
      const std::uint64_t bag = hash(hash(seed_, 0xB1), index);  // hash(seed_, 0xB1, index, x) is hash(bag, x)
      const Zipf& z = zipf_[f];
      std::vector<double>& u = draws_scratch();
      u.resize(length);
      for (std::size_t j = 1; j < length; ++j) {
        u[j] = uniform(hash(bag, f * 1024 + j));
        z.prefetch_guide(u[j]);
      }
      e.bag_ids.push_back(id);
      constexpr std::size_t ahead = 4;
      for (std::size_t j = 1; j < std::min(length, 1 + ahead); ++j) z.prefetch_range(u[j]);
      const std::vector<double>& w = weights_[f];
      for (std::size_t j = 1; j < length; ++j) {
        if (j + ahead < length) z.prefetch_range(u[j + ahead]);
        const std::size_t kj = z.draw(u[j]);
        const auto idj = static_cast<std::int64_t>((kj * 2654435761ull) % rows_[f]);
        e.bag_ids.push_back(idj);
        prefetch(&w[static_cast<std::size_t>(idj)]);
      }
      double sum = 0;
      for (std::size_t j = first; j < e.bag_ids.size(); ++j) sum += w[static_cast<std::size_t>(e.bag_ids[j])];
      e.bag_ends.push_back(e.bag_ids.size());
      logit += id_weight_ * (sum / static_cast<double>(length)) / std::sqrt(static_cast<double>(rows_.size()));
    }
    e.label = uniform(hash(seed_, 0x1A, index)) < 1.0 / (1.0 + std::exp(-logit)) ? 1 : 0;
  }

 private:
  std::vector<std::size_t> rows_;
  std::size_t dense_;
  std::uint64_t seed_;
  double id_weight_, dense_weight_;
  std::vector<Zipf> zipf_;
  std::vector<bool> multi_;
  static std::vector<double>& draws_scratch() {
    thread_local std::vector<double> u;  // make() runs on several threads at once
    return u;
  }
  Zipf lengths_;                             // a bag's length - 1
  std::vector<std::vector<double>> weights_;  // multi-hot features' hidden weights, by id
};

// ---------------------------------------------------------------- dense classification

/// Points x ~ N(0, I) of `inputs` dimensions labelled by a fixed random
/// two-layer teacher network, argmax over `classes` scores: a target an MLP
/// can learn, with chance accuracy near 1 / classes.
class TeacherData {
 public:
  TeacherData(std::size_t inputs, std::size_t classes, std::uint64_t seed, std::size_t teacher_hidden = 32)
      : inputs_(inputs), classes_(classes), hidden_(teacher_hidden), seed_(seed), a_(inputs * teacher_hidden),
        b_(teacher_hidden * classes) {
    for (std::size_t i = 0; i < a_.size(); ++i) a_[i] = normal(hash(seed, 0xA0, i));
    for (std::size_t i = 0; i < b_.size(); ++i) b_[i] = normal(hash(seed, 0xB0, i));
  }
  std::size_t inputs() const noexcept { return inputs_; }
  std::size_t classes() const noexcept { return classes_; }

  /// Example `index`: writes `inputs()` floats to x and returns the class.
  int make(std::uint64_t index, float* x) const {
    for (std::size_t i = 0; i < inputs_; ++i) x[i] = static_cast<float>(normal(hash(seed_, 0x70, index, i)));
    int best = 0;
    double best_score = -1e300;
    std::vector<double> h(hidden_);
    for (std::size_t j = 0; j < hidden_; ++j) {
      double s = 0;
      for (std::size_t i = 0; i < inputs_; ++i) s += x[i] * a_[i * hidden_ + j];
      h[j] = std::max(0.0, s);
    }
    for (std::size_t c = 0; c < classes_; ++c) {
      double s = 0;
      for (std::size_t j = 0; j < hidden_; ++j) s += h[j] * b_[j * classes_ + c];
      if (s > best_score) best_score = s, best = static_cast<int>(c);
    }
    return best;
  }

  /// Examples [base + first, base + first + count) as a batch of a model
  /// whose Batch has `rows`, `x` (rows x inputs()) and `labels`.
  template <class Batch>
  Batch batch(std::uint64_t base, std::size_t first, std::size_t count) const {
    Batch b;
    b.rows = count;
    b.x.resize(count * inputs_);
    b.labels.resize(count);
    for (std::size_t e = 0; e < count; ++e) b.labels[e] = make(base + first + e, b.x.data() + e * inputs_);
    return b;
  }

 private:
  std::size_t inputs_, classes_, hidden_;
  std::uint64_t seed_;
  std::vector<double> a_, b_;
};

}  // namespace examples
