// Sparse variables stored in 16 bits (bf16, fp16) through the trainer's
// policies: N ranks train the same model as one process on the same global
// batch, bit for bit (the rounding of each update depends on the row's sums,
// which every rank count forms alike, and on a seeded hash of (step, id,
// column)); a bf16 table stores half a float table's bytes per rank; bad
// input is a clear error; a checkpoint of a 16-bit table restores at any
// rank count, bit for bit, and a float checkpoint into one rounds, named.
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t kRows = 40, kDim = 4, kClasses = 3, kBatch = 12, kSteps = 4;

struct Model {
  std::vector<float> emb, w;
};

// Ids repeat within a batch and across ranks: a row sums several examples.
px::index_t example_id(std::size_t s, std::size_t e) { return static_cast<px::index_t>((e * 7 + s * 3) % 11); }
float target(std::size_t s, std::size_t e, std::size_t c) { return std::sin(0.3f * (e + 2 * s + 5 * c)); }

/// Where train() starts from and what it saves: a checkpoint to restore
/// first, and a directory to save into after step `save_after`.
struct Saves {
  std::string restore;
  std::string dir;
  std::size_t save_after = 0;
  std::string saved;  ///< the checkpoint's path, once saved
  std::vector<std::string> conversions;  ///< the restore's, described
};

/// The toy model (a table of T rows -> linear layer -> squared error) up to
/// step `steps` on this rank's share of each global batch.
template <class Arch, class T, class Opt>
Model train(px::Context& ctx, const Opt& opt, px::Rounding rounding, std::size_t steps = kSteps,
            Saves* saves = nullptr) {
  px::Variable<px::Sparse, T> emb(ctx, "emb", {kRows, kDim}, px::init::Uniform{-0.5f, 0.5f, 7});
  px::Variable<px::Dense, float> w(ctx, "w", {kDim, kClasses}, px::init::Glorot{3});
  if constexpr (px::is_half_v<T>) emb.set_rounding(rounding);
  px::Trainer<Arch, Opt> trainer(ctx, opt, emb, w);
  if (saves && !saves->restore.empty()) {
    trainer.restore(saves->restore);
    for (const auto& c : trainer.restored_conversions()) saves->conversions.push_back(c.describe());
  }

  const std::size_t n = static_cast<std::size_t>(ctx.size()), r = static_cast<std::size_t>(ctx.rank());
  const std::size_t local = kBatch / n, first = r * local;
  for (std::size_t s = trainer.steps(); s < steps; ++s) {
    std::vector<px::index_t> ids(local);
    for (std::size_t i = 0; i < local; ++i) ids[i] = example_id(s, first + i);
    const auto rows = test::to_host(trainer.lookup(emb, ids));  // float rows, whatever T
    const auto W = w.value().to_host();
    std::vector<float> dW(kDim * kClasses, 0.f), dh(local * kDim, 0.f);
    for (std::size_t i = 0; i < local; ++i) {
      const float* h = rows.data() + i * kDim;
      for (std::size_t c = 0; c < kClasses; ++c) {
        float out = 0;
        for (std::size_t d = 0; d < kDim; ++d) out += h[d] * W[d * kClasses + c];
        const float g = (out - target(s, first + i, c)) / static_cast<float>(local);
        for (std::size_t d = 0; d < kDim; ++d) {
          dW[d * kClasses + c] += h[d] * g;
          dh[i * kDim + d] += W[d * kClasses + c] * g;
        }
      }
    }
    test::copy_from_host<px::HostSpace>(w.grad().data(), dW);
    emb.grad().add(ids, dh);
    trainer.step();
    if (saves && !saves->dir.empty() && s + 1 == saves->save_after) saves->saved = trainer.save(saves->dir);
  }
  return Model{trainer.fetch(emb), trainer.fetch(w)};
}

/// Every value of `v` is one T holds exactly (the table really is T).
template <class T>
bool representable(const std::vector<float>& v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return static_cast<float>(T(x)) == x; });
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

