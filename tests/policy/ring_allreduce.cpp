// RingAllReduce: the ring and the native path give the exact sum for every
// size class, identical bits on every rank, and the bytes of DESIGN.md §4;
// tensor fusion plans buckets as documented and changes no result.
#include "support.hpp"

#include <cstring>

using px::engine::Algorithm;

namespace {

// Integer-valued data, distinct per rank and element, exact in any type.
template <class T>
std::vector<T> pattern(int rank, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<T>((rank + 1) * 3 + static_cast<long>(i % 1000) * 7);
  return v;
}
template <class T>
T expected(int n, std::size_t i) {
  return static_cast<T>(3 * n * (n + 1) / 2 + n * static_cast<long>(i % 1000) * 7);
}

/// Every rank holds the same bytes.
template <class T>
bool same_bits_everywhere(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ull;
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

}  // namespace

TEMPLATE_TEST_CASE("RingAllReducer sums exactly with either algorithm", "[policy][ring]", float, double,
                   std::int32_t, std::int64_t) {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  const Algorithm algo = GENERATE(Algorithm::ring, Algorithm::native);
  // 0, 1, fewer elements than ranks, not divisible by n, several segments.
  const std::size_t count =
      GENERATE_COPY(std::size_t{0}, std::size_t{1}, std::size_t(n > 1 ? n - 1 : 1), std::size_t(3 * n + 1),
                    std::size_t{5000});
  px::RingOptions opt;
  opt.algorithm = algo;
  opt.segment_bytes = 256;  // many segments even for small buffers
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);

  auto v = pattern<TestType>(me, count);
  ring.allreduce(v.data(), count);
  bool ok = true;
  for (std::size_t i = 0; i < count; ++i) ok = ok && v[i] == expected<TestType>(n, i);
  CHECK(ok);
  CHECK(same_bits_everywhere(v));

  const px::Traffic t = mpi.stats().total();
  const std::uint64_t b = sizeof(TestType);
  CHECK(t.sent() == b * px::detail::ring::allreduce_sent(count, n, me));
  CHECK(t.received() == b * px::detail::ring::allreduce_received(count, n, me));
}

TEST_CASE("RingAllReduce sends 2(N-1)/N of the buffer per rank", "[policy][ring]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size();
  px::RingOptions opt;
  opt.algorithm = Algorithm::ring;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);
  const std::size_t count = 12 * 1024;  // divisible by 1..4
  std::vector<float> v(count, 1.f);
  ring.allreduce(v.data(), count);
  const std::uint64_t S = count * sizeof(float);
  CHECK(mpi.stats().total().sent() == 2 * (n - 1) * S / n);
  CHECK(mpi.stats().total().received() == 2 * (n - 1) * S / n);
  CHECK(v[count - 1] == static_cast<float>(n));
  // The ring takes 2(N-1) exchanges, each one engine call (one segment here).
  CHECK(mpi.stats().total().calls == static_cast<std::uint64_t>(2 * (n - 1)));
}

TEST_CASE("RingAllReduce under automatic: native below the threshold, ring above", "[policy][ring]") {
  px::engine::Mpi mpi(test::world());
  px::RingOptions opt;
  opt.native_below_bytes = 1024;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);
  if (mpi.size() == 1) {
    CHECK(ring.choose(1 << 20) == Algorithm::native);
  } else {
    CHECK(ring.choose(1023) == Algorithm::native);
    CHECK(ring.choose(1024) == Algorithm::ring);
  }
  opt.algorithm = Algorithm::ring;
  CHECK(px::RingAllReducer<px::engine::Mpi>(mpi, opt).choose(4) == Algorithm::ring);
}

TEST_CASE("Tensor fusion packs small gradients into buckets and sums them exactly", "[policy][ring][fusion]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  px::RingOptions opt;
  opt.bucket_bytes = 1024;  // 256 floats
  opt.algorithm = Algorithm::ring;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);

  // Sizes: small ones that share buckets, an empty one, one exactly a bucket
  // (in place), one larger (in place), and a double between floats (new bucket).
  const std::vector<std::size_t> sizes{10, 100, 0, 200, 256, 1000, 3, 50, 60};
  std::vector<std::vector<float>> tensors;
  std::vector<double> dbl(7);
  for (std::size_t t = 0; t < sizes.size(); ++t) tensors.push_back(pattern<float>(me + static_cast<int>(t), sizes[t]));
  for (std::size_t i = 0; i < dbl.size(); ++i) dbl[i] = me + 0.5 * static_cast<double>(i);

  std::vector<px::TensorRef> refs;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    refs.push_back({tensors[t].data(), sizes[t], px::DataType::f32});
    if (t == 6) refs.push_back({dbl.data(), dbl.size(), px::DataType::f64});
  }
  px::FusedAllReducer<px::engine::Mpi> fused(ring, refs);

  // Plan: [10,100] [0 in place] [200] [256 in place] [1000 in place] [3] [dbl] [50,60]
  const auto& b = fused.buckets();
  REQUIRE(b.size() == 8);
  CHECK((b[0].first == 0 && b[0].last == 2 && !b[0].in_place && b[0].elements == 110));
  CHECK(b[1].in_place);
  CHECK((b[2].elements == 200 && !b[2].in_place));
  CHECK((b[3].in_place && b[3].elements == 256));
  CHECK((b[4].in_place && b[4].elements == 1000));
  CHECK(b[5].elements == 3);
  CHECK((b[6].type == px::DataType::f64 && b[6].elements == 7));
  CHECK((b[7].elements == 110 && b[7].first == 8 && b[7].last == 10));
  CHECK(fused.staging_bytes() == 200 * sizeof(float));

  fused.run();
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    bool ok = true;
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += pattern<float>(r + static_cast<int>(t), sizes[t])[i];
      ok = ok && tensors[t][i] == want;
    }
    CHECK(ok);
  }
  for (std::size_t i = 0; i < dbl.size(); ++i) CHECK(dbl[i] == n * (n - 1) / 2.0 + n * 0.5 * static_cast<double>(i));

  // Bytes: one ring per bucket.
  std::uint64_t want_sent = 0;
  for (const auto& bucket : b) want_sent += size_of(bucket.type) * px::detail::ring::allreduce_sent(bucket.elements, n, me);
  CHECK(mpi.stats().total().sent() == want_sent);
}
