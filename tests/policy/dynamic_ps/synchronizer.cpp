// DynamicVariable through DynamicPS: at 1-4 ranks, the rows lookups return
// and the tables after the pushes equal, bit for bit, (a) one process's
// trainer on the same global batch (no eviction; probability admission,
// which is the same on every rank count) and (b) with eviction and
// count-min admission on (small capacities), a serial replay of the ranks'
// tables over the global batch; reruns are bit-identical; statistics add up
// over the ranks; a wrong-width gradient and a lookup beyond an owner's
// capacity throw on every rank; a table saved at N ranks restores at 1-N
// ranks bit for bit and goes on training as one process that never
// stopped, and a corrupt save is refused on every rank; Trainer::save holds
// a dynamic table with the fixed variables (saved at 2 ranks, restored at
// 1-N, training goes on as one process's; another model and a torn file
// are refused by name); clipping by the
// global norm and a NaN gradient act alike at every rank count; three
// tables in one batched lookup (a push of the looked-up keys, of some of
// them, none) equal one process's, a lookup taking 3 engine calls.
#include "policy/dynamic_stream.hpp"
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

using namespace dynamic_test;

struct Run {
  std::vector<float> looked_up;        // this rank's rows, every step, in order
  px::dynamic::Snapshot<float> table;  // this rank's shard at the end
  px::policy::DynamicStats stats;
};

// Trains `steps` steps on ctx: each rank looks up its block of the global
// batch and pushes gradients of the rows it read.
template <class Opt>
Run train(const px::Context& ctx, const Opt& opt, std::size_t capacity, bool small, double clip_norm = 0,
          std::vector<double>* norms = nullptr) {
  px::TrainerOptions to;
  to.reduction = px::Reduction::sum;
  to.clip_norm = clip_norm;
  Var emb(ctx, "emb", options(capacity, small));
  px::Variable<px::Dense, float> w(ctx, "w", {2, 2});
  px::Trainer<px::arch::Hybrid, Opt> trainer(ctx, to, opt, emb, w);
  Run run;
  for (std::uint64_t s = 1; s <= steps; ++s) {
    look_up_and_push(trainer, emb, s, run.looked_up);
    std::fill(w.grad().data(), w.grad().data() + 4, ctx.rank() == 0 ? 0.01f : 0.0f);  // summed: one process's
    trainer.step();
    if (norms) norms->push_back(trainer.gradient_norm());
  }
  auto& sync = trainer.template synchronizer<px::DynamicPS>();
  run.table = sync.table(emb).export_rows();
  run.stats = sync.stats(emb);
  return run;
}

// The serial replay: `ranks` tables of `capacity` rows, fed the global
// batch in rank order, as owners receive it. Returns rank `me`'s view.
template <class Opt>
Run replay(const Opt& opt, int ranks, int me, std::size_t capacity, bool small) {
  std::vector<px::dynamic::Table<float>> tables;
  for (int r = 0; r < ranks; ++r) {
    auto o = options(capacity, small);
    o.name = "emb";
    o.with_optimizer(opt);
    tables.emplace_back(o);
  }
  Run run;
  const auto [first, last] = block(me, ranks);
  for (std::uint64_t s = 1; s <= steps; ++s) {
    std::vector<float> rows(G * C);
    for (std::size_t j = 0; j < G; ++j) {
      const std::uint64_t key = key_at(s, j);
      auto& t = tables[static_cast<std::size_t>(px::dynamic::owner(key, ranks))];
      px::index_t slot = -1;
      t.find_or_insert(&key, 1, s, &slot);
      t.gather(&key, &slot, 1, rows.data() + j * C);
    }
    for (std::size_t j = first; j < last; ++j)
      run.looked_up.insert(run.looked_up.end(), rows.begin() + j * C, rows.begin() + (j + 1) * C);
    // Each owner sums a key's rows in global order, then applies them.
    for (int r = 0; r < ranks; ++r) {
      std::vector<std::uint64_t> keys;
      std::vector<float> sums;
      for (std::size_t j = 0; j < G; ++j) {
        const std::uint64_t key = key_at(s, j);
        if (px::dynamic::owner(key, ranks) != r) continue;
        auto at = std::find(keys.begin(), keys.end(), key);
        if (at == keys.end()) {
          keys.push_back(key);
          for (std::size_t c = 0; c < C; ++c) sums.push_back(grad_of(s, j, c, rows[j * C + c]));
        } else {
          const std::size_t k = static_cast<std::size_t>(at - keys.begin());
          for (std::size_t c = 0; c < C; ++c) sums[k * C + c] += grad_of(s, j, c, rows[j * C + c]);
        }
      }
      auto& t = tables[static_cast<std::size_t>(r)];
      std::vector<px::index_t> slots(keys.size());
      t.find(keys.data(), keys.size(), slots.data());
      t.apply(opt, s, slots.data(), sums.data(), keys.size());
    }
  }
  run.table = tables[static_cast<std::size_t>(me)].export_rows();
  return run;
}

