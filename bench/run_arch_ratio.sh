#!/usr/bin/env bash
# Throughput of one example under two architectures, as a ratio of medians
# over alternating runs: the architectures take turns, and each round starts
# with the other one, so drift on a shared machine falls on both alike.
# Prints each run's samples/s, the medians and the ratio A / B as a markdown
# table row.
#
#   bench/run_arch_ratio.sh EXAMPLE RANKS [example options...]
#   ROUNDS=5 ARCHS="hybrid allreduce" bench/run_arch_ratio.sh build/host/examples/02_ctr 4 --steps 60
#
# The example must print its `result:` line (every example in examples/ does).
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
exe="$1" ranks="$2"
shift 2
rounds="${ROUNDS:-5}"
read -r -a archs <<<"${ARCHS:-hybrid allreduce}"
[ "${#archs[@]}" -eq 2 ] || { echo "run_arch_ratio: ARCHS names two architectures" >&2; exit 2; }
declare -A runs
for round in $(seq 1 "$rounds"); do
  order=("${archs[@]}")
  [ $((round % 2)) -eq 0 ] && order=("${archs[1]}" "${archs[0]}")
  for arch in "${order[@]}"; do
    line=$( (mpiexec -n "$ranks" "$exe" --arch "$arch" "$@" || true) | grep "^result:" || true)
    rate=$(printf '%s\n' "$line" | sed -n 's/.* samples_per_s=\([^ ]*\).*/\1/p')
    [ -n "$rate" ] || { echo "run_arch_ratio: no samples_per_s in: $line" >&2; exit 1; }
    runs[$arch]+="$rate "
    echo "round $round $arch: $rate samples/s (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
done
python3 - "$(basename "$exe")" "$ranks" "${archs[0]}" "${runs[${archs[0]}]}" "${archs[1]}" "${runs[${archs[1]}]}" <<'PY'
import statistics, sys
name, ranks, a, ra, b, rb = sys.argv[1:]
ra = [float(x) for x in ra.split()]
rb = [float(x) for x in rb.split()]
ma, mb = statistics.median(ra), statistics.median(rb)
runs = ", ".join(f"{x / y:.2f}" for x, y in zip(ra, rb))
print(f"| {name} | {ranks} | {a} {ma:,.0f} | {b} {mb:,.0f} | {ma / mb:.3f} | {runs} |")
PY
