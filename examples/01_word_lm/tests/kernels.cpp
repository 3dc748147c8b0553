// Unit tests of word_lm's sampled softmax (examples/01_word_lm/model.hpp):
// SampledSoftmax's logits and backward, whose matrix products are BLAS
// calls, against the formulas written out in double and against the
// hand-written functors the example ran before (tests/reference_kernels.hpp),
// on shapes whose edges cut the functors' register tiles, with repeated
// labels and an accidental hit; the same bits run to run; and the softmax
// cross-entropy it trains with (examples/common/layers.hpp). No MPI.
#include <catch2/catch.hpp>

#include "01_word_lm/model.hpp"
#include "01_word_lm/tests/reference_kernels.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace lm = examples::word_lm;
namespace px = parallax;

namespace {

const px::Exec<px::HostSpace> host;

// A step's worth of inputs: candidate ids 0..n-1 stand for the rows of w.
struct Case {
  std::size_t rows, dim, sampled, n;
  std::vector<float> h, w, log_q, dz;
  std::vector<px::index_t> sampled_row, label_row;
  std::vector<std::int32_t> column;

  lm::SampledSoftmax<px::HostSpace>::Inputs inputs() const {
    return {log_q.data(), sampled_row.data(), label_row.data(), column.data(), n, sampled};
  }
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

std::vector<float> logits(lm::SampledSoftmax<px::HostSpace>& layer, const Case& c) {
  const float* z = layer.logits(host, c.h.data(), c.w.data(), c.rows, c.dim, c.inputs());
  return std::vector<float>(z, z + c.rows * (1 + c.sampled));
}

// SampledSoftmax's backward from the case's dz: the candidates' gradient g
// and dh.
struct Grads {
  std::vector<float> g, dh;
};
Grads backward(const Case& c) {
  lm::SampledSoftmax<px::HostSpace> layer;
  float* z = layer.logits(host, c.h.data(), c.w.data(), c.rows, c.dim, c.inputs());
  std::copy(c.dz.begin(), c.dz.end(), z);  // the loss's gradient, in place of the logits
  Grads out{std::vector<float>(c.n * (c.dim + 1), -7.0f), std::vector<float>(c.rows * c.dim, -7.0f)};
  layer.backward(host, c.w.data(), c.inputs(), out.g.data(), out.dh.data());
  return out;
}

// The hand-written functors' g and dh, as the example computed them.
Grads reference_backward(const Case& c) {
  std::vector<float> d(c.n * c.rows);
  px::for_each(host, d.size(), lm::reference::SampledGrad<float>{c.dz.data(), c.column.data(), d.data(), c.rows, c.sampled});
  Grads out{std::vector<float>(c.n * (c.dim + 1)), std::vector<float>(c.rows * c.dim)};
  px::for_each(host, c.n,
               lm::reference::CandidateGrad<float>{c.h.data(), d.data(), c.dz.data(), c.label_row.data(), out.g.data(),
                                                   c.rows, c.dim, c.sampled});
  using HG = lm::reference::HiddenGrad<float>;
  px::for_each(host, HG::calls(c.rows, c.dim),
               HG{c.w.data(), d.data(), c.dz.data(), c.label_row.data(), out.dh.data(), c.rows, c.dim, c.sampled, c.n});
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("SampledSoftmax logits: the true word's, the sampled words', and -1e30 for an accidental hit", "[word_lm][kernels]") {
  for (std::size_t rows : {1, 5}) {
    for (std::size_t dim : {13, 64}) {
      const Case c = make_case(rows, dim, 7);
      lm::SampledSoftmax<px::HostSpace> layer;
      const std::vector<float> z = logits(layer, c);
      std::vector<float> functor(z.size());
      px::for_each(host, z.size(),
                   lm::reference::SampledLogits<float>{c.h.data(), c.w.data(), c.log_q.data(), c.sampled_row.data(),
                                                       c.label_row.data(), functor.data(), rows, dim, c.sampled});
      for (std::size_t b = 0; b < rows; ++b) {
        for (std::size_t k = 0; k <= c.sampled; ++k) {
          const std::size_t e = b * (1 + c.sampled) + k;
          const auto row = static_cast<std::size_t>(k == 0 ? c.label_row[b] : c.sampled_row[k - 1]);
          INFO(rows << " rows, dim " << dim << ": row b " << b << ", logit " << k);
          if (k > 0 && row == static_cast<std::size_t>(c.label_row[b])) {
            CHECK(z[e] == -1e30f);
          } else {
            CHECK(z[e] == Approx(logit(c, b, row)).epsilon(1e-5).margin(1e-6));
          }
          CHECK(z[e] == Approx(functor[e]).epsilon(1e-5).margin(1e-6));
        }
      }
    }
  }
}

TEST_CASE("SampledSoftmax backward: g = d^T [h, 1] and dh = d w, as the formulas and the functors give them", "[word_lm][kernels]") {
  for (std::size_t rows : {1, 4, 5, 9}) {
    for (std::size_t dim : {7, 13, 16, 64, 70}) {  // the functors' tiles: 16 columns (g), 4 x 8 and panels of 64 (dh)
      INFO(rows << " rows, dim " << dim);
      const Case c = make_case(rows, dim, 3);
      const Grads blas = backward(c), functor = reference_backward(c);
      for (std::size_t r = 0; r < c.n; ++r) {
        double bias = 0;
        for (std::size_t b = 0; b < rows; ++b) bias += delta(c, r, b);
        CHECK(blas.g[r * (dim + 1) + dim] == Approx(bias).margin(1e-5));
        for (std::size_t i = 0; i < dim; ++i) {
          double s = 0;
          for (std::size_t b = 0; b < rows; ++b) s += delta(c, r, b) * c.h[b * dim + i];
          CHECK(blas.g[r * (dim + 1) + i] == Approx(s).margin(1e-5));
        }
      }
      for (std::size_t b = 0; b < rows; ++b)
        for (std::size_t i = 0; i < dim; ++i) {
          double s = 0;
          for (std::size_t r = 0; r < c.n; ++r) s += delta(c, r, b) * c.w[r * (dim + 1) + i];
          CHECK(blas.dh[b * dim + i] == Approx(s).margin(1e-5));
        }
      for (std::size_t i = 0; i < blas.g.size(); ++i) CHECK(blas.g[i] == Approx(functor.g[i]).margin(1e-5));
      for (std::size_t i = 0; i < blas.dh.size(); ++i) CHECK(blas.dh[i] == Approx(functor.dh[i]).margin(1e-5));
    }
  }
}

TEST_CASE("SampledSoftmax: the same bits run to run", "[word_lm][kernels]") {
  const Case c = make_case(9, 70, 5);
  lm::SampledSoftmax<px::HostSpace> a, b;
  CHECK(same_bits(logits(a, c), logits(b, c)));
  const Grads first = backward(c), second = backward(c);
  CHECK(same_bits(first.g, second.g));
  CHECK(same_bits(first.dh, second.dh));
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
  px::for_each(host, rows,
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
