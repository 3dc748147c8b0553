#pragma once
// MPI and 16-bit floats. MPI has no bf16 or fp16 type and no reduction over
// one; this gives an MPI engine what it needs for DataType::bf16 and
// DataType::f16:
//
//   half_datatype()            the datatype that moves them (2 bytes each);
//   half_op(type, op)          an MPI_Op over that datatype: sum, max, min,
//                              computed in float per element, the sum
//                              rounded to the 16-bit type at every
//                              combination (16 bits on the wire);
//   allreduce_half_in_float()  the accurate sum: widened to float, summed
//                              by MPI in float, rounded once (32 bits on
//                              the wire).
//
// Which sum. With half_op the sum is rounded to 16 bits each time MPI
// combines two contributions, so the result depends on the order MPI
// combines them in (its algorithm, the rank count) and can differ from
// summing everything in float and rounding once by up to a unit in the last
// place per combination. Each combination is the correctly rounded sum of
// its two 16-bit operands: float's 24 significant bits are more than twice
// bf16's 8 and fp16's 11 plus one, so rounding the float sum to 16 bits
// does not round twice (S. Figueroa, "When is double rounding innocuous?",
// 1995). allreduce_half_in_float() rounds once: wherever the float sum is
// exact it equals one process's float sum rounded, at any rank count and in
// any order; it moves twice the bytes. A ring all-reduce that
// keeps its partial sums in float is the same thing with the ring's order.
// Engines use the float path where the design promises the result of one
// process, and half_op where the bytes on the wire matter more (compressed
// exchanges).
//
// The datatype and the operators are made at first use and kept until the
// process ends (MPI frees them at MPI_Finalize); MPI must be initialised.

#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/half.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <cstddef>
#include <type_traits>
#include <vector>

namespace parallax::detail {

/// Frees `handle` with `Free` when MPI_Finalize runs (it deletes
/// MPI_COMM_SELF's attributes first), so that handles made once per
/// process leave no leak report behind (MPICH's yaksa counts them).
template <class Handle, int (*Free)(Handle*)>
void free_at_finalize(Handle handle) {
  int key = MPI_KEYVAL_INVALID;
  MPI_Comm_delete_attr_function* erase = [](MPI_Comm, int, void* value, void*) -> int {
    auto* h = static_cast<Handle*>(value);
    Free(h);
    delete h;
    return MPI_SUCCESS;
  };
  if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, erase, &key, nullptr) != MPI_SUCCESS) return;
  MPI_Comm_set_attr(MPI_COMM_SELF, key, new Handle(handle));
}

/// The MPI datatype of bf16 and fp16 elements: a committed contiguous type
/// of 2 bytes. Not MPI_UINT16_T: MPI's predefined operators refuse a
/// derived type, so a reduction that forgets half_op fails instead of
/// adding bit patterns as integers.
inline MPI_Datatype half_datatype() {
  static const MPI_Datatype type = [] {
    MPI_Datatype t = MPI_DATATYPE_NULL;
    PARALLAX_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t));
    PARALLAX_MPI_CHECK(MPI_Type_commit(&t));
    free_at_finalize<MPI_Datatype, &MPI_Type_free>(t);
    return t;
  }();
  return type;
}

/// `inout[i] = inout[i] op in[i]` for n elements of H, in float: one
/// combination of half_op, callable without MPI.
template <class H, ReduceOp Op>
void combine_half(const H* in, H* inout, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float a = in[i], b = inout[i];
    float r;
    if constexpr (Op == ReduceOp::sum)
      r = a + b;
    else if constexpr (Op == ReduceOp::max)
      r = b < a ? a : b;
    else
      r = a < b ? a : b;
    inout[i] = H(r);
  }
}

template <class H, ReduceOp Op>
void mpi_combine_half(void* in, void* inout, int* len, MPI_Datatype*) {
  combine_half<H, Op>(static_cast<const H*>(in), static_cast<H*>(inout), static_cast<std::size_t>(*len));
}

template <class H, ReduceOp Op>
MPI_Op make_half_op() {
  static const MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    PARALLAX_MPI_CHECK(MPI_Op_create(&mpi_combine_half<H, Op>, /*commute=*/1, &o));
    free_at_finalize<MPI_Op, &MPI_Op_free>(o);
    return o;
  }();
  return op;
}

template <class H>
MPI_Op half_op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return make_half_op<H, ReduceOp::sum>();
    case ReduceOp::max: return make_half_op<H, ReduceOp::max>();
    case ReduceOp::min: return make_half_op<H, ReduceOp::min>();
  }
  throw error(concat("no MPI operator for reduction #", static_cast<int>(op), " of 16-bit floats"));
}

/// The MPI_Op that reduces `t` (bf16 or f16) elements of half_datatype()
/// with `op`. Throws parallax::error for any other type.
inline MPI_Op half_op(DataType t, ReduceOp op) {
  if (t == DataType::bf16) return half_op_of<bf16>(op);
  if (t == DataType::f16) return half_op_of<fp16>(op);
  throw error(concat("half_op: ", to_string(t), " is not a 16-bit float type (bf16 or f16)"));
}

/// Whether `t` is one of the 16-bit floats, which MPI has no type for.
constexpr bool is_half(DataType t) noexcept { return t == DataType::bf16 || t == DataType::f16; }

/// The MPI datatype an engine moves `t`'s elements as: half_datatype() for
/// the 16-bit floats, MPI's own type otherwise.
inline MPI_Datatype mpi_type_for(DataType t) { return is_half(t) ? half_datatype() : mpi_datatype(t); }

/// The MPI_Op an engine reduces `t`'s elements with: half_op() for the
/// 16-bit floats (each combination done in float and rounded to nearest
/// even, so a sum's last bit depends on the ranks' combining order), MPI's
/// own otherwise.
inline MPI_Op mpi_op_for(DataType t, ReduceOp op) { return is_half(t) ? half_op(t, op) : mpi_op(op); }

/// Sums n elements of `t` (bf16 or f16) over `comm` in float and rounds
/// each total once to nearest even: out = round(sum over ranks of in). `in`
/// may equal `out`. Moves n floats per rank (twice half_op's bytes).
inline void allreduce_half_in_float(const void* in, void* out, std::size_t n, DataType t, MPI_Comm comm) {
  PARALLAX_EXPECTS(t == DataType::bf16 || t == DataType::f16, "allreduce_half_in_float: ", to_string(t),
                   " is not a 16-bit float type (bf16 or f16)");
  std::vector<float> wide(n);
  auto widen = [&](const auto* h) {
    for (std::size_t i = 0; i < n; ++i) wide[i] = h[i];
  };
  auto narrow = [&](auto* h) {
    using H = std::remove_pointer_t<decltype(h)>;
    for (std::size_t i = 0; i < n; ++i) h[i] = H(wide[i]);
  };
  if (t == DataType::bf16)
    widen(static_cast<const bf16*>(in));
  else
    widen(static_cast<const fp16*>(in));
  PARALLAX_MPI_CHECK(
      PARALLAX_MPI_C(MPI_Allreduce)(MPI_IN_PLACE, wide.data(), to_mpi_count(n), MPI_FLOAT, MPI_SUM, comm));
  if (t == DataType::bf16)
    narrow(static_cast<bf16*>(out));
  else
    narrow(static_cast<fp16*>(out));
}

}  // namespace parallax::detail