template <class Opt>
void check_one_process(const Opt& opt) {
  const auto& ctx = test::world();
  px::Context single(MPI_COMM_SELF);  // one process, the whole global batch
  const Run want = train(single, opt, 1000, false);
  const Run got = train(ctx, opt, 1000, false);
  const auto [first, last] = block(ctx.rank(), ctx.size());
  const std::vector<float> mine(want.looked_up.begin(), want.looked_up.end());
  // One process read every position; this rank read its block of each step.
  std::vector<float> want_mine;
  for (std::uint64_t s = 0; s < steps; ++s)
    want_mine.insert(want_mine.end(), mine.begin() + static_cast<std::ptrdiff_t>((s * G + first) * C),
                     mine.begin() + static_cast<std::ptrdiff_t>((s * G + last) * C));
  CHECK(same_bits(got.looked_up, want_mine));
  check_same(got.table, px::dynamic::owned_share(want.table, ctx.rank(), ctx.size()));
  // The tables moved, and the admission filter refused some keys.
  CHECK(got.stats.total.admissions_refused > 0);
  CHECK(got.stats.total.size == want.table.size());
  CHECK(got.stats.total.inserts == want.stats.total.inserts);
  CHECK(got.stats.total.lookups == steps * G);
  bool moved = false;
  for (std::size_t i = 0; i < want.table.size() && !moved; ++i) {
    float initial[C];
    auto o = options(1, false);
    o.name = "emb";
    px::dynamic::Table<float>(o).initial_row(want.table.keys[i], initial);
    moved = std::memcmp(initial, want.table.rows.data() + i * C, sizeof initial) != 0;
  }
  CHECK(moved);
}


// Three tables in one batched lookup a step: "a" pushes the keys it looked
// up (its route's keys are left out), "b" the even ones of them (in the
// same order, so the owners sum in one process's order; the keys travel),
// "c" nothing. Returns the rows read and the tables; `calls`
// and the step get each step's engine calls.
struct Three {
  std::vector<float> looked_up;
  std::vector<px::dynamic::Snapshot<float>> tables;
  std::vector<std::uint64_t> lookup_calls, step_calls;
};
template <class Opt>
Three train_three(const px::Context& ctx, const Opt& opt) {
  px::TrainerOptions to;
  to.reduction = px::Reduction::sum;
  Var a(ctx, "a", options(1000, false)), b(ctx, "b", options(1000, false)), c(ctx, "c", options(1000, false));
  px::Trainer<px::arch::Hybrid, Opt> trainer(ctx, to, opt, a, b, c);
  Three out;
  const auto [first, last] = block(ctx.rank(), ctx.size());
  for (std::uint64_t s = 1; s <= steps; ++s) {
    std::vector<std::uint64_t> keys;
    for (std::size_t j = first; j < last; ++j) keys.push_back(key_at(s, j));
    const auto* ids = reinterpret_cast<const px::index_t*>(keys.data());
    std::vector<px::Lookup<Var>> batch{{a, ids, keys.size()}, {b, ids, keys.size()}, {c, ids, keys.size()}};
    const px::Traffic before = trainer.stats().total();
    const auto rows = trainer.lookup(batch);
    const px::Traffic looked = trainer.stats().total();
    std::vector<float> ga(keys.size() * C), gb;
    std::vector<std::uint64_t> even;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (keys[i] % 2 == 0) even.push_back(keys[i]);
      for (std::size_t k = 0; k < C; ++k) {
        for (const auto& r : rows) out.looked_up.push_back(r.row(i)[k]);
        ga[i * C + k] = grad_of(s, first + i, k, rows[0].row(i)[k]);
        if (keys[i] % 2 == 0) gb.push_back(grad_of(s, first + i, k, rows[1].row(i)[k]));
      }
    }
    a.grad().add(keys, ga);
    b.grad().add(even, gb);
    trainer.step();
    const px::Traffic stepped = trainer.stats().total();
    out.lookup_calls.push_back((looked - before).calls);
    out.step_calls.push_back((stepped - looked).calls);
  }
  auto& sync = trainer.template synchronizer<px::DynamicPS>();
  for (Var* v : {&a, &b, &c}) out.tables.push_back(sync.table(*v).export_rows());
  return out;
}

}  // namespace

