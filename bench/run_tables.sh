#!/usr/bin/env bash
# Runs bench_tables several times at 4 ranks (whole runs: the variants of a
# run share its machine state), keeps the JSON of every run, and prints the
# table of docs/benchmarks.md ("Table groups"): the median step time of T
# tables over its runs, its ratio to one table, and the engine calls and
# bytes a rank makes per step.
#
#   bench/run_tables.sh [build-dir]          # default build dir: build/host
#
# Environment: RANKS=4, RUNS=5, OUT=<dir> (default <build-dir>/bench/results).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build/host}"
bin="$build/bench/bench_tables"
ranks="${RANKS:-4}"
runs="${RUNS:-5}"
out="${OUT:-$build/bench/results}"
if [ ! -x "$bin" ]; then
  echo "run_tables: $bin not found; build it first: cmake --build $build --target bench_tables" >&2
  exit 1
fi
mkdir -p "$out"
files=()
for run in $(seq 1 "$runs"); do
  json="$out/tables_np${ranks}_run${run}.json"
  echo "== $ranks ranks, run $run of $runs -> $json" >&2
  mpiexec -n "$ranks" "$bin" --benchmark_format=json --benchmark_out="$json" --benchmark_out_format=json >/dev/null
  files+=("$json")
done
python3 - "${files[@]}" <<'PY'
import json, re, statistics, sys
runs = [json.load(open(f))["benchmarks"] for f in sys.argv[1:]]
times, counters = {}, {}
for run in runs:
    for b in run:
        m = re.match(r"Tables/T:(\d+)/(\w+)/(\w+)/", b["name"])
        if not m:
            continue  # RouteHeaders/...: docs/benchmarks.md, "Call shapes in route headers"
        key = (int(m.group(1)), m.group(2), m.group(3))
        times.setdefault(key, []).append(b["real_time"] / 1000.0)  # ms
        counters[key] = (b["calls"], b["bytes_sent"])
ranks = runs[0][0].get("ranks", "")
print("| lookups | grouping | T | step ms (median) | runs | vs T = 1 | engine calls / step | KiB sent / step |")
print("|---|---|---:|---:|---|---:|---:|---:|")
for lookups in ("shared", "messages"):
    for grouping in ("grouped", "one_group_each"):
        base = statistics.median(times[(1, grouping, lookups)])
        for t in sorted({k[0] for k in times}):
            v = times[(t, grouping, lookups)]
            med = statistics.median(v)
            calls, sent = counters[(t, grouping, lookups)]
            print(f"| {lookups} | {grouping.replace('_', ' ')} | {t} | {med:.2f} | {' / '.join(f'{x:.1f}' for x in v)} "
                  f"| {med / base:.2f}x | {calls:.0f} | {sent / 1024:.0f} |")
PY
