// pipeline.hpp over device engines (CUDA builds, [gpu]): stages whose
// activations and errors stay in device memory, moved by engine::MpiStaged
// (ranks may share a GPU) and engine::Nccl (a GPU per rank, or an NCCL node
// per rank under engine/nccl_node_per_rank.sh), give the losses, input
// gradients and bytes of the same stages over host memory and engine::Mpi,
// bit for bit, under GPipe and 1F1B, S stages x R replicas; a stage that
// runs another batch size is named by its receiver.
#include "support.hpp"

#include <parallax/cuda/device.cuh>
#include <parallax/engine/mpi_staged.cuh>
#include <parallax/engine/nccl.cuh>
#include <parallax/pipeline.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

namespace {

namespace pp = px::pipeline;

constexpr std::size_t kWidth = 16, kBatch = 24;

/// y = (x + c) * a: no multiply-add for nvcc to contract, so host and
/// device compute the same bits.
struct Affine {
  const float* x;
  float* y;
  float a, c;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { y[i] = (x[i] + c) * a; }
};
/// g = (s * scale) * a, the last stage's input gradient from its saved y
/// (loss = sum y^2 / 2 / batch_rows); scale 1 for a middle stage's error.
struct Back {
  const float* s;
  float* g;
  float scale, a;
  PARALLAX_HOST_DEVICE void operator()(std::size_t i) const { g[i] = (s[i] * scale) * a; }
};

/// What the first stage saw: the sum of the errors it received (double, in
/// order), and the sum of the losses the last stage returned.
struct Seen {
  double first_errors = 0, losses = 0;
};

template <class Space>
struct ChainStage {
  using Saved = typename pp::Stage<float, Space>::Saved;
  const pp::Grid* grid;
  px::Exec<Space> ex;
  px::Buffer<float, Space> input, scratch;
  Seen* seen;
  float a() const { return 0.5f + 0.25f * static_cast<float>(grid->stage()); }
  float c() const { return 0.125f * static_cast<float>(grid->stage() + 1); }

  static void size(Saved& v, std::size_t n) {
    if constexpr (std::is_same_v<Space, px::HostSpace>) v.resize(n);
    else v.resize_discard(n);
  }

  pp::Stage<float, Space> stage() {
    pp::Stage<float, Space> st;
    st.name = "affine";
    st.in_width = grid->first_stage() ? 0 : kWidth;
    st.out_width = grid->last_stage() ? 0 : kWidth;
    st.forward = [this](const pp::MicroBatch& mb, const float* in, float* out, Saved& saved) {
      const std::size_t n = mb.rows * kWidth;
      if (!in) {  // the first stage reads rows mb.first.. of its replica's batch
        std::vector<float> x(n);
        for (std::size_t r = 0; r < mb.rows; ++r)
          for (std::size_t j = 0; j < kWidth; ++j)
            x[r * kWidth + j] = std::sin(0.37f * static_cast<float>(mb.first + r) + 0.9f * static_cast<float>(j) +
                                         0.5f * static_cast<float>(grid->replica()));
        input.assign_from_host(x.data(), n);
        in = input.data();
      }
      double loss = 0;
      if (out) {
        if (n) px::for_each(ex, n, Affine{in, out, a(), c()});
      } else {
        size(saved, n);
        if (n) px::for_each(ex, n, Affine{in, saved.data(), a(), c()});
        ex.synchronize();
        std::vector<float> y(n);
        if (n) px::space_traits<Space>::copy_to_host(y.data(), saved.data(), n * sizeof(float));
        for (float v : y) loss += 0.5 * static_cast<double>(v) * v / static_cast<double>(mb.batch_rows);
        seen->losses += loss;
      }
      ex.synchronize();
      return loss;
    };
    st.backward = [this](const pp::MicroBatch& mb, const float*, const float* out_grad, float* in_grad,
                         Saved& saved) {
      const std::size_t n = mb.rows * kWidth;
      if (!out_grad) {  // the last stage: from its loss
        if (in_grad && n) px::for_each(ex, n, Back{saved.data(), in_grad, 1.0f / static_cast<float>(mb.batch_rows), a()});
      } else if (in_grad) {
        if (n) px::for_each(ex, n, Back{out_grad, in_grad, 1.0f, a()});
      } else {  // the first stage: what arrived
        std::vector<float> g(n);
        if (n) px::space_traits<Space>::copy_to_host(g.data(), out_grad, n * sizeof(float));
        for (float v : g) seen->first_errors += v;
      }
      ex.synchronize();
    };
    return st;
  }
};

template <class Space>
px::Exec<Space> make_exec() {
  if constexpr (std::is_same_v<Space, px::HostSpace>) return px::Exec<Space>{};
  else return px::Exec<Space>::create();
}

struct Outcome {
  Seen seen;
  std::uint64_t sent = 0, received = 0;
};

/// Two steps of the chain with Engine's pipeline.
template <class Engine>
Outcome run_chain(const pp::Grid& grid, pp::Schedule schedule) {
  using Space = typename Engine::space;
  Outcome o;
  ChainStage<Space> part{&grid, make_exec<Space>(), {}, {}, &o.seen};
  pp::Pipeline<float, Engine> pipe(grid, part.stage(), std::move(schedule));
  for (int step = 0; step < 2; ++step) {
    const pp::RunStats s = pipe.run(kBatch / static_cast<std::size_t>(grid.replicas()));
    o.sent += s.sent_bytes;
    o.received += s.received_bytes;
  }
  return o;
}

/// Every grid of the world's size with S >= 2 stages where it can, both
/// schedules: the device engine's outcome equals engine::Mpi's, bit for bit.
template <class Engine>
void same_as_host() {
  const auto& w = test::world();
  for (int stages = 1; stages <= w.size(); ++stages) {
    if (w.size() % stages != 0) continue;
    for (auto kind : {pp::ScheduleKind::gpipe, pp::ScheduleKind::one_f_one_b}) {
      pp::Grid grid(w, stages);
      const Outcome host = run_chain<px::engine::Mpi>(grid, pp::Schedule::make(kind, stages, 4));
      const Outcome dev = run_chain<Engine>(grid, pp::Schedule::make(kind, stages, 4));
      INFO(Engine::name << ", " << stages << " stages x " << grid.replicas() << " replicas, "
                        << pp::Schedule::make(kind, stages, 4).name() << ", rank " << w.rank());
      CHECK(test::all_ranks(dev.seen.losses == host.seen.losses));
      CHECK(test::all_ranks(dev.seen.first_errors == host.seen.first_errors));
      CHECK(test::all_ranks(dev.sent == host.sent && dev.received == host.received));
      if (grid.last_stage()) CHECK(host.seen.losses > 0);
      if (grid.first_stage() && !grid.last_stage()) CHECK(host.seen.first_errors != 0);
    }
  }
}

/// Collective. Skips the case unless this rank's NCCL node has a GPU for
/// each of its ranks, which engine::Nccl needs.
bool skip_without_gpu_per_rank() {
  int gpus = 0;
  PARALLAX_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  const int local = px::nccl_node_on_host(MPI_COMM_WORLD).size;
  return test::skip_unless(local <= gpus, "engine::Nccl needs a GPU per rank; this host runs " + std::to_string(local) +
                                              " ranks and has " + std::to_string(gpus) + " GPU(s)");
}

}  // namespace

