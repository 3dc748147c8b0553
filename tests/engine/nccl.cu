// engine::Nccl (CUDA builds, [gpu]): the engine contract (contract.hpp)
// with device buffers, then what is its own: host buffers through the
// device scratch, reduce_scatter's two NCCL paths, the GPU placement rule,
// the ring all-reduce over the engine and whole trainers.
// Written for any rank count with a GPU per rank; CTest runs it at 1 and 2
// ranks. The cases that make an engine are tagged [needs-gpu-per-rank]: they
// report themselves skipped on a host with fewer GPUs than ranks (at 2 ranks
// on a one-GPU machine). A case whose check cannot fail at one rank is also
// tagged [np2+], so it runs only at 2 ranks, on two GPUs.
#include "support.hpp"

#include <parallax/cuda/device.cuh>
#include <parallax/engine/nccl.cuh>

#include <cstdint>
#include <cstdlib>
#include <utility>
#include <numeric>
#include <tuple>
#include <string>
#include <vector>

using px::DataType;
using px::ReduceOp;

namespace {

using Engine = px::engine::Nccl;

template <class T>
px::Buffer<T, px::CudaSpace> device(const std::vector<T>& v) {
  return px::Buffer<T, px::CudaSpace>::from_host(v);
}

/// Ranks of this rank's NCCL node (its host's, or fewer under
/// nccl_node_per_rank.sh) and the GPUs this process sees. Collective.
std::pair<int, int> node_ranks_and_gpus() {
  int gpus = 0;
  PARALLAX_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  return {px::nccl_node_on_host(MPI_COMM_WORLD).size, gpus};
}

/// Collective. Skips the case unless this rank's NCCL node has a GPU for
/// each of its ranks, which engine::Nccl needs (the placement rule).
bool skip_without_gpu_per_rank() {
  const auto [local, gpus] = node_ranks_and_gpus();
  return test::skip_unless(local <= gpus, "engine::Nccl needs a GPU per rank; this host runs " + std::to_string(local) +
                                              " ranks and has " + std::to_string(gpus) + " GPU(s)");
}

}  // namespace

using ContractEngines = std::tuple<Engine>;
#define PARALLAX_CONTRACT_TAGS "[gpu][engine][nccl][needs-gpu-per-rank][contract]"
#define PARALLAX_CONTRACT_SKIP() skip_without_gpu_per_rank()
#include "contract.hpp"

namespace {
using Fixture = contract::Fixture<Engine>;
using contract::f32;
}  // namespace

TEST_CASE("choose_device: local rank mod GPUs, one GPU per rank for Nccl", "[gpu][engine][nccl]") {
  CHECK(px::choose_device({0, 1}, 1, px::DeviceSharing::exclusive, "engine::Nccl") == 0);
  CHECK(px::choose_device({3, 4}, 4, px::DeviceSharing::exclusive, "engine::Nccl") == 3);
  CHECK(px::choose_device({3, 4}, 1, px::DeviceSharing::shared, "engine::MpiStaged") == 0);
  CHECK(px::choose_device({5, 8}, 2, px::DeviceSharing::shared, "engine::MpiStaged") == 1);
  const std::string crowded =
      test::error_of([] { (void)px::choose_device({1, 3}, 2, px::DeviceSharing::exclusive, "engine::Nccl"); });
  CHECK(crowded.find("engine::Nccl needs one GPU per rank, but this host runs 3 ranks and has 2 GPUs") !=
        std::string::npos);
  CHECK(crowded.find("engine::MpiStaged") != std::string::npos);
  const std::string none =
      test::error_of([] { (void)px::choose_device({0, 1}, 0, px::DeviceSharing::shared, "engine::MpiStaged"); });
  CHECK(none.find("sees none") != std::string::npos);
}

