#pragma once
/// @file
/// Where the portable examples (01-03) run: the memory space their variables
/// live in and the engine their trainer uses.
///
/// The host build (g++) uses HostSpace and engine::Mpi's backend. The CUDA
/// twin of an example (the same source compiled by nvcc, `<name>_cuda`) uses
/// CudaSpace and engine::MpiStaged's (device memory through pinned host
/// buffers: works with any number of ranks per GPU) when the CUDA engines are
/// part of this parallax; examples/CMakeLists.txt defines
/// PARALLAX_EXAMPLES_CUDA_ENGINE when it finds them. Without them the twin
/// trains on the host, so it still builds and runs.
///
/// Each engine is the facade over its backend decorated by link::Emulated
/// (tools/link), so that a benchmark of an example can emulate a cluster's
/// links between emulated hosts (PARALLAX_LINK, docs/cluster.md); without a
/// link it is the plain engine.

#include <parallax/link/emulated.hpp>
#include <parallax/parallax.hpp>

namespace examples {

namespace px = parallax;

/// The engine over host memory (what a host-only part of an example uses).
using HostEngine = px::engine::Comm<px::link::Emulated<px::engine::backend::Mpi>>;
#if PARALLAX_HAS_CUDA && defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
using DefaultSpace = px::CudaSpace;
using DefaultEngine = px::engine::Comm<px::link::Emulated<px::engine::backend::MpiStaged>>;
#else
using DefaultSpace = px::HostSpace;
using DefaultEngine = HostEngine;
#endif

/// "host" or "cuda", for the examples' banners.
inline const char* space_name() { return DefaultSpace::name; }

}  // namespace examples
