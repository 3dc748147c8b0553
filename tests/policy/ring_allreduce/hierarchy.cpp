// The hierarchical all-reduce (policy/ring_allreduce/hierarchy.hpp and
// RingAllReducer): chosen from the host layout, the exact sum, identical bits
// on every rank and from run to run, the intra- and inter-host bytes the
// algorithm must move, fused tensors as one buffer, and a trainer equal to
// one process. Hosts are emulated (ContextOptions::ranks_per_host): at
// 4 ranks 4x1, 2x2, 3+1 (uneven: the flat ring) and 1x4.
#include "support.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>

using px::engine::Algorithm;

namespace {

/// Element i of rank r: exact in every type (integers), or not exact in
/// floating point, so that a different summation order shows in the bits.
template <class T>
T exact_value(int rank, std::size_t i) {
  return static_cast<T>((rank + 1) * 1000 + static_cast<long>(i % 997) * 3);
}
template <class T>
T inexact_value(int rank, std::size_t i) {
  return static_cast<T>(0.1 * (rank + 1) + 1e-3 * static_cast<double>(i % 1013) + 1.0 / (3 + rank));
}

/// Whether the layout of `t` has every host of one size.
bool uniform(const px::Topology& t) { return px::policy::ring::uniform_hosts(t); }

/// The traffic one all-reduce of `count` elements of `bytes` each must book
/// on this rank: hierarchical, the host ring's reduce-scatter and all-gather
/// inside the host and the ring of this rank's share between hosts; flat,
/// the ring's to rank i+1 and from rank i-1, intra or inter by their host.
px::Traffic expected_traffic(const px::Topology& t, bool hierarchical, std::size_t count, std::uint64_t bytes) {
  px::Traffic w;
  if (hierarchical) {
    const px::policy::ring::HostRings r(t);
    w.sent_intra = bytes * r.intra_sent(count);
    w.recv_intra = bytes * r.intra_received(count);
    w.sent_inter = bytes * r.inter_sent(count);
    w.recv_inter = bytes * r.inter_received(count);
    return w;
  }
  const int n = t.size(), me = t.rank();
  const std::uint64_t sent = bytes * px::detail::ring::allreduce_sent(count, n, me);
  const std::uint64_t received = bytes * px::detail::ring::allreduce_received(count, n, me);
  (t.same_host(px::detail::ring::mod(me + 1, n)) ? w.sent_intra : w.sent_inter) = sent;
  (t.same_host(px::detail::ring::mod(me - 1, n)) ? w.recv_intra : w.recv_inter) = received;
  return w;
}

/// One all-reduce of `count` elements of T over hosts of `per_host` ranks.
template <class T>
void check_sum(int per_host, Algorithm algo, std::size_t count) {
  px::Context& ctx = test::hosts_of(per_host);
  px::engine::Mpi mpi(ctx);
  const px::Topology& t = mpi.topology();
  const int n = mpi.size(), me = mpi.rank();
  px::RingOptions opt;
  opt.algorithm = algo;
  opt.native_below_bytes = 0;             // automatic: a ring for every size
  opt.segment_bytes = 256;                // many segments even for small buffers
  opt.adapt_to_oversubscription = false;  // ... on any host
  px::RingAllReducer<px::engine::Mpi> reducer(mpi, opt);

  const bool want_hier = uniform(t) && (algo == Algorithm::hierarchical ||
                                        (algo == Algorithm::automatic && t.num_hosts() > 1 && t.local_size() > 1));
  INFO(t.num_hosts() << " hosts of " << per_host << " ranks, " << px::engine::to_string(algo) << ", " << count
                     << " elements of " << px::to_string(px::data_type_of_v<T>));
  CHECK(reducer.hierarchical() == want_hier);
  if (n > 1)
    CHECK(reducer.choose(count * sizeof(T)) == (want_hier ? Algorithm::hierarchical : Algorithm::ring));

  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_value<T>(me, i);
  const px::Traffic before = mpi.stats().total();
  reducer.allreduce(v.data(), count);
  px::Traffic got = mpi.stats().total() - before;
  bool ok = true;
  for (std::size_t i = 0; i < count; ++i) {
    T want = 0;
    for (int r = 0; r < n; ++r) want += exact_value<T>(r, i);
    ok = ok && v[i] == want;
  }
  CHECK(ok);
  CHECK(test::same_bits_everywhere(v));

  px::Traffic want = n > 1 ? expected_traffic(t, want_hier, count, sizeof(T)) : px::Traffic{};
  got.calls = want.calls = 0;
  CHECK(got == want);
}

}  // namespace

