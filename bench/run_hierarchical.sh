#!/usr/bin/env bash
# The hierarchical all-reduce against the flat ring (RingAllReduce/hierarchical
# and RingAllReduce/ring of bench_collectives) at 4, 16 and 64 MiB, 4 ranks
# as 2 hosts x 2 ranks, in alternated runs: each run times one of the two
# (flat, hierarchical, hierarchical, flat, ...), so that a machine shared
# with other jobs slows both alike. Prints the median time of each and the
# median of the per-pair ratios (flat / hierarchical) behind
# docs/benchmarks.md, "Hierarchical all-reduce".
#
#   bench/run_hierarchical.sh [build-dir]            # default build dir: build
#
# Environment:
#   MODE=emulated    hosts emulated on one machine: PARALLAX_RANKS_PER_HOST=2
#                    and PARALLAX_LINK=$LINK (default 1Gbit/s,50us)
#   MODE=cluster     real hosts over TCP: scripts/cluster.sh run --ppn 2 (the
#                    cluster must be up: scripts/cluster.sh up 2 --rate 1gbit),
#                    with PARALLAX_YIELD=1 unless set: the hosts' ranks share
#                    this machine's cores, which no rank's topology can see,
#                    and a spinning wait would hold the core its peer needs
#   PAIRS=3          flat/hierarchical pairs of runs
#   SIZES="4194304 16777216 67108864"
#   OUT=<dir>        where the JSON goes (default <build-dir>/bench/results)
#   EXTRA="..."      more flags for bench_collectives (e.g. --iterations_scale=0.5)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build}"
bin="$(cd "$build" && pwd)/bench/bench_collectives"
mode="${MODE:-emulated}"
pairs="${PAIRS:-3}"
sizes="${SIZES:-4194304 16777216 67108864}"
out="${OUT:-$build/bench/results}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
[ -x "$bin" ] || { echo "run_hierarchical: $bin not found; build the target bench_collectives" >&2; exit 1; }
mkdir -p "$out"
size_re="($(echo "$sizes" | tr ' ' '|'))"

complete() { python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["benchmarks"]' "$1" 2>/dev/null; }

run() {  # run <ring|hierarchical> <json>
  local filter="RingAllReduce/$1/$size_re/"
  # shellcheck disable=SC2086
  local args=("$bin" --benchmark_filter="$filter" --benchmark_out="$2" --benchmark_out_format=json
              --benchmark_format=console ${EXTRA:-})
  case "$mode" in
    emulated)
      PARALLAX_RANKS_PER_HOST=2 PARALLAX_LINK="${LINK:-1Gbit/s,50us}" mpiexec -n 4 "${args[@]}" >&2 ;;
    cluster)
      PARALLAX_YIELD="${PARALLAX_YIELD:-1}" "$root/scripts/cluster.sh" run --ppn 2 -- -n 4 "${args[@]}" >&2 &
      local launcher=$!
      # MPI_Finalize over UCX's TCP transport between the namespaces has hung
      # after the results were written: 20 s after complete JSON, the
      # launcher (cluster.sh's mpiexec, which takes the ranks with it) goes.
      while kill -0 "$launcher" 2>/dev/null; do
        if complete "$2" && [ $(($(date +%s) - $(stat -c %Y "$2"))) -ge 20 ]; then
          echo "run_hierarchical: results complete, the launcher still running 20 s on: stopping it" >&2
          for m in $(pgrep -P "$launcher" -x mpiexec); do kill "$m"; done
        fi
        sleep 2
      done
      wait "$launcher" ;;
    *) echo "run_hierarchical: MODE is emulated or cluster, not '$mode'" >&2; exit 2 ;;
  esac
}

files=()
failed=0
for p in $(seq 1 "$pairs"); do
  order="ring hierarchical"
  [ $((p % 2)) -eq 0 ] && order="hierarchical ring"
  for algo in $order; do
    json="$out/hierarchical_${mode}_pair${p}_${algo}.json"
    echo "== $mode, pair $p of $pairs: $algo -> $json" >&2
    # A launcher that fails after the timed loops (a host's proxy lost at
    # exit) leaves complete JSON: keep it. Otherwise try once more.
    for try in 1 2; do
      rm -f "$json"
      run "$algo" "$json" || echo "run_hierarchical: the launcher failed (try $try)" >&2
      complete "$json" && break
      [ "$try" = 2 ] && { echo "run_hierarchical: no results in $json; the pairs so far:" >&2; failed=1; }
    done
    [ "$failed" = 1 ] && break 2
    files+=("$json")
  done
done

# Pairs are zipped in order: an unfinished last pair counts in neither ratio.
python3 - "$mode" "${files[@]}" <<'EOF'
import json, re, statistics, sys
mode, files = sys.argv[1], sys.argv[2:]
times = {}  # (algo, size) -> [ms per pair]
for f in files:
    for b in json.load(open(f))["benchmarks"]:
        m = re.match(r"RingAllReduce/(ring|hierarchical)/(\d+)/", b["name"])
        if m and b.get("run_type", "iteration") == "iteration":
            assert b.get("wrong", 0) == 0, f"{f}: {b['name']} has wrong results"
            unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
            times.setdefault((m.group(1), int(m.group(2))), []).append(b["real_time"] * unit)
pairs = min(sum(1 for f in files if f.endswith("_ring.json")), sum(1 for f in files if f.endswith("_hierarchical.json")))
print(f"| size | flat ring (ms) | hierarchical (ms) | flat / hierarchical ({mode}, median of {pairs} pairs) |")
print("|---|---|---|---|")
for size in sorted({s for _, s in times}):
    flat, hier = times.get(("ring", size), [])[:pairs], times.get(("hierarchical", size), [])[:pairs]
    ratios = [a / b for a, b in zip(flat, hier)]
    print(f"| {size >> 20} MiB | {statistics.median(flat):.1f} | {statistics.median(hier):.1f} | "
          f"{statistics.median(ratios):.2f}x (pairs: {', '.join(f'{r:.2f}' for r in ratios)}) |")
EOF
exit "$failed"
