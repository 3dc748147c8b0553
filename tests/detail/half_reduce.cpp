// detail/half_reduce.hpp: the MPI datatype and operators for bf16 and fp16.
// One combination is the correctly rounded sum of its two operands (checked
// against a double reference); over the ranks, sums whose partial sums are
// exact agree bit for bit at every rank count, two ranks give one rounding,
// the float path rounds once where the 16-bit operator rounds per
// combination, max and min are exact, moves keep the bits, and a
// predefined operator or a wrong type is refused.
#include "support.hpp"

#include <parallax/detail/half_reduce.hpp>

#include <cmath>
#include <cstring>
#include <random>

namespace {

template <class H>
px::DataType type_of() {
  return px::data_type_of_v<H>;
}

/// Correct rounding of a double to H: the float conversion rounds to 24
/// bits first, which is innocuous only when x is a float; the reference
/// instead picks the nearer of the two H neighbours of x in double.
template <class H>
H round_double(double x) {
  H lo = H(static_cast<float>(x));  // within one H step of the answer
  // Walk to the neighbours bracketing x, then choose by distance and evenness.
  auto value = [](H h) { return static_cast<double>(static_cast<float>(h)); };
  auto step = [](H h, int dir) {
    const bool neg = h.bits & 0x8000;
    const std::uint16_t mag = h.bits & 0x7FFF;
    if (mag == 0 && dir < 0) return H::from_bits(0x8001);
    if (mag == 0) return H::from_bits(0x0001);
    return H::from_bits(static_cast<std::uint16_t>(h.bits + ((dir > 0) != neg ? 1 : -1)));
  };
  while (value(lo) > x) lo = step(lo, -1);
  while (value(step(lo, +1)) <= x) lo = step(lo, +1);
  const H hi = step(lo, +1);
  const double down = x - value(lo), up = value(hi) - x;
  if (down < up || (down == up && (lo.bits & 1) == 0)) return lo;
  return hi;
}

}  // namespace

TEMPLATE_TEST_CASE("one combination is the correctly rounded sum of its two operands", "[detail][half]", px::bf16,
                   px::fp16) {
  using H = TestType;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> pattern(0, 0xFFFF);
  std::vector<H> a, b;
  while (a.size() < 200000) {
    const H x = H::from_bits(static_cast<std::uint16_t>(pattern(rng)));
    const H y = H::from_bits(static_cast<std::uint16_t>(pattern(rng)));
    const double sum = static_cast<double>(static_cast<float>(x)) + static_cast<double>(static_cast<float>(y));
    // Finite operands whose sum stays below H's largest finite value (the
    // reference walks the finite grid).
    if (x.is_nan() || y.is_nan() || x.is_inf() || y.is_inf() || H(static_cast<float>(sum)).is_inf()) continue;
    a.push_back(x);
    b.push_back(y);
  }
  std::vector<H> got = b;
  px::detail::combine_half<H, px::ReduceOp::sum>(a.data(), got.data(), a.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double exact = static_cast<double>(static_cast<float>(a[i])) + static_cast<double>(static_cast<float>(b[i]));
    const H want = round_double<H>(exact);
    wrong += got[i].bits != want.bits && !(exact == 0 && static_cast<float>(got[i]) == 0.f);
  }
  CHECK(wrong == 0);
}

