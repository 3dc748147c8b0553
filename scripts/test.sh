#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds
# the host configuration and runs every test (1-4 MPI ranks each), runs the
# real-host cases across network namespaces (tests/cluster), runs the
# tests again under AddressSanitizer + UndefinedBehaviorSanitizer and the
# asynchronous-training and overlap tests under ThreadSanitizer (scripts/sanitize.sh),
# runs every libFuzzer target for a bounded time
# (scripts/fuzz.sh), then compiles and links the CUDA configuration when nvcc
# is present (its tests need a GPU: scripts/gpu-check.sh runs them).
#
#   scripts/test.sh                          # everything
#   PARALLAX_SKIP_CUDA=1 scripts/test.sh     # skip a stage: also
#   PARALLAX_SKIP_SANITIZE=1, PARALLAX_SKIP_TSAN=1, PARALLAX_SKIP_FUZZ=1, PARALLAX_SKIP_CLUSTER=1;
#   FUZZ_SECONDS=20 (per target)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
jobs="$(nproc)"
# Each stage prints how long it took, so CI time is easy to follow.
stage() {
  [ -n "${stage_name:-}" ] && echo "== $stage_name: $((SECONDS - stage_start)) s"
  echo "== $*"
  stage_name="$*" stage_start=$SECONDS
}

stage "host build (HostSpace, engine::Mpi)"
cmake -S "$root" -B "$root/build/host" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
cmake --build "$root/build/host" -j "$jobs"
stage "host tests"
(cd "$root/build/host" && ctest -LE "gpu|cluster" --output-on-failure -j "$jobs")

if [ -z "${PARALLAX_SKIP_CLUSTER:-}" ]; then
  # Jobs across network namespaces of this machine over TCP (scripts/cluster.sh):
  # 2 hosts x 2 ranks against emulated hosts, a checkpoint resharded from 2
  # hosts to 3, links cut and healed, a host killed. One at a time (they share
  # the hosts); each reports itself skipped where namespaces cannot be made.
  stage "real hosts (network namespaces, TCP; tests/cluster)"
  (cd "$root/build/host" && ctest -L cluster --output-on-failure)
fi

if [ -z "${PARALLAX_SKIP_SANITIZE:-}" ]; then
  stage "sanitizers (ASan + UBSan + LSan)"
  "$root/scripts/sanitize.sh"
fi

if [ -z "${PARALLAX_SKIP_TSAN:-}" ]; then
  stage "ThreadSanitizer (asynchronous training, overlap; 1-4 ranks)"
  SANITIZER=thread "$root/scripts/sanitize.sh"
fi

if [ -z "${PARALLAX_SKIP_FUZZ:-}" ]; then
  stage "fuzzing (libFuzzer, ${FUZZ_SECONDS:=20} s per target)"
  FUZZ_SECONDS="$FUZZ_SECONDS" "$root/scripts/fuzz.sh"
fi

if [ -z "${PARALLAX_SKIP_CUDA:-}" ] && command -v nvcc >/dev/null; then
  stage "CUDA build (compile and link only; no GPU needed)"
  # Nothing built here runs, so host code is compiled at -O0: nvcc spends
  # about half its time in the host compiler at -O3 (tests/trainer.cpp: 47 of
  # 89 s), 21 s at -O0. Device code is compiled for sm_90 alone: no code of
  # parallax's depends on __CUDA_ARCH__, and a second architecture took the
  # stage's time up by 70% (tests/policy/sharded_ps.cpp's twin: 124 s for
  # sm_80 and sm_90, 72 s for sm_90). scripts/gpu-check.sh builds Release for
  # PARALLAX_CUDA_ARCHITECTURES (80;90) in build/cuda.
  cmake -S "$root" -B "$root/build/cuda-check" -DCMAKE_BUILD_TYPE=None -DCMAKE_CUDA_FLAGS=-O0 \
    -DCMAKE_CXX_FLAGS=-O0 -DCMAKE_CUDA_ARCHITECTURES=90 -DPARALLAX_ENABLE_CUDA=ON >/dev/null
  cmake --build "$root/build/cuda-check" -j "$jobs"
fi
stage "all tests passed (total $SECONDS s)"