TEST_CASE("RingAllReduce picks the hierarchical ring from the host layout", "[policy][ring][hierarchical]") {
  const int n = test::world().size();
  for (int per_host = 1; per_host <= n; ++per_host) {
    px::engine::Mpi mpi(test::hosts_of(per_host));
    const px::Topology& t = mpi.topology();
    const bool even = n % per_host == 0;
    CHECK(uniform(t) == even);
    px::RingOptions opt;
    opt.native_below_bytes = 0;
    opt.adapt_to_oversubscription = false;
    // Automatic: several hosts, each of the same number (> 1) of ranks.
    const bool several = t.num_hosts() > 1 && per_host > 1;
    CHECK(px::RingAllReducer<px::engine::Mpi>(mpi, opt).hierarchical() == (even && several));
    // Forced on: wherever the hosts are even; forced off: never.
    opt.algorithm = Algorithm::hierarchical;
    CHECK(px::RingAllReducer<px::engine::Mpi>(mpi, opt).hierarchical() == even);
    opt.algorithm = Algorithm::ring;
    const px::RingAllReducer<px::engine::Mpi> flat(mpi, opt);
    CHECK(!flat.hierarchical());
    CHECK(flat.choose(1 << 20) == Algorithm::ring);
    if (even) {
      const px::policy::ring::HostRings r(t);
      CHECK(r.host.size() == per_host);
      CHECK(r.across.size() == t.num_hosts());
      CHECK(r.host.peer(r.host.me) == t.rank());
      CHECK(r.across.peer(r.across.me) == t.rank());
      for (int p = 0; p < r.across.size(); ++p) CHECK(t.host_of(r.across.peer(p)) == p);
    }
  }
  // Automatic under a threshold: the engine's all-reduce; the world's hosts
  // (one machine, unless PARALLAX_RANKS_PER_HOST says otherwise) decide the ring.
  px::engine::Mpi mpi(test::world());
  const px::Topology& t = mpi.topology();
  CHECK(px::RingAllReducer<px::engine::Mpi>(mpi).choose(1) == Algorithm::native);
  CHECK(px::RingAllReducer<px::engine::Mpi>(mpi).hierarchical() ==
        (uniform(t) && t.num_hosts() > 1 && t.local_size() > 1));
}

TEMPLATE_TEST_CASE("the hierarchical all-reduce sums exactly and books the bytes it must move",
                   "[policy][ring][hierarchical]", float, double, std::int32_t, std::int64_t) {
  const int n = test::world().size();
  const int per_host = GENERATE(1, 2, 3, 4);
  if (per_host > n) return;
  const Algorithm algo = GENERATE(Algorithm::automatic, Algorithm::hierarchical, Algorithm::ring);
  // 0, 1, fewer elements than ranks, not divisible by the host size, several segments.
  const std::size_t count = GENERATE(std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{37},
                                     std::size_t{5003});
  check_sum<TestType>(per_host, algo, count);
}

TEST_CASE("the hierarchical all-reduce moves 2(L-1)/L of the buffer inside a host and 2(H-1)/H of 1/L between hosts",
          "[policy][ring][hierarchical]") {
  const int n = test::world().size();
  const int per_host = GENERATE(1, 2, 4);
  if (per_host > n || n % per_host != 0) return;
  px::engine::Mpi mpi(test::hosts_of(per_host));
  const std::uint64_t L = static_cast<std::uint64_t>(per_host), H = static_cast<std::uint64_t>(n / per_host);
  px::RingOptions opt;
  opt.algorithm = Algorithm::hierarchical;
  opt.segment_bytes = std::size_t{1} << 20;  // one segment per chunk: one call per step
  px::RingAllReducer<px::engine::Mpi> reducer(mpi, opt);
  const std::size_t count = 12 * 1024;  // divisible by every L and H at 1..4 ranks
  std::vector<float> v(count, 1.f);
  reducer.allreduce(v.data(), count);
  const std::uint64_t S = count * sizeof(float);
  const px::Traffic t = mpi.stats().total();
  CHECK(v[count - 1] == static_cast<float>(n));
  CHECK(t.sent_intra == 2 * (L - 1) * S / L);
  CHECK(t.recv_intra == 2 * (L - 1) * S / L);
  CHECK(t.sent_inter == 2 * (H - 1) * S / (H * L));
  CHECK(t.recv_inter == 2 * (H - 1) * S / (H * L));
  // 2(L-1) exchanges inside the host, 2(H-1) between hosts.
  CHECK(t.calls == 2 * (L - 1) + 2 * (H - 1));
}

