// TrainerOptions::compress: dense float gradients cross the wire in 16 bits
// (bf16 or fp16) under RingAllReduce. The bytes booked are exactly half the
// uncompressed run's, and the model stays within what 16-bit sums allow of
// the float one.
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

namespace {

constexpr std::size_t kIn = 24, kOut = 10, kSteps = 5;

struct Run {
  std::vector<float> w;
  std::uint64_t bytes = 0;  // sent by this rank for w
};

/// A linear least-squares model trained with one dense variable: rank r's
/// gradient is a deterministic function of (r, step).
Run train(px::Compression compress, std::size_t steps = kSteps) {
  auto& ctx = test::world();
  px::Variable<px::Dense, float> w(ctx, "w", {kIn, kOut}, px::init::Uniform{-0.5f, 0.5f, 3});
  px::TrainerOptions o;
  o.compress = compress;
  px::Trainer<px::arch::AllReduce, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, w);
  const auto r = static_cast<float>(ctx.rank());
  for (std::size_t s = 0; s < steps; ++s) {
    const auto W = w.value().to_host();
    float* g = w.grad().data();
    for (std::size_t i = 0; i < kIn * kOut; ++i)
      g[i] = W[i] - std::sin(0.1f * static_cast<float>(i) + r + 0.5f * static_cast<float>(s));
    trainer.step();
  }
  return Run{trainer.fetch(w), trainer.stats().variable("w").sent()};
}

}  // namespace

TEST_CASE("compressed all-reduces send half the bytes and stay within 16-bit rounding of float", "[trainer][compress]") {
  const Run plain = train(px::Compression::none);
  for (auto c : {px::Compression::bf16, px::Compression::fp16}) {
    const bool is_bf16 = c == px::Compression::bf16;
    INFO((is_bf16 ? "bf16" : "fp16"));
    const Run packed = train(c);
    if (test::world().size() == 1) {
      CHECK(packed.bytes == 0);  // one rank sums nothing
      CHECK(packed.w == plain.w);
      continue;
    }
    REQUIRE(plain.bytes > 0);
    CHECK(packed.bytes * 2 == plain.bytes);
    // Each gradient element (|g| < 2.5) is rounded to 16 bits once per
    // combination: at most log2(4) + 1 roundings of 2^-9 (bf16) or 2^-12
    // (fp16) relative, and SGD at 0.1 over 5 steps moves w by 0.5 x that.
    const double unit = is_bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    double worst = 0;
    for (std::size_t i = 0; i < plain.w.size(); ++i)
      worst = std::max(worst, std::abs(double(packed.w[i]) - plain.w[i]));
    CHECK(worst <= 0.5 * 3 * 2.5 * unit * test::world().size());
    CHECK(worst > 0);  // the sums really were rounded
  }
}

TEST_CASE("PARALLAX_COMPRESS sets compression for a job and names a bad value", "[trainer][compress][errors]") {
  auto& ctx = test::world();
  setenv("PARALLAX_COMPRESS", "bf16", 1);
  CHECK(px::TrainerOptions{}.resolve(ctx).compress == px::Compression::bf16);
  px::TrainerOptions fp;
  fp.compress = px::Compression::fp16;
  CHECK(fp.resolve(ctx).compress == px::Compression::fp16);  // the program's own choice stands
  setenv("PARALLAX_COMPRESS", "int8", 1);
  CHECK(test::error_of([&] { (void)px::TrainerOptions{}.resolve(ctx); }) ==
        "PARALLAX_COMPRESS must be none, bf16 or fp16, not 'int8'");
  unsetenv("PARALLAX_COMPRESS");
}
