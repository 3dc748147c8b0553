#pragma once
/// @file
/// The common trainers, compiled once: include this header instead of (or
/// before) <parallax/parallax.hpp> in the files that create the Context or
/// create or drive a Trainer, and link the CMake target parallax::trainers.
/// That target is a library holding explicit instantiations of
///
///   Trainer<arch::Hybrid | arch::AllReduce | arch::PS, optim::Sgd | Momentum | Adagrad | Adam | AdagradAdamW>
///   (engine::Mpi, host memory), the synchronizers those place float
///   variables in, what their constructors and lookups reach for float
///   variables, the engine, Checkpoints<engine::Mpi>, and the Context's
///   constructors and destructor (context.hpp),
///
/// and it defines PARALLAX_TRAINERS_LIBRARY, under which this header declares
/// them `extern template` (and context.hpp leaves those members undefined):
/// a file that includes it compiles none of that code again (README,
/// "Compile time"). Without the target (the macro unset) the header is the
/// umbrella header and nothing else, so code that includes it builds either
/// way. The trainer's constructor for the file's own variables still
/// compiles where it is called, as do the small inline functions it calls.

#include <parallax/parallax.hpp>

/// The explicit instantiations of parallax::trainers for one optimizer `O`:
/// `PARALLAX_TRAINERS_FOR(extern, O)` declares them, `PARALLAX_TRAINERS_FOR(, O)`
/// defines them (in the library's sources). Besides the class templates, the
/// pieces a trainer's constructor and lookups reach: GCC and Clang still
/// instantiate an `extern` inline function where it is called, to inline it,
/// and a small one inlined into the user's file would bring its callees
/// with it; so each step down that path (registering a variable, a
/// synchronizer's add and lookup, the sharded lookup's gather, route and
/// serve) and the nested classes whose virtual tables those would emit
/// are declared too, for float variables in host memory.
#define PARALLAX_TRAINERS_FOR(EXTERN, O)                                                              \
  EXTERN template class ::parallax::Trainer<::parallax::arch::Hybrid, O>;                             \
  EXTERN template class ::parallax::Trainer<::parallax::arch::AllReduce, O>;                          \
  EXTERN template class ::parallax::Trainer<::parallax::arch::PS, O>;                                 \
  EXTERN template class ::parallax::policy::RingSynchronizer<::parallax::engine::Mpi, O>;             \
  EXTERN template class ::parallax::policy::GatherSynchronizer<::parallax::engine::Mpi, O>;           \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>;          \
  PARALLAX_TRAINERS_ARCH_(EXTERN, ::parallax::arch::Hybrid, O)                                        \
  PARALLAX_TRAINERS_ARCH_(EXTERN, ::parallax::arch::AllReduce, O)                                     \
  PARALLAX_TRAINERS_ARCH_(EXTERN, ::parallax::arch::PS, O)                                            \
  PARALLAX_TRAINERS_POLICIES_(EXTERN, O)

/// What parallax::trainers holds that does not depend on the optimizer.
#define PARALLAX_TRAINERS_COMMON(EXTERN)                                                               \
  EXTERN template class ::parallax::Checkpoints<::parallax::engine::Mpi>;                              \
  EXTERN template class ::parallax::policy::sharded::TableGroup<float, ::parallax::engine::Mpi>;                        \
  EXTERN template class ::parallax::policy::ring::FusedAllReducer<::parallax::engine::Mpi>;                       \
  EXTERN template class ::parallax::engine::Comm<::parallax::engine::backend::Mpi>;                    \
  EXTERN template parallax::engine::Comm<::parallax::engine::backend::Mpi>::Comm(                      \
      const ::parallax::Context&, ::parallax::engine::Options);                                        \
  EXTERN template class ::parallax::policy::Synchronizer<::parallax::engine::Mpi>;                     \
  EXTERN template PARALLAX_TRAINERS_SPARSE_::Variable(const ::parallax::Context&, std::string,         \
                                                     ::parallax::Shape, ::parallax::Init);             \
  EXTERN template PARALLAX_TRAINERS_DENSE_::Variable(const ::parallax::Context&, std::string,          \
                                                    ::parallax::Shape, ::parallax::Init);              \
  EXTERN template class ::parallax::policy::MemberOf<PARALLAX_TRAINERS_SPARSE_>;                       \
  EXTERN template class ::parallax::policy::MemberOf<PARALLAX_TRAINERS_DENSE_>;                        \
  EXTERN template class ::parallax::policy::sharded::DenseShards<float, ::parallax::engine::Mpi>;                       \
  EXTERN template class ::parallax::policy::ring::RingAllReducer<::parallax::engine::Mpi>;                        \
  EXTERN template class ::parallax::policy::sharded::RowExchange<float, ::parallax::engine::Mpi>;               \
  EXTERN template void parallax::detail::agree_on_variables<::parallax::engine::Mpi>(                  \
      ::parallax::engine::Mpi&, const std::vector<::parallax::detail::VarRecord>&);

// Helpers of the two macros above.
#define PARALLAX_TRAINERS_SPARSE_ ::parallax::Variable<::parallax::Sparse, float>
#define PARALLAX_TRAINERS_DENSE_ ::parallax::Variable<::parallax::Dense, float>
#define PARALLAX_TRAINERS_ROWS_ ::parallax::Rows<float, ::parallax::HostSpace>

