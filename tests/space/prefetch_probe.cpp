// Compiled to assembly by prefetch.cmake (CTest space_prefetch_codegen), not
// run: each function asks for rows ahead the way the library's row kernels
// do, with a row width known only at run time, and the test checks that the
// compiler kept a prefetch instruction in every one of them.
#include <parallax/detail/algorithms.hpp>
#include <parallax/optim.hpp>

namespace px = parallax;

extern "C" void probe_prefetch_bytes(const float* p, std::size_t bytes) { px::prefetch_bytes(p, bytes); }

extern "C" void probe_row_update(const px::optim::detail::RowUpdate<px::optim::Adagrad::Rule<float>, float, 1>& u,
                                 std::size_t j) {
  u.prefetch(j);
}

extern "C" void probe_gather(const px::detail::GatherRows<float>& g, std::size_t j) { g.prefetch(j); }