TEST_CASE("pipeline over engine::MpiStaged: device stages give the host chain's losses, errors and bytes",
          "[gpu][pipeline]") {
  same_as_host<px::engine::MpiStaged>();
}

TEST_CASE("pipeline over engine::Nccl: device stages give the host chain's losses, errors and bytes",
          "[gpu][pipeline][nccl][needs-gpu-per-rank]") {
  if (skip_without_gpu_per_rank()) return;
  same_as_host<px::engine::Nccl>();
}

TEST_CASE("pipeline over a device engine: a stage running another batch size is named by its receiver",
          "[gpu][pipeline][np2+]") {
  if (test::skip_below_ranks(2)) return;
  const auto& w = test::world();
  pp::Grid g(w, w.size());
  pp::PipelineOptions o;
  o.engine.timeout = std::chrono::milliseconds(300);
  Seen seen;
  ChainStage<px::CudaSpace> part{&g, px::Exec<px::CudaSpace>::create(), {}, {}, &seen};
  std::string e;
  {
    pp::Pipeline<float, px::engine::MpiStaged> p(g, part.stage(), pp::Schedule::gpipe(w.size(), 4), o);
    e = test::error_of([&] { p.run(g.stage() == 1 ? 5 : 4); });
  }
  px::detail::job_failed() = false;  // the drill is over
  INFO(e);
  // Stage 1 runs 5 rows where its neighbours run 4: stage 1 names stage 0,
  // stage 2 names stage 1 (it told stage 2 before it heard from stage 0),
  // and the others wait in vain until the deadline.
  if (g.stage() == 1)
    CHECK(e == "pipeline: rank 1 (stage 1, replica 0) runs a batch of 5 rows but rank 0 (stage 0, replica 0) runs 4 "
               "(the ranks of one replica must run the same batch size)");
  else if (g.stage() == 2)
    CHECK(e == "pipeline: rank 2 (stage 2, replica 0) runs a batch of 4 rows but rank 1 (stage 1, replica 0) runs 5 "
               "(the ranks of one replica must run the same batch size)");
  else
    CHECK(e.find("gave up after 300 ms") != std::string::npos);
  MPI_Barrier(MPI_COMM_WORLD);
}
