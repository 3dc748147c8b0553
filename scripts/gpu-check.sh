#!/usr/bin/env bash
# The GPU half of the test suite, on a machine with (at least) one NVIDIA GPU:
# installs dependencies, builds the CUDA configuration in build/cuda, runs
# every test labelled gpu (engine::MpiStaged at 1-4 ranks sharing the GPU,
# engine::Nccl at 1 rank, at 2 where there are 2 GPUs (else its cases
# report Skipped), and at 2-4 ranks with each rank its own NCCL node on
# whatever GPUs there are (tests/engine/nccl_node_per_rank.sh: its own
# NCCL_HOSTID; NCCL's set-up logs in gpu-results/nccl-logs, and the
# transports its channels took in the summary), the CUB coalesce, the CUDA dynamic table
# against the host one (tests/dynamic/cuda_table.cu), the CUDA
# twins of the portable tests),
# then the GPU benchmarks: at 1 rank (kernels, MpiStaged, Nccl) and
# with MpiStaged at 2-4 ranks sharing the GPU. Results go to
# build/cuda/gpu-results/ as JSON (Google Benchmark's format) plus the
# CTest log and a summary.
#
#   scripts/gpu-check.sh                    # everything
#   PARALLAX_GPU_SKIP_BENCH=1 scripts/gpu-check.sh   # tests only
#   PARALLAX_GPU_MAX_RANKS=2 scripts/gpu-check.sh    # fewer ranks for the bench
#   PARALLAX_GPU_CTEST_ARGS="--stop-time 12:30:00" scripts/gpu-check.sh   # more ctest arguments
#   PARALLAX_GPU_BUILD_DIR=build/gpu PARALLAX_GPU_PREBUILT=1 scripts/gpu-check.sh
#       # run a CUDA build made on another machine (same path, same CUDA
#       # major version): for GPU nodes with no compiler or package registry
#       # (scripts/gpu-pack.sh packs one with the MPI runtime); a copy of the
#       # sources without .git names its commit in PARALLAX_GIT_COMMIT
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${PARALLAX_GPU_BUILD_DIR:-$root/build/cuda}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
prebuilt="${PARALLAX_GPU_PREBUILT:-}"
if [ -z "$prebuilt" ]; then
  source "$root/scripts/setup.sh"
elif [ ! -f "$build/CTestTestfile.cmake" ]; then
  echo "gpu-check: PARALLAX_GPU_PREBUILT set but $build holds no configured build" >&2
  exit 1
fi
jobs="$(nproc)"
results="$build/gpu-results"
max_ranks="${PARALLAX_GPU_MAX_RANKS:-4}"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU visible (nvidia-smi failed); nothing to do" >&2
  exit 1
fi
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
gpu_count="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
echo "== GPU: $gpu_name (x$gpu_count, driver $driver)"

if [ -z "$prebuilt" ]; then
  echo "== CUDA build ($build)"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=ON -DPARALLAX_CUDA_BUILD_HOST_COPIES=ON >/dev/null
  cmake --build "$build" -j "$jobs"
else
  echo "== CUDA build made elsewhere: $build"
fi

mkdir -p "$results"
echo "== GPU tests (ctest -L gpu)"
# One test at a time: they share the GPU, and MpiStaged tests start up to 4
# ranks on it.
status=0
rm -rf "$results/nccl-logs"
(cd "$build" && PARALLAX_NCCL_DEBUG_DIR="$results/nccl-logs" \
  ctest -L gpu --output-on-failure -j "${PARALLAX_GPU_TEST_JOBS:-1}" ${PARALLAX_GPU_CTEST_ARGS:-} 2>&1 |
  tee "$results/ctest.log") || status=$?
if grep -q "tests failed" "$results/ctest.log"; then status=1; fi

bench_status=0
if [ -z "${PARALLAX_GPU_SKIP_BENCH:-}" ]; then
  bench="$build/bench/bench_gpu"
  mpiexec_bin="$(command -v mpiexec)"
  echo "== GPU benchmarks, 1 rank (kernels, MpiStaged, Nccl)"
  "$mpiexec_bin" -n 1 "$bench" --benchmark_out="$results/bench_gpu_np1.json" --benchmark_out_format=json \
    || bench_status=1
  for k in $(seq 2 "$max_ranks"); do
    echo "== GPU benchmarks, $k ranks sharing the GPU (MpiStaged; Nccl only with a GPU per rank)"
    "$mpiexec_bin" -n "$k" "$bench" --benchmark_out="$results/bench_gpu_np$k.json" --benchmark_out_format=json \
      || bench_status=1
  done
fi

# A summary a person (or CI) can read without parsing the logs.
passed="$(grep -Eo '[0-9]+% tests passed(, [0-9]+ tests failed)? out of [0-9]+' "$results/ctest.log" | tail -n 1 || true)"
# Entries whose checks could not run here (docs/testing.md, "Skipped
# checks"), e.g. engine::Nccl's at 2 ranks on a one-GPU machine: CTest counts
# them as not failed, so they are named apart.
skipped="$(grep -Eo '[A-Za-z0-9_]+ \(Skipped\)' "$results/ctest.log" | cut -d' ' -f1 | sort -u | paste -sd' ' - || true)"
# The transports NCCL's channels took between the ranks of different NCCL
# nodes ("via NET/Socket/0", "via P2P/IPC", ...), counted over every process.
transports="$(cat "$results"/nccl-logs/*.log 2>/dev/null | grep -Eo 'via [A-Za-z0-9/_]+' | sed 's/^via //' |
  sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? ", " : ""), $2, $1}' || true)"
# The NCCL the programs loaded, as its own log names it.
nccl_version="$(cat "$results"/nccl-logs/*.log 2>/dev/null | grep -Eo 'NCCL version [^ ]+' | head -n 1 | cut -d' ' -f3 || true)"
cat >"$results/summary.json" <<EOF
{
  "gpu": "$gpu_name",
  "gpu_count": $gpu_count,
  "driver": "$driver",
  "git_commit": "${PARALLAX_GIT_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}",
  "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "ctest": "${passed:-no summary}",
  "ctest_skipped": "${skipped}",
  "nccl_version": "${nccl_version:-not logged}",
  "nccl_transports": "${transports:-none logged}",
  "tests_ok": $([ "$status" = 0 ] && echo true || echo false),
  "bench_ok": $([ "$bench_status" = 0 ] && echo true || echo false)
}
EOF
[ -n "$skipped" ] && echo "== skipped (their checks cannot run on this machine): $skipped"
echo "== results in $results"
cat "$results/summary.json"
if [ "$status" != 0 ] || [ "$bench_status" != 0 ]; then
  echo "== gpu-check FAILED" >&2
  exit 1
fi
echo "== gpu-check passed on $gpu_name"
