#pragma once
/// @file
/// The umbrella header: everything a training program needs.
///
///     #include <parallax/parallax.hpp>
///     namespace px = parallax;
///
/// It includes only portable headers. In translation units compiled by nvcc
/// it also brings in CudaSpace and, in CUDA configurations, engine::Nccl and
/// engine::MpiStaged (PARALLAX_HAS_CUDA, PARALLAX_HAS_NCCL).

#include <parallax/config.hpp>

#include <parallax/arch.hpp>
#include <parallax/async.hpp>
#include <parallax/bags.hpp>
#include <parallax/batch.hpp>
#include <parallax/checkpoint.hpp>
#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/dynamic/admission.hpp>
#include <parallax/dynamic/table.hpp>
#include <parallax/dynamic/variable.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/half.hpp>
#include <parallax/init.hpp>
#include <parallax/optim.hpp>
#include <parallax/options.hpp>
#include <parallax/partition.hpp>
#include <parallax/partition_plan.hpp>
#include <parallax/pipeline.hpp>
#include <parallax/policy/allgatherv.hpp>
#include <parallax/policy/allgatherv/gatherer.hpp>
#include <parallax/policy/allgatherv/synchronizer.hpp>
#include <parallax/policy/async_ps.hpp>
#include <parallax/policy/async_ps/clock.hpp>
#include <parallax/policy/async_ps/synchronizer.hpp>
#include <parallax/policy/dynamic_ps.hpp>
#include <parallax/policy/dynamic_ps/synchronizer.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/replicas.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/policy/ring_allreduce/fusion.hpp>
#include <parallax/policy/ring_allreduce/reducer.hpp>
#include <parallax/policy/ring_allreduce/synchronizer.hpp>
#include <parallax/policy/sharded_ps.hpp>
#include <parallax/policy/sharded_ps/dense_shards.hpp>
#include <parallax/policy/sharded_ps/synchronizer.hpp>
#include <parallax/space.hpp>
#include <parallax/sparse_grad.hpp>
#include <parallax/trainer.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>

#if PARALLAX_HAS_CUDA
#include <parallax/cuda/device.cuh>
#include <parallax/cuda/error.cuh>
#include <parallax/cuda/space.cuh>
#include <parallax/engine/mpi_staged.cuh>
#endif
#if PARALLAX_HAS_NCCL
#include <parallax/engine/nccl.cuh>
#endif
