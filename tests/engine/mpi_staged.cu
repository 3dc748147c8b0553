// engine::MpiStaged (CUDA builds, [gpu]): the engine contract
// (contract.hpp) with device buffers, then what is its own: the pipelined
// paths with many chunks, host and mixed buffers, the ring all-reduce over
// the engine, and whole trainers in device memory against the same
// trainers on the host. Runs at 1-4 ranks on one GPU.
#include "support.hpp"

#include <parallax/engine/mpi_staged.cuh>

#include <cstdint>
#include <numeric>
#include <tuple>
#include <vector>

using px::DataType;
using px::ReduceOp;

namespace {

using Engine = px::engine::MpiStaged;

template <class T>
px::Buffer<T, px::CudaSpace> device(const std::vector<T>& v) {
  return px::Buffer<T, px::CudaSpace>::from_host(v);
}

}  // namespace

using ContractEngines = std::tuple<Engine>;
#define PARALLAX_CONTRACT_TAGS "[gpu][engine][mpi_staged][contract]"
#include "contract.hpp"

namespace {
using Fixture = contract::Fixture<Engine>;
using contract::f32;
}  // namespace

TEST_CASE("MpiStaged::allreduce sums device buffers, in chunks", "[gpu][engine][mpi_staged]") {
  Fixture f;
  const std::size_t count = GENERATE(0u, 1u, 7u, 1001u, 300000u);
  const std::size_t chunk = GENERATE(std::size_t{64}, Engine::default_chunk_bytes);
  f.eng.set_chunk_bytes(chunk);
  std::vector<float> in(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(f.me * 1000 + i % 1000);
  auto send = device(in);
  px::Buffer<float, px::CudaSpace> recv(count);
  f.eng.allreduce(send.data(), recv.data(), count, DataType::f32, ReduceOp::sum);
  const auto out = recv.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += out[i] != static_cast<float>(1000 * f.n * (f.n - 1) / 2 + f.n * static_cast<int>(i % 1000));
  CHECK(wrong == 0);
  const px::Traffic t = f.eng.stats().total();
  CHECK(t.calls == 1);
  CHECK(t.sent() == f32(px::detail::ring::allreduce_sent(count, f.n, f.me)));
  CHECK(t.received() == f32(px::detail::ring::allreduce_received(count, f.n, f.me)));
  CHECK(f.eng.calls() == 1);
}

TEST_CASE("MpiStaged::allreduce in place, max and min, host and mixed buffers", "[gpu][engine][mpi_staged]") {
  Fixture f;
  f.eng.set_chunk_bytes(16);  // two i64 per chunk
  const std::vector<std::int64_t> v{f.me, -f.me, 7, 3 * f.me + 1, 100};
  const std::vector<std::int64_t> sum{f.n * (f.n - 1) / 2, -f.n * (f.n - 1) / 2, 7 * f.n,
                                      3 * f.n * (f.n - 1) / 2 + f.n, 100 * f.n};
  auto d = device(v);
  f.eng.allreduce(d.data(), d.data(), v.size(), DataType::i64, ReduceOp::sum);
  CHECK(d.to_host() == sum);

  std::vector<std::int64_t> h = v;  // host memory: MPI directly
  f.eng.allreduce(h.data(), h.data(), h.size(), DataType::i64, ReduceOp::sum);
  CHECK(h == sum);

  px::Buffer<std::int64_t, px::CudaSpace> mixed(v.size());  // host in, device out
  f.eng.allreduce(v.data(), mixed.data(), v.size(), DataType::i64, ReduceOp::sum);
  CHECK(mixed.to_host() == sum);

  auto mx = device(std::vector<std::int32_t>{f.me, -f.me});
  f.eng.allreduce(mx.data(), mx.data(), 2, DataType::i32, ReduceOp::max);
  CHECK(mx.to_host() == std::vector<std::int32_t>{f.n - 1, 0});
  auto mn = device(std::vector<double>{static_cast<double>(f.me), -0.5 * f.me});
  f.eng.allreduce(mn.data(), mn.data(), 2, DataType::f64, ReduceOp::min);
  CHECK(mn.to_host() == std::vector<double>{0.0, -0.5 * (f.n - 1)});
}

TEST_CASE("MpiStaged::start_sendrecv pipelines chunks round a ring, two exchanges in flight",
          "[gpu][engine][mpi_staged]") {
  Fixture f;
  const std::size_t count = GENERATE(0u, 1u, 37u, 5000u);
  f.eng.set_chunk_bytes(40);  // 10 floats per chunk: many chunks
  auto value = [](int rank, int which, std::size_t i) { return static_cast<float>(rank * 100000 + which * 50000 + i); };
  std::vector<float> a(count), b(count);
  for (std::size_t i = 0; i < count; ++i) {
    a[i] = value(f.me, 0, i);
    b[i] = value(f.me, 1, i);
  }
  auto sa = device(a), sb = device(b);
  px::Buffer<float, px::CudaSpace> ra(count), rb(count);
  auto xa = f.eng.start_sendrecv(sa.data(), count, f.right, ra.data(), count, f.left, DataType::f32);
  auto xb = f.eng.start_sendrecv(sb.data(), count, f.right, rb.data(), count, f.left, DataType::f32);
  f.eng.wait(xb);  // completion in either order
  f.eng.wait(xa);
  const auto ga = ra.to_host(), gb = rb.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += (ga[i] != value(f.left, 0, i)) + (gb[i] != value(f.left, 1, i));
  CHECK(wrong == 0);
  const px::Traffic t = f.eng.stats().total();
  CHECK(t.calls == 2);
  CHECK(t.sent() == 2 * f32(count));
  CHECK(t.received() == 2 * f32(count));
}

TEST_CASE("MpiStaged::send and recv pair even ranks with odd ones", "[gpu][engine][mpi_staged][np2+]") {
  if (test::skip_below_ranks(2)) return;
  Fixture f;
  const int partner = f.me ^ 1;
  if (partner >= f.n) return;  // the last of an odd count has no partner; the others check
  std::vector<std::int32_t> v(300);
  std::iota(v.begin(), v.end(), 1000 * f.me);
  auto d = device(v);
  px::Buffer<std::int32_t, px::CudaSpace> got(v.size());
  if (f.me % 2 == 0) {
    f.eng.send(d.data(), v.size(), DataType::i32, partner);
    f.eng.recv(got.data(), v.size(), DataType::i32, partner);
  } else {
    f.eng.recv(got.data(), v.size(), DataType::i32, partner);
    f.eng.send(d.data(), v.size(), DataType::i32, partner);
  }
  std::vector<std::int32_t> want(v.size());
  std::iota(want.begin(), want.end(), 1000 * partner);
  CHECK(got.to_host() == want);
  CHECK(f.eng.stats().total().sent() == 4 * v.size());
}

// At one rank the sum is the input: a reducer that did nothing would pass.
TEST_CASE("RingAllReducer over MpiStaged sums device buffers with the ring", "[gpu][engine][mpi_staged][np2+]") {
  if (test::skip_below_ranks(2)) return;
  Fixture f;
  f.eng.set_chunk_bytes(256);
  px::RingOptions o;
  o.algorithm = px::engine::Algorithm::ring;
  o.segment_bytes = 512;
  o.adapt_to_oversubscription = false;
  px::RingAllReducer<Engine> reducer(f.eng, o);
  const std::size_t count = GENERATE(1u, 10u, 4097u);
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((f.me + 1) + static_cast<int>(i % 97));
  auto d = device(v);
  reducer.allreduce(d.data(), count);
  const auto out = d.to_host();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += out[i] != static_cast<float>(f.n * (f.n + 1) / 2 + f.n * static_cast<int>(i % 97));
  CHECK(wrong == 0);
  // The ring books its point-to-point messages exactly: 2(N-1)/N of the buffer.
  CHECK(f.eng.stats().total().sent() == f32(px::detail::ring::allreduce_sent(count, f.n, f.me)));
}

TEST_CASE("RingAllReduce under automatic takes MpiStaged's own all-reduce for device memory",
          "[gpu][engine][mpi_staged]") {
  Fixture f;
  px::RingOptions o;
  o.adapt_to_oversubscription = false;
  px::RingAllReducer<Engine> reducer(f.eng, o);
  CHECK(reducer.choose(64u << 20) == px::engine::Algorithm::native);
  o.algorithm = px::engine::Algorithm::ring;  // still there when asked for
  CHECK(px::RingAllReducer<Engine>(f.eng, o).choose(64u << 20) == px::engine::Algorithm::ring);
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

TEMPLATE_TEST_CASE("Trainer over MpiStaged in device memory equals the host trainer", "[gpu][engine][mpi_staged]",
                   px::arch::Hybrid, px::arch::AllReduce, px::arch::PS) {
  auto& ctx = test::world();
  const auto gpu = train_fixed<TestType, px::CudaSpace, Engine>(ctx);
  const auto host = train_fixed<TestType, px::HostSpace, px::engine::Mpi>(ctx);
  CHECK(gpu.first == host.first);
  CHECK(gpu.second == host.second);
  CHECK(test::all_ranks(gpu == host));
}
