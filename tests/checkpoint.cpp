// checkpoint.hpp and Trainer::save/restore: a resume continues bit-for-bit;
// a checkpoint restores onto other rank counts (via sub-communicators:
// 4 -> 3 and 2 -> 4 in a 4-rank job); every kind of corruption is reported
// on every rank before anything is loaded; old checkpoints are pruned; what
// interrupted saves and removals leave is never listed and is removed by
// the next save (tests/fault/checkpoint_drill.cpp kills real saves).
#include "support.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kRows = 30, kDim = 4, kBatch = 12;

/// A job on the first `ranks` ranks of the world (MPI_COMM_NULL elsewhere).
struct SubJob {
  MPI_Comm comm = MPI_COMM_NULL;
  explicit SubJob(int ranks) {
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_split(MPI_COMM_WORLD, me < ranks ? 0 : MPI_UNDEFINED, me, &comm);
  }
  ~SubJob() {
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  bool member() const { return comm != MPI_COMM_NULL; }
};

/// A model with a sparse and two dense variables, trained on data that
/// depends only on the global step and example, not on the rank count.
template <class Arch, class Opt = px::optim::Adam>
struct Job {
  px::Variable<px::Sparse, float> emb;
  px::Variable<px::Dense, float> w;
  px::Variable<px::Dense, double> bias;
  px::Trainer<Arch, Opt> trainer;

  Job(px::Context& ctx, px::TrainerOptions o = {}, Opt opt = Opt{0.05f})
      : emb(ctx, "emb", {kRows, kDim}, px::init::Normal{0.f, 0.3f, 1}),
        w(ctx, "w", {kDim, kDim}, px::init::Glorot{2}),
        bias(ctx, "bias", {kDim}),
        trainer(ctx, o, opt, emb, w, bias) {}

