// Unit tests of word_lm's sampled-softmax kernels (examples/01_word_lm/
// model.hpp): SampledLogits, SampledGrad, CandidateGrad and HiddenGrad
// against the formulas written out in double, on shapes whose edges cut the
// host's register tiles (rows and dim not multiples of the tile), with
// repeated labels and an accidental hit; and HiddenGrad's tilings against
// each other and against a loop over the sampled words, bit for bit; and the
// softmax cross-entropy it trains with (examples/common/layers.hpp). No MPI.
#include <catch2/catch.hpp>

#include "01_word_lm/model.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace lm = examples::word_lm;
namespace px = parallax;

namespace {

// A step's worth of inputs: candidate ids 0..n-1 stand for the rows of w.
struct Case {
  std::size_t rows, dim, sampled, n;
  std::vector<float> h, w, log_q, dz;
  std::vector<px::index_t> sampled_row, label_row;
  std::vector<std::int32_t> column;
};

// Sampled words at every other candidate row; labels at chosen rows, one of
// them sampled too (an accidental hit) and one repeated.
Case make_case(std::size_t rows, std::size_t dim, std::uint32_t seed) {
  Case c;
  c.rows = rows;
  c.dim = dim;
  c.sampled = 9;
  c.n = 2 * c.sampled + 2;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  c.h.resize(rows * dim);
  c.w.resize(c.n * (dim + 1));
  c.log_q.resize(c.n);
  for (auto* v : {&c.h, &c.w, &c.log_q})
    for (float& x : *v) x = u(gen);
  c.column.assign(c.n, 0);
  for (std::size_t j = 0; j < c.sampled; ++j) {
    c.sampled_row.push_back(static_cast<px::index_t>(2 * j + 1));
    c.column[2 * j + 1] = static_cast<std::int32_t>(j + 1);
  }
  for (std::size_t b = 0; b < rows; ++b)  // rows 0, 2, 4...: not sampled; b == 1: row 3, sampled word 1
    c.label_row.push_back(static_cast<px::index_t>(b == 1 ? 3 : (2 * b) % c.n));
  c.label_row.back() = c.label_row.front();  // a repeated label
  c.dz.resize(rows * (1 + c.sampled));
  for (float& x : c.dz) x = u(gen);
  if (rows > 1) c.dz[1 * (1 + c.sampled) + 2] = 0.0f;  // the accidental hit's gradient, as the softmax leaves it
  return c;
}

double logit(const Case& c, std::size_t b, std::size_t row) {
  double s = c.w[row * (c.dim + 1) + c.dim] - static_cast<double>(c.log_q[row]);
  for (std::size_t i = 0; i < c.dim; ++i) s += static_cast<double>(c.h[b * c.dim + i]) * c.w[row * (c.dim + 1) + i];
  return s;
}

// d[r, b] in full: the sampled term plus the true word's.
double delta(const Case& c, std::size_t r, std::size_t b) {
  const float* zb = c.dz.data() + b * (1 + c.sampled);
  return (c.column[r] ? zb[c.column[r]] : 0.0) + (static_cast<std::size_t>(c.label_row[b]) == r ? zb[0] : 0.0);
}

std::vector<float> sampled_grad(const Case& c) {
  std::vector<float> d(c.n * c.rows);
  px::for_each(px::Exec<px::HostSpace>{}, d.size(), lm::SampledGrad<float>{c.dz.data(), c.column.data(), d.data(), c.rows, c.sampled});
  return d;
}

template <class HG>
std::vector<float> hidden_grad(const Case& c) {
  const std::vector<float> d = sampled_grad(c);
  std::vector<float> dh(c.rows * c.dim, -7.0f);
  px::for_each(px::Exec<px::HostSpace>{}, HG::calls(c.rows, c.dim),
               HG{c.w.data(), d.data(), c.dz.data(), c.label_row.data(), dh.data(), c.rows, c.dim, c.sampled, c.n});
  return dh;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("SampledLogits: the true word's logit, the sampled words', and -1e30 for an accidental hit", "[word_lm][kernels]") {
  for (std::size_t rows : {1, 5}) {
    const Case c = make_case(rows, 13, 7);
    std::vector<float> z(rows * (1 + c.sampled));
    px::for_each(px::Exec<px::HostSpace>{}, z.size(),
                 lm::SampledLogits<float>{c.h.data(), c.w.data(), c.log_q.data(), c.sampled_row.data(), c.label_row.data(),
                                          z.data(), rows, c.dim, c.sampled});
    for (std::size_t b = 0; b < rows; ++b) {
      CHECK(z[b * (1 + c.sampled)] == Approx(logit(c, b, static_cast<std::size_t>(c.label_row[b]))).epsilon(1e-5));
      for (std::size_t j = 0; j < c.sampled; ++j) {
        const auto row = static_cast<std::size_t>(c.sampled_row[j]);
        INFO("row b " << b << ", sampled word " << j);
        if (row == static_cast<std::size_t>(c.label_row[b]))
          CHECK(z[b * (1 + c.sampled) + 1 + j] == -1e30f);
        else
          CHECK(z[b * (1 + c.sampled) + 1 + j] == Approx(logit(c, b, row)).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("CandidateGrad: each candidate row's gradient is sum_b d[b, r] [h_b, 1]", "[word_lm][kernels]") {
  for (std::size_t dim : {13, 16, 40}) {  // a partial tile of 16 columns, one whole tile, two and a part
    const Case c = make_case(5, dim, 11);
    const std::vector<float> d = sampled_grad(c);
    std::vector<float> g(c.n * (dim + 1), -7.0f);
    px::for_each(px::Exec<px::HostSpace>{}, c.n,
                 lm::CandidateGrad<float>{c.h.data(), d.data(), c.dz.data(), c.label_row.data(), g.data(), c.rows, dim, c.sampled});
    for (std::size_t r = 0; r < c.n; ++r) {
      INFO("dim " << dim << ", candidate row " << r);
      double bias = 0;
      for (std::size_t b = 0; b < c.rows; ++b) bias += delta(c, r, b);
      CHECK(g[r * (dim + 1) + dim] == Approx(bias).margin(1e-6));
      for (std::size_t i = 0; i < dim; ++i) {
        double s = 0;
        for (std::size_t b = 0; b < c.rows; ++b) s += delta(c, r, b) * c.h[b * dim + i];
        CHECK(g[r * (dim + 1) + i] == Approx(s).margin(1e-6));
      }
    }
  }
}

TEST_CASE("HiddenGrad: dh = dz w over the true and sampled words, the same bits under every tiling", "[word_lm][kernels]") {
  for (std::size_t rows : {1, 4, 5, 9}) {
    for (std::size_t dim : {7, 8, 13, 64, 70}) {
      INFO(rows << " rows, dim " << dim);
      const Case c = make_case(rows, dim, 3);
      const std::vector<float> host = hidden_grad<lm::HiddenGrad<float>>(c);  // the host's 4 x 8 tiles, panels of 64
      // against the formula
      for (std::size_t b = 0; b < rows; ++b)
        for (std::size_t i = 0; i < dim; ++i) {
          double s = 0;
          for (std::size_t r = 0; r < c.n; ++r) s += delta(c, r, b) * c.w[r * (dim + 1) + i];
          CHECK(host[b * dim + i] == Approx(s).margin(1e-5));
        }
      // a GPU's one element a thread, and odd tiles, blocks and panels
      CHECK(same_bits(host, hidden_grad<lm::HiddenGrad<float, 1, 1, 1, 1024>>(c)));
      CHECK(same_bits(host, hidden_grad<lm::HiddenGrad<float, 3, 2, 6, 5>>(c)));
      // and a loop over the sampled words after the true word: the order the sums promise
      std::vector<float> loop(rows * dim, 0.0f);
      for (std::size_t b = 0; b < rows; ++b) {
        const float* zb = c.dz.data() + b * (1 + c.sampled);
        float* out = loop.data() + b * dim;
        examples::axpy(zb[0], c.w.data() + static_cast<std::size_t>(c.label_row[b]) * (dim + 1), out, dim);
        for (std::size_t j = 0; j < c.sampled; ++j)
          examples::axpy(zb[1 + j], c.w.data() + static_cast<std::size_t>(c.sampled_row[j]) * (dim + 1), out, dim);
      }
      CHECK(same_bits(host, loop));
    }
  }
}

TEST_CASE("SoftmaxCrossEntropy: each row's loss, whether its label wins, and the gradient in place", "[word_lm][kernels]") {
  const std::size_t rows = 3, classes = 7;
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<float> z(rows * classes);
  for (float& x : z) x = u(gen);
  z[1 * classes + 2] = 9.0f;  // row 1's label (2) is its largest logit
  const std::vector<float> logits = z;
  const std::vector<std::int32_t> labels{0, 2, 6};
  std::vector<float> loss(rows), correct(rows);
  px::for_each(px::Exec<px::HostSpace>{}, rows,
               examples::SoftmaxCrossEntropy<float>{z.data(), labels.data(), loss.data(), correct.data(), classes, 0.5f});
  for (std::size_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    const float* x = logits.data() + r * classes;
    const auto label = static_cast<std::size_t>(labels[r]);
    double sum = 0;
    std::size_t arg = 0;
    for (std::size_t c = 0; c < classes; ++c) {
      sum += std::exp(static_cast<double>(x[c]));
      if (x[c] > x[arg]) arg = c;
    }
    CHECK(loss[r] == Approx(std::log(sum) - x[label]).epsilon(1e-5));
    CHECK(correct[r] == (arg == label ? 1.0f : 0.0f));
    for (std::size_t c = 0; c < classes; ++c)
      CHECK(z[r * classes + c] == Approx(0.5 * (std::exp(x[c]) / sum - (c == label ? 1.0 : 0.0))).margin(1e-6));
  }
  CHECK(correct[1] == 1.0f);
}
