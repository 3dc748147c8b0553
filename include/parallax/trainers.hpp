#pragma once
/// @file
/// The common trainers, compiled once: include this header instead of (or
/// beside) <parallax/parallax.hpp> in the files that create or drive a
/// Trainer, and link the CMake target parallax::trainers. That target is a
/// library holding explicit instantiations of
///
///   Trainer<arch::Hybrid | arch::AllReduce | arch::PS, optim::Sgd | Momentum | Adagrad | Adam | AdagradAdamW>
///   (engine::Mpi, host memory), the synchronizers those place float
///   variables in, and Checkpoints<engine::Mpi>,
///
/// and it defines PARALLAX_TRAINERS_LIBRARY, under which this header declares
/// them `extern template`: a file that includes it compiles none of that
/// code again: the README program compiled in a median 16.0 s of CPU instead
/// of 21.3 s (README, "Compile time"; docs/benchmarks.md). Without the target (the macro unset) the
/// header is the umbrella header and nothing else, so code that includes it
/// builds either way. Member templates (the trainer's constructor, lookup)
/// still compile where they are called, as do the engine's and the
/// context's inline functions.

#include <parallax/parallax.hpp>

/// The explicit instantiations of parallax::trainers for one optimizer `O`:
/// `PARALLAX_TRAINERS_FOR(extern, O)` declares them, `PARALLAX_TRAINERS_FOR(, O)`
/// defines them (in the library's sources).
#define PARALLAX_TRAINERS_FOR(EXTERN, O)                                                              \
  EXTERN template class ::parallax::Trainer<::parallax::arch::Hybrid, O>;                             \
  EXTERN template class ::parallax::Trainer<::parallax::arch::AllReduce, O>;                          \
  EXTERN template class ::parallax::Trainer<::parallax::arch::PS, O>;                                 \
  EXTERN template class ::parallax::policy::RingSynchronizer<::parallax::engine::Mpi, O>;             \
  EXTERN template class ::parallax::policy::GatherSynchronizer<::parallax::engine::Mpi, O>;           \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>;

/// What parallax::trainers holds that does not depend on the optimizer.
#define PARALLAX_TRAINERS_COMMON(EXTERN)                                   \
  EXTERN template class ::parallax::Checkpoints<::parallax::engine::Mpi>;  \
  EXTERN template class ::parallax::TableGroup<float, ::parallax::engine::Mpi>; \
  EXTERN template class ::parallax::FusedAllReducer<::parallax::engine::Mpi>;

#if defined(PARALLAX_TRAINERS_LIBRARY) && PARALLAX_TRAINERS_LIBRARY
PARALLAX_TRAINERS_COMMON(extern)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Sgd)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Momentum)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Adagrad)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Adam)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::AdagradAdamW)
#endif
