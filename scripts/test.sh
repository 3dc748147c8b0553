#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds
# the host configuration and runs every test (1-4 MPI ranks each), then
# compiles and links the CUDA configuration when nvcc is present (its tests
# need a GPU: scripts/gpu-check.sh runs them).
#
#   scripts/test.sh              # everything
#   PARALLAX_SKIP_CUDA=1 scripts/test.sh   # host build and tests only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
jobs="$(nproc)"

echo "== host build (HostSpace, engine::Mpi)"
cmake -S "$root" -B "$root/build/host" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
cmake --build "$root/build/host" -j "$jobs"
echo "== host tests"
(cd "$root/build/host" && ctest -LE gpu --output-on-failure -j "$jobs")

if [ -z "${PARALLAX_SKIP_CUDA:-}" ] && command -v nvcc >/dev/null; then
  echo "== CUDA build (compile and link only; no GPU needed)"
  cmake -S "$root" -B "$root/build/cuda" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=ON >/dev/null
  cmake --build "$root/build/cuda" -j "$jobs"
fi
echo "== all tests passed"
