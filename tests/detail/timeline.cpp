// detail/timeline.hpp and TrainerOptions::timeline: a trainer given a path
// records every phase of its steps and the user's time between its calls,
// and rank 0 writes one Chrome trace with a track per rank.
#include "support.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

/// A fresh file name made by rank 0, known to every rank.
std::string temp_path(const px::Context& ctx) {
  char name[] = "/tmp/parallax-timeline-XXXXXX";
  std::string path;
  if (ctx.rank() == 0) {
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    close(fd);
    path = name;
  }
  int length = static_cast<int>(path.size());
  MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(static_cast<std::size_t>(length));
  MPI_Bcast(path.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

std::string read_and_remove(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  return text.str();
}

}  // namespace

TEST_CASE("a trainer's timeline holds every rank's phases in one Chrome trace", "[timeline]") {
  auto& ctx = test::world();
  const int n = ctx.size();
  const std::string path = temp_path(ctx);
  {
    px::Variable<px::Sparse, float> emb(ctx, "emb", {20, 4});
    px::Variable<px::Dense, float> w(ctx, "w", {4});
    px::TrainerOptions o;
    o.timeline = path;
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, emb, w);
    for (int s = 0; s < 3; ++s) {
      const std::vector<px::index_t> ids{1, 2};
      trainer.lookup(emb, ids);
      emb.grad().add(ids, std::vector<float>(8, 1.f));
      w.grad()[0] = 1.f;
      trainer.step();
    }
  }  // written here
  MPI_Barrier(MPI_COMM_WORLD);
  if (ctx.rank() == 0) {
    const std::string trace = read_and_remove(path);
    CHECK(trace.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0);
    CHECK(trace.substr(trace.size() - 4) == "\n]}\n");
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      const std::string pid = "\"pid\":" + std::to_string(r) + ",";
      CHECK(count(trace, "\"name\":\"rank " + std::to_string(r) + "\"") == 1);  // the track's name
      CHECK(count(trace, pid + "\"tid\":0") >= 3 * 4);  // every rank's spans
    }
    // Each rank's three steps and lookups, the user's time between them,
    // and the phases inside.
    CHECK(count(trace, "\"name\":\"step\"") == static_cast<std::size_t>(3 * n));
    CHECK(count(trace, "\"name\":\"lookup\"") == static_cast<std::size_t>(3 * n));
    CHECK(count(trace, "\"cat\":\"user\"") == static_cast<std::size_t>(5 * n));
    CHECK(count(trace, "\"name\":\"agreement\"") == static_cast<std::size_t>(3 * n));
    CHECK(count(trace, "\"name\":\"push: route\"") == static_cast<std::size_t>(3 * n));
    CHECK(count(trace, "\"name\":\"update: ShardedPS\"") == static_cast<std::size_t>(3 * n));
    // One rank sums nothing: no bucket is reduced, so none is traced.
    CHECK(count(trace, "\"name\":\"all-reduce bucket 0 (16 B)\"") == static_cast<std::size_t>(n > 1 ? 3 * n : 0));
  }
  CHECK_FALSE(px::detail::Timeline::get().on());
}

// Work that ready() starts runs on the trainer's communication thread while
// the caller records its own spans: both land in the trace, the
// communication thread's on its own row (tid 1) of the rank's track.
TEST_CASE("the communication thread's spans land on their own row of the timeline", "[timeline]") {
  auto& ctx = test::world();
  const int n = ctx.size();
  const std::string path = temp_path(ctx);
  constexpr int steps = 50;
  {
    std::vector<px::Variable<px::Dense, float>> layers;
    for (int l = 0; l < 4; ++l) layers.emplace_back(ctx, "layer" + std::to_string(l), px::Shape{256});
    px::TrainerOptions o;
    o.timeline = path;
    o.ring.bucket_bytes = 256 * sizeof(float);  // a bucket per layer
    o.overlap_needs_spare_core = false;          // the communication thread, on any host
    px::Trainer<px::arch::Hybrid, px::optim::Sgd> trainer(ctx, o, px::optim::Sgd{0.1f}, layers);
    REQUIRE(trainer.overlapping());
    for (int s = 0; s < steps; ++s) {
      for (int l = 3; l >= 0; --l) {
        layers[static_cast<std::size_t>(l)].grad()[0] = 1.f;
        trainer.ready(layers[static_cast<std::size_t>(l)]);  // spans on both threads at once
      }
      trainer.step();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (ctx.rank() == 0) {
    const std::string trace = read_and_remove(path);
    CHECK(trace.substr(trace.size() - 4) == "\n]}\n");
    CHECK(count(trace, "\"name\":\"ready\"") == static_cast<std::size_t>(4 * steps * n));
    CHECK(count(trace, "\"name\":\"step\"") == static_cast<std::size_t>(steps * n));
    CHECK(count(trace, "\"name\":\"communication thread\"") == static_cast<std::size_t>(n));
    if (n > 1 && ctx.serialized_threads()) {
      // Every bucket's all-reduce ran on the communication thread, and each
      // step lent it the update of the first variables (its span is the
      // one that starts at variable 0; the caller's starts after them).
      CHECK(count(trace, "\"name\":\"update variables 0-") == static_cast<std::size_t>(steps * n));
      CHECK(count(trace, "\"name\":\"update variables ") == static_cast<std::size_t>(2 * steps * n));
      CHECK(count(trace, "\"tid\":1,") == static_cast<std::size_t>(5 * steps * n) + static_cast<std::size_t>(n));
      CHECK(count(trace, "\"name\":\"all-reduce bucket 3 (1024 B)\"") == static_cast<std::size_t>(steps * n));
    }
  }
  CHECK_FALSE(px::detail::Timeline::get().on());
}
