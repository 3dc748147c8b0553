#pragma once
// Helpers shared by the tests: the job's context, verdicts agreed across
// ranks, and the list of memory spaces a test is instantiated for.

#include <parallax/parallax.hpp>

#include <catch2/catch.hpp>

#include <mpi.h>

#include <string>
#include <vector>

namespace px = parallax;

namespace test {

/// One Context for the whole test binary (MPI is initialised by main.cpp).
inline px::Context& world() {
  static px::Context ctx(MPI_COMM_WORLD);
  return ctx;
}

/// True on every rank iff `ok` is true on every rank: collective.
inline bool all_ranks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all == 1;
}

/// Runs `f`, expecting it to throw parallax::error on this rank; returns the
/// message ("" if nothing was thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const px::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace test

#if PARALLAX_HAS_CUDA
#define PARALLAX_TEST_SPACES px::HostSpace, px::CudaSpace
#else
#define PARALLAX_TEST_SPACES px::HostSpace
#endif
