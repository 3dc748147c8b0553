#pragma once
/// @file
/// Which GPU a rank uses. The CUDA engines call select_device() when they
/// are constructed: rank r of the L ranks on a host takes device r mod D of
/// the D devices it sees (CUDA_VISIBLE_DEVICES narrows them). engine::Nccl
/// needs a device of its own per rank of an NCCL node (NCCL refuses two
/// ranks of one communicator on one GPU of one node), so it throws
/// parallax::error when L > D; engine::MpiStaged lets ranks share a device.
/// NCCL takes a host's ranks for one node unless their `NCCL_HOSTID`s
/// differ: nccl_node_on_host() sees them as NCCL does, so a test launcher
/// that gives each rank its own NCCL_HOSTID (tests/engine/nccl_node_per_rank.sh)
/// runs several ranks of engine::Nccl on one GPU, joined by NCCL's network
/// transport. nvcc only.

#include <parallax/config.hpp>

#if !PARALLAX_HAS_CUDA
#error "parallax/cuda/device.cuh needs nvcc (a CUDA translation unit of a PARALLAX_ENABLE_CUDA build)"
#endif

#include <parallax/cuda/error.cuh>
#include <parallax/detail/mpi.hpp>
#include <parallax/error.hpp>

#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace parallax {

/// Whether ranks on one host may use the same GPU.
enum class DeviceSharing {
  exclusive,  ///< one GPU per rank (engine::Nccl); more ranks than GPUs is an error
  shared,     ///< ranks take GPUs round-robin and may share one (engine::MpiStaged)
};

/// A rank's place among the ranks of its host, as the GPU placement sees it.
struct LocalRank {
  int rank = 0;  ///< index among the ranks of this host, 0-based
  int size = 1;  ///< ranks on this host
};

/// This rank's place on its *real* host: the ranks that share memory with it
/// (MPI_COMM_TYPE_SHARED), whatever hosts a Context emulates for tests
/// (ContextOptions::ranks_per_host), since GPUs belong to real hosts. Equals
/// Topology::local_rank()/local_size() when no hosts are emulated.
/// Collective over `comm`.
inline LocalRank local_rank_on_host(MPI_Comm comm) {
  int rank = 0;
  PARALLAX_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm shared = MPI_COMM_NULL;
  PARALLAX_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  LocalRank out;
  MPI_Comm_rank(shared, &out.rank);
  MPI_Comm_size(shared, &out.size);
  MPI_Comm_free(&shared);
  return out;
}

/// This rank's place among the ranks NCCL takes for one node: those of its
/// real host (local_rank_on_host()) whose `NCCL_HOSTID` environment variable
/// has the same value (unset counts as one value), as NCCL compares host
/// hashes. Without NCCL_HOSTID it equals local_rank_on_host(). Collective
/// over `comm` (an all-gather of each rank's value among its host's ranks).
inline LocalRank nccl_node_on_host(MPI_Comm comm) {
  int rank = 0;
  PARALLAX_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_Comm shared = MPI_COMM_NULL;
  PARALLAX_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  int me = 0, size = 0;
  MPI_Comm_rank(shared, &me);
  MPI_Comm_size(shared, &size);
  constexpr int width = 256;  // values are compared by their first 255 characters
  std::string mine(width, '\0');
  if (const char* id = std::getenv("NCCL_HOSTID"))
    std::memcpy(mine.data(), id, std::min<std::size_t>(std::strlen(id), width - 1));
  else
    mine[width - 1] = '\1';  // unset differs from every value, the empty one included
  std::string all(static_cast<std::size_t>(width) * size, '\0');
  const int status = MPI_Allgather(mine.data(), width, MPI_CHAR, all.data(), width, MPI_CHAR, shared);
  MPI_Comm_free(&shared);
  PARALLAX_MPI_CHECK(status);
  LocalRank out{0, 0};
  for (int r = 0; r < size; ++r) {
    if (all.compare(static_cast<std::size_t>(r) * width, width, mine) != 0) continue;
    if (r < me) ++out.rank;
    ++out.size;
  }
  return out;
}

/// The device ordinal for local rank `local.rank` of `local.size` on a host
/// with `devices` GPUs: local.rank mod devices. Throws parallax::error when
/// there is no GPU, or when `sharing` is exclusive and the host runs more
/// ranks than it has GPUs; `engine` names the caller in the message.
inline int choose_device(LocalRank local, int devices, DeviceSharing sharing, const char* engine) {
  PARALLAX_EXPECTS(devices > 0, "parallax: ", engine, " needs a CUDA device, but this process sees none (",
                   "local rank ", local.rank, " of ", local.size, "; check CUDA_VISIBLE_DEVICES and the driver)");
  PARALLAX_EXPECTS(sharing == DeviceSharing::shared || local.size <= devices, "parallax: ", engine,
                   " needs one GPU per rank, but this host runs ", local.size, " ranks and has ", devices,
                   devices == 1 ? " GPU" : " GPUs", "; start at most ", devices,
                   " ranks per host, or use engine::MpiStaged, which lets ranks share a GPU");
  return local.rank % devices;
}

/// Picks this rank's GPU (choose_device over the devices this process sees)
/// and makes it current for the calling thread. Returns its ordinal.
inline int select_device(LocalRank local, DeviceSharing sharing, const char* engine) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    devices = 0;
  } else if (status != cudaSuccess) {
    detail::throw_cuda_error(status, "cudaGetDeviceCount(&devices)", __FILE__, __LINE__,
                             detail::concat(engine, " looking for its GPU"));
  }
  const int device = choose_device(local, devices, sharing, engine);
  PARALLAX_CUDA_CHECK(cudaSetDevice(device));
  return device;
}

/// The name of a device (cudaGetDeviceProperties), for reports.
inline std::string device_name(int device) {
  cudaDeviceProp prop{};
  PARALLAX_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

}  // namespace parallax
