// bench/row_kernels.cpp's baselines that need other compile flags, each the
// library's Adagrad row update in a translation unit of its own
// (bench/CMakeLists.txt): row_kernels_errno.cpp with -fmath-errno, the
// default of GCC and Clang on Linux; row_kernels_baseline_isa.cpp (this file
// again) with PARALLAX_NO_ISA_CLONES, the kernel built for the baseline
// x86-64 only. Its kernel is a type local to this file, so this file's
// for_each_rows is its own instantiation, not one the linker might share
// with row_kernels.cpp.
#include "row_kernels.hpp"

namespace px = parallax;

namespace {
struct Update : px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float, px::optim::Adagrad::slots> {};
}  // namespace

#if defined(PARALLAX_NO_ISA_CLONES)
void px::bench::adagrad_rows_baseline_isa(RowWorkload& w, std::size_t s) {
#else
void px::bench::adagrad_rows_math_errno(RowWorkload& w, std::size_t s) {
#endif
  px::for_each_rows(px::Exec<px::HostSpace>{}, RowWorkload::touched, RowWorkload::cols, adagrad_update<Update>(w, s));
}
