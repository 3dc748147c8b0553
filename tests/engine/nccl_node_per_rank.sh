#!/bin/sh
# nccl_node_per_rank.sh PROGRAM [ARG...]: a test launcher, put between
# mpiexec and a program (`mpiexec -n 3 nccl_node_per_rank.sh test_engine_nccl`),
# that gives each rank its own NCCL_HOSTID. NCCL then takes the ranks for
# separate nodes and lets them share one GPU, joined by its network transport
# (sockets over the loopback interface unless NCCL_SOCKET_IFNAME says
# otherwise), so engine::Nccl runs at several ranks on a one-GPU machine.
# For tests only: on real hardware each rank has its own GPU, and NCCL's
# faster transports (NVLink, shared memory) need the ranks of a host to share
# one host id.
#
# With PARALLAX_NCCL_DEBUG_DIR set, NCCL logs its set-up (NCCL_DEBUG=INFO,
# INIT and NET) to a file per process there, which names the transport each
# channel took (scripts/gpu-check.sh reports it).
set -eu
rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-}}"
if [ -z "$rank" ]; then
  echo "nccl_node_per_rank.sh: no rank in the environment (PMI_RANK); start it under mpiexec" >&2
  exit 2
fi
export NCCL_HOSTID="parallax-test-node-$rank"
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
if [ -n "${PARALLAX_NCCL_DEBUG_DIR:-}" ]; then
  mkdir -p "$PARALLAX_NCCL_DEBUG_DIR"
  export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_DEBUG_FILE="$PARALLAX_NCCL_DEBUG_DIR/nccl.$rank.%p.log"
fi
exec "$@"