template <class Arch, class T, class Opt>
void check_equivalence(const Opt& opt, px::Rounding rounding) {
  px::Context single(MPI_COMM_SELF);
  const Model want = train<Arch, T>(single, opt, rounding);
  const Model got = train<Arch, T>(test::world(), opt, rounding);
  INFO("architecture " << Arch::name << ", optimizer " << Opt::name << ", rounding "
                       << (rounding.mode == px::Rounding::stochastic ? "stochastic" : "nearest"));
  CHECK(representable<T>(got.emb));
  // One process and N ranks sum each row's gradient in the same order
  // (by rank, then entry: docs/design.md), so the float update and its
  // rounding to 16 bits give the same bits.
  CHECK(got.emb == want.emb);
  CHECK(max_abs_difference(got.w, want.w) <= 1e-6);
  const Model initial = train<Arch, T>(single, opt, rounding, 0);
  CHECK(max_abs_difference(got.emb, initial.emb) > 1e-3);  // it trained
  const Model again = train<Arch, T>(test::world(), opt, rounding);
  CHECK(again.emb == got.emb);
  CHECK(again.w == got.w);
}

template <class T, class Opt>
void check_every_arch(const Opt& opt, px::Rounding rounding) {
  check_equivalence<px::arch::Hybrid, T>(opt, rounding);
  check_equivalence<px::arch::AllReduce, T>(opt, rounding);
  check_equivalence<px::arch::PS, T>(opt, rounding);
}

}  // namespace

TEMPLATE_TEST_CASE("a 16-bit table trains as in one process, bit for bit, under every architecture",
                   "[trainer][half]", px::bf16, px::fp16) {
  using H = TestType;
  SECTION("sgd, to nearest") { check_every_arch<H>(px::optim::Sgd{0.5f}, {}); }
  SECTION("adam, stochastic") {
    check_every_arch<H>(px::optim::Adam{0.05f}, {px::Rounding::stochastic, 2026});
  }
}

TEST_CASE("a bf16 table trains close to the float table", "[trainer][half]") {
  auto& ctx = test::world();
  const px::optim::Adam opt{0.05f};
  const Model f = train<px::arch::AllReduce, float>(ctx, opt, {});
  const Model h = train<px::arch::AllReduce, px::bf16>(ctx, opt, {px::Rounding::stochastic, 1});
  // bf16 keeps 8 significant bits: a relative error of 2^-9 per rounding,
  // over |w| <= 1 and a few steps.
  CHECK(max_abs_difference(h.emb, f.emb) <= 0.02);
  CHECK(max_abs_difference(h.emb, f.emb) > 0);  // they are different tables
}

TEST_CASE("a bf16 table stores half the bytes of a float table on each rank", "[trainer][half][memory]") {
  auto& ctx = test::world();
  const std::size_t rows = 1000, cols = 8;
  px::Variable<px::Sparse, float> f(ctx, "f", {rows, cols});
  px::Variable<px::Sparse, px::bf16> b(ctx, "b", {rows, cols});
  px::Variable<px::Sparse, px::fp16> h(ctx, "h", {rows, cols});
  SECTION("replicated (AllGatherv)") {
    px::Trainer<px::arch::AllReduce, px::optim::Sgd> ar(ctx, px::optim::Sgd{}, f, b, h);
    CHECK(ar.stored_bytes(f) == rows * cols * sizeof(float));
    CHECK(ar.stored_bytes(b) * 2 == ar.stored_bytes(f));
    CHECK(ar.stored_bytes(h) * 2 == ar.stored_bytes(f));
  }
  SECTION("sharded (ShardedPS)") {
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> hy(ctx, px::optim::Sgd{}, f, b, h);
    CHECK(hy.stored_bytes(f) == hy.stored_rows(f) * cols * sizeof(float));
    CHECK(hy.stored_rows(f) <= rows / static_cast<std::size_t>(ctx.size()) + 1);
    CHECK(hy.stored_bytes(b) * 2 == hy.stored_bytes(f));
    CHECK(hy.stored_bytes(h) * 2 == hy.stored_bytes(f));
    std::uint64_t total = hy.stored_bytes(b);
    MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(total == rows * cols * 2);
  }
}

