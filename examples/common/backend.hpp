#pragma once
/// @file
/// Where the portable examples (01-03) run: the memory space their variables
/// live in and the engine their trainer uses.
///
/// The host build (g++) uses HostSpace and engine::Mpi. The CUDA twin of an
/// example (the same source compiled by nvcc, `<name>_cuda`) uses CudaSpace
/// and engine::MpiStaged (device memory through pinned host buffers: works
/// with any number of ranks per GPU) when the CUDA engines are part of this
/// parallax; examples/CMakeLists.txt defines PARALLAX_EXAMPLES_CUDA_ENGINE
/// when it finds them. Without them the twin trains on the host, so it still
/// builds and runs.

#include <parallax/parallax.hpp>

namespace examples {

namespace px = parallax;

#if PARALLAX_HAS_CUDA && defined(PARALLAX_EXAMPLES_CUDA_ENGINE) && PARALLAX_EXAMPLES_CUDA_ENGINE
using DefaultSpace = px::CudaSpace;
using DefaultEngine = px::engine::MpiStaged;
#else
using DefaultSpace = px::HostSpace;
using DefaultEngine = px::engine::Mpi;
#endif

/// "host" or "cuda", for the examples' banners.
inline const char* space_name() { return DefaultSpace::name; }

}  // namespace examples