TEMPLATE_TEST_CASE("16-bit sums over the ranks", "[detail][half]", px::bf16, px::fp16) {
  using H = TestType;
  auto& ctx = test::world();
  const int n = ctx.size(), me = ctx.rank();
  const MPI_Datatype type = px::detail::half_datatype();
  const MPI_Op sum = px::detail::half_op(type_of<H>(), px::ReduceOp::sum);

  SECTION("exact partial sums agree bit for bit at every rank count") {
    // Small integers and halves: every partial sum is a 16-bit value, so
    // the order MPI combines in cannot matter.
    constexpr int count = 1000;
    std::vector<H> mine(count), total(count);
    for (int i = 0; i < count; ++i) mine[i] = H(static_cast<float>((i * 7 + me * 3) % 16) * 0.5f - 3.f);
    PARALLAX_MPI_CHECK(MPI_Allreduce(mine.data(), total.data(), count, type, sum, ctx.comm()));
    std::size_t wrong = 0;
    for (int i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>((i * 7 + r * 3) % 16) * 0.5f - 3.f;
      wrong += total[i].bits != H(want).bits;
    }
    CHECK(test::all_ranks(wrong == 0));
  }

  SECTION("the float path rounds once; the 16-bit operator rounds per combination") {
    // Rank 0 gives 1; every other rank a quarter of 1's unit in the last
    // place. In float the total is 1 + (n-1)/4 units, rounded once; the
    // 16-bit operator may round each quarter away as it adds it.
    const float unit = std::is_same_v<H, px::bf16> ? std::ldexp(1.f, -7) : std::ldexp(1.f, -10);
    const H mine(me == 0 ? 1.f : unit / 4);
    H wide = mine, narrow = mine;
    px::detail::allreduce_half_in_float(&wide, &wide, 1, type_of<H>(), ctx.comm());
    PARALLAX_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &narrow, 1, type, sum, ctx.comm()));
    const float once = 1.f + static_cast<float>(n - 1) * unit / 4;
    CHECK(wide.bits == H(once).bits);
    // The 16-bit result lies between 1 (each quarter rounded away) and the
    // float total rounded, and is the same on every rank.
    CHECK(static_cast<float>(narrow) >= 1.f);
    CHECK(static_cast<float>(narrow) <= static_cast<float>(H(once)));
    std::uint16_t bits[2] = {narrow.bits, narrow.bits};
    std::uint16_t low = 0, high = 0;
    MPI_Allreduce(&bits[0], &low, 1, MPI_UINT16_T, MPI_MIN, ctx.comm());
    MPI_Allreduce(&bits[1], &high, 1, MPI_UINT16_T, MPI_MAX, ctx.comm());
    CHECK(low == high);
    if (n == 2) CHECK(narrow.bits == H(1.f + unit / 4).bits);  // one combination: 1 + a quarter rounds to 1
  }

  SECTION("the float path over many values equals one process rounding the float sums") {
    constexpr std::size_t count = 4099;
    std::vector<H> mine(count), total(count);
    for (std::size_t i = 0; i < count; ++i)
      mine[i] = H(std::ldexp(1.f + static_cast<float>((i * 13 + static_cast<std::size_t>(me) * 5) % 128) / 128.f,
                             static_cast<int>(i % 5)));
    px::detail::allreduce_half_in_float(mine.data(), total.data(), count, type_of<H>(), ctx.comm());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float want = 0;  // exact: at most 4 terms of 8 significant bits within one binade
      for (int r = 0; r < n; ++r)
        want += static_cast<float>(H(std::ldexp(1.f + static_cast<float>((i * 13 + static_cast<std::size_t>(r) * 5) % 128) / 128.f,
                                                static_cast<int>(i % 5))));
      wrong += total[i].bits != H(want).bits;
    }
    CHECK(test::all_ranks(wrong == 0));
  }
}

TEMPLATE_TEST_CASE("16-bit max and min over the ranks are exact; moves keep the bits", "[detail][half]", px::bf16,
                   px::fp16) {
  using H = TestType;
  auto& ctx = test::world();
  const int n = ctx.size(), me = ctx.rank();
  const MPI_Datatype type = px::detail::half_datatype();
  constexpr int count = 257;
  std::vector<H> mine(count), most(count), least(count), all(static_cast<std::size_t>(count * n));
  auto value = [](int r, int i) { return H(static_cast<float>(std::sin(0.37 * i + 1.3 * r)) * 1000.f); };
  for (int i = 0; i < count; ++i) mine[i] = value(me, i);
  PARALLAX_MPI_CHECK(MPI_Allreduce(mine.data(), most.data(), count, type, px::detail::half_op(type_of<H>(), px::ReduceOp::max), ctx.comm()));
  PARALLAX_MPI_CHECK(MPI_Allreduce(mine.data(), least.data(), count, type, px::detail::half_op(type_of<H>(), px::ReduceOp::min), ctx.comm()));
  PARALLAX_MPI_CHECK(MPI_Allgather(mine.data(), count, type, all.data(), count, type, ctx.comm()));
  std::size_t wrong = 0;
  for (int i = 0; i < count; ++i) {
    float hi = -HUGE_VALF, lo = HUGE_VALF;
    for (int r = 0; r < n; ++r) {
      hi = std::max(hi, static_cast<float>(value(r, i)));
      lo = std::min(lo, static_cast<float>(value(r, i)));
      wrong += all[static_cast<std::size_t>(r * count + i)].bits != value(r, i).bits;
    }
    wrong += most[i].bits != H(hi).bits || least[i].bits != H(lo).bits;
  }
  CHECK(test::all_ranks(wrong == 0));
}

TEST_CASE("16-bit reductions refuse what they cannot do", "[detail][half]") {
  auto& ctx = test::world();
  // Not a 16-bit type: a parallax::error naming it.
  CHECK_THROWS_WITH(px::detail::half_op(px::DataType::f32, px::ReduceOp::sum), Catch::Contains("f32 is not a 16-bit"));
  float f = 1.f;
  CHECK_THROWS_WITH(px::detail::allreduce_half_in_float(&f, &f, 1, px::DataType::i32, ctx.comm()),
                    Catch::Contains("i32 is not a 16-bit"));
  // MPI's own sum on the 16-bit datatype is refused (a derived type), not
  // computed on bit patterns as integers.
  px::bf16 x(1.f), y;
  const int rc = MPI_Allreduce(&x, &y, 1, px::detail::half_datatype(), MPI_SUM, ctx.comm());
  CHECK(rc != MPI_SUCCESS);
  // The engine's datatype map has no MPI type for them.
  CHECK(px::detail::mpi_datatype(px::DataType::bf16) == MPI_DATATYPE_NULL);
  CHECK(px::detail::mpi_datatype(px::DataType::f16) == MPI_DATATYPE_NULL);
}