TEST_CASE("the hierarchical all-reduce repeats bit for bit and gives fused tensors the bits of one buffer",
          "[policy][ring][hierarchical][fusion]") {
  const int n = test::world().size(), me = test::world().rank();
  const int per_host = GENERATE(1, 2, 4);
  if (per_host > n || n % per_host != 0) return;
  px::engine::Mpi mpi(test::hosts_of(per_host));
  px::RingOptions opt;
  opt.algorithm = Algorithm::hierarchical;
  opt.segment_bytes = 64;  // segments that straddle tensors
  opt.adapt_to_oversubscription = false;
  px::RingAllReducer<px::engine::Mpi> reducer(mpi, opt);
  opt.algorithm = Algorithm::ring;
  px::RingAllReducer<px::engine::Mpi> flat(mpi, opt);

  const std::vector<std::size_t> sizes{3, 0, 17, 1, 64, 5, 2000, 2};
  std::size_t count = 0;
  for (std::size_t s : sizes) count += s;
  std::vector<double> input(count);
  for (std::size_t i = 0; i < count; ++i) input[i] = inexact_value<double>(me, i);

  std::vector<double> once = input, twice = input, ring = input;
  reducer.allreduce(once.data(), count);
  reducer.allreduce(twice.data(), count);
  flat.allreduce(ring.data(), count);
  CHECK(std::memcmp(once.data(), twice.data(), count * sizeof(double)) == 0);
  CHECK(test::same_bits_everywhere(once));
  // The flat ring's sum up to reassociation, and the plain sum's.
  double worst = 0;
  for (std::size_t i = 0; i < count; ++i) {
    double want = 0;
    for (int r = 0; r < n; ++r) want += inexact_value<double>(r, i);
    worst = std::max({worst, std::abs(once[i] - ring[i]) / std::abs(want), std::abs(once[i] - want) / std::abs(want)});
  }
  CHECK(worst <= 1e-14);

  // Tensors laid end to end: the bits of the contiguous buffer, the same bytes.
  std::vector<std::vector<double>> tensors;
  std::vector<px::TensorRef> refs;
  std::size_t at = 0;
  for (std::size_t s : sizes) {
    tensors.emplace_back(input.begin() + static_cast<std::ptrdiff_t>(at),
                         input.begin() + static_cast<std::ptrdiff_t>(at + s));
    at += s;
  }
  for (auto& v : tensors) refs.push_back({v.data(), v.size(), px::DataType::f64});
  const px::Traffic before = mpi.stats().total();
  reducer.ring_allreduce(refs.data(), refs.size());
  const px::Traffic pieces = mpi.stats().total() - before;
  std::vector<double> joined;
  for (const auto& v : tensors) joined.insert(joined.end(), v.begin(), v.end());
  CHECK(std::memcmp(joined.data(), once.data(), count * sizeof(double)) == 0);
  px::Traffic want = n > 1 ? expected_traffic(mpi.topology(), true, count, sizeof(double)) : px::Traffic{};
  CHECK(pieces.sent_intra == want.sent_intra);
  CHECK(pieces.sent_inter == want.sent_inter);
  CHECK(pieces.recv_intra == want.recv_intra);
  CHECK(pieces.recv_inter == want.recv_inter);
}

// ---------------------------------------------------------------- trainer