/// One architecture `A` with optimizer `O`: the trainer's parts, registering
/// each kind of variable, and its lookups of a sparse one.
#define PARALLAX_TRAINERS_ARCH_(EXTERN, A, O)                                                          \
  EXTERN template class ::parallax::trainer::Registry<A, ::parallax::engine::Mpi, O>;                  \
  EXTERN template class ::parallax::trainer::Steps<A, ::parallax::engine::Mpi, O>;                     \
  EXTERN template class ::parallax::trainer::Saves<A, ::parallax::engine::Mpi, O>;                     \
  EXTERN template void parallax::trainer::Registry<A, ::parallax::engine::Mpi, O>::add(                \
      ::parallax::engine::Mpi&, const O&, const ::parallax::TrainerOptions&, const void*,              \
      PARALLAX_TRAINERS_SPARSE_&);                                                                     \
  EXTERN template void parallax::trainer::Registry<A, ::parallax::engine::Mpi, O>::add(                \
      ::parallax::engine::Mpi&, const O&, const ::parallax::TrainerOptions&, const void*,              \
      PARALLAX_TRAINERS_DENSE_&);                                                                      \
  EXTERN template PARALLAX_TRAINERS_ROWS_ parallax::Trainer<A, O>::lookup(                             \
      PARALLAX_TRAINERS_SPARSE_&, const ::parallax::index_t*, std::size_t);                            \
  EXTERN template PARALLAX_TRAINERS_ROWS_ parallax::Trainer<A, O>::lookup(                             \
      PARALLAX_TRAINERS_SPARSE_&, const std::vector<::parallax::index_t>&);                            \
  EXTERN template std::vector<PARALLAX_TRAINERS_ROWS_> parallax::Trainer<A, O>::lookup(                \
      const ::parallax::Lookup<PARALLAX_TRAINERS_SPARSE_>*, std::size_t);

/// The synchronizers' members for float variables under optimizer `O`.
#define PARALLAX_TRAINERS_POLICIES_(EXTERN, O)                                                         \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::Group<float>;     \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::TableMember<float>; \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::Batch<float>;     \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::BagBatch<float>;  \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::TableOf<          \
      PARALLAX_TRAINERS_SPARSE_>;                                                                      \
  EXTERN template class ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::DenseOf<          \
      PARALLAX_TRAINERS_DENSE_>;                                                                       \
  EXTERN template class ::parallax::policy::RingSynchronizer<::parallax::engine::Mpi, O>::DenseOf<             \
      PARALLAX_TRAINERS_DENSE_>;                                                                       \
  EXTERN template class ::parallax::policy::GatherSynchronizer<::parallax::engine::Mpi, O>::Of<                \
      PARALLAX_TRAINERS_SPARSE_>;                                                                      \
  EXTERN template class ::parallax::policy::DenseReplica<PARALLAX_TRAINERS_DENSE_, ::parallax::engine::Mpi, O>; \
  EXTERN template class ::parallax::policy::SparseReplica<PARALLAX_TRAINERS_SPARSE_, ::parallax::engine::Mpi, O>; \
  EXTERN template ::parallax::policy::Member&                                                          \
  parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::add(PARALLAX_TRAINERS_SPARSE_);   \
  EXTERN template ::parallax::policy::Member&                                                          \
  parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::add(PARALLAX_TRAINERS_DENSE_);    \
  EXTERN template ::parallax::policy::Member&                                                          \
  parallax::policy::RingSynchronizer<::parallax::engine::Mpi, O>::add(PARALLAX_TRAINERS_DENSE_);       \
  EXTERN template ::parallax::policy::Member&                                                          \
  parallax::policy::GatherSynchronizer<::parallax::engine::Mpi, O>::add(PARALLAX_TRAINERS_SPARSE_);    \
  EXTERN template std::vector<PARALLAX_TRAINERS_ROWS_>                                                 \
  parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::lookup(                           \
      const ::parallax::Lookup<PARALLAX_TRAINERS_SPARSE_>*, std::size_t);                              \
  EXTERN template std::vector<PARALLAX_TRAINERS_ROWS_>                                                 \
  parallax::policy::GatherSynchronizer<::parallax::engine::Mpi, O>::lookup(                            \
      const ::parallax::Lookup<PARALLAX_TRAINERS_SPARSE_>*, std::size_t);                              \
  EXTERN template void parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::gather(      \
      ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::Batch<float>&,              \
      const ::parallax::Lookup<PARALLAX_TRAINERS_SPARSE_>*, std::size_t, bool, bool);                  \
  EXTERN template void parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::route(       \
      ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::Batch<float>&);             \
  EXTERN template std::vector<PARALLAX_TRAINERS_ROWS_>                                                 \
  parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::serve(                            \
      ::parallax::policy::ShardedSynchronizer<::parallax::engine::Mpi, O>::Batch<float>&);

#if defined(PARALLAX_TRAINERS_LIBRARY) && PARALLAX_TRAINERS_LIBRARY
PARALLAX_TRAINERS_COMMON(extern)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Sgd)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Momentum)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Adagrad)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::Adam)
PARALLAX_TRAINERS_FOR(extern, ::parallax::optim::AdagradAdamW)
#endif
