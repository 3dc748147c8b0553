// GPU benchmarks (issue 4), CUDA builds only:
//
//   * kernels, one rank: the CUB sparse coalesce (1M rows x 64 floats, 10%
//     duplicate ids) and the lookup gather (1M rows x 64 floats out of a
//     2M-row table), each as GB/s and as a fraction of the device-to-device
//     cudaMemcpy bandwidth measured in the same binary;
//   * all-reduce of a device buffer: RingAllReduce over engine::MpiStaged
//     against the plain baseline (copy to pinned memory, MPI_Allreduce, copy
//     back), and engine::Nccl's all-reduce where each rank has its own GPU.
//
//   mpiexec -n 2 build/cuda/bench/bench_gpu --benchmark_format=json
//
// Bandwidth of a kernel counts the bytes it must read and write at least
// (what a perfect kernel would move), so `of_memcpy` is the fraction of the
// copy engine's bandwidth it reaches; memcpy itself counts read + write.
// Every benchmark checks its result after the timed loop (`wrong`, must be 0).
#include "common/harness.hpp"

#include <parallax/parallax.hpp>

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;

namespace {

using Dev = px::CudaSpace;
constexpr std::size_t kCols = 64;
constexpr std::size_t kRows = 1'000'000;  // gradient rows (coalesce) and looked-up rows (gather)
constexpr double kDuplicates = 0.10;

/// Device-to-device cudaMemcpy bandwidth in bytes/s (read + write), the
/// best of a few timed copies of `bytes`.
double memcpy_bandwidth(std::size_t bytes) {
  px::Buffer<std::byte, Dev> a(bytes), b(bytes);
  a.zero();
  cudaEvent_t start = nullptr, stop = nullptr;  // timing events (CudaEvent disables timing)
  PARALLAX_CUDA_CHECK(cudaEventCreate(&start));
  PARALLAX_CUDA_CHECK(cudaEventCreate(&stop));
  cudaStream_t s = nullptr;
  PARALLAX_CUDA_CHECK(cudaStreamCreate(&s));
  float best_ms = 1e30f;
  for (int i = 0; i < 12; ++i) {
    PARALLAX_CUDA_CHECK(cudaEventRecord(start, s));
    PARALLAX_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
    PARALLAX_CUDA_CHECK(cudaEventRecord(stop, s));
    PARALLAX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    PARALLAX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (i >= 2) best_ms = std::min(best_ms, ms);  // two warm-up copies
  }
  PARALLAX_CUDA_CHECK(cudaStreamDestroy(s));
  PARALLAX_CUDA_CHECK(cudaEventDestroy(start));
  PARALLAX_CUDA_CHECK(cudaEventDestroy(stop));
  return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3);
}

/// Sets `GB/s` and `of_memcpy` for a kernel that moves `bytes` per call.
void set_kernel_bandwidth(benchmark::State& st, double bytes, double memcpy_bw) {
  using C = benchmark::Counter;
  st.counters["bytes_per_call"] = C(bytes);
  st.counters["GB/s"] = C(bytes / 1e9, C::kIsIterationInvariantRate);
  if (memcpy_bw > 0) {
    // A rate counter divides by the time; of_memcpy is the rate / memcpy_bw.
    st.counters["of_memcpy"] = C(bytes / memcpy_bw, C::kIsIterationInvariantRate);
  }
}

/// 1M ids, 90% drawn from a large table and 10% repeats of earlier ones.
std::vector<px::index_t> gradient_ids(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<px::index_t> any(0, static_cast<px::index_t>(10 * n));
  std::bernoulli_distribution repeat(kDuplicates);
  std::vector<px::index_t> ids;
  ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0 && repeat(rng)) ids.push_back(ids[std::uniform_int_distribution<std::size_t>(0, i - 1)(rng)]);
    else ids.push_back(any(rng));
  }
  return ids;
}

/// Small integers, so sums are exact and the check is exact.
std::vector<float> row_values(std::size_t n, std::size_t cols) {
  std::vector<float> v(n * cols);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 13) - 6);
  return v;
}

