// batch.hpp: each rank's share of a global batch covers it exactly, shares
// differ by at most one, and gradients scaled by BatchShare::scale() keep
// N ranks training the model one process trains on the whole batch, also
// when the batch does not divide evenly.
#include "support.hpp"

#include <cmath>

TEST_CASE("shares cover the global batch, in rank order, differing by at most one", "[batch]") {
  for (std::size_t global : {0u, 1u, 7u, 12u, 13u, 1000u})
    for (int ranks = 1; ranks <= 5; ++ranks) {
      std::size_t next = 0, least = global, most = 0;
      double scales = 0;
      for (int r = 0; r < ranks; ++r) {
        const px::BatchShare s = px::share_of(global, r, ranks);
        CHECK(s.first == next);
        next += s.count;
        least = std::min(least, s.count);
        most = std::max(most, s.count);
        scales += s.scale();
      }
      INFO("global " << global << ", ranks " << ranks);
      CHECK(next == global);
      CHECK(most - least <= 1);
      if (global > 0) CHECK(scales / ranks == Approx(1.0));  // the scales average to one
      if (global % static_cast<std::size_t>(ranks) == 0 && global > 0) CHECK(px::share_of(global, 0, ranks).scale() == 1.0);
    }
  CHECK_THAT(test::error_of([] { px::share_of(10, 3, 3); }), Catch::Contains("rank 3 of 3"));
}

namespace {

/// A linear model on a global batch of 10 examples (which no rank count
/// from 3 up divides), each rank's gradient the mean over its share times
/// the share's scale.
std::vector<float> train_uneven(px::Context& ctx) {
  constexpr std::size_t kGlobal = 10, kDim = 3;
  px::Variable<px::Dense, float> w(ctx, "w", {kDim}, px::init::Constant{0.2});
  px::Variable<px::Sparse, float> emb(ctx, "emb", {7, kDim}, px::init::Uniform{-0.5f, 0.5f, 2});
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.5f}, w, emb);
  const px::BatchShare share = px::share_of(kGlobal, ctx);
  for (std::size_t step = 0; step < 3; ++step) {
    std::vector<px::index_t> ids;
    for (std::size_t e = share.first; e < share.first + share.count; ++e) ids.push_back(static_cast<px::index_t>((e * 3 + step) % 7));
    const auto rows = trainer.lookup(emb, ids);
    std::vector<float> d_rows(ids.size() * kDim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::size_t e = share.first + i;
      float y = 0;
      for (std::size_t d = 0; d < kDim; ++d) y += rows.row(i)[d] * w.value()[d];
      // The mean over this rank's examples, times the share's scale.
      const float g = static_cast<float>((y - std::sin(0.5 * static_cast<double>(e + step))) * share.scale() /
                                         static_cast<double>(share.count));
      for (std::size_t d = 0; d < kDim; ++d) {
        w.grad()[d] += g * rows.row(i)[d];
        d_rows[i * kDim + d] = g * w.value()[d];
      }
    }
    emb.grad().add(ids, d_rows);
    trainer.step();
  }
  auto out = trainer.fetch(w);
  const auto e = trainer.fetch(emb);
  out.insert(out.end(), e.begin(), e.end());
  return out;
}

}  // namespace

TEST_CASE("uneven shares, scaled, train the model of the whole batch", "[batch]") {
  px::Context single(MPI_COMM_SELF);
  const auto want = train_uneven(single);
  const auto got = train_uneven(test::world());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(1e-3, std::abs(double(want[i]))));
  CHECK(worst <= 1e-5);
}
