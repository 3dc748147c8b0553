// Collectives of issue 2: parallax's RingAllReduce (as users get it, with the
// flat ring forced, with the hierarchical ring forced (issue 40: hosts of
// several ranks, e.g. PARALLAX_RANKS_PER_HOST=2 or scripts/cluster.sh), and
// with the engine's all-reduce forced), tensor fusion, and
// the sparse AllGatherv, each beside the plain MPI call it competes with, in
// the same run so every figure is a ratio. Sizes 4 KiB to 64 MiB in x4 steps.
//
//   mpiexec -n 2 build/bench/bench_collectives --benchmark_format=json
//
// Inputs are small integers distinct per rank and element, so every sum is
// exact in float and has a closed form; each benchmark checks its result after
// the timed loop and reports the mismatches as `wrong` (must be 0).
#include "common/harness.hpp"

#include <parallax/engine/mpi.hpp>
#include <parallax/policy/allgatherv/gatherer.hpp>
#include <parallax/policy/ring_allreduce/fusion.hpp>
#include <parallax/space.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace px = parallax;
namespace pb = parallax::bench;

namespace {

using Engine = px::engine::Mpi;

/// Message sizes in bytes: 4 KiB, 16 KiB, ..., 64 MiB.
std::vector<std::size_t> sizes() {
  std::vector<std::size_t> out;
  for (std::size_t b = std::size_t{4} << 10; b <= std::size_t{64} << 20; b *= 4) out.push_back(b);
  return out;
}

// ---------------------------------------------------------------- all-reduce

/// Element i of rank r's input: a small integer, so sums stay exact.
inline float input(int rank, std::size_t i) { return static_cast<float>((rank + 1) + static_cast<int>(i % 97)); }
/// Element i of the sum over n ranks.
inline float expected_sum(int n, std::size_t i) {
  return static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 97));
}

/// The all-reduce input of this rank, and a pristine copy to restore it from
/// before every call (the reduction is in place).
struct AllReduceData {
  px::Buffer<float> data, pristine;
  float* at;  ///< where the input lives: data, or a slice of a caller's arena
  AllReduceData(int rank, std::size_t count) : data(count), pristine(count), at(data.data()) {
    for (std::size_t i = 0; i < count; ++i) pristine[i] = input(rank, i);
    restore();
  }
  void restore() { std::memcpy(at, pristine.data(), pristine.bytes()); }
  std::uint64_t wrong(int n, float shift = 0) const {
    std::uint64_t bad = 0;
    for (std::size_t i = 0; i < pristine.size(); ++i) bad += at[i] != expected_sum(n, i) + shift;
    return bad;
  }
};

void ring_allreduce(benchmark::State& st, pb::Session& s, std::size_t bytes, px::RingOptions options) {
  Engine engine(s.context());
  px::RingAllReducer<Engine> reducer(engine, options);
  const int n = s.size();
  const std::size_t count = bytes / sizeof(float);
  AllReduceData in(s.rank(), count);

  const px::Traffic before = engine.stats().total();
  std::uint64_t calls = 0;
  pb::timed_loop(
      st, engine.comm(), s.warmup(bytes), [&] { in.restore(); },
      [&] {
        reducer.allreduce(in.data.data(), count);
        ++calls;
      });
  const px::Traffic during = engine.stats().total() - before;

  in.restore();
  reducer.allreduce(in.data.data(), count);
  pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
  pb::set_wrong(st, in.wrong(n), engine.comm());
  // Warm-up calls are booked too, and `calls` counts them (the check above is in neither).
  pb::set_bytes_sent(st, during.sent(), calls, engine.comm());
  // The bytes that cross between hosts, per call, on the rank that sends most.
  double inter = calls ? static_cast<double>(during.sent_inter) / static_cast<double>(calls) : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &inter, 1, MPI_DOUBLE, MPI_MAX, engine.comm());
  st.counters["bytes_inter"] = benchmark::Counter(inter, benchmark::Counter::kDefaults, benchmark::Counter::OneK::kIs1024);
  st.SetLabel(px::engine::to_string(reducer.choose(bytes)));
}

