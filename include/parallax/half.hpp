#pragma once
/// @file
/// 16-bit floating-point storage types: `bf16` (bfloat16: 8 exponent bits,
/// 7 mantissa bits, the range of float) and `fp16` (IEEE binary16: 5
/// exponent bits, 10 mantissa bits, largest finite 65504).
///
/// They store values; arithmetic happens in float. float -> 16 bits rounds to
/// nearest, ties to even (IEEE's default), overflows to infinity, keeps
/// subnormals (fp16's from 2^-24) and turns a NaN into a quiet NaN of the same
/// sign; 16 bits -> float is exact. The conversions are integer code, the
/// same on the host and the GPU, so a value rounds to the same bits on either
/// (CUDA's own intrinsics flush or canonicalise NaN payloads differently).
/// `round_stochastic(x, random)` rounds to one of the two neighbours of x,
/// the farther with probability proportional to its nearness, from a random
/// 32-bit value the caller derives from a counter (optim::rounding_bits), so
/// a run's bits do not depend on threads or ranks.
///
/// Under nvcc the types convert to and from `__nv_bfloat16` and `__half` bit
/// for bit; the host build needs no CUDA header.

#include <parallax/config.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#if PARALLAX_HAS_CUDA
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace parallax {

namespace detail {

PARALLAX_HOST_DEVICE inline std::uint32_t float_bits(float f) noexcept {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

PARALLAX_HOST_DEVICE inline float bits_float(std::uint32_t u) noexcept {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// The magnitude of a finite float on a 16-bit format's grid:
/// |x| = (trunc + rem / 2^shift) units, where trunc is the 15-bit pattern of
/// |x| rounded toward zero and rem the `shift` bits cut off.
struct HalfSplit {
  std::uint32_t trunc;
  std::uint32_t rem;
  int shift;
};

/// Round to nearest, ties to even, on a split. Adding 1 to a pattern steps to
/// the next magnitude (and from the largest finite to infinity), so carries
/// into the exponent need no care.
PARALLAX_HOST_DEVICE inline std::uint32_t round_nearest_even(HalfSplit s) noexcept {
  if (s.shift > 32) return s.trunc;  // rem < 2^24 < half a unit
  const std::uint64_t half = std::uint64_t{1} << (s.shift - 1);
  const bool up = s.rem > half || (s.rem == half && (s.trunc & 1u));
  return s.trunc + (up ? 1u : 0u);
}

/// Rounds up with probability rem / 2^shift, exactly where shift <= 32 and
/// within 2^-32 below that, given `random` uniform over 32 bits.
PARALLAX_HOST_DEVICE inline std::uint32_t round_stochastic(HalfSplit s, std::uint32_t random) noexcept {
  std::uint64_t threshold;  // in [0, 2^32): round up when random < threshold
  if (s.shift <= 32)
    threshold = std::uint64_t{s.rem} << (32 - s.shift);
  else
    threshold = s.shift - 32 >= 32 ? 0 : std::uint64_t{s.rem} >> (s.shift - 32);
  return s.trunc + (random < threshold ? 1u : 0u);
}

/// bfloat16 is float's upper half: the grid unit is 2^16 float patterns
/// everywhere, subnormals included.
PARALLAX_HOST_DEVICE inline HalfSplit split_bf16(std::uint32_t magnitude) noexcept {
  return {magnitude >> 16, magnitude & 0xFFFFu, 16};
}

/// binary16 below 65536; 13 bits cut for normal results, more for
/// subnormal ones (the unit is 2^-24 there).
PARALLAX_HOST_DEVICE inline HalfSplit split_fp16(std::uint32_t magnitude) noexcept {
  const std::uint32_t e = magnitude >> 23;
  if (e >= 113) return {(magnitude - 0x38000000u) >> 13, magnitude & 0x1FFFu, 13};  // |x| >= 2^-14
  const std::uint32_t m = (magnitude & 0x7FFFFFu) | (e ? 0x800000u : 0u);         // value: m * 2^(max(e,1) - 150)
  const int shift = 126 - static_cast<int>(e ? e : 1);                             // from 14 up to 125
  if (shift >= 32) return {0u, m, shift};
  return {m >> shift, m & ((1u << shift) - 1u), shift};
}

template <bool Bf16>
PARALLAX_HOST_DEVICE inline std::uint16_t float_to_half(float x, bool stochastic, std::uint32_t random) noexcept {
  const std::uint32_t u = float_bits(x);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if constexpr (Bf16) {
    if (a > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN, payload kept
    if (a == 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7F80u);
    const HalfSplit s = split_bf16(a);
    return static_cast<std::uint16_t>(sign | (stochastic ? round_stochastic(s, random) : round_nearest_even(s)));
  } else {
    if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // |x| >= 2^16: past the grid
    const HalfSplit s = split_fp16(a);
    return static_cast<std::uint16_t>(sign | (stochastic ? round_stochastic(s, random) : round_nearest_even(s)));
  }
}

PARALLAX_HOST_DEVICE inline float bf16_to_float(std::uint16_t h) noexcept {
  return bits_float(std::uint32_t{h} << 16);
}

PARALLAX_HOST_DEVICE inline float fp16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  std::uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13));  // infinity, NaN (payload kept)
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 1;  // subnormal m * 2^-24: normalise
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    m &= 0x3FFu;
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

#if PARALLAX_HAS_CUDA
/// CUDA's own type of each format (bf16: true), and its raw bits.
template <bool Bf16>
struct CudaHalf {
  using type = __nv_bfloat16;
  using raw = __nv_bfloat16_raw;
};
template <>
struct CudaHalf<false> {
  using type = __half;
  using raw = __half_raw;
};
#endif

/// What bf16 and fp16 share: the 16 bits, the named constructors and the
/// conversion to CUDA's own type.
/// Arithmetic and comparisons go through the implicit conversion to float. `Derived` supplies the two conversions.
template <class Derived, bool Bf16>
struct HalfBase {
  std::uint16_t bits;

  /// The value of these bits.
  PARALLAX_HOST_DEVICE static constexpr Derived from_bits(std::uint16_t b) noexcept {
    Derived h{};
    h.bits = b;
    return h;
  }
  /// x rounded to nearest, ties to even (the same as the constructor).
  PARALLAX_HOST_DEVICE static Derived round_nearest(float x) noexcept {
    return from_bits(float_to_half<Bf16>(x, false, 0));
  }
  /// x rounded to the neighbour below or above its magnitude, the one above
  /// with probability (|x| - below) / (above - below), given `random`
  /// uniform over 32 bits (the draw rounds up when random < that fraction
  /// x 2^32). Past the largest finite value the neighbour above is
  /// infinity. NaN becomes a quiet NaN.
  PARALLAX_HOST_DEVICE static Derived round_stochastic(float x, std::uint32_t random) noexcept {
    return from_bits(float_to_half<Bf16>(x, true, random));
  }

  PARALLAX_HOST_DEVICE bool is_nan() const noexcept {
    return Bf16 ? (bits & 0x7FFFu) > 0x7F80u : (bits & 0x7FFFu) > 0x7C00u;
  }
  PARALLAX_HOST_DEVICE bool is_inf() const noexcept {
    return (bits & 0x7FFFu) == (Bf16 ? 0x7F80u : 0x7C00u);
  }

#if PARALLAX_HAS_CUDA
  // Explicit: an implicit one beside `operator float` made `a == b` ambiguous under nvcc (cuda_bf16.hpp's operators).
  PARALLAX_HOST_DEVICE explicit operator typename CudaHalf<Bf16>::type() const noexcept {
    typename CudaHalf<Bf16>::raw r;
    r.x = bits;
    return typename CudaHalf<Bf16>::type(r);
  }
#endif
};

}  // namespace detail

/// bfloat16: a float's sign, exponent and top 7 mantissa bits. Storage for
/// tables and messages; compute in float.
struct bf16 : detail::HalfBase<bf16, true> {
  bf16() = default;
  /// Rounds to nearest, ties to even.
  PARALLAX_HOST_DEVICE bf16(float x) noexcept : HalfBase{detail::float_to_half<true>(x, false, 0)} {}  // NOLINT: implicit, as float -> double
  PARALLAX_HOST_DEVICE operator float() const noexcept { return detail::bf16_to_float(bits); }  // NOLINT: exact
#if PARALLAX_HAS_CUDA
  PARALLAX_HOST_DEVICE bf16(__nv_bfloat16 h) noexcept : HalfBase{__nv_bfloat16_raw(h).x} {}  // NOLINT
#endif
};

/// IEEE 754 binary16 ("half"): 5 exponent bits, 10 mantissa bits, largest
/// finite 65504, subnormals down to 2^-24. Storage; compute in float.
struct fp16 : detail::HalfBase<fp16, false> {
  fp16() = default;
  /// Rounds to nearest, ties to even; overflows to infinity from 65520.
  PARALLAX_HOST_DEVICE fp16(float x) noexcept : HalfBase{detail::float_to_half<false>(x, false, 0)} {}  // NOLINT
  PARALLAX_HOST_DEVICE operator float() const noexcept { return detail::fp16_to_float(bits); }  // NOLINT: exact
#if PARALLAX_HAS_CUDA
  PARALLAX_HOST_DEVICE fp16(__half h) noexcept : HalfBase{__half_raw(h).x} {}  // NOLINT
#endif
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16>);
static_assert(sizeof(fp16) == 2 && std::is_trivially_copyable_v<fp16> && std::is_standard_layout_v<fp16>);

/// True for bf16 and fp16.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, fp16>;

/// The type a value of T is computed in: float for the 16-bit types, T otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

/// How a value computed in float is stored in 16 bits (a bf16 or fp16
/// table's update; optim::Rounding names it too).
struct Rounding {
  enum Mode : std::uint8_t {
    nearest,     ///< to nearest, ties to even: small updates (below half a unit in the last place) are lost
    stochastic,  ///< to a neighbour, the farther with probability its nearness: unbiased on average
  };
  Mode mode = nearest;
  /// Seeds stochastic rounding's draws: a run with the same seed rounds the
  /// same way on any rank count and thread count.
  std::uint64_t seed = 0;
};

}  // namespace parallax