void register_kernels(pb::Session& session, double memcpy_bw) {
  const MPI_Comm comm = session.context().comm();

  // Coalesce: sort 1M (id, position) pairs, sum the duplicate rows.
  {
    const std::size_t payload = kRows * (sizeof(px::index_t) + 2 * kCols * sizeof(float));
    session.add("coalesce/cub/1M_rows_x64/dup10", payload, [=, &session](benchmark::State& st) {
      px::Exec<Dev> ex = px::Exec<Dev>::create();
      const auto host_ids = gradient_ids(kRows, 7);
      const auto host_values = row_values(kRows, kCols);
      auto ids = px::Buffer<px::index_t, Dev>::from_host(host_ids);
      auto values = px::Buffer<float, Dev>::from_host(host_values);
      px::Buffer<px::index_t, Dev> out_ids;
      px::Buffer<float, Dev> out_values;
      px::detail::CoalesceScratch<Dev> scratch;
      std::size_t m = 0;
      auto step = [&] {
        m = px::detail::coalesce_rows(ex, ids.data(), values.data(), kRows, kCols, out_ids, out_values, scratch);
        ex.synchronize();
      };
      pb::timed_loop(st, comm, session.warmup(payload), [] {}, step);
      // The bytes a perfect kernel moves: ids in, every row in, unique rows out.
      set_kernel_bandwidth(st, static_cast<double>(kRows * sizeof(px::index_t) + (kRows + m) * kCols * sizeof(float)),
                           memcpy_bw);
      st.counters["unique_rows"] = benchmark::Counter(static_cast<double>(m));
      // Check against the host path.
      px::Exec<px::HostSpace> hex;
      px::Buffer<px::index_t> hids = px::Buffer<px::index_t>::from_host(host_ids), hout_ids;
      px::Buffer<float> hvalues = px::Buffer<float>::from_host(host_values), hout_values;
      px::detail::CoalesceScratch<px::HostSpace> hscratch;
      const std::size_t hm =
          px::detail::coalesce_rows(hex, hids.data(), hvalues.data(), kRows, kCols, hout_ids, hout_values, hscratch);
      std::uint64_t wrong = hm == m ? 0 : 1;
      if (hm == m) {
        const auto gi = out_ids.to_host();
        const auto gv = out_values.to_host();
        for (std::size_t i = 0; i < m; ++i) wrong += gi[i] != hout_ids[i];
        for (std::size_t i = 0; i < m * kCols; ++i) wrong += gv[i] != hout_values[i];
      }
      pb::set_wrong(st, wrong, comm);
    });
  }

  // Lookup gather: 1M rows of 64 floats out of a 2M-row table, by random ids.
  {
    const std::size_t table_rows = 2 * kRows;
    const std::size_t payload = kRows * (sizeof(px::index_t) + 2 * kCols * sizeof(float));
    session.add("lookup_gather/1M_rows_x64/table_2M", payload, [=, &session](benchmark::State& st) {
      px::Exec<Dev> ex = px::Exec<Dev>::create();
      std::vector<float> host_table(table_rows * kCols);
      for (std::size_t i = 0; i < host_table.size(); ++i) host_table[i] = static_cast<float>(i % 1000003);
      std::mt19937_64 rng(11);
      std::uniform_int_distribution<px::index_t> any(0, static_cast<px::index_t>(table_rows) - 1);
      std::vector<px::index_t> host_ids(kRows);
      for (auto& id : host_ids) id = any(rng);
      auto table = px::Buffer<float, Dev>::from_host(host_table);
      auto ids = px::Buffer<px::index_t, Dev>::from_host(host_ids);
      px::Buffer<float, Dev> out(kRows * kCols);
      auto step = [&] {
        px::for_each_rows(ex, kRows, kCols, px::detail::GatherRows<float>{table.data(), ids.data(), out.data(), kCols});
        ex.synchronize();
      };
      pb::timed_loop(st, comm, session.warmup(payload), [] {}, step);
      set_kernel_bandwidth(st, static_cast<double>(payload), memcpy_bw);
      const auto got = out.to_host();
      std::uint64_t wrong = 0;
      for (std::size_t i = 0; i < kRows; ++i)
        for (std::size_t c = 0; c < kCols; ++c)
          wrong += got[i * kCols + c] != host_table[static_cast<std::size_t>(host_ids[i]) * kCols + c];
      pb::set_wrong(st, wrong, comm);
    });
  }

  // Row update: Adagrad on 1M distinct rows of 64 floats of a 2M-row table
  // (the sparse update a parameter server applies to its shard).
  {
    const std::size_t table_rows = 2 * kRows;
    // Ids and gradient rows read; weights and accumulators read and written.
    const std::size_t payload = kRows * (sizeof(px::index_t) + 5 * kCols * sizeof(float));
    session.add("row_update/adagrad/1M_rows_x64/table_2M", payload, [=, &session](benchmark::State& st) {
      px::Exec<Dev> ex = px::Exec<Dev>::create();
      std::vector<px::index_t> host_rows(table_rows);
      for (std::size_t i = 0; i < table_rows; ++i) host_rows[i] = static_cast<px::index_t>(i);
      std::shuffle(host_rows.begin(), host_rows.end(), std::mt19937_64(13));
      host_rows.resize(kRows);
      std::vector<float> host_w(table_rows * kCols), host_a(table_rows * kCols, 0.1f);
      for (std::size_t i = 0; i < host_w.size(); ++i) host_w[i] = static_cast<float>(i % 1009) * 1e-3f;
      const auto host_g = row_values(kRows, kCols);
      auto rows = px::Buffer<px::index_t, Dev>::from_host(host_rows);
      auto w = px::Buffer<float, Dev>::from_host(host_w);
      auto a = px::Buffer<float, Dev>::from_host(host_a);
      auto g = px::Buffer<float, Dev>::from_host(host_g);
      const px::optim::Adagrad opt{};
      auto update = [&](auto& exec, float* wp, float* ap, const px::index_t* rp, const float* gp) {
        px::optim::detail::row_update(exec, opt, 0, wp, rp, gp, kRows, kCols, ap, static_cast<float*>(nullptr), 1.0f);
      };
      auto step = [&] {
        update(ex, w.data(), a.data(), rows.data(), g.data());
        ex.synchronize();
      };
      pb::timed_loop(st, comm, session.warmup(payload), [] {}, step);
      set_kernel_bandwidth(st, static_cast<double>(payload), memcpy_bw);
      // Check one update from the same start against the host kernel's
      // (relative 1e-5: nvcc contracts the rule into fused multiply-adds).
      w.assign_from_host(host_w.data(), host_w.size());
      a.assign_from_host(host_a.data(), host_a.size());
      update(ex, w.data(), a.data(), rows.data(), g.data());
      ex.synchronize();
      px::Exec<px::HostSpace> hex;
      update(hex, host_w.data(), host_a.data(), host_rows.data(), host_g.data());
      const auto got_w = w.to_host();
      const auto got_a = a.to_host();
      std::uint64_t wrong = 0;
      auto far = [](float x, float y) { return std::fabs(x - y) > 1e-5f * std::max(1.0f, std::fabs(y)); };
      for (std::size_t i = 0; i < host_w.size(); ++i) wrong += far(got_w[i], host_w[i]) || far(got_a[i], host_a[i]);
      pb::set_wrong(st, wrong, comm);
    });
  }

  // The reference: a device-to-device copy of the same order of bytes.
  {
    const std::size_t bytes = kRows * kCols * sizeof(float);
    session.add("memcpy_d2d/256MB", bytes, [=, &session](benchmark::State& st) {
      px::Exec<Dev> ex = px::Exec<Dev>::create();
      px::Buffer<std::byte, Dev> a(bytes), b(bytes);
      a.zero();
      auto step = [&] {
        ex.copy(b.data(), a.data(), bytes);
        ex.synchronize();
      };
      pb::timed_loop(st, comm, session.warmup(bytes), [] {}, step);
      set_kernel_bandwidth(st, 2.0 * static_cast<double>(bytes), memcpy_bw);
      pb::set_wrong(st, 0, comm);
    });
  }
}

