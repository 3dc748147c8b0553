#!/usr/bin/env bash
# End-to-end benchmarks of issue 5 at 1, 2, 3 and 4 ranks: builds
# bench_end_to_end in build/host, runs it under mpiexec with JSON output, and
# writes the "End to end" section of docs/benchmarks.md and the plot
# docs/end_to_end.png (matplotlib, Debian's python3-matplotlib).
#
#   bench/run_end_to_end.sh              # 1..4 ranks, 3 repetitions each (median)
#   RANKS="2 4" REPETITIONS=5 bench/run_end_to_end.sh
#   ROUNDS=3 bench/run_end_to_end.sh     # the whole set of runs 3 times; figures are medians over rounds
#       (Google Benchmark's own random interleaving would shuffle differently on each rank); round r
#       runs the architectures from the r-th on (--rotate), so each runs first in some round
#   OUT_DIR=/tmp/e2e PARALLAX_PREBUILT=1 bench/run_end_to_end.sh   # JSON only, no build, no report
#       (for a machine without compilers; turn the JSON into the report elsewhere with
#        bench/end_to_end_report.py --title "## ..." --plot docs/other.png ...)
#
# Timings are only as quiet as the machine: run it with nothing else busy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ranks="${RANKS:-1 2 3 4}"
repetitions="${REPETITIONS:-3}"
rounds="${ROUNDS:-1}"
build="$root/build/host"
out="${OUT_DIR:-$build/bench/end_to_end}"

if [ -z "${PARALLAX_PREBUILT:-}" ]; then
  source "$root/scripts/setup.sh" python3-matplotlib
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target bench_end_to_end
fi
mkdir -p "$out"
files=()
rm -f "$out"/np*.json
for round in $(seq "$rounds"); do
  for np in $ranks; do
    echo "== round $round of $rounds, $np rank(s); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    json="$out/np$np.json"
    [ "$rounds" -gt 1 ] && json="$out/np${np}_round$round.json"
    mpiexec -n "$np" "$build/bench/bench_end_to_end" --rotate=$((round - 1)) --benchmark_repetitions="$repetitions" \
      --benchmark_report_aggregates_only=true --benchmark_out_format=json --benchmark_out="$json"
    files+=("$json")
  done
done
if [ -n "${PARALLAX_PREBUILT:-}" ]; then
  echo "== JSON in $out"
  exit 0
fi
# Debian's python3-matplotlib serves /usr/bin/python3 (another python3 may come first on PATH).
py=python3
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then py=/usr/bin/python3; fi
"$py" "$root/bench/end_to_end_report.py" --doc "$root/docs/benchmarks.md" --plot "$root/docs/end_to_end.png" \
  --command "RANKS=\"$ranks\" REPETITIONS=$repetitions ROUNDS=$rounds bench/run_end_to_end.sh" "${files[@]}"
echo "== wrote docs/benchmarks.md (section \"End to end\") and docs/end_to_end.png"