TEST_CASE("nccl_node_on_host: ranks of a host with one NCCL_HOSTID are one node", "[gpu][engine][nccl]") {
  const px::LocalRank host = px::local_rank_on_host(MPI_COMM_WORLD);
  const px::LocalRank node = px::nccl_node_on_host(MPI_COMM_WORLD);
  const char* id = std::getenv("NCCL_HOSTID");
  const char* rank = std::getenv("PMI_RANK");
  if (id != nullptr && rank != nullptr && std::string(id) == std::string("parallax-test-node-") + rank) {
    // nccl_node_per_rank.sh: a value of its own on every rank.
    CHECK(node.rank == 0);
    CHECK(node.size == 1);
  } else {
    // Unset, or one value for the whole job: the host is one node.
    CHECK(node.rank == host.rank);
    CHECK(node.size == host.size);
  }
}

// At 2 ranks (engine_nccl_np2) on a one-GPU machine every rank must fail at
// once with the message, and none may wait in NCCL's initialisation; under
// nccl_node_per_rank.sh (engine_nccl_nodes_np*) every rank is its own NCCL
// node and the engine is made.
TEST_CASE("Nccl on more ranks than GPUs fails on every rank, naming the counts", "[gpu][engine][nccl][placement]") {
  const auto [local, gpus] = node_ranks_and_gpus();
  const std::string what = test::error_of([] { Engine e{test::world()}; });
  if (local > gpus) {
    INFO(what);
    CHECK(what.find("engine::Nccl needs one GPU per rank, but this host runs " + std::to_string(local) +
                    " ranks and has " + std::to_string(gpus) + " GPU") != std::string::npos);
  } else {
    CHECK(what.empty());
  }
  CHECK(test::all_ranks(true));  // every rank got here: nobody hangs
}

TEST_CASE("Nccl takes host buffers for control messages", "[gpu][engine][nccl][needs-gpu-per-rank]") {
  if (skip_without_gpu_per_rank()) return;
  Fixture f;
  std::vector<std::int64_t> v{f.me, -f.me, 7};
  f.eng.allreduce(v.data(), v.data(), 3, DataType::i64, ReduceOp::sum);
  CHECK(v == std::vector<std::int64_t>{f.n * (f.n - 1) / 2, -f.n * (f.n - 1) / 2, 7 * f.n});
  std::int32_t mx = f.me, mn = f.me;
  f.eng.allreduce(&mx, &mx, 1, DataType::i32, ReduceOp::max);
  f.eng.allreduce(&mn, &mn, 1, DataType::i32, ReduceOp::min);
  CHECK(mx == f.n - 1);
  CHECK(mn == 0);
  std::vector<std::int64_t> header(2 * static_cast<std::size_t>(f.n)), got(header.size());
  for (int p = 0; p < f.n; ++p) {
    header[2 * p] = 10 * f.me + p;
    header[2 * p + 1] = -1;
  }
  f.eng.alltoall(header.data(), got.data(), 2, DataType::i64);
  for (int p = 0; p < f.n; ++p) {
    CHECK(got[2 * p] == 10 * p + f.me);
    CHECK(got[2 * p + 1] == -1);
  }
  std::vector<char> text{'o', 'k', char('0' + f.me)};
  f.eng.broadcast(text.data(), text.size(), DataType::u8, 0);
  CHECK(text == std::vector<char>{'o', 'k', '0'});
}

TEST_CASE("Nccl::reduce_scatter, equal and unequal blocks", "[gpu][engine][nccl][needs-gpu-per-rank]") {
  if (skip_without_gpu_per_rank()) return;
  Fixture f;
  const bool equal = GENERATE(true, false);
  std::vector<std::size_t> counts(static_cast<std::size_t>(f.n));
  for (int j = 0; j < f.n; ++j) counts[j] = equal ? 5 : static_cast<std::size_t>(j % 3 + (j == 0));
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<double> in(total);
  for (std::size_t i = 0; i < total; ++i) in[i] = f.me + 10.0 * i;
  auto send = device(in);
  auto recv = device(std::vector<double>(counts[f.me] + 1, -1.0));
  f.eng.reduce_scatter(send.data(), recv.data(), counts.data(), DataType::f64, ReduceOp::sum);
  const auto out = recv.to_host();
  const std::size_t first = std::accumulate(counts.begin(), counts.begin() + f.me, std::size_t{0});
  for (std::size_t k = 0; k < counts[f.me]; ++k) CHECK(out[k] == f.n * (f.n - 1) / 2.0 + f.n * 10.0 * (first + k));
  CHECK(out[counts[f.me]] == -1.0);
  const px::Traffic t = f.eng.stats().total();
  CHECK(t.sent() == (f.n > 1 ? 8 * (total - counts[f.me]) : 0));
  CHECK(t.received() == (f.n > 1 ? 8 * (total - counts[static_cast<std::size_t>(f.left)]) : 0));
}

