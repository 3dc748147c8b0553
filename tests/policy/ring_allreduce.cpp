// RingAllReduce: the ring and the native path give the exact sum for every
// size class, identical bits on every rank, and the bytes of docs/design.md,
// "Byte accounting", in host and device memory; tensor fusion plans buckets
// as documented and changes no result.
#include "support.hpp"

#include <cstring>
#include <thread>
#include <type_traits>

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

/// One all-reduce of `count` elements of T in Space, over the space's
/// engine: the exact sum, the same bits on every rank, the ring's bytes.
template <class T, class Space>
void check_ring_sum(Algorithm algo, std::size_t count) {
  test::engine_for<Space> mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  px::RingOptions opt;
  opt.algorithm = algo;
  opt.segment_bytes = 256;  // many segments even for small buffers
  opt.adapt_to_oversubscription = false;  // ... on any host
  px::RingAllReducer<test::engine_for<Space>> ring(mpi, opt);

  auto in_space = px::Buffer<T, Space>::from_host(pattern<T>(me, count));
  ring.allreduce(in_space.data(), count);
  const auto v = in_space.to_host();
  INFO("type " << px::to_string(px::data_type_of_v<T>) << ", space " << Space::name);
  bool ok = true;
  for (std::size_t i = 0; i < count; ++i) ok = ok && v[i] == expected<T>(n, i);
  CHECK(ok);
  CHECK(test::same_bits_everywhere(v));

  const px::Traffic t = mpi.stats().total();
  const std::uint64_t b = sizeof(T);
  CHECK(t.sent() == b * px::detail::ring::allreduce_sent(count, n, me));
  CHECK(t.received() == b * px::detail::ring::allreduce_received(count, n, me));
}

}  // namespace

// At one rank the sum is the input: a reducer that did nothing would pass.
TEMPLATE_TEST_CASE("RingAllReducer sums exactly with either algorithm", "[policy][ring][np2+]", PARALLAX_TEST_SPACES) {
  using Space = TestType;
  if (test::skip_below_ranks(2)) return;
  const int n = test::world().size();
  const Algorithm algo = GENERATE(Algorithm::ring, Algorithm::native);
  // 0, 1, fewer elements than ranks, not divisible by n, several segments.
  const std::size_t count =
      GENERATE_COPY(std::size_t{0}, std::size_t{1}, std::size_t(n > 1 ? n - 1 : 1), std::size_t(3 * n + 1),
                    std::size_t{5000});
  check_ring_sum<float, Space>(algo, count);
  check_ring_sum<double, Space>(algo, count);
  check_ring_sum<std::int32_t, Space>(algo, count);
  check_ring_sum<std::int64_t, Space>(algo, count);
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
  opt.adapt_to_oversubscription = false;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);
  if (mpi.size() == 1) {
    CHECK(ring.choose(1 << 20) == Algorithm::native);
  } else {
    CHECK(ring.choose(1023) == Algorithm::native);
    // The ring: hierarchical where the world has several hosts of equally
    // many ranks (PARALLAX_RANKS_PER_HOST; tests/policy/ring_allreduce/hierarchy.cpp).
    CHECK(ring.choose(1024) == (ring.hierarchical() ? Algorithm::hierarchical : Algorithm::ring));
  }
  opt.algorithm = Algorithm::ring;
  CHECK(px::RingAllReducer<px::engine::Mpi>(mpi, opt).choose(4) == Algorithm::ring);
}

