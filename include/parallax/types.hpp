#pragma once
/// @file
/// Vocabulary shared by every layer: sparsity tags, element types as a runtime
/// enum (the transport boundary is untyped, as in gloo), reduction operators,
/// and the shape of a variable.

#include <parallax/config.hpp>
#include <parallax/half.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace parallax {

namespace detail {
/// True when T is one of Ts.
template <class T, class... Ts>
inline constexpr bool is_any_of_v = (std::is_same_v<T, Ts> || ...);
}  // namespace detail

/// Every element of the variable is touched each step (MLP, conv, LSTM weights).
struct Dense {
  static constexpr const char* name = "dense";
};
/// Only some rows are touched each step (embeddings, softmax tables).
struct Sparse {
  static constexpr const char* name = "sparse";
};

template <class S> inline constexpr bool is_sparsity_v = detail::is_any_of_v<S, Dense, Sparse>;

/// `is_sparse_v<Sparse>` and `is_sparse_v<Variable<Sparse, ...>>` are true.
template <class V, class = void>
struct is_sparse : std::is_same<V, Sparse> {};
template <class V>
struct is_sparse<V, std::void_t<typename V::sparsity>> : std::is_same<typename V::sparsity, Sparse> {};
template <class V>
inline constexpr bool is_sparse_v = is_sparse<V>::value;

/// Element types the engines move. Only the engines see this enum; the rest of
/// the library is typed. bf16 and f16 are parallax::bf16 and parallax::fp16
/// (half.hpp); new values go at the end, since checkpoints and the ranks'
/// agreement record them as numbers.
enum class DataType : std::uint8_t { f32, f64, i32, i64, u8, bf16, f16 };

template <class T>
struct data_type_of;
template <>
struct data_type_of<float> : std::integral_constant<DataType, DataType::f32> {};
template <>
struct data_type_of<double> : std::integral_constant<DataType, DataType::f64> {};
template <>
struct data_type_of<std::int32_t> : std::integral_constant<DataType, DataType::i32> {};
template <>
struct data_type_of<std::int64_t> : std::integral_constant<DataType, DataType::i64> {};
template <>
struct data_type_of<std::uint8_t> : std::integral_constant<DataType, DataType::u8> {};
template <>
struct data_type_of<bf16> : std::integral_constant<DataType, DataType::bf16> {};
template <>
struct data_type_of<fp16> : std::integral_constant<DataType, DataType::f16> {};
template <class T>
inline constexpr DataType data_type_of_v = data_type_of<T>::value;

constexpr std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::u8: return 1;
    case DataType::bf16: return 2;
    case DataType::f16: return 2;
  }
  return 0;
}

constexpr const char* to_string(DataType t) noexcept {
  switch (t) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
    case DataType::u8: return "u8";
    case DataType::bf16: return "bf16";
    case DataType::f16: return "f16";
  }
  return "?";
}

/// Whether t is a floating-point type (f64, f32, bf16, f16).
constexpr bool is_floating(DataType t) noexcept {
  return t == DataType::f32 || t == DataType::f64 || t == DataType::bf16 || t == DataType::f16;
}

enum class ReduceOp : std::uint8_t { sum, max, min };

/// A variable is a `rows x cols` matrix; a vector is `{n}` (n rows, 1 column).
struct Shape {
  std::size_t rows = 0;
  std::size_t cols = 1;
  constexpr Shape() = default;
  constexpr Shape(std::size_t r, std::size_t c = 1) : rows(r), cols(c) {}
  constexpr std::size_t elements() const noexcept { return rows * cols; }
  friend constexpr bool operator==(Shape a, Shape b) noexcept { return a.rows == b.rows && a.cols == b.cols; }
  friend constexpr bool operator!=(Shape a, Shape b) noexcept { return !(a == b); }
};

/// Row index type of sparse gradients and lookups.
using index_t = std::int64_t;

}  // namespace parallax