  void train(px::Context& ctx, std::size_t steps) {
    const std::size_t n = static_cast<std::size_t>(ctx.size()), local = kBatch / n;
    const std::size_t first = static_cast<std::size_t>(ctx.rank()) * local;
    for (std::size_t s = 0; s < steps; ++s) {
      const std::uint64_t g = trainer.steps();  // the global step decides the data
      std::vector<px::index_t> ids(local);
      std::vector<float> rows(local * kDim);
      for (std::size_t i = 0; i < local; ++i) {
        ids[i] = static_cast<px::index_t>((first + i) * 5 + g * 7) % static_cast<px::index_t>(kRows);
        for (std::size_t d = 0; d < kDim; ++d) rows[i * kDim + d] = std::cos(0.1f * (first + i + d + g)) / local;
      }
      const auto got = trainer.lookup(emb, ids);
      for (std::size_t i = 0; i < got.size(); ++i) rows[i] += 0.01f * got.data[i] / static_cast<float>(local);
      emb.grad().add(ids, rows);
      for (std::size_t i = 0; i < w.grad().size(); ++i) w.grad()[i] = std::sin(0.2f * (i + g));  // same on every rank: its mean is itself
      for (std::size_t i = 0; i < bias.grad().size(); ++i) bias.grad()[i] = 0.5;
      trainer.step();
    }
  }
  std::vector<double> snapshot() {
    std::vector<double> out;
    for (float v : trainer.fetch(emb)) out.push_back(v);
    for (float v : trainer.fetch(w)) out.push_back(v);
    for (double v : trainer.fetch(bias)) out.push_back(v);
    return out;
  }
};

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace

TEMPLATE_TEST_CASE("a resumed run continues bit-for-bit", "[checkpoint]", px::arch::Hybrid, px::arch::AllReduce,
                   px::arch::PS) {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  Job<TestType> straight(ctx);
  straight.train(ctx, 3);
  const std::string path = straight.trainer.save(dir.path);
  CHECK(path == dir.path + "/step-0000000003");
  straight.train(ctx, 3);

  Job<TestType> resumed(ctx);
  REQUIRE(resumed.trainer.restore_latest(dir.path));
  CHECK(resumed.trainer.steps() == 3);
  resumed.train(ctx, 3);
  CHECK(resumed.snapshot() == straight.snapshot());
}

// From 2 ranks: at one there are no fewer ranks to restore onto.
TEST_CASE("a checkpoint restores onto fewer and more ranks", "[checkpoint][np2+]") {
  if (test::skip_below_ranks(2)) return;
  auto& world = test::world();
  const int n = world.size();
  // Adam keeps two optimizer slots, restored and re-cut with the values; a
  // continuation on another rank count differs from a straight run only by
  // float reassociation.
  using Opt = px::optim::Adam;
  const Opt opt{0.05f};
  for (auto [from, to] : {std::pair{n, n - 1}, std::pair{2, n}}) {
    test::TempDir dir("parallax-ckpt");
    std::vector<double> saved;
    {
      SubJob job(from);
      if (job.member()) {
        px::Context ctx(job.comm);
        Job<px::arch::PS, Opt> a(ctx, {}, opt);
        a.train(ctx, 4);
        a.trainer.save(dir.path);
        saved = a.snapshot();
      }
    }
    std::size_t count = saved.size();  // rank 0 is in every sub-job
    MPI_Bcast(&count, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    saved.resize(count);
    MPI_Bcast(saved.data(), static_cast<int>(count), MPI_DOUBLE, 0, MPI_COMM_WORLD);

    SubJob job(to);
    if (job.member()) {
      px::Context ctx(job.comm);
      Job<px::arch::Hybrid, Opt> b(ctx, {}, opt);  // another architecture too: another layout
      REQUIRE(b.trainer.restore_latest(dir.path));
      INFO("restored " << from << " -> " << to << " ranks");
      CHECK(b.trainer.steps() == 4);
      CHECK(b.snapshot() == saved);  // the same bits, re-cut
      b.train(ctx, 2);
      Job<px::arch::PS, Opt> c(ctx, {}, opt);
      c.train(ctx, 6);
      CHECK(max_abs_diff(b.snapshot(), c.snapshot()) < 1e-5);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("a checkpoint restores whatever the grouping of tables and the rank count", "[checkpoint][groups]") {
  // Three tables of one width (one group, or three) and partitions that
  // interleave owners: each is saved as its own rows and restored into
  // another grouping, another architecture and another rank count.
  auto& world = test::world();
  const int n = world.size();
  using Opt = px::optim::Adagrad;
  auto make = [](px::Context& ctx, bool group, const Opt& opt, auto arch) {
    struct Model {
      px::Variable<px::Sparse, float> a, b, c;
      px::Variable<px::Dense, float> w;
      px::Trainer<decltype(arch), Opt> trainer;
      Model(px::Context& x, px::TrainerOptions o, const Opt& p)
          : a(x, "a", {kRows, kDim}, px::init::Normal{0.f, 0.3f, 1}), b(x, "b", {11, kDim}, px::init::Normal{0.f, 0.3f, 2}),
            c(x, "c", {5, kDim}, px::init::Normal{0.f, 0.3f, 3}), w(x, "w", {kDim}),
            trainer(x, std::move(o), p, a, b, c, w) {}
      void train(px::Context& x, std::size_t steps) {
        const std::size_t local = kBatch / static_cast<std::size_t>(x.size());
        const std::size_t first = static_cast<std::size_t>(x.rank()) * local;
        for (std::size_t s = 0; s < steps; ++s) {
          const std::uint64_t g = trainer.steps();
          std::vector<std::vector<px::index_t>> ids(3);
          std::vector<std::vector<float>> rows(3);
          for (std::size_t t = 0; t < 3; ++t)
            for (std::size_t i = 0; i < local; ++i) {
              ids[t].push_back(static_cast<px::index_t>(((first + i) * (t + 2) + g * 3) % (t == 0 ? kRows : t == 1 ? 11 : 5)));
              for (std::size_t d = 0; d < kDim; ++d) rows[t].push_back(std::cos(0.3f * (first + i + d + g + t)) / local);
            }
          trainer.lookup({px::Lookup{a, ids[0]}, px::Lookup{b, ids[1]}, px::Lookup{c, ids[2]}});
          a.grad().add(ids[0], rows[0]);
          b.grad().add(ids[1], rows[1]);
          c.grad().add(ids[2], rows[2]);
          w.grad()[g % kDim] = 1.f;
          trainer.step();
        }
      }
      std::vector<double> snapshot() {
        std::vector<double> out;
        for (auto* v : {&a, &b, &c})
          for (float x : trainer.fetch(*v)) out.push_back(x);
        for (float x : trainer.fetch(w)) out.push_back(x);
        return out;
      }
    };
    px::TrainerOptions o;
    o.sharded.group_tables = group;
    o.partitions["a"] = 2 * ctx.size() + 1;
    return std::make_unique<Model>(ctx, o, opt);
  };
  const Opt opt{0.1f};
  for (const bool group_first : {true, false}) {
    test::TempDir dir("parallax-ckpt");
    std::vector<double> saved;
    {
      auto m = make(world, group_first, opt, px::arch::PS{});
      m->train(world, 3);
      m->trainer.save(dir.path);
      saved = m->snapshot();
    }
    const int to = n > 1 ? n - 1 : 1;
    SubJob job(to);
    if (job.member()) {
      px::Context ctx(job.comm);
      auto m = make(ctx, !group_first, opt, px::arch::Hybrid{});
      REQUIRE(m->trainer.restore_latest(dir.path));
      INFO("saved " << (group_first ? "grouped" : "one group per table") << " on " << n << " ranks, restored on " << to);
      CHECK(m->snapshot() == saved);  // the same bits, regrouped and re-cut
      m->train(ctx, 1);  // and it trains on
      CHECK(m->trainer.steps() == 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("corrupt checkpoints are refused on every rank before anything loads", "[checkpoint][errors]") {
  auto& ctx = test::world();
  const int n = ctx.size();
  test::TempDir dir("parallax-ckpt");
  Job<px::arch::Hybrid> job(ctx);
  job.train(ctx, 2);
  const std::string path = job.trainer.save(dir.path);
  job.train(ctx, 1);
  const auto before = job.snapshot();

  auto damage = [&](auto&& edit) {
    // Work on a copy so every section starts from a good checkpoint.
    const std::string copy = dir.path + "/copy";
    if (ctx.rank() == 0) {
      std::error_code ec;
      fs::remove_all(copy, ec);
      fs::copy(path, copy);
      edit(copy);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return copy;
  };
  auto flip = [](const std::string& file, std::uint64_t at) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
  };
  const std::string victim = px::detail::rank_file_name(n - 1);
  std::string msg;
  SECTION("a truncated file") {
    const auto copy = damage([&](const std::string& d) { fs::resize_file(d + "/" + victim, fs::file_size(d + "/" + victim) - 3); });
    msg = test::error_of([&] { job.trainer.restore(copy); });
    CHECK_THAT(msg, Catch::Contains(victim) && Catch::Contains("truncated"));
  }
  SECTION("a flipped byte") {
    const auto copy = damage([&](const std::string& d) { flip(d + "/" + victim, fs::file_size(d + "/" + victim) / 2); });
    msg = test::error_of([&] { job.trainer.restore(copy); });
    CHECK_THAT(msg, Catch::Contains(victim) && Catch::Contains("CRC-32C"));
  }
  SECTION("a missing shard") {
    const auto copy = damage([&](const std::string& d) { fs::remove(d + "/" + victim); });
    msg = test::error_of([&] { job.trainer.restore(copy); });
    CHECK_THAT(msg, Catch::Contains(victim) && Catch::Contains("missing"));
  }
  SECTION("a flipped byte in the manifest") {
    const auto copy = damage([&](const std::string& d) { flip(d + "/manifest", 20); });
    msg = test::error_of([&] { job.trainer.restore(copy); });
    CHECK_THAT(msg, Catch::Contains("manifest") && Catch::Contains("corrupt"));
  }
  SECTION("a manifest from another model") {
    px::Variable<px::Sparse, float> emb(ctx, "emb", {kRows, kDim});
    px::Variable<px::Dense, float> w(ctx, "w", {kDim, kDim + 1});
    px::Variable<px::Dense, double> bias(ctx, "bias", {kDim});
    px::Trainer<px::arch::Hybrid, px::optim::Adam> other(ctx, px::optim::Adam{}, emb, w, bias);
    msg = test::error_of([&] { other.restore(path); });
    CHECK_THAT(msg, Catch::Contains("different model") && Catch::Contains("'w'") && Catch::Contains("4 x 5"));
  }
  SECTION("another optimizer") {
    Job<px::arch::Hybrid, px::optim::Sgd> other(ctx, {}, px::optim::Sgd{0.1f});
    msg = test::error_of([&] { other.trainer.restore(path); });
    CHECK_THAT(msg, Catch::Contains("optimizer adam") && Catch::Contains("sgd"));
  }
  SECTION("no checkpoint at all") {
    msg = test::error_of([&] { job.trainer.restore(dir.path + "/nothing-here"); });
    CHECK_THAT(msg, Catch::Contains("missing"));
  }
  // Every rank got the error; nothing was loaded; the trainer still trains.
  CHECK(test::all_ranks(!msg.empty()));
  CHECK(job.snapshot() == before);
  CHECK_NOTHROW(job.train(ctx, 1));
}

TEST_CASE("automatic saves keep the newest checkpoints and skip unfinished ones", "[checkpoint]") {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  px::TrainerOptions o;
  o.checkpoint.dir = dir.path;
  o.checkpoint.every_steps = 2;
  o.checkpoint.keep_last = 2;
  Job<px::arch::Hybrid> job(ctx, o);
  job.train(ctx, 7);
  MPI_Barrier(MPI_COMM_WORLD);
  auto all = px::list_checkpoints(dir.path);
  REQUIRE(all.size() == 2);
  CHECK(all[0].step == 4);
  CHECK(all[1].step == 6);

  // A save that crashed half-way leaves a .partial directory: ignored.
  if (ctx.rank() == 0) fs::create_directories(dir.path + "/step-0000000099.partial");
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(px::latest_checkpoint(dir.path)->step == 6);
  Job<px::arch::Hybrid> again(ctx);
  CHECK(again.trainer.restore_latest(dir.path));
  CHECK(again.trainer.steps() == 6);

  // Saving by time: a tiny interval saves after every step.
  px::TrainerOptions t;
  t.checkpoint.dir = dir.path + "/timed";
  t.checkpoint.every_seconds = 1e-9;
  t.checkpoint.keep_last = 10;
  Job<px::arch::Hybrid> timed(ctx, t);
  timed.train(ctx, 3);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(px::list_checkpoints(t.checkpoint.dir).size() == 3);
}

TEST_CASE("what interrupted saves and removals leave is not listed, and the next save removes it", "[checkpoint]") {
  auto& ctx = test::world();
  const int n = ctx.size();
  test::TempDir dir("parallax-ckpt");
  px::TrainerOptions o;
  o.checkpoint.dir = dir.path;
  o.checkpoint.keep_last = 10;
  Job<px::arch::Hybrid> job(ctx, o);
  job.train(ctx, 1);
  const std::string one = job.trainer.save();
  job.train(ctx, 1);
  const std::string two = job.trainer.save();
  // What a kill at each instant leaves, what versions that deleted in place
  // left, and what is not parallax's.
  const std::string last_file = px::detail::rank_file_name(n - 1);
  auto at = [&](int step) { return dir.path + "/" + px::detail::checkpoint_dir_name(static_cast<std::uint64_t>(step)); };
  if (ctx.rank() == 0) {
    fs::copy(two, at(7) + ".partial");  // a save killed before its rename (complete, or not)
    fs::create_directory(at(8) + ".partial");
    fs::copy(one, at(5) + ".removing");  // a removal killed after its rename
    fs::copy(one, at(3));                // deleted in place: the manifest went first
    fs::remove(at(3) + "/manifest");
    fs::copy(one, at(4));                // ... or a data file did
    fs::remove(at(4) + "/" + last_file);
    fs::copy(one, at(6));                // a data file cut short
    fs::resize_file(at(6) + "/" + last_file, fs::file_size(at(6) + "/" + last_file) - 1);
    fs::create_directory(dir.path + "/notes");
    std::ofstream(dir.path + "/step-0000000009.txt") << "not a checkpoint";
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const auto listed = px::list_checkpoints(dir.path);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].path == one);
  CHECK(listed[1].path == two);
  auto names = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir.path)) out.insert(e.path().filename().string());
    return out;
  };
  const std::set<std::string> theirs = {"notes", "step-0000000009.txt"};
  SECTION("an explicit cleanup") {
    if (ctx.rank() == 0) {
      auto removed = px::remove_checkpoint_leftovers(dir.path);
      CHECK(removed.size() == 6);
      std::set<std::string> want = {"step-0000000001", "step-0000000002"};
      want.insert(theirs.begin(), theirs.end());
      CHECK(names() == want);
    }
  }
  SECTION("the next save") {
    job.train(ctx, 1);
    const std::string three = job.trainer.save();
    if (ctx.rank() == 0) {
      std::set<std::string> want = {"step-0000000001", "step-0000000002", "step-0000000003"};
      want.insert(theirs.begin(), theirs.end());
      CHECK(names() == want);
    }
    Job<px::arch::Hybrid> again(ctx);
    again.trainer.restore(three);  // the leftover step-3 was replaced whole
    CHECK(again.snapshot() == job.snapshot());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a checkpoint leaves the listed names before its files go", "[checkpoint]") {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  Job<px::arch::PS> job(ctx);
  job.train(ctx, 1);
  const std::string one = job.trainer.save(dir.path);
  job.train(ctx, 1);
  const std::string two = job.trainer.save(dir.path);
  const auto at_two = job.snapshot();
  if (ctx.rank() == 0) {
    px::remove_checkpoint(one);
    CHECK_FALSE(fs::exists(one));
    CHECK_FALSE(fs::exists(one + ".removing"));
    CHECK_THAT(test::error_of([&] { px::remove_checkpoint(one); }), Catch::Contains("cannot remove checkpoint " + one));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  REQUIRE(px::list_checkpoints(dir.path).size() == 1);

  // Saving a step that has a checkpoint replaces it whole: another run
  // resumed from step 1 with another learning rate saves step 2 again.
  Job<px::arch::PS> other(ctx, {}, px::optim::Adam{0.2f});
  other.train(ctx, 1);
  other.trainer.save(dir.path);  // step 1
  other.train(ctx, 1);
  CHECK(other.trainer.save(dir.path) == two);
  CHECK(other.snapshot() != at_two);
  Job<px::arch::PS> check(ctx);
  check.trainer.restore(two);
  CHECK(check.snapshot() == other.snapshot());
  if (ctx.rank() == 0) CHECK_FALSE(fs::exists(two + ".removing"));
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("restore_latest finds nothing in an empty directory and changes nothing", "[checkpoint]") {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  Job<px::arch::PS> job(ctx);
  const auto before = job.snapshot();
  CHECK_FALSE(job.trainer.restore_latest(dir.path));
  CHECK(job.trainer.steps() == 0);
  CHECK(job.snapshot() == before);
}

TEST_CASE("a checkpoint keeps the base learning rate and the schedule's position", "[checkpoint][optim]") {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  px::TrainerOptions o;
  o.schedule = px::schedule::StepDecay{2, 0.5};
  auto make = [&](px::Variable<px::Dense, float>& w) {
    return px::Trainer<px::arch::Hybrid, px::optim::Sgd>(ctx, o, px::optim::Sgd{0.5f}, w);
  };
  px::Variable<px::Dense, float> w(ctx, "w", {2}, px::init::Constant{1.0});
  auto trainer = make(w);
  for (int s = 0; s < 3; ++s) {
    w.grad()[0] = 1.f;
    trainer.step();
  }
  trainer.set_learning_rate(0.3);  // a rate the user chose mid-run (a plateau rule, say)
  const double rate = trainer.learning_rate();
  CHECK(rate == Approx(0.3 * 0.5));  // step 4: one decay
  const std::string saved = trainer.save(dir.path);

  px::Variable<px::Dense, float> w2(ctx, "w", {2}, px::init::Constant{1.0});
  auto resumed = make(w2);
  CHECK(resumed.learning_rate() == 0.5);
  resumed.restore(saved);
  CHECK(resumed.steps() == 3);
  CHECK(resumed.learning_rate() == rate);  // exact: the manifest holds the rate as a hexadecimal float
  w.grad()[0] = 1.f;
  w2.grad()[0] = 1.f;
  trainer.step();
  resumed.step();
  CHECK(w2.value()[0] == w.value()[0]);
}

TEST_CASE("a step that fails after updates made when ready leaves the trainer refusing work until a restore",
          "[checkpoint][overlap][update-when-ready]") {
  auto& ctx = test::world();
  test::TempDir dir("parallax-ckpt");
  const int last = ctx.size() - 1;
  px::Variable<px::Sparse, float> emb(ctx, "emb", {10, 2});
  px::Variable<px::Dense, float> w(ctx, "w", {2}, px::init::Constant{1.0});
  px::TrainerOptions o;
  o.update_when_ready = true;
  o.overlap_needs_spare_core = false;
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, emb, w);
  const std::string saved = trainer.save(dir.path);  // step 0
  // The dense bucket is summed and updated at ready(); the bad id (on the
  // last rank) fails the step afterwards, on every rank.
  w.grad()[0] = 1.f;
  trainer.ready(w);
  emb.grad().add(std::vector<px::index_t>{ctx.rank() == last ? 12 : 1}, std::vector<float>{1.f, 1.f});
  trainer.ready(emb);
  CHECK_THAT(test::error_of([&] { trainer.step(); }), Catch::Contains("row index 12"));
  CHECK(trainer.fetch(w)[0] == Approx(0.9f));  // updated early, and not undone
  w.grad()[0] = 1.f;
  const std::string refused = test::error_of([&] { trainer.step(); });
  CHECK_THAT(refused, Catch::Contains("cannot be used") && Catch::Contains("step 1 failed after updating") &&
                          Catch::Contains("restore()"));
  CHECK_THAT(test::error_of([&] { trainer.ready(w); }), Catch::Contains("cannot be used"));
  trainer.restore(saved);
  CHECK(trainer.fetch(w)[0] == 1.f);
  w.grad()[0] = 1.f;
  trainer.ready(w);
  emb.grad().add(std::vector<px::index_t>{1}, std::vector<float>{1.f, 1.f});
  trainer.ready(emb);
  CHECK_NOTHROW(trainer.step());
  CHECK(trainer.steps() == 1);
  CHECK(trainer.fetch(w)[0] == Approx(0.9f));
}

namespace {

/// A variable of element type T that the test holds itself, as a policy
/// member Checkpoints saves and restores: replicated (rank 0 saves every
/// row) or sharded in ranks + 1 partitions, with one optimizer slot. The
/// policies do not take 16-bit variables yet; this lets the checkpoint
/// side be tested on its own.
template <class T>
class HeldVariable final : public px::policy::Member {
 public:
  HeldVariable(std::string name, std::size_t rows, std::size_t cols, bool sharded, int rank, int ranks)
      : name_(std::move(name)), rows_(rows), cols_(cols), sharded_(sharded), rank_(rank),
        map_(rows, ranks + 1, ranks) {
    value.resize(stored_rows() * cols);
    slot.resize(value.size());
  }
  /// Element (local row i, col c) set from its global row by `f(row, c, what)`.
  template <class F>
  void fill(F f) {
    for (std::size_t i = 0; i < stored_rows(); ++i)
      for (std::size_t c = 0; c < cols_; ++c) {
        value[i * cols_ + c] = T(f(global_row(i), c, 0));
        slot[i * cols_ + c] = T(f(global_row(i), c, 1));
      }
  }
  std::size_t global_row(std::size_t i) const {
    return sharded_ ? static_cast<std::size_t>(map_.global_row(rank_, i)) : i;
  }

  std::vector<T> value, slot;  // the rows this rank stores

  const void* identity() const override { return this; }
  const std::string& name() const override { return name_; }
  const char* policy() const override { return "held"; }
  px::detail::VarRecord record() const override {
    return px::detail::VarRecord::make(name_, {rows_, cols_}, px::data_type_of_v<T>, sharded_, "held");
  }
  std::size_t stored_rows() const override { return sharded_ ? map_.shard_rows(rank_) : rows_; }
  /// This rank's rows (the test reads `value` directly).
  void fetch(void* out) override { std::memcpy(out, value.data(), value.size() * sizeof(T)); }
  int saved_partitions() const override { return sharded_ ? map_.parts : 0; }
  void save(px::detail::AtomicFile& out) override {
    if (!sharded_ && rank_ != 0) return;
    T* slots[1] = {slot.data()};
    px::policy::save_state<T, px::HostSpace>(out, value.data(), slots, 1, value.size());
  }
  void load(px::detail::CheckpointReader& in, std::size_t index) override {
    T* slots[1] = {slot.data()};
    px::policy::load_state<T, px::HostSpace>(in, index, sharded_ ? &map_ : nullptr, rank_, rows_, cols_, value.data(),
                                             slots, 1);
  }

 private:
  std::string name_;
  std::size_t rows_, cols_;
  bool sharded_;
  int rank_;
  px::PartitionMap map_;
};

/// A dense and a sharded variable of element type T.
template <class T>
struct HeldModel {
  HeldVariable<T> w, emb;
  explicit HeldModel(px::Context& ctx)
      : w("w", 7, 3, false, ctx.rank(), ctx.size()), emb("emb", 29, 4, true, ctx.rank(), ctx.size()) {}
  std::vector<px::policy::Member*> members() { return {&w, &emb}; }
  px::Checkpoints<px::engine::Mpi> checkpoints(px::engine::Mpi& engine) {
    return px::Checkpoints<px::engine::Mpi>(engine, {}, "held-sgd", 1, members());
  }
};

/// Values over many binades, with every mantissa bit in use: for fp16 some
/// are subnormal (below 2^-14) and some overflow (from 65520).
float original(std::size_t row, std::size_t c, int what) {
  const float frac = std::fmod(0.6180339887f * static_cast<float>(row * 5 + c * 3 + what * 11 + 1), 1.f);
  const int binade = static_cast<int>((row * 7 + c * 13 + static_cast<std::size_t>(what) * 3) % 48) - 28;
  return std::ldexp(1.f + frac, binade) * ((row + c) % 3 == 0 ? -1.f : 1.f);
}

/// How many stored elements (value and slot) of `m` differ in their bits
/// from want(row, c, what).
template <class T, class F>
std::size_t differences(HeldVariable<T>& m, std::size_t cols, F want) {
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < m.stored_rows(); ++i)
    for (std::size_t c = 0; c < cols; ++c) {
      const T v = want(m.global_row(i), c, 0), s = want(m.global_row(i), c, 1);
      wrong += std::memcmp(&m.value[i * cols + c], &v, sizeof(T)) != 0;
      wrong += std::memcmp(&m.slot[i * cols + c], &s, sizeof(T)) != 0;
    }
  return wrong;
}

template <class T>
std::size_t differences(HeldModel<T>& m, std::function<T(std::size_t, std::size_t, int)> want) {
  return differences(m.w, 3, want) + differences(m.emb, 4, want);
}

std::vector<std::string> described(const std::vector<px::CheckpointConversion>& all) {
  std::vector<std::string> out;
  for (const auto& c : all) out.push_back(c.describe());
  return out;
}

}  // namespace

TEST_CASE("a checkpoint restores into another precision, rounding to nearest even, and says so",
          "[checkpoint][half]") {
  auto& ctx = test::world();
  px::engine::Mpi engine(ctx);
  test::TempDir dir("parallax-ckpt");

  HeldModel<float> f32(ctx);
  f32.w.fill(original);
  f32.emb.fill(original);
  const std::string saved_f32 = f32.checkpoints(engine).save(dir.path, 1);

  // f32 -> bf16: every value and slot rounded to nearest even, named.
  HeldModel<px::bf16> b(ctx);
  auto from_f32 = b.checkpoints(engine);
  CHECK(from_f32.restore(saved_f32) == 1);
  CHECK(test::all_ranks(differences<px::bf16>(b, [](std::size_t r, std::size_t c, int w) {
                          return px::bf16(original(r, c, w));
                        }) == 0));
  CHECK(described(from_f32.restored_conversions()) ==
        std::vector<std::string>{"variable 'w': saved as f32, restored as bf16, rounded to nearest even",
                                 "variable 'emb': saved as f32, restored as bf16, rounded to nearest even"});

  // bf16 -> f32: exact.
  const std::string saved_bf16 = b.checkpoints(engine).save(dir.path, 2);
  HeldModel<float> back(ctx);
  auto from_bf16 = back.checkpoints(engine);
  from_bf16.restore(saved_bf16);
  CHECK(test::all_ranks(differences<float>(back, [](std::size_t r, std::size_t c, int w) {
                          return static_cast<float>(px::bf16(original(r, c, w)));
                        }) == 0));
  REQUIRE(from_bf16.restored_conversions().size() == 2);
  CHECK(from_bf16.restored_conversions()[1].exact);
  CHECK(from_bf16.restored_conversions()[1].describe() == "variable 'emb': saved as bf16, restored as f32, exactly");

  // f32 -> f16 (subnormals, overflow to infinity) and bf16 -> f16.
  HeldModel<px::fp16> h(ctx);
  auto into_f16 = h.checkpoints(engine);
  into_f16.restore(saved_f32);
  CHECK(test::all_ranks(differences<px::fp16>(h, [](std::size_t r, std::size_t c, int w) {
                          return px::fp16(original(r, c, w));
                        }) == 0));
  into_f16.restore(saved_bf16);
  CHECK(test::all_ranks(differences<px::fp16>(h, [](std::size_t r, std::size_t c, int w) {
                          return px::fp16(static_cast<float>(px::bf16(original(r, c, w))));
                        }) == 0));
  CHECK(into_f16.restored_conversions().front().describe() ==
        "variable 'w': saved as bf16, restored as f16, rounded to nearest even");

  // The same type: nothing converted, nothing named.
  HeldModel<px::bf16> same(ctx);
  auto plain = same.checkpoints(engine);
  plain.restore(saved_bf16);
  CHECK(plain.restored_conversions().empty());
  CHECK(test::all_ranks(differences<px::bf16>(same, [](std::size_t r, std::size_t c, int w) {
                          return px::bf16(original(r, c, w));
                        }) == 0));

  // f64 converts to nothing (through float it would round twice): refused
  // on every rank before anything loads.
  HeldModel<double> wide(ctx);
  wide.w.fill([](std::size_t, std::size_t, int) { return 7.0; });
  auto refused = wide.checkpoints(engine);
  CHECK_THROWS_WITH(refused.restore(saved_f32), Catch::Contains("is of a different model") &&
                                                    Catch::Contains("'w' (7 x 3, f32, dense)"));
  CHECK(wide.w.value[0] == 7.0);
  CHECK_FALSE(refused.damaged());
}
