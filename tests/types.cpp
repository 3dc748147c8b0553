// types.hpp: sparsity traits, element types, shapes.
#include "support.hpp"

static_assert(px::is_sparse_v<px::Sparse>);
static_assert(!px::is_sparse_v<px::Dense>);
static_assert(px::is_sparse_v<px::Variable<px::Sparse, float>>);
static_assert(!px::is_sparse_v<px::Variable<px::Dense, double>>);
static_assert(!px::is_sparse_v<int>);
static_assert(px::is_sparsity_v<px::Dense> && px::is_sparsity_v<px::Sparse> && !px::is_sparsity_v<int>);
static_assert(px::detail::is_any_of_v<float, int, float> && !px::detail::is_any_of_v<float, double, int>);
static_assert(!px::detail::is_any_of_v<float>);
static_assert(px::data_type_of_v<float> == px::DataType::f32);
static_assert(px::data_type_of_v<std::int64_t> == px::DataType::i64);
static_assert(px::size_of(px::DataType::f64) == 8);
static_assert(px::data_type_of_v<px::bf16> == px::DataType::bf16);
static_assert(px::data_type_of_v<px::fp16> == px::DataType::f16);
static_assert(px::is_floating(px::DataType::bf16) && !px::is_floating(px::DataType::i32));

TEST_CASE("Shape counts elements and compares", "[types]") {
  constexpr px::Shape m{3, 4};
  STATIC_REQUIRE(m.elements() == 12);
  CHECK(px::Shape{5}.cols == 1);
  CHECK(px::Shape{5} == px::Shape(5, 1));
  CHECK(px::Shape{5, 2} != px::Shape(2, 5));
}

TEST_CASE("DataType names and sizes", "[types]") {
  CHECK(std::string(px::to_string(px::DataType::f32)) == "f32");
  CHECK(px::size_of(px::DataType::u8) == 1);
  CHECK(px::size_of(px::DataType::i32) == 4);
  CHECK(px::size_of(px::DataType::bf16) == 2);
  CHECK(px::size_of(px::DataType::f16) == 2);
  CHECK(std::string(px::to_string(px::DataType::bf16)) == "bf16");
  CHECK(std::string(px::to_string(px::DataType::f16)) == "f16");
}