TEST_CASE("RingAllReduce under automatic: native on an oversubscribed host", "[policy][ring]") {
  px::engine::Mpi mpi(test::world());
  px::RingOptions opt;
  opt.native_below_bytes = 1024;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);
  const auto threads = static_cast<int>(std::thread::hardware_concurrency());
  const bool oversubscribed = threads > 0 && mpi.topology().local_size() > threads;
  CHECK(mpi.topology().oversubscribed() == oversubscribed);
  CHECK(ring.oversubscribed() == oversubscribed);
  CHECK(ring.choose(1 << 20) == (mpi.size() == 1 || oversubscribed ? Algorithm::native : Algorithm::ring));
  // Forcing the ring still runs the ring; oversubscribed, each chunk whole.
  opt.algorithm = Algorithm::ring;
  opt.segment_bytes = 256;
  px::RingAllReducer<px::engine::Mpi> forced(mpi, opt);
  CHECK(forced.choose(1 << 20) == Algorithm::ring);
  const std::size_t count = 64 * 1024;  // 256 KiB: 256 segments per chunk unless whole
  std::vector<float> v(count, 1.f);
  const px::Traffic before = mpi.stats().total();
  forced.allreduce(v.data(), count);
  const std::uint64_t calls = (mpi.stats().total() - before).calls;
  CHECK(v[count - 1] == static_cast<float>(mpi.size()));
  // One rank exchanges nothing (no call); oversubscribed, each of the
  // 2(N-1) exchanges is one call; else several segments each.
  if (mpi.size() == 1 || oversubscribed) CHECK(calls == static_cast<std::uint64_t>(2 * (mpi.size() - 1)));
  else CHECK(calls > static_cast<std::uint64_t>(2 * (mpi.size() - 1)));
}

TEST_CASE("Tensors adjacent in memory are one piece of the ring's view", "[policy][ring][fusion]") {
  std::vector<float> arena(100);
  std::vector<float> apart(10);
  const std::vector<px::TensorRef> refs{{arena.data(), 30, px::DataType::f32},
                                        {arena.data() + 30, 0, px::DataType::f32},
                                        {arena.data() + 30, 50, px::DataType::f32},
                                        {apart.data(), 10, px::DataType::f32},
                                        {arena.data() + 80, 20, px::DataType::f32}};
  px::policy::ring::PieceView<float> view(refs.data(), refs.size());
  CHECK(view.size() == 110);
  CHECK(view.pieces() == 3);  // [0, 80) of the arena, apart, [80, 100) of the arena
  CHECK(view.span(10, 70) == arena.data() + 10);
  CHECK(view.span(75, 10) == nullptr);  // straddles the arena and `apart`
  CHECK(view.span(80, 10) == apart.data());
  CHECK(view.span(95, 15) == arena.data() + 85);
  CHECK(view.span(110, 0) == nullptr);
}

TEMPLATE_TEST_CASE("RingAllReduce over tensors laid end to end gives the bits of one contiguous buffer",
                   "[policy][ring][fusion]", float, double, std::int32_t, std::int64_t) {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  // Small segments (64 bytes: 16 floats, 8 doubles) straddle tensors, large
  // ones (4096 bytes) also lie inside one; sizes include an empty tensor and
  // fewer elements than ranks.
  const std::size_t segment = GENERATE(std::size_t{64}, std::size_t{4096});
  const std::vector<std::size_t> sizes = GENERATE(std::vector<std::size_t>{1},
                                                  std::vector<std::size_t>{3, 0, 17, 1, 64, 5, 200, 2},
                                                  std::vector<std::size_t>{500, 1, 1, 1, 300});
  px::RingOptions opt;
  opt.algorithm = Algorithm::ring;
  opt.segment_bytes = segment;
  opt.adapt_to_oversubscription = false;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);

  // Values that are not exact in floating point, so a different summation
  // order would show in the bits.
  auto value = [&](int rank, std::size_t i) {
    if constexpr (std::is_floating_point_v<TestType>)
      return static_cast<TestType>(0.1 * (rank + 1) + 1e-3 * static_cast<double>(i % 1013) + 1.0 / (3 + rank));
    else
      return static_cast<TestType>((rank + 1) * 1000003 + static_cast<long>(i) * 7);
  };
  std::vector<std::vector<TestType>> tensors;
  std::vector<TestType> whole;
  std::vector<px::TensorRef> refs;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    std::vector<TestType> v(sizes[t]);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(me, whole.size() + i);
    whole.insert(whole.end(), v.begin(), v.end());
    tensors.push_back(std::move(v));
  }
  for (auto& v : tensors) refs.push_back({v.data(), v.size(), px::data_type_of_v<TestType>});

  ring.allreduce(whole.data(), whole.size());
  const px::Traffic contiguous = mpi.stats().total();
  ring.ring_allreduce(refs.data(), refs.size());
  const px::Traffic pieces = mpi.stats().total() - contiguous;

  std::vector<TestType> joined;
  for (const auto& v : tensors) joined.insert(joined.end(), v.begin(), v.end());
  REQUIRE(joined.size() == whole.size());
  CHECK(std::memcmp(joined.data(), whole.data(), whole.size() * sizeof(TestType)) == 0);
  CHECK(test::same_bits_everywhere(joined));
  if constexpr (std::is_integral_v<TestType>) {
    bool ok = true;
    for (std::size_t i = 0; i < joined.size(); ++i) {
      TestType want = 0;
      for (int r = 0; r < n; ++r) want += value(r, i);
      ok = ok && joined[i] == want;
    }
    CHECK(ok);
  }
  // The same bytes as the contiguous ring: only where they come from differs.
  CHECK(pieces.sent() == contiguous.sent());
  CHECK(pieces.received() == contiguous.received());
}

