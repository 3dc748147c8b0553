// bench/row_kernels.cpp's baseline for the errno flag: the same Adagrad row
// update, in a translation unit compiled with -fmath-errno (bench/CMakeLists.txt),
// the default of GCC and Clang on Linux. Its kernel is a type local to this
// file, so this file's for_each_rows is its own instantiation, not one the
// linker might share with row_kernels.cpp.
#include "row_kernels.hpp"

namespace px = parallax;

namespace {
struct ErrnoUpdate : px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float> {};
}  // namespace

void px::bench::adagrad_rows_math_errno(RowWorkload& w, std::size_t s) {
  px::for_each_rows(px::Exec<px::HostSpace>{}, RowWorkload::touched, RowWorkload::cols,
                    adagrad_update<ErrnoUpdate>(w, s));
}
