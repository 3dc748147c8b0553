// TrainerOptions::compress: dense float gradients cross the wire in 16 bits
// (bf16 or fp16) under RingAllReduce. The bytes booked are exactly half the
// uncompressed run's, and the model stays within what 16-bit sums allow of
// the float one. ShardedPS's pushed rows and lookup replies travel in 16
// bits too, with their ids as 4-byte offsets: the bytes saved are counted
// exactly, block by block.
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
  const std::uint64_t before = trainer.stats().variable("w").sent();
  const auto r = static_cast<float>(ctx.rank());
  for (std::size_t s = 0; s < steps; ++s) {
    const auto W = w.value().to_host();
    float* g = w.grad().data();
    for (std::size_t i = 0; i < kIn * kOut; ++i)
      g[i] = W[i] - std::sin(0.1f * static_cast<float>(i) + r + 0.5f * static_cast<float>(s));
    trainer.step();
  }
  return Run{trainer.fetch(w), trainer.stats().variable("w").sent() - before};
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

namespace {

constexpr std::size_t kRows = 50, kCols = 4;  // a row on the wire: 8 + 16 bytes, or 4 + 8 compressed

std::uint64_t pad8(std::uint64_t x) { return (x + 7) / 8 * 8; }

/// Rank r's gradient rows at step s: ids (r + 3 j + s) % kRows, unique.
std::vector<px::index_t> push_ids(std::size_t r, std::size_t s) {
  std::vector<px::index_t> ids;
  for (std::size_t j = 0; j < 7 + r; ++j) ids.push_back(static_cast<px::index_t>((r + 3 * j + s) % kRows));
  return ids;
}

/// Sparse rows pushed to their ShardedPS owners, no lookups.
Run push(px::Compression compress) {
  auto& ctx = test::world();
  px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kCols}, px::init::Uniform{-0.5f, 0.5f, 5});
  px::TrainerOptions o;
  o.compress = compress;
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, emb);
  const auto r = static_cast<std::size_t>(ctx.rank());
  const std::uint64_t before = trainer.stats().variable("emb").sent();
  for (std::size_t s = 0; s < kSteps; ++s) {
    const auto ids = push_ids(r, s);
    std::vector<float> g;
    for (std::size_t j = 0; j < ids.size(); ++j)
      for (std::size_t c = 0; c < kCols; ++c) g.push_back(std::cos(0.7f * static_cast<float>(j + c + s)) + 0.01f * r);
    emb.grad().add(ids, g);
    trainer.step();
  }
  return Run{trainer.fetch(emb), trainer.stats().variable("emb").sent() - before};
}

}  // namespace

TEST_CASE("compressed pushes send rows in 16 bits to their owners and sum them in float", "[trainer][compress][sparse]") {
  auto& ctx = test::world();
  const Run plain = push(px::Compression::none);
  // The rows this rank sends to other owners (one partition per rank), and
  // the bytes compression saves: a block of k rows per owner and step takes
  // k (8 + 4 kCols) bytes, or k (4 + 2 kCols) padded to 8.
  const px::PartitionMap map(kRows, ctx.size(), ctx.size());
  std::uint64_t rows_out = 0, saved = 0;
  for (std::size_t s = 0; s < kSteps; ++s) {
    std::vector<std::uint64_t> to(static_cast<std::size_t>(ctx.size()), 0);
    for (px::index_t id : push_ids(static_cast<std::size_t>(ctx.rank()), s))
      if (map.owner(id) != ctx.rank()) ++to[static_cast<std::size_t>(map.owner(id))];
    for (std::uint64_t k : to) {
      rows_out += k;
      saved += k * (8 + 4 * kCols) - pad8(k * (4 + 2 * kCols));
    }
  }
  for (auto c : {px::Compression::bf16, px::Compression::fp16}) {
    const bool is_bf16 = c == px::Compression::bf16;
    INFO((is_bf16 ? "bf16" : "fp16"));
    const Run packed = push(c);
    // The same headers and rows; each row's values in 2 bytes instead of 4,
    // its id in 4 instead of 8.
    CHECK(plain.bytes - packed.bytes == saved);
    if (ctx.size() > 1) CHECK(plain.bytes > rows_out * (8 + kCols * 4));
    // Each pushed value (|g| <= 1.05) is rounded once where it leaves: SGD
    // at 0.1 moves a row by at most 0.1 x ranks x that rounding a step.
    const double unit = is_bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
    double worst = 0;
    for (std::size_t i = 0; i < plain.w.size(); ++i)
      worst = std::max(worst, std::abs(double(packed.w[i]) - plain.w[i]));
    CHECK(worst <= 0.1 * kSteps * 1.05 * unit * ctx.size());
    CHECK(worst > 0);
  }
}

TEST_CASE("compressed lookups reply with rows in 16 bits", "[trainer][compress][sparse]") {
  auto& ctx = test::world();
  const auto r = static_cast<std::size_t>(ctx.rank());
  // Ids with a repeat; rows asked of other owners are replied over the
  // wire (shards kept private, so nothing is read in place).
  std::vector<px::index_t> ids = push_ids(r, 1);
  ids.push_back(ids.front());
  auto lookup = [&](px::Compression compress) {
    px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kCols}, px::init::Uniform{-0.5f, 0.5f, 5});
    px::TrainerOptions o;
    o.compress = compress;
    o.sharded.shared_memory = false;
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, emb);
    const std::uint64_t before = trainer.stats().variable("emb").sent();
    std::vector<float> rows = test::to_host(trainer.lookup(emb, ids));
    return Run{rows, trainer.stats().variable("emb").sent() - before};
  };
  const Run plain = lookup(px::Compression::none);
  // The rows this rank serves to other ranks: each asks each of its unique
  // ids of the owner once; and the ids this rank asks of each other owner,
  // a block of 8 bytes each, or of 4 padded to 8.
  const px::PartitionMap map(kRows, ctx.size(), ctx.size());
  std::uint64_t served = 0, ids_saved = 0;
  for (int q = 0; q < ctx.size(); ++q)
    if (q != ctx.rank())
      for (px::index_t id : push_ids(static_cast<std::size_t>(q), 1)) served += map.owner(id) == ctx.rank();
  std::vector<std::uint64_t> asked(static_cast<std::size_t>(ctx.size()), 0);
  for (px::index_t id : push_ids(r, 1))
    if (map.owner(id) != ctx.rank()) ++asked[static_cast<std::size_t>(map.owner(id))];
  for (std::uint64_t k : asked) ids_saved += 8 * k - pad8(4 * k);
  for (auto c : {px::Compression::bf16, px::Compression::fp16}) {
    const bool is_bf16 = c == px::Compression::bf16;
    INFO((is_bf16 ? "bf16" : "fp16"));
    const Run packed = lookup(c);
    CHECK(plain.bytes - packed.bytes == served * kCols * 2 + ids_saved);
    REQUIRE(packed.w.size() == plain.w.size());
    // Every row is its float row rounded to nearest even (a rank's own rows
    // too: they take the same reply, to itself); one rank reads its shard
    // in place, with no reply.
    bool rounded = true;
    for (std::size_t i = 0; i < plain.w.size(); ++i) {
      const float wire = is_bf16 ? static_cast<float>(px::bf16(plain.w[i])) : static_cast<float>(px::fp16(plain.w[i]));
      rounded = rounded && packed.w[i] == (ctx.size() == 1 ? plain.w[i] : wire);
    }
    CHECK(rounded);
  }
}
