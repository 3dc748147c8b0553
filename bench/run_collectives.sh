#!/usr/bin/env bash
# Runs bench_collectives at 2 and 4 ranks, several times each, keeps the JSON
# of every run, and prints the tables behind docs/benchmarks.md ("Collectives")
# from them: medians over the runs, ratios to the MPI baselines in
# the same run, and which items of the issue-2 bar are met.
#
#   bench/run_collectives.sh [build-dir]          # default build dir: build
#
# Environment:
#   RANKS="2 4"      rank counts to run
#   RUNS=3           whole runs per rank count (the figures are their medians)
#   OUT=<dir>        where the JSON goes (default <build-dir>/bench/results)
#   FILTER=<regex>   --benchmark_filter (default: everything)
#   PRIORITY=1       run each rank through bench/raise_priority.sh (root only;
#                    shields the runs from other jobs on a shared machine)
#   SUMMARY=1        print the short table of scripts/demo.sh instead
#   EXTRA="..."      more flags for bench_collectives
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
bin="$build/bench/bench_collectives"
ranks="${RANKS:-2 4}"
runs="${RUNS:-3}"
out="${OUT:-$build/bench/results}"
filter="${FILTER:-.}"
if [ ! -x "$bin" ]; then
  echo "run_collectives: $bin not found; build it first:" >&2
  echo "  cmake -S $root -B $build -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF && cmake --build $build --target bench_collectives" >&2
  exit 1
fi
launch=()
if [ "${PRIORITY:-0}" = 1 ]; then launch=("$here/raise_priority.sh"); fi

mkdir -p "$out"
files=()
for np in $ranks; do
  for run in $(seq 1 "$runs"); do
    json="$out/collectives_np${np}_run${run}.json"
    echo "== $np ranks, run $run of $runs -> $json" >&2
    # shellcheck disable=SC2086
    mpiexec -n "$np" "${launch[@]}" "$bin" --benchmark_filter="$filter" \
      --benchmark_out="$json" --benchmark_out_format=json --benchmark_format=console ${EXTRA:-} >&2
    files+=("$json")
  done
done

if [ "${SUMMARY:-0}" = 1 ]; then
  python3 "$here/collectives_table.py" --summary "${files[@]}"
else
  python3 "$here/collectives_table.py" "${files[@]}"
fi