TEST_CASE("dynamic lookups and pushes at N ranks equal one process's on the same global batch", "[dynamic_ps]") {
  SECTION("sgd") { check_one_process(px::optim::Sgd{0.5f}); }
  SECTION("adagrad") { check_one_process(px::optim::Adagrad{0.3f}); }
}

TEST_CASE("with eviction and admission on, N ranks equal a serial replay of their tables, bit for bit",
          "[dynamic_ps]") {
  const auto& ctx = test::world();
  const int n = ctx.size();
  const std::size_t capacity = 16 / static_cast<std::size_t>(n) + 4;
  auto check = [&](const auto& opt) {
    const Run got = train(ctx, opt, capacity, true);
    const Run want = replay(opt, n, ctx.rank(), capacity, true);
    CHECK(same_bits(got.looked_up, want.looked_up));
    check_same(got.table, want.table);
    CHECK(got.stats.total.evictions > 0);
    CHECK(got.stats.total.admissions_refused > 0);
    CHECK(got.stats.max.size <= capacity);
    CHECK(got.stats.total.capacity == capacity * static_cast<std::size_t>(n));
    const Run again = train(ctx, opt, capacity, true);
    CHECK(same_bits(again.looked_up, got.looked_up));
    check_same(again.table, got.table);
  };
  SECTION("sgd") { check(px::optim::Sgd{0.5f}); }
  SECTION("adagrad") { check(px::optim::Adagrad{0.3f}); }
}

TEST_CASE("a wrong-width dynamic gradient throws on every rank", "[dynamic_ps]") {
  check_wrong_width<px::arch::PS>();
}