TEST_CASE("RingAllReducer over Nccl sums with the ring and natively",
          "[gpu][engine][nccl][needs-gpu-per-rank][np2+]") {
  if (test::skip_below_ranks(2) || skip_without_gpu_per_rank()) return;
  Fixture f;
  const auto algorithm = GENERATE(px::engine::Algorithm::ring, px::engine::Algorithm::native);
  px::RingOptions o;
  o.algorithm = algorithm;
  o.segment_bytes = 512;
  o.adapt_to_oversubscription = false;
  px::RingAllReducer<Engine> reducer(f.eng, o);
  const std::size_t count = 4097;
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((f.me + 1) + static_cast<int>(i % 97));
  auto d = device(v);
  reducer.allreduce(d.data(), count);
  const auto out = d.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += out[i] != static_cast<float>(f.n * (f.n + 1) / 2 + f.n * static_cast<int>(i % 97));
  CHECK(wrong == 0);
}

namespace {

constexpr std::size_t kRows = 50, kDim = 3, kSteps = 3;

/// A few steps of SGD with fixed, integer-valued gradients (so every sum is
/// exact): the final values of a sparse and a dense variable.
template <class Arch, class Space, class Eng>
std::pair<std::vector<float>, std::vector<float>> train_fixed(px::Context& ctx) {
  px::Variable<px::Sparse, float, Space> emb(ctx, "emb", {kRows, kDim}, px::init::Constant{1.0});
  px::Variable<px::Dense, float, Space> w(ctx, "w", {4, 2}, px::init::Constant{2.0});
  px::TrainerOptions options;
  options.reduction = px::Reduction::sum;
  px::Trainer<Arch, px::optim::Sgd, Eng> trainer(ctx, options, px::optim::Sgd{0.5f}, emb, w);
  const int me = ctx.rank();
  for (std::size_t s = 0; s < kSteps; ++s) {
    std::vector<px::index_t> ids;
    for (std::size_t k = 0; k < 6; ++k) ids.push_back(static_cast<px::index_t>((me * 7 + s * 3 + k * 11) % kRows));
    ids.push_back(ids.front());  // a duplicate
    (void)trainer.lookup(emb, ids);
    std::vector<float> rows(ids.size() * kDim);
    for (std::size_t k = 0; k < rows.size(); ++k) rows[k] = static_cast<float>(static_cast<int>((k + me + s) % 5) - 2);
    emb.grad().add(ids, rows);
    std::vector<float> g(8);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i + me + s) % 3);
    px::space_traits<Space>::copy_from_host(w.grad().data(), g.data(), g.size() * sizeof(float));
    trainer.step();
  }
  return {trainer.fetch(emb), trainer.fetch(w)};
}

}  // namespace

TEMPLATE_TEST_CASE("Trainer over Nccl in device memory equals the host trainer",
                   "[gpu][engine][nccl][needs-gpu-per-rank]", px::arch::Hybrid, px::arch::PS,
                   px::arch::AllReduce) {
  if (skip_without_gpu_per_rank()) return;
  auto& ctx = test::world();
  const auto gpu = train_fixed<TestType, px::CudaSpace, Engine>(ctx);
  const auto host = train_fixed<TestType, px::HostSpace, px::engine::Mpi>(ctx);
  CHECK(gpu.first == host.first);
  CHECK(gpu.second == host.second);
  CHECK(test::all_ranks(gpu == host));
}