TEST_CASE("RingAllReduce over tensors refuses mixed types", "[policy][ring][fusion]") {
  px::engine::Mpi mpi(test::world());
  px::RingAllReducer<px::engine::Mpi> ring(mpi);
  std::vector<float> a(4);
  std::vector<double> b(4);
  const std::vector<px::TensorRef> refs{{a.data(), a.size(), px::DataType::f32}, {b.data(), b.size(), px::DataType::f64}};
  CHECK_THROWS_AS(ring.ring_allreduce(refs.data(), refs.size()), px::error);
}

TEST_CASE("Tensor fusion under automatic sums exactly whichever algorithm each bucket takes",
          "[policy][ring][fusion]") {
  px::engine::Mpi mpi(test::world());
  const int n = mpi.size(), me = mpi.rank();
  px::RingOptions opt;
  opt.bucket_bytes = 4096;         // 1024 floats
  opt.native_below_bytes = 2048;   // buckets under 512 floats go native
  opt.segment_bytes = 512;
  px::RingAllReducer<px::engine::Mpi> ring(mpi, opt);
  const std::vector<std::size_t> sizes{100, 700, 300, 900, 10, 20, 5000, 3, 1000};
  std::vector<std::vector<float>> tensors;
  std::vector<px::TensorRef> refs;
  for (std::size_t t = 0; t < sizes.size(); ++t) tensors.push_back(pattern<float>(me + static_cast<int>(t), sizes[t]));
  for (auto& v : tensors) refs.push_back({v.data(), v.size(), px::DataType::f32});
  px::FusedAllReducer<px::engine::Mpi> fused(ring, refs);
  // Plan: [100,700] [300] [900,10,20] [5000 in place] [3,1000]: automatic takes
  // the ring for the 3200-, 3720- and 4012-byte buckets, native for 1200 bytes
  // (and for everything with one rank or on an oversubscribed host).
  const auto& b = fused.buckets();
  REQUIRE(b.size() == 5);
  CHECK((b[0].elements == 800 && b[1].elements == 300 && b[2].elements == 930 && b[3].in_place &&
         b[4].elements == 1003));
  CHECK(ring.choose(300 * sizeof(float)) == Algorithm::native);
  CHECK(ring.choose(800 * sizeof(float)) == (n > 1 && !ring.oversubscribed() ? Algorithm::ring : Algorithm::native));
  fused.run();
  fused.run();  // twice: the sum of sums, still exact
  bool ok = true;
  for (std::size_t t = 0; t < sizes.size(); ++t)
    for (std::size_t i = 0; i < sizes[t]; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += pattern<float>(r + static_cast<int>(t), sizes[t])[i];
      ok = ok && tensors[t][i] == want * static_cast<float>(n);
    }
  CHECK(ok);
  CHECK(test::same_bits_everywhere(tensors[1]));
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