TEST_CASE("a lookup beyond an owner's capacity throws on every rank", "[dynamic_ps]") {
  const auto& ctx = test::world();
  std::vector<std::uint64_t> keys;
  if (ctx.rank() == 0)
    for (std::uint64_t k = 0; k < 64; ++k) keys.push_back(k);  // some owner gets more than 4
  const std::string what = over_capacity_error<px::arch::Hybrid>(keys);  // DynamicPS
  INFO(what);
  CHECK(what.find("capacity of 4 rows") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
}

namespace {

// Steps [from, to] of the global batch on `trainer` (this rank's block of
// it), `more(s)` giving the step's other gradients; returns the rows this
// rank read.
template <class Trainer, class More>
std::vector<float> run_steps(Trainer& trainer, Var& emb, std::uint64_t from, std::uint64_t to, More&& more) {
  std::vector<float> read;
  for (std::uint64_t s = from; s <= to; ++s) {
    look_up_and_push(trainer, emb, s, read);
    more(s);
    trainer.step();
  }
  return read;
}

// A dynamic variable alone in a trainer over ctx, trained step by step on
// the global batch (this rank's block of it).
template <class Opt>
struct Model {
  Var emb;
  px::Trainer<px::arch::PS, Opt> trainer;
  Model(const px::Context& ctx, const Opt& opt)
      : emb(ctx, "emb", options(1000, false)), trainer(ctx, sum_options(), opt, emb) {}
  static px::TrainerOptions sum_options() {
    px::TrainerOptions to;
    to.reduction = px::Reduction::sum;
    return to;
  }
  px::policy::DynamicSynchronizer<px::engine::Mpi, Opt>& sync() { return trainer.template synchronizer<px::DynamicPS>(); }
  // Steps [from, to] of the global batch; returns the rows this rank read.
  std::vector<float> run(std::uint64_t from, std::uint64_t to) {
    return run_steps(trainer, emb, from, to, [](std::uint64_t) {});
  }
};

std::string scratch_dir() {
  long id = static_cast<long>(::getpid());
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return (std::filesystem::temp_directory_path() / ("parallax_dynamic_ps_" + std::to_string(id))).string();
}

}  // namespace

TEST_CASE("a dynamic table saved at N ranks restores at 1-N ranks bit for bit, and training goes on alike",
          "[dynamic_ps]") {
  const auto& world = test::world();
  const int n = world.size(), me = world.rank();
  const px::optim::Adagrad opt{0.3f};
  const std::string dir = scratch_dir();
  // One process, the global batch, no restart.
  px::Context single(MPI_COMM_SELF);
  Model<px::optim::Adagrad> ref(single, opt);
  ref.run(1, 3);
  const auto at3 = ref.sync().table(ref.emb).export_rows();
  const auto read_after = ref.run(4, 5);
  const auto at5 = ref.sync().table(ref.emb).export_rows();

  {
    Model<px::optim::Adagrad> a(world, opt);
    a.run(1, 3);
    check_same(a.sync().table(a.emb).export_rows(), px::dynamic::owned_share(at3, me, n));
    a.sync().save(a.emb, dir);
  }
  for (int m = 1; m <= n; ++m) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, me < m ? 0 : MPI_UNDEFINED, me, &sub);
    if (me >= m) continue;
    {
      INFO("saved at " << n << " ranks, restored at " << m);
      px::Context ctx(sub);
      Model<px::optim::Adagrad> b(ctx, opt);
      b.run(1, 1);  // rows that the restore replaces
      b.sync().restore(b.emb, dir);
      check_same(b.sync().table(b.emb).export_rows(), px::dynamic::owned_share(at3, me, m));
      const auto read = b.run(4, 5);
      CHECK(same_bits(read, rows_of_block(read_after, me, m)));
      check_same(b.sync().table(b.emb).export_rows(), px::dynamic::owned_share(at5, me, m));
    }
    MPI_Comm_free(&sub);
  }

  // A corrupt file is refused on every rank, naming it.
  if (me == 0) {
    std::fstream f(px::policy::dynamic_ps::shard_path(dir, "emb", n - 1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Model<px::optim::Adagrad> c(world, opt);
  std::string what;
  try {
    c.sync().restore(c.emb, dir);
  } catch (const px::error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("size or checksum differs from its manifest") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::remove_all(dir);
}

namespace {

// A dynamic variable with a dense one in a trainer over ctx: the model of
// a checkpoint that holds both. Rank 0 alone gives the dense gradient, so
// its sum is one process's at every rank count.
struct Mixed {
  Var emb;
  px::Variable<px::Dense, float> w;
  px::Trainer<px::arch::Hybrid, px::optim::Adagrad> trainer;
  Mixed(const px::Context& ctx, const px::optim::Adagrad& opt)
      : emb(ctx, "emb", options(1000, false)), w(ctx, "w", {2, 2}),
        trainer(ctx, Model<px::optim::Adagrad>::sum_options(), opt, emb, w) {}
  std::vector<float> run(std::uint64_t from, std::uint64_t to) {
    const bool root = trainer.context().rank() == 0;
    return run_steps(trainer, emb, from, to, [&](std::uint64_t s) {
      for (std::size_t i = 0; i < 4; ++i) w.grad().data()[i] = root ? 0.01f * static_cast<float>(s + i) : 0.0f;
    });
  }
  px::dynamic::Snapshot<float> table() { return trainer.template synchronizer<px::DynamicPS>().table(emb).export_rows(); }
};

}  // namespace

TEST_CASE("Trainer::save holds dynamic tables: saved at 2 ranks, restored at 1-N, training goes on alike",
          "[dynamic_ps][checkpoint]") {
  const int n = test::world().size(), me = test::world().rank();
  const px::optim::Adagrad opt{0.3f};
  const test::TempDir dir("parallax_dynamic_ckpt");
  px::Context single(MPI_COMM_SELF);
  Mixed ref(single, opt);
  ref.run(1, 3);
  const auto at3 = ref.table();
  const auto read_after = ref.run(4, 5);
  const auto at5 = ref.table();
  const auto w5 = ref.trainer.fetch(ref.w);

  const int saving = std::min(n, 2);
  on_first(saving, [&](px::Context& ctx) {
    Mixed a(ctx, opt);
    a.run(1, 3);
    a.trainer.save(dir.path);
  });
  MPI_Barrier(MPI_COMM_WORLD);
  const auto saved = px::latest_checkpoint(dir.path);
  REQUIRE(saved);
  CHECK(saved->step == 3);
  {
    // The manifest lists the table and its files after the rank files; one
    // file fewer is refused.
    std::ifstream in(saved->path + "/manifest", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto m = px::detail::Manifest::parse(text, "manifest");
    REQUIRE(m.tables.size() == 1);
    CHECK(m.tables[0].name == "emb");
    CHECK(m.tables[0].cols == C);
    REQUIRE(m.files.size() == static_cast<std::size_t>(2 * saving + 1));
    CHECK(m.files[static_cast<std::size_t>(saving)].name == "emb.dynamic.rank0");
    CHECK(m.files.back().name == "emb.dynamic");
    auto fewer = m;
    fewer.files.pop_back();
    std::string what;
    try {
      (void)px::detail::Manifest::parse(fewer.serialize(), "manifest");
    } catch (const px::error& e) {
      what = e.what();
    }
    CHECK(what.find("data files for " + std::to_string(saving) + " ranks and 1 dynamic tables") != std::string::npos);
  }
  for (int m = 1; m <= n; ++m)
    on_first(m, [&](px::Context& ctx) {
      INFO("saved at " << saving << " ranks, restored at " << m);
      Mixed b(ctx, opt);
      b.run(1, 1);  // rows that the restore replaces
      b.trainer.restore(saved->path);
      check_same(b.table(), px::dynamic::owned_share(at3, me, m));
      const auto read = b.run(4, 5);
      CHECK(same_bits(read, rows_of_block(read_after, me, m)));
      check_same(b.table(), px::dynamic::owned_share(at5, me, m));
      CHECK(same_bits(b.trainer.fetch(b.w), w5));
    });

  // A model without the dynamic table is refused, naming the difference.
  std::string what;
  {
    px::Variable<px::Dense, float> w(test::world(), "w", {2, 2});
    px::Trainer<px::arch::Hybrid, px::optim::Adagrad> other(test::world(), Model<px::optim::Adagrad>::sum_options(),
                                                           opt, w);
    try {
      other.restore(saved->path);
    } catch (const px::error& e) {
      what = e.what();
    }
  }
  INFO(what);
  CHECK(what.find("its dynamic tables are 'emb' (3 columns, f32); this model's are none") != std::string::npos);
  CHECK(test::same_on_every_rank(what));

  // A save that died part way through a dynamic table's file: the
  // checkpoint is no longer listed, and restoring it names the file.
  const std::string torn = saved->path + "/emb.dynamic.rank0";
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::filesystem::resize_file(torn, std::filesystem::file_size(torn) / 2);
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK_FALSE(px::latest_checkpoint(dir.path));
  Mixed c(test::world(), opt);
  what.clear();
  try {
    c.trainer.restore(saved->path);
  } catch (const px::error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find(torn) != std::string::npos);
  CHECK(what.find("the manifest says") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
}

TEST_CASE("the tutorial's dynamic variable: declare, look up, push, read the statistics", "[dynamic_ps]") {
  const auto& ctx = test::world();
  // example-begin dynamic_variable
  px::dynamic::Options o;
  o.capacity = 100000;                               // rows per rank
  o.cols = 8;
  o.init = px::init::Uniform{-0.05f, 0.05f, 1};      // a pure function of (name, key, column)
  o.evict = px::dynamic::Evict::lru;                 // when full, the least recently seen go
  o.admission = px::dynamic::admit::CountMin{};      // a key needs 2 sightings for a row
  px::DynamicVariable<float> users(ctx, "users", o);
  px::Trainer<px::arch::Hybrid, px::optim::Adagrad> trainer(ctx, px::optim::Adagrad{0.1f}, users);

  const std::vector<std::uint64_t> keys{0x9E3779B97F4A7C15ull, 42, 0x9E3779B97F4A7C15ull};
  const auto rows = trainer.lookup(users, keys);     // 3 x 8, default rows for keys not admitted yet
  users.grad().add(keys, std::vector<float>(keys.size() * 8, 0.5f));
  trainer.step();

  const px::policy::DynamicStats s = trainer.synchronizer<px::DynamicPS>().stats(users);  // collective
  // s.total.size, .inserts, .evictions, .admissions_refused; s.hit_rate(); s.max.size
  // example-end
  CHECK(rows.rows == 3);
  CHECK(rows.cols == 8);
  // Every rank looked the three keys up: the first is seen twice per rank
  // and so admitted; 42 once per rank, so admitted from 2 ranks on.
  const std::uint64_t admitted = ctx.size() >= 2 ? 2 : 1;
  CHECK(s.total.lookups == 3 * static_cast<std::uint64_t>(ctx.size()));
  CHECK(s.total.inserts == admitted);
  CHECK(s.total.size == admitted);
  CHECK(s.total.admissions_refused == 2);  // the first sighting of each key
  CHECK(users.local_stats().capacity == 100000);
}

TEST_CASE("a NaN in a dynamic gradient skips the step on every rank, naming the key", "[dynamic_ps]") {
  const auto& ctx = test::world();
  Var emb(ctx, "emb", options(100, false));
  px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.1f}, emb);
  const std::vector<std::uint64_t> keys{1000, 1001};
  (void)trainer.lookup(emb, keys);
  const auto before = trainer.synchronizer<px::DynamicPS>().table(emb).export_rows();
  std::vector<float> grads(keys.size() * C, 1.0f);
  if (ctx.rank() == ctx.size() - 1) grads[C + 1] = std::nanf("");
  emb.grad().add(keys, grads);
  trainer.step();
  CHECK(trainer.skipped_steps() == 1);
  INFO(trainer.skipped_why());
  CHECK(trainer.skipped_why().find("gradient of dynamic variable 'emb' holds NaN in the row for key 1001") !=
        std::string::npos);
  CHECK(test::same_on_every_rank(trainer.skipped_why()));
  check_same(trainer.synchronizer<px::DynamicPS>().table(emb).export_rows(), before);
}

TEST_CASE("clipping by the global norm counts each summed dynamic row once, at any rank count", "[dynamic_ps]") {
  const auto& ctx = test::world();
  px::Context single(MPI_COMM_SELF);
  const px::optim::Sgd opt{0.5f};
  std::vector<double> want_norms, got_norms;
  const Run want = train(single, opt, 1000, false, 0.05, &want_norms);
  const Run got = train(ctx, opt, 1000, false, 0.05, &got_norms);
  REQUIRE(got_norms.size() == want_norms.size());
  for (std::size_t s = 0; s < want_norms.size(); ++s) {
    INFO("step " << s + 1 << ": norm " << got_norms[s] << " against one process's " << want_norms[s]);
    CHECK(want_norms[s] > 0.05);  // every step clips
    CHECK(std::abs(got_norms[s] - want_norms[s]) <= 1e-9 * want_norms[s]);
  }
  const auto mine = px::dynamic::owned_share(want.table, ctx.rank(), ctx.size());
  REQUIRE(got.table.keys == mine.keys);
  double worst = 0;
  for (std::size_t i = 0; i < mine.rows.size(); ++i)
    worst = std::max(worst, std::abs(double(got.table.rows[i]) - mine.rows[i]) / std::max(1e-3, std::abs(double(mine.rows[i]))));
  INFO("max relative error " << worst);
  CHECK(worst <= 1e-5);
}

TEST_CASE("a batched lookup of three dynamic tables and the step's push each route once, as one process would",
          "[dynamic_ps]") {
  const auto& ctx = test::world();
  const px::optim::Adagrad opt{0.3f};
  px::Context single(MPI_COMM_SELF);
  const Three want = train_three(single, opt);
  const Three got = train_three(ctx, opt);
  const auto [first, last] = block(ctx.rank(), ctx.size());
  std::vector<float> want_mine;
  for (std::uint64_t s = 0; s < steps; ++s)
    want_mine.insert(want_mine.end(), want.looked_up.begin() + static_cast<std::ptrdiff_t>((s * G + first) * 3 * C),
                     want.looked_up.begin() + static_cast<std::ptrdiff_t>((s * G + last) * 3 * C));
  CHECK(same_bits(got.looked_up, want_mine));
  for (std::size_t t = 0; t < 3; ++t)
    check_same(got.tables[t], px::dynamic::owned_share(want.tables[t], ctx.rank(), ctx.size()));
  CHECK(want.tables[2].size() > 0);  // "c" took rows it never trained
  if (ctx.size() == 1) return;  // one rank routes nothing: no calls to count
  // A lookup: the keys' exchange, the agreement on its problems (one
  // all-reduce), the rows' exchange; whatever the number of tables. The
  // step: the push's one exchange beside the trainer's own calls, alike
  // every step.
  for (std::uint64_t n : got.lookup_calls) CHECK(n == 3);
  for (std::uint64_t n : got.step_calls) CHECK(n == got.step_calls.front());
}
