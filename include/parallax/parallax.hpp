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

#include <parallax/comm_stats.hpp>
#include <parallax/context.hpp>
#include <parallax/engine/engine.hpp>
#include <parallax/engine/mpi.hpp>
#include <parallax/error.hpp>
#include <parallax/init.hpp>
#include <parallax/policy/allgatherv.hpp>
#include <parallax/policy/policy.hpp>
#include <parallax/policy/ring_allreduce.hpp>
#include <parallax/space.hpp>
#include <parallax/sparse_grad.hpp>
#include <parallax/types.hpp>
#include <parallax/variable.hpp>