namespace {

constexpr std::size_t kIn = 64, kOut = 40, kBatch = 12, kSteps = 3;

float feature(std::size_t s, std::size_t e, std::size_t d) {
  return std::sin(0.1f * static_cast<float>(e * 13 + s * 7 + d));
}
float target(std::size_t s, std::size_t e, std::size_t c) {
  return std::cos(0.2f * static_cast<float>(e + 3 * s + 5 * c));
}

struct Trained {
  std::vector<float> w, b;
  px::Traffic dense;  ///< w's and b's traffic over the steps
};

/// A linear layer (kIn x kOut, 10 KiB, and a bias) under RingAllReduce,
/// trained with squared error for kSteps steps on this rank's share of each
/// global batch of kBatch examples.
Trained train(px::Context& ctx, Algorithm algo, std::size_t steps = kSteps) {
  px::Variable<px::Dense, float> w(ctx, "w", {kIn, kOut}, px::init::Glorot{3});
  px::Variable<px::Dense, float> b(ctx, "b", {kOut}, px::init::Constant{0.1});
  px::TrainerOptions o;
  o.ring.algorithm = algo;
  o.ring.segment_bytes = 1024;
  px::Trainer<px::arch::AllReduce, px::optim::Momentum> trainer(ctx, o, px::optim::Momentum{0.05f, 0.9f}, w, b);
  CHECK(trainer.policy_of(w) == "RingAllReduce");
  const px::Traffic before = trainer.stats().variable("w");
  const px::Traffic before_b = trainer.stats().variable("b");

  const std::size_t n = static_cast<std::size_t>(ctx.size()), local = kBatch / n;
  const std::size_t first = static_cast<std::size_t>(ctx.rank()) * local;
  for (std::size_t s = 0; s < steps; ++s) {
    const auto W = w.value().to_host(), B = b.value().to_host();
    auto& dW = w.grad();
    auto& dB = b.grad();
    for (std::size_t e = first; e < first + local; ++e)
      for (std::size_t c = 0; c < kOut; ++c) {
        float out = B[c];
        for (std::size_t d = 0; d < kIn; ++d) out += feature(s, e, d) * W[d * kOut + c];
        const float g = (out - target(s, e, c)) / static_cast<float>(local);  // mean over the local batch
        dB[c] += g;
        for (std::size_t d = 0; d < kIn; ++d) dW[d * kOut + c] += feature(s, e, d) * g;
      }
    trainer.step();
  }
  Trained t{trainer.fetch(w), trainer.fetch(b), trainer.stats().variable("w") - before};
  t.dense += trainer.stats().variable("b") - before_b;
  return t;
}

/// max |got - want| / max |want|: normwise, since a weight near zero has
/// float rounding of the sums' size, however they associate.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, size = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    size = std::max(size, std::abs(double(want[i])));
  }
  return diff / size;
}

}  // namespace

TEST_CASE("a trainer with the hierarchical all-reduce trains the model of one process",
          "[policy][ring][hierarchical][trainer]") {
  px::Context single(MPI_COMM_SELF);  // one process, the whole global batch
  const Trained want = train(single, Algorithm::ring);
  px::Context& hosts = test::hosts_of(2);
  const Trained got = train(hosts, Algorithm::hierarchical);
  const Trained again = train(hosts, Algorithm::hierarchical);
  const Trained flat = train(hosts, Algorithm::ring);
  INFO(hosts.topology().num_hosts() << " hosts of up to 2 ranks");
  CHECK(relative_error(got.w, want.w) <= 1e-5);
  CHECK(relative_error(got.b, want.b) <= 1e-5);
  CHECK(relative_error(got.w, flat.w) <= 1e-5);
  // The model moved: the checks above are not comparing initial values.
  CHECK(relative_error(got.w, train(single, Algorithm::ring, 0).w) > 1e-3);
  // Bit for bit from run to run.
  CHECK(again.w == got.w);
  CHECK(again.b == got.b);
  // The step's bucket (w and b end to end) went round the hierarchical
  // rings: their bytes, summed over w and b, at every step.
  const px::Topology& t = hosts.topology();
  const bool hier = uniform(t);
  px::Traffic per_step = t.size() > 1 ? expected_traffic(t, hier, kIn * kOut + kOut, sizeof(float)) : px::Traffic{};
  CHECK(got.dense.sent_intra == kSteps * per_step.sent_intra);
  CHECK(got.dense.sent_inter == kSteps * per_step.sent_inter);
  CHECK(got.dense.recv_intra == kSteps * per_step.recv_intra);
  CHECK(got.dense.recv_inter == kSteps * per_step.recv_inter);
}
