#pragma once
// MPI plumbing shared by the context and the MPI engines: the check macro,
// datatype and operator mapping, and large-count wrappers.

#include <parallax/error.hpp>
#include <parallax/types.hpp>

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <string>

namespace parallax::detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(len));
}

inline MPI_Datatype mpi_datatype(DataType t) {
  switch (t) {
    case DataType::f32: return MPI_FLOAT;
    case DataType::f64: return MPI_DOUBLE;
    case DataType::i32: return MPI_INT32_T;
    case DataType::i64: return MPI_INT64_T;
    case DataType::u8: return MPI_UINT8_T;
    case DataType::bf16:
    case DataType::f16: break;  // MPI has none: detail/half_reduce.hpp's half_datatype() and half_op()
  }
  return MPI_DATATYPE_NULL;
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

/// MPI 4 has large-count (`_c`) variants; older MPIs take int counts, which
/// parallax checks rather than truncating.
#if MPI_VERSION >= 4
using mpi_count = MPI_Count;
using mpi_displ = MPI_Aint;
#define PARALLAX_MPI_C(fn) fn##_c
#else
using mpi_count = int;
using mpi_displ = int;
#define PARALLAX_MPI_C(fn) fn
#endif

inline mpi_count to_mpi_count(std::size_t n) {
#if MPI_VERSION < 4
  PARALLAX_EXPECTS(n <= static_cast<std::size_t>(INT_MAX),
                   "message of ", n, " elements exceeds this MPI's int count limit (MPI < 4.0)");
#endif
  return static_cast<mpi_count>(n);
}

}  // namespace parallax::detail

/// Calls an MPI function and throws parallax::mpi_error with the MPI error
/// string, the call text, file and line when it does not return MPI_SUCCESS.
/// The communicators parallax uses have MPI_ERRORS_RETURN set.
#define PARALLAX_MPI_CHECK(call)                                                                   \
  do {                                                                                             \
    const int parallax_mpi_status_ = (call);                                                       \
    if (parallax_mpi_status_ != MPI_SUCCESS)                                                       \
      throw ::parallax::mpi_error("MPI", parallax_mpi_status_,                                     \
                                  ::parallax::detail::mpi_error_string(parallax_mpi_status_), #call, \
                                  __FILE__, __LINE__);                                             \
  } while (0)