void mpi_allreduce(benchmark::State& st, pb::Session& s, std::size_t bytes) {
  const int n = s.size();
  const std::size_t count = bytes / sizeof(float);
  AllReduceData in(s.rank(), count);
  auto call = [&] {
    MPI_Allreduce(MPI_IN_PLACE, in.data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  pb::timed_loop(st, MPI_COMM_WORLD, s.warmup(bytes), [&] { in.restore(); }, call);
  in.restore();
  call();
  pb::set_bandwidth(st, static_cast<double>(bytes), pb::bus_factor::allreduce(n), n);
  pb::set_wrong(st, in.wrong(n), MPI_COMM_WORLD);
}

// ---------------------------------------------------------------- fusion

/// `tensors` gradients of `tensor_bytes` each through FusedAllReducer with
/// default RingOptions: what a trainer does with many small dense variables.
/// Each tensor is its own allocation, or, with `arena`, all are slices of one
/// allocation laid end to end (the ring then sees one buffer and packs nothing).
void fused_allreduce(benchmark::State& st, pb::Session& s, std::size_t tensors, std::size_t tensor_bytes,
                     bool arena) {
  Engine engine(s.context());
  px::RingAllReducer<Engine> reducer(engine);
  const int n = s.size(), me = s.rank();
  const std::size_t count = tensor_bytes / sizeof(float);
  std::vector<AllReduceData> data;
  std::vector<px::TensorRef> refs;
  data.reserve(tensors);
  px::Buffer<float> one(arena ? tensors * count : 0);
  for (std::size_t t = 0; t < tensors; ++t) {
    data.emplace_back(me + static_cast<int>(t % 7), count);  // tensors differ too
    if (arena) data.back().data = px::Buffer<float>();      // lives in `one` instead
    float* at = arena ? one.data() + t * count : data.back().data.data();
    data.back().at = at;
    refs.push_back({at, count, px::DataType::f32});
  }
  px::FusedAllReducer<Engine> fused(reducer, refs);
  auto restore = [&] {
    for (auto& d : data) d.restore();
  };

  const px::Traffic before = engine.stats().total();
  std::uint64_t calls = 0;
  pb::timed_loop(st, engine.comm(), s.warmup(tensors * tensor_bytes), restore, [&] {
    fused.run();
    ++calls;
  });
  const px::Traffic during = engine.stats().total() - before;

  restore();
  fused.run();
  std::uint64_t wrong = 0;
  for (std::size_t t = 0; t < tensors; ++t) {
    // Rank r's tensor t holds input(r + t % 7, i): the sum over ranks is
    // expected_sum shifted by n * (t % 7).
    wrong += data[t].wrong(n, static_cast<float>(n * static_cast<int>(t % 7)));
  }
  pb::set_bandwidth(st, static_cast<double>(tensors * tensor_bytes), pb::bus_factor::allreduce(n), n);
  pb::set_wrong(st, wrong, engine.comm());
  pb::set_bytes_sent(st, during.sent(), calls, engine.comm());
  st.counters["buckets"] = static_cast<double>(fused.buckets().size());
  st.SetLabel(px::engine::to_string(reducer.choose(tensors * tensor_bytes)));
}

// ---------------------------------------------------------------- all-gather

/// Sparse rows: 64 floats each, plus an int64 id on the wire.
constexpr std::size_t kCols = 64;
constexpr std::size_t kRowBytes = sizeof(px::index_t) + kCols * sizeof(float);

/// Rows a rank contributes for a per-rank payload of `bytes` (whole rows, at
/// least one): the payload on the wire is rows * kRowBytes <= bytes.
std::size_t rows_for(std::size_t bytes) { return std::max<std::size_t>(1, bytes / kRowBytes); }

/// Row i of rank r has id i*n + r: distinct across ranks (no duplicates to
/// sum), interleaved so the gathered ids are 0..n*k-1 once each.
inline px::index_t row_id(int n, int rank, std::size_t i) {
  return static_cast<px::index_t>(i) * n + rank;
}
inline float row_value(int rank, std::size_t i, std::size_t c) {
  return static_cast<float>((rank + 1) + static_cast<int>((i + c) % 97));
}

/// This rank's rows in the layout SparseAllGatherer puts on the wire: k ids,
/// then k*kCols values.
struct SparseRows {
  std::size_t k;
  px::Buffer<px::index_t> ids;
  px::Buffer<float> values;
  SparseRows(int n, int rank, std::size_t rows) : k(rows), ids(rows), values(rows * kCols) {
    for (std::size_t i = 0; i < k; ++i) {
      ids[i] = row_id(n, rank, i);
      for (std::size_t c = 0; c < kCols; ++c) values[i * kCols + c] = row_value(rank, i, c);
    }
  }
  /// The wire payload: ids then values.
  std::vector<std::byte> packed() const {
    std::vector<std::byte> out(k * kRowBytes);
    std::memcpy(out.data(), ids.data(), ids.bytes());
    std::memcpy(out.data() + ids.bytes(), values.data(), values.bytes());
    return out;
  }
};

void sparse_allgatherv(benchmark::State& st, pb::Session& s, std::size_t bytes) {
  Engine engine(s.context());
  const int n = s.size(), me = s.rank();
  const std::size_t k = rows_for(bytes);
  SparseRows rows(n, me, k);
  px::SparseAllGatherer<float, Engine> gatherer(engine, kCols);
  px::Buffer<px::index_t> out_ids;
  px::Buffer<float> out_values;

  const px::Traffic before = engine.stats().total();
  std::uint64_t calls = 0;
  std::size_t m = 0;
  auto call = [&] {
    m = gatherer.gather(rows.ids.data(), rows.values.data(), k, out_ids, out_values);
    ++calls;
  };
  pb::timed_loop(st, engine.comm(), s.warmup(bytes), [] {}, call);
  const px::Traffic during = engine.stats().total() - before;
  const std::uint64_t timed_calls = calls;

  out_ids.zero();
  out_values.zero();
  call();
  std::uint64_t wrong = m == k * n ? 0 : 1 + k * n;
  for (std::size_t j = 0; wrong == 0 && j < m; ++j) {
    const int r = static_cast<int>(j % n);
    const std::size_t i = j / n;
    wrong += out_ids[j] != static_cast<px::index_t>(j);
    for (std::size_t c = 0; c < kCols; ++c) wrong += out_values[j * kCols + c] != row_value(r, i, c);
  }
  const double payload = static_cast<double>(k * kRowBytes);
  pb::set_bandwidth(st, payload * n, pb::bus_factor::allgather(n), n);
  pb::set_wrong(st, wrong, engine.comm());
  pb::set_bytes_sent(st, during.sent(), timed_calls, engine.comm());
  st.counters["rows"] = static_cast<double>(k);
}

void mpi_allgatherv(benchmark::State& st, pb::Session& s, std::size_t bytes) {
  const int n = s.size(), me = s.rank();
  const std::size_t k = rows_for(bytes), payload = k * kRowBytes;
  const std::vector<std::byte> send = SparseRows(n, me, k).packed();
  px::Buffer<std::byte> recv(payload * n);
  std::vector<int> counts(n, static_cast<int>(payload)), displs(n);
  for (int r = 0; r < n; ++r) displs[r] = static_cast<int>(payload * r);
  auto call = [&] {
    MPI_Allgatherv(send.data(), static_cast<int>(payload), MPI_BYTE, recv.data(), counts.data(), displs.data(),
                   MPI_BYTE, MPI_COMM_WORLD);
  };
  pb::timed_loop(st, MPI_COMM_WORLD, s.warmup(bytes), [] {}, call);

  recv.zero();
  call();
  std::uint64_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    const std::vector<std::byte> want = SparseRows(n, r, k).packed();
    const std::byte* got = recv.data() + displs[r];
    for (std::size_t b = 0; b < payload; ++b) wrong += got[b] != want[b];
  }
  pb::set_bandwidth(st, static_cast<double>(payload) * n, pb::bus_factor::allgather(n), n);
  pb::set_wrong(st, wrong, MPI_COMM_WORLD);
  st.counters["rows"] = static_cast<double>(k);
}

}  // namespace