TEST_CASE("16-bit tables: bad input is a clear error on every rank", "[trainer][half][errors]") {
  auto& ctx = test::world();
  SECTION("a lookup id outside the table") {
    px::Variable<px::Sparse, px::bf16> emb(ctx, "emb", {10, 2});
    px::Trainer<px::arch::AllReduce, px::optim::Sgd> t(ctx, px::optim::Sgd{}, emb);
    const std::vector<px::index_t> ids{ctx.rank() == 0 ? 10 : 1};
    const std::string msg = test::error_of([&] { t.lookup(emb, ids); });
    CHECK(msg.find("variable 'emb': lookup id 10 is outside [0, 10)") != std::string::npos);
    CHECK(test::same_on_every_rank(msg));
  }
  SECTION("set_rounding after the table joined a trainer") {
    px::Variable<px::Sparse, px::fp16> emb(ctx, "emb", {10, 2});
    px::Trainer<px::arch::AllReduce, px::optim::Sgd> t(ctx, px::optim::Sgd{}, emb);
    CHECK(test::error_of([&] { emb.set_rounding({px::Rounding::stochastic, 1}); }) ==
          "variable 'emb': set_rounding() after it joined a Trainer; set it before");
  }
  SECTION("a rank whose table has another precision") {
    const std::string msg = test::error_of([&] {
      if (ctx.rank() == 0) {
        px::Variable<px::Sparse, px::bf16> emb(ctx, "emb", {10, 2});
        px::Trainer<px::arch::AllReduce, px::optim::Sgd> t(ctx, px::optim::Sgd{}, emb);
      } else {
        px::Variable<px::Sparse, float> emb(ctx, "emb", {10, 2});
        px::Trainer<px::arch::AllReduce, px::optim::Sgd> t(ctx, px::optim::Sgd{}, emb);
      }
    });
    if (ctx.size() > 1) CHECK(msg.find("bf16") != std::string::npos);
    else CHECK(msg.empty());
  }
}

namespace {

/// Saved at this job's rank count after 2 steps, restored by one process
/// (and by this job again), the rest of the run gives the bits of an
/// uninterrupted run: the checkpoint holds the 16-bit rows widened to float
/// (exactly) and the float optimizer state, and a restore rounds them back.
template <class Arch, class T>
void check_checkpoint(const std::string& where) {
  const px::optim::Adam opt{0.05f};
  const px::Rounding rounding{px::Rounding::stochastic, 99};
  px::Context single(MPI_COMM_SELF);
  const Model want = train<Arch, T>(single, opt, rounding);
  Saves first;
  first.dir = where + "/" + Arch::name;
  first.save_after = 2;
  train<Arch, T>(test::world(), opt, rounding, kSteps, &first);
  REQUIRE_FALSE(first.saved.empty());
  Saves alone;
  alone.restore = first.saved;
  const Model resumed = train<Arch, T>(single, opt, rounding, kSteps, &alone);
  INFO("architecture " << Arch::name);
  CHECK(resumed.emb == want.emb);
  CHECK(max_abs_difference(resumed.w, want.w) <= 1e-6);
  Saves again;
  again.restore = first.saved;
  CHECK(train<Arch, T>(test::world(), opt, rounding, kSteps, &again).emb == want.emb);
  // The file holds float: a 16-bit table names the rounding back (which
  // changes no value), a float table reads it as it is.
  CHECK(alone.conversions ==
        std::vector<std::string>{std::string("variable 'emb': saved as f32, restored as ") +
                                 px::to_string(px::data_type_of_v<T>) + ", rounded to nearest even"});
  Saves into_float;
  into_float.restore = first.saved;
  const Model wide = train<Arch, float>(single, opt, rounding, 2, &into_float);
  CHECK(into_float.conversions.empty());
  const Model at_two = train<Arch, T>(single, opt, rounding, 2);
  CHECK(wide.emb == at_two.emb);  // the 16-bit values, exactly
}

}  // namespace

TEMPLATE_TEST_CASE("a 16-bit table's checkpoint restores at another rank count, bit for bit",
                   "[trainer][half][checkpoint]", px::bf16, px::fp16) {
  const test::TempDir dir("half-tables");
  check_checkpoint<px::arch::Hybrid, TestType>(dir.path);
  check_checkpoint<px::arch::AllReduce, TestType>(dir.path);
}

TEST_CASE("a float table's checkpoint restores into a 16-bit table, rounded and named", "[trainer][half][checkpoint]") {
  const test::TempDir dir("half-tables-from-float");
  const px::optim::Adam opt{0.05f};
  Saves f;
  f.dir = dir.path;
  f.save_after = 2;
  train<px::arch::Hybrid, float>(test::world(), opt, {}, 2, &f);
  Saves b;
  b.restore = f.saved;
  px::Context single(MPI_COMM_SELF);
  const Model restored = train<px::arch::Hybrid, px::bf16>(single, opt, {}, 2, &b);
  const Model original = train<px::arch::Hybrid, float>(single, opt, {}, 2);
  CHECK(b.conversions ==
        std::vector<std::string>{"variable 'emb': saved as f32, restored as bf16, rounded to nearest even"});
  REQUIRE(restored.emb.size() == original.emb.size());
  for (std::size_t i = 0; i < original.emb.size(); ++i)
    CHECK(restored.emb[i] == static_cast<float>(px::bf16(original.emb[i])));
}
