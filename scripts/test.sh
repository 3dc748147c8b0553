#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs dependencies, builds
# the host configuration and runs every test (1-4 MPI ranks each), runs the
# real-host cases across network namespaces (tests/cluster), runs the
# tests again under AddressSanitizer + UndefinedBehaviorSanitizer and the
# asynchronous-training and overlap tests under ThreadSanitizer (scripts/sanitize.sh),
# runs every libFuzzer target for a bounded time
# (scripts/fuzz.sh), then compiles the CUDA configuration when nvcc is
# present (its tests need a GPU: scripts/gpu-check.sh builds and runs them).
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
# The benchmark programs (but bench_soak, which a test runs) are built ahead
# (below), in a tree of their own, not in this stage. The tests compile at
# -O1, not Release's -O3: the optimiser still inlines, allocates registers
# and removes dead code, at much less CPU, and most of CI's time is
# compiling (docs/testing.md, "Build time"). Hence a tree of its own:
# build/host is Release, which the demo and the benchmark scripts build and
# time.
cmake -S "$root" -B "$root/build/test" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DPARALLAX_ENABLE_CUDA=OFF -DPARALLAX_BENCH_IN_ALL=OFF >/dev/null
cmake --build "$root/build/test" -j "$jobs"

# The builds of the later stages start now, one after another in the
# background, at idle priority (SCHED_IDLE: they get only the CPU the
# foreground leaves). The test stages leave much of it: ranks wait on
# deadlines, on killed or cut peers and on each other. Each stage waits for
# its build (ahead_wait), whose output is printed then.
ahead="$root/build/ahead"
rm -rf "$ahead" && mkdir -p "$ahead"
cuda_build() {
  # Nothing built here runs, so host code is compiled at -O0, where the host
  # compiler's share of nvcc's time is much smaller than at -O3. Device code
  # is compiled for sm_90 alone: no code of parallax's depends on
  # __CUDA_ARCH__, and each architecture more compiles the device code again
  # (docs/testing.md, "Build time"). scripts/gpu-check.sh builds Release for
  # PARALLAX_CUDA_ARCHITECTURES (80;90) in build/cuda. nvcc's host compiler
  # here is clang, the sanitizer stage's, whose passes take less time than
  # gcc's (docs/testing.md, "Build time"); gpu-check.sh's build, which runs,
  # keeps gcc. The CUDA twins of tests and examples stop after nvcc's front
  # ends (PARALLAX_CUDA_TWINS_COMPILE_ONLY: no host pass, no link); the
  # GPU-only tests, 04 and bench_gpu compile whole and link.
  "$root/scripts/setup.sh" clang >/dev/null
  cmake -S "$root" -B "$root/build/cuda-check" -DCMAKE_BUILD_TYPE=None -DCMAKE_CUDA_FLAGS=-O0 \
    -DCMAKE_CXX_FLAGS=-O0 -DCMAKE_CUDA_ARCHITECTURES=90 -DPARALLAX_ENABLE_CUDA=ON \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CUDA_HOST_COMPILER=clang++ -DPARALLAX_CUDA_TWINS_COMPILE_ONLY=ON >/dev/null
  cmake --build "$root/build/cuda-check" -j "$jobs"
}
bench_build() {
  # The benchmark programs only compile and link here (bench_soak, which a
  # test runs, is in the host build), so they build at -O0 in a tree of
  # their own, without the tests and examples, with clang (the sanitizer
  # stage's compiler), which compiles them faster than gcc (docs/testing.md,
  # "Build time").
  "$root/scripts/setup.sh" clang >/dev/null
  cmake -S "$root" -B "$root/build/bench-check" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_FLAGS=-O0 -DPARALLAX_ENABLE_CUDA=OFF -DPARALLAX_BUILD_TESTS=OFF -DPARALLAX_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$root/build/bench-check" -j "$jobs" --target parallax_bench
}
ahead_steps=("benchmark programs:bench_build")
[ -n "${PARALLAX_SKIP_SANITIZE:-}" ] || ahead_steps+=("sanitizer build:$root/scripts/sanitize.sh build")
[ -n "${PARALLAX_SKIP_TSAN:-}" ] || ahead_steps+=("ThreadSanitizer build:env SANITIZER=thread $root/scripts/sanitize.sh build")
[ -n "${PARALLAX_SKIP_FUZZ:-}" ] || ahead_steps+=("fuzzer build:$root/scripts/fuzz.sh build")
if [ -z "${PARALLAX_SKIP_CUDA:-}" ] && command -v nvcc >/dev/null; then ahead_steps+=("CUDA build:cuda_build"); fi
(
  chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
  for step in "${ahead_steps[@]}"; do
    name="${step%%:*}" start=$SECONDS
    rc=0
    ${step#*:} >"$ahead/$name.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - start))" >"$ahead/$name.rc"
  done
) &
ahead_pid=$!
# A failing stage ends the run: the builds still going end with it.
tree() {
  local child
  echo "$1"
  for child in $(pgrep -P "$1" 2>/dev/null); do tree "$child"; done
}
trap 'kill $(tree "$ahead_pid") 2>/dev/null || true' EXIT
# ahead_wait <name>: waits for that build; prints its output, fails with it.
ahead_wait() {
  local name="$1" waited=$SECONDS rc secs
  until [ -f "$ahead/$name.rc" ]; do
    kill -0 "$ahead_pid" 2>/dev/null || { echo "$name: the builds ahead ended early" >&2; exit 1; }
    sleep 1
  done
  read -r rc secs <"$ahead/$name.rc"
  cat "$ahead/$name.log"
  echo "== $name: $secs s in the background, $((SECONDS - waited)) s waited for"
  [ "$rc" -eq 0 ] || { echo "$name failed (status $rc)" >&2; exit 1; }
}

stage "host tests"
(cd "$root/build/test" && ctest -LE "gpu|cluster" --output-on-failure -j "$jobs")

if [ -z "${PARALLAX_SKIP_CLUSTER:-}" ]; then
  # Jobs across network namespaces of this machine over TCP (scripts/cluster.sh):
  # 2 hosts x 2 ranks against emulated hosts, a checkpoint resharded from 2
  # hosts to 3, links cut and healed, a host killed. One at a time (they share
  # the hosts); each reports itself skipped where namespaces cannot be made.
  stage "real hosts (network namespaces, TCP; tests/cluster)"
  (cd "$root/build/test" && ctest -L cluster --output-on-failure)
fi

if [ -z "${PARALLAX_SKIP_SANITIZE:-}" ]; then
  stage "sanitizers (ASan + UBSan + LSan)"
  ahead_wait "sanitizer build"
  "$root/scripts/sanitize.sh" test
fi

if [ -z "${PARALLAX_SKIP_TSAN:-}" ]; then
  stage "ThreadSanitizer (asynchronous training, overlap; 1-4 ranks)"
  ahead_wait "ThreadSanitizer build"
  SANITIZER=thread "$root/scripts/sanitize.sh" test
fi

if [ -z "${PARALLAX_SKIP_FUZZ:-}" ]; then
  stage "fuzzing (libFuzzer, ${FUZZ_SECONDS:=20} s per target)"
  ahead_wait "fuzzer build"
  FUZZ_SECONDS="$FUZZ_SECONDS" "$root/scripts/fuzz.sh" run
fi

stage "benchmark programs (compile and link only)"
ahead_wait "benchmark programs"
if [ -z "${PARALLAX_SKIP_CUDA:-}" ] && command -v nvcc >/dev/null; then
  stage "CUDA build (compile only, GPU-only programs linked; no GPU needed)"
  ahead_wait "CUDA build"
fi
wait "$ahead_pid"
stage "all tests passed (total $SECONDS s)"
