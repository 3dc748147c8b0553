// The program the packaging tests build: it includes the umbrella header (by
// way of trainers.hpp) and the optional nn headers, as a user does, checks that the pieces parallax
// links (MPI, OpenMP, Thrust, a CBLAS through parallax::nn) work in a project
// that is not parallax's own, and trains a small MLP made of nn::DenseLayer
// with a Trainer (from parallax::trainers where the package has it). Prints "consumer OK" on rank 0 and exits 0 only when every
// check passes.
#include <parallax/nn/dense.hpp>
#include <parallax/trainers.hpp>  // parallax.hpp; with parallax::trainers linked, its trainers precompiled

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace px = parallax;

namespace {

/// Element i of rank r's contribution: distinct for every rank and element.
std::int64_t contribution(int rank, std::size_t i) { return 1000 * static_cast<std::int64_t>(rank) + 1 + static_cast<std::int64_t>(i); }

/// Sets v[i] = contribution(rank, i) with the portable for_each (OpenMP).
struct Fill {
  std::int64_t* v;
  int rank;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { v[i] = contribution(rank, i); }
};

/// Feature j of example i of the training set, in [-1, 1).
float feature(std::size_t i, std::size_t j) {
  return static_cast<float>(((i * 7 + j * 13 + i * j * 5) % 32)) / 16.0f - 1.0f;
}
/// The target of example i: a function of its features no linear model fits.
float target(std::size_t i) { return std::sin(2.0f * feature(i, 0)) + feature(i, 1) * feature(i, 2); }

/// dy[r] = 2 (y[r] - t[r]) / count: the gradient of this rank's mean squared error.
struct SquaredErrorGrad {
  const float* y;
  const float* t;
  float* dy;
  float inv_count;
  PARALLAX_HOST_DEVICE void operator()(std::size_t r) const { dy[r] = 2.0f * (y[r] - t[r]) * inv_count; }
};

/// Full-batch training of a 4-32-1 MLP on 64 examples, split over the ranks;
/// returns the mean squared error over all 64 before and after 300 steps.
std::vector<double> train_mlp(const px::Context& ctx, px::engine::Mpi& mpi) {
  namespace nn = px::nn;
  const px::Exec<px::HostSpace> ex;
  const std::size_t inputs = 4, global = 64;
  nn::DenseLayer<px::HostSpace> hidden(ctx, "hidden", inputs, 32, nn::Activation::tanh, 1);
  nn::DenseLayer<px::HostSpace> head(ctx, "head", 32, 1, nn::Activation::none, 2);
  px::Trainer<px::arch::AllReduce, px::optim::Adagrad> trainer(ctx, px::optim::Adagrad{0.1f}, hidden.w, hidden.b,
                                                              head.w, head.b);
  const px::BatchShare share = px::share_of(global, ctx);
  std::vector<float> x(share.count * inputs), t(share.count), dh(share.count * 32);
  for (std::size_t r = 0; r < share.count; ++r) {
    for (std::size_t j = 0; j < inputs; ++j) x[r * inputs + j] = feature(share.first + r, j);
    t[r] = target(share.first + r);
  }
  std::vector<double> mse;
  for (int step = 0; step <= 300; ++step) {
    const float* h = hidden.forward(ex, x.data(), share.count);
    const float* y = head.forward(ex, h, share.count);
    if (step == 0 || step == 300) {
      double sum = 0;
      for (std::size_t r = 0; r < share.count; ++r) sum += (y[r] - t[r]) * (y[r] - t[r]);
      mpi.allreduce(&sum, &sum, 1, px::DataType::f64, px::ReduceOp::sum);
      mse.push_back(sum / global);
      if (step == 300) break;
    }
    px::for_each(ex, share.count, SquaredErrorGrad{y, t.data(), head.output_grad(), 1.0f / share.count});
    head.backward(ex, h, share.count, hidden.output_grad());
    hidden.backward(ex, x.data(), share.count, nullptr);
    trainer.step();
  }
  return mse;
}

}  // namespace

int main(int argc, char** argv) {
  px::Context ctx(argc, argv);
  px::engine::Mpi mpi(ctx);
  const int n = ctx.size();
  bool ok = true;

  // All-reduce of rank-distinct values: sum over r of (1000 r + 1 + i).
  const std::size_t count = 7;
  px::Buffer<std::int64_t> v(count);
  px::for_each(px::Exec<px::HostSpace>{}, count, Fill{v.data(), ctx.rank()});
  mpi.allreduce(v.data(), v.data(), count, px::DataType::i64, px::ReduceOp::sum);
  for (std::size_t i = 0; i < count; ++i) {
    const std::int64_t want = 1000 * static_cast<std::int64_t>(n) * (n - 1) / 2 + n * static_cast<std::int64_t>(1 + i);
    if (v[i] != want) {
      std::fprintf(stderr, "rank %d: element %zu is %lld, expected %lld\n", ctx.rank(), i,
                   static_cast<long long>(v[i]), static_cast<long long>(want));
      ok = false;
    }
  }

  // A sparse gradient coalesced with Thrust's OpenMP backend: rows 3, 1, 3.
  px::SparseGrad<float> g(px::Shape{4, 1}, "consumer");
  g.add(std::vector<px::index_t>{3, 1, 3}, std::vector<float>{1.f, 2.f, 4.f});
  g.coalesce();
  if (g.size() != 2 || g.indices()[0] != 1 || g.indices()[1] != 3 || g.values()[0] != 2.f || g.values()[1] != 5.f) {
    std::fprintf(stderr, "rank %d: SparseGrad::coalesce gave a wrong result\n", ctx.rank());
    ok = false;
  }

  // An MLP of nn::DenseLayer trained with a Trainer: the error falls tenfold.
  const std::vector<double> mse = train_mlp(ctx, mpi);
  if (!(mse[1] < mse[0] / 10)) {
    std::fprintf(stderr, "rank %d: the MLP's mean squared error went from %g to %g, not a tenth\n", ctx.rank(), mse[0],
                 mse[1]);
    ok = false;
  }

  // Every rank reports the same verdict.
  std::int32_t all_ok = ok ? 1 : 0;
  mpi.allreduce(&all_ok, &all_ok, 1, px::DataType::i32, px::ReduceOp::min);
  if (all_ok == 1 && ctx.is_root())
    std::printf("consumer OK: parallax %s, %d ranks, %d OpenMP threads per rank, MLP error %.4f -> %.4f (%s)\n",
                PARALLAX_VERSION_STRING, n, ctx.threads(), mse[0], mse[1],
                px::nn::gemm_description<px::HostSpace>().c_str());
  return all_ok == 1 ? 0 : 1;
}