int main(int argc, char** argv) {
  pb::Session session(argc, argv);
  pb::Session& s = session;
  using px::engine::Algorithm;
  auto with = [](Algorithm a) {
    px::RingOptions o;
    o.algorithm = a;
    return o;
  };

  for (const std::size_t b : sizes()) {
    const std::string sz = std::to_string(b);
    s.add("RingAllReduce/" + sz, b, [&s, b](benchmark::State& st) { ring_allreduce(st, s, b, px::RingOptions{}); });
    s.add("RingAllReduce/ring/" + sz, b,
          [&s, b, o = with(Algorithm::ring)](benchmark::State& st) { ring_allreduce(st, s, b, o); });
    s.add("RingAllReduce/hierarchical/" + sz, b,
          [&s, b, o = with(Algorithm::hierarchical)](benchmark::State& st) { ring_allreduce(st, s, b, o); });
    s.add("RingAllReduce/native/" + sz, b,
          [&s, b, o = with(Algorithm::native)](benchmark::State& st) { ring_allreduce(st, s, b, o); });
    s.add("MPI_Allreduce/" + sz, b, [&s, b](benchmark::State& st) { mpi_allreduce(st, s, b); });
  }
  constexpr std::size_t kTensors = 256, kTensorBytes = std::size_t{16} << 10;
  s.add("FusedRingAllReduce/256x16KiB", kTensors * kTensorBytes,
        [&s](benchmark::State& st) { fused_allreduce(st, s, kTensors, kTensorBytes, false); });
  s.add("FusedRingAllReduce/256x16KiB/arena", kTensors * kTensorBytes,
        [&s](benchmark::State& st) { fused_allreduce(st, s, kTensors, kTensorBytes, true); });
  for (const std::size_t b : sizes()) {
    const std::string sz = std::to_string(b);
    s.add("AllGatherv/" + sz, b, [&s, b](benchmark::State& st) { sparse_allgatherv(st, s, b); });
    s.add("MPI_Allgatherv/" + sz, b, [&s, b](benchmark::State& st) { mpi_allgatherv(st, s, b); });
  }
  return session.run();
}