/// Element i of rank r's all-reduce input, and of the sum over n ranks.
inline float input(int rank, std::size_t i) { return static_cast<float>((rank + 1) + static_cast<int>(i % 97)); }
inline float expected_sum(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 97));
}

/// A device buffer holding this rank's input, restored before every call
/// (the reductions are in place), and the result check.
struct DeviceInput {
  px::Buffer<float, Dev> data, pristine;
  DeviceInput(int rank, std::size_t count) : data(count) {
    std::vector<float> h(count);
    for (std::size_t i = 0; i < count; ++i) h[i] = input(rank, i);
    pristine = px::Buffer<float, Dev>::from_host(h);
  }
  void restore() { px::space_traits<Dev>::copy(data.data(), pristine.data(), pristine.bytes()); }
  std::uint64_t wrong(int n) const {
    const auto h = data.to_host();
    std::uint64_t w = 0;
    for (std::size_t i = 0; i < h.size(); ++i) w += h[i] != expected_sum(n, i);
    return w;
  }
};

std::vector<std::size_t> allreduce_sizes() { return {std::size_t{1} << 20, std::size_t{16} << 20, std::size_t{64} << 20}; }

std::string mib(std::size_t bytes) { return std::to_string(bytes >> 20) + "MiB"; }

void register_allreduce(pb::Session& session, px::engine::MpiStaged& staged, px::engine::Nccl* nccl) {
  const MPI_Comm comm = session.context().comm();
  const int n = session.size(), me = session.rank();
  for (const std::size_t bytes : allreduce_sizes()) {
    const std::size_t count = bytes / sizeof(float);

    session.add("allreduce/ring_mpi_staged/" + mib(bytes), bytes, [=, &session, &staged](benchmark::State& st) {
      px::RingOptions ring;  // the ring itself (automatic picks native over MpiStaged)
      ring.algorithm = px::engine::Algorithm::ring;
      px::RingAllReducer<px::engine::MpiStaged> reducer(staged, ring);
      DeviceInput in(me, count);
      pb::timed_loop(st, comm, session.warmup(bytes), [&] { in.restore(); }, [&] { reducer.allreduce(in.data.data(), count); });
      pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
      st.counters["algorithm"] = benchmark::Counter(reducer.choose(bytes) == px::engine::Algorithm::ring ? 1 : 0);
      in.restore();
      reducer.allreduce(in.data.data(), count);
      pb::set_wrong(st, n > 1 ? in.wrong(n) : 0, comm);
    });

    session.add("allreduce/mpi_staged_native/" + mib(bytes), bytes, [=, &session, &staged](benchmark::State& st) {
      DeviceInput in(me, count);
      auto step = [&] { staged.allreduce(in.data.data(), in.data.data(), count, px::DataType::f32, px::ReduceOp::sum); };
      pb::timed_loop(st, comm, session.warmup(bytes), [&] { in.restore(); }, step);
      pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
      in.restore();
      step();
      pb::set_wrong(st, in.wrong(n), comm);
    });

    // Baseline: what a program without parallax does.
    session.add("allreduce/baseline_copy_mpi_copy/" + mib(bytes), bytes, [=, &session](benchmark::State& st) {
      DeviceInput in(me, count);
      px::detail::PinnedBuffer pinned;
      float* h = reinterpret_cast<float*>(pinned.reserve(bytes));
      auto step = [&] {
        PARALLAX_CUDA_CHECK(cudaMemcpy(h, in.data.data(), bytes, cudaMemcpyDeviceToHost));
        MPI_Allreduce(MPI_IN_PLACE, h, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm);
        PARALLAX_CUDA_CHECK(cudaMemcpy(in.data.data(), h, bytes, cudaMemcpyHostToDevice));
      };
      pb::timed_loop(st, comm, session.warmup(bytes), [&] { in.restore(); }, step);
      pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
      in.restore();
      step();
      pb::set_wrong(st, in.wrong(n), comm);
    });

    if (nccl != nullptr) {
      session.add("allreduce/nccl/" + mib(bytes), bytes, [=, &session](benchmark::State& st) {
        DeviceInput in(me, count);
        auto step = [&] { nccl->allreduce(in.data.data(), in.data.data(), count, px::DataType::f32, px::ReduceOp::sum); };
        pb::timed_loop(st, comm, session.warmup(bytes), [&] { in.restore(); }, step);
        pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
        in.restore();
        step();
        pb::set_wrong(st, in.wrong(n), comm);
      });
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  pb::Session session(argc, argv);
  auto& ctx = session.context();
  // Engines are built once (collective) and shared by the benchmarks.
  px::engine::MpiStaged staged(ctx);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  const px::LocalRank local = px::local_rank_on_host(ctx.comm());
  int one_gpu_each = local.size <= devices ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &one_gpu_each, 1, MPI_INT, MPI_MIN, ctx.comm());
  std::unique_ptr<px::engine::Nccl> nccl;
  if (one_gpu_each) nccl = std::make_unique<px::engine::Nccl>(ctx);

  benchmark::AddCustomContext("gpu", px::device_name(staged.device()));
  benchmark::AddCustomContext("nccl", one_gpu_each ? "yes" : "no (ranks share a GPU)");
  double memcpy_bw = 0;
  if (session.size() == 1) {
    // Kernel benchmarks use the whole GPU: one rank only.
    memcpy_bw = memcpy_bandwidth(kRows * kCols * sizeof(float));
    benchmark::AddCustomContext("memcpy_d2d_GBps", std::to_string(memcpy_bw / 1e9));
    register_kernels(session, memcpy_bw);
  }
  register_allreduce(session, staged, nccl.get());
  const int status = session.run();
  nccl.reset();
  return status;
}
