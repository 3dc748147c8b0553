#pragma once
// The stream the dynamic-variable policy tests train on (DynamicPS:
// dynamic_ps/synchronizer.cpp; AllGatherv: allgatherv/dynamic.cpp), and
// their comparisons: a global batch of G keys a step, each rank its
// contiguous block, so the ranks' blocks in rank order are the global batch.
#include "support.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace dynamic_test {

using Var = px::DynamicVariable<float>;
constexpr std::size_t C = 3;   // columns
constexpr std::size_t G = 24;  // keys in a step's global batch (divisible by 1-4)
constexpr std::uint64_t steps = 6;

// Global position j of step s: a popular head (every third key), keys that
// come back across steps, and keys new at every step (each twice in it, so
// count-min admission admits them).
inline std::uint64_t key_at(std::uint64_t s, std::size_t j) {
  if (j % 3 == 0) return 1000 + (j / 3) % 2;  // each 4 times a step: sums of 4 rows
  if (j % 3 == 1) return px::detail::splitmix64((s + j) % 29 + 17);
  return px::detail::splitmix64(s * 1000 + j / 6);
}
// The gradient of position j's row: depends on the row looked up.
inline float grad_of(std::uint64_t s, std::size_t j, std::size_t c, float row) {
  return 0.25f * row + 0.01f * static_cast<float>((s * 7 + j * 3 + c) % 11) - 0.05f;
}

// Rank r's share of the global batch: a contiguous block.
inline std::pair<std::size_t, std::size_t> block(int rank, int ranks) {
  const std::size_t n = G / static_cast<std::size_t>(ranks);
  return {static_cast<std::size_t>(rank) * n, (static_cast<std::size_t>(rank) + 1) * n};
}

// `small`: LFU eviction and count-min admission, for small capacities;
// else probability admission, which is the same at every rank count.
inline px::dynamic::Options options(std::size_t capacity, bool small) {
  px::dynamic::Options o;
  o.capacity = capacity;
  o.cols = C;
  o.init = px::init::Uniform{-0.5f, 0.5f, 11};
  if (small) {
    o.evict = px::dynamic::Evict::lfu;
    o.evict_fraction = 0.1;
    px::dynamic::admit::CountMin cm;
    cm.sightings = 2;
    o.admission = cm;
    o.unadmitted = px::dynamic::Unadmitted::initial;
  } else {
    o.admission = px::dynamic::admit::Probability{0.7};
  }
  return o;
}

// One step of the stream on `trainer`, before its dense gradients and
// step(): looks this rank's block of step s up, appends the rows read to
// `read` and adds their gradients (grad_of) to emb's.
template <class Trainer>
void look_up_and_push(Trainer& trainer, Var& emb, std::uint64_t s, std::vector<float>& read) {
  const auto [first, last] = block(trainer.context().rank(), trainer.context().size());
  std::vector<std::uint64_t> keys;
  for (std::size_t j = first; j < last; ++j) keys.push_back(key_at(s, j));
  const auto rows = trainer.lookup(emb, keys);
  REQUIRE(rows.rows == keys.size());
  REQUIRE(rows.cols == C);
  std::vector<float> grads(keys.size() * C);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t c = 0; c < C; ++c) {
      read.push_back(rows.row(i)[c]);
      grads[i * C + c] = grad_of(s, first + i, c, rows.row(i)[c]);
    }
  emb.grad().add(keys, grads);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void check_same(const px::dynamic::Snapshot<float>& got, const px::dynamic::Snapshot<float>& want) {
  CHECK(got.keys == want.keys);
  CHECK(same_bits(got.rows, want.rows));
  for (int k = 0; k < want.slots; ++k) CHECK(same_bits(got.state[k], want.state[k]));
  CHECK(got.counts == want.counts);
  CHECK(got.last_steps == want.last_steps);
}

// Rank `me` of `ranks`' share of the rows one process read over the
// global batch of some steps: its block of each step.
inline std::vector<float> rows_of_block(const std::vector<float>& global, int me, int ranks) {
  const auto [first, last] = block(me, ranks);
  std::vector<float> out;
  for (std::size_t s = 0; s < global.size() / (G * C); ++s)
    out.insert(out.end(), global.begin() + static_cast<std::ptrdiff_t>((s * G + first) * C),
               global.begin() + static_cast<std::ptrdiff_t>((s * G + last) * C));
  return out;
}

// A gradient of the wrong width on rank 0 throws at step() on every rank
// under architecture Arch, naming it, and the trainer goes on.
// The error of a lookup past a capacity of 4 rows under Arch (each rank
// asking for `keys`), or "" if none was thrown.
template <class Arch>
std::string over_capacity_error(const std::vector<std::uint64_t>& keys) {
  auto o = options(4, false);
  o.admission = px::dynamic::admit::Always{};
  Var emb(test::world(), "emb", o);
  px::Trainer<Arch, px::optim::Sgd> trainer(test::world(), px::optim::Sgd{0.1f}, emb);
  try {
    (void)trainer.lookup(emb, keys);
  } catch (const px::error& e) {
    return e.what();
  }
  return "";
}

template <class Arch>
void check_wrong_width() {
  const auto& ctx = test::world();
  Var emb(ctx, "emb", options(100, false));
  px::Trainer<Arch, px::optim::Sgd> trainer(ctx, px::optim::Sgd{0.1f}, emb);
  const std::vector<std::uint64_t> keys{1, 2};
  (void)trainer.lookup(emb, keys);
  if (ctx.rank() == 0) emb.grad().add(keys, std::vector<float>(5, 1.0f));
  else emb.grad().add(keys, std::vector<float>(keys.size() * C, 1.0f));
  std::string what;
  try {
    trainer.step();
  } catch (const px::error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("gradient of dynamic variable 'emb' has 5 values for 2 keys") != std::string::npos);
  CHECK(test::same_on_every_rank(what));
  (void)trainer.lookup(emb, keys);
  emb.grad().add(keys, std::vector<float>(keys.size() * C, 1.0f));
  CHECK_NOTHROW(trainer.step());
}

// Runs f on a communicator of the first m world ranks (the others skip it).
template <class F>
void on_first(int m, F&& f) {
  const int me = test::world().rank();
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, me < m ? 0 : MPI_UNDEFINED, me, &sub);
  if (me >= m) return;
  {
    px::Context ctx(sub);
    f(ctx);
  }
  MPI_Comm_free(&sub);
}

}  // namespace dynamic_test
