#!/usr/bin/env bash
# Asynchronous against synchronous training over real hosts
# (scripts/cluster.sh): 01_word_lm at 2 hosts x 2 ranks, links at 1 Gbit/s,
# then px1's link narrowed to 100 Mbit/s; alternated runs, the median of
# the fast host's ranks' own words/s (ranks 0 and 1, on px0).
#   scripts/bench_async_hosts.sh BUILD_DIR [REPEATS] [ARCH]
# Needs root (namespaces); brings the hosts down when done.
set -euo pipefail
build="${1:?build dir}" repeats="${2:-3}" arch="${3:-ps}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cluster="$root/scripts/cluster.sh"
exe="$build/examples/01_word_lm"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
"$cluster" up 2 --rate 1gbit >/dev/null
"$cluster" shape px1 --rate 100mbit >/dev/null
args=(--arch "$arch" --steps 40 --warmup 5 --batch 8 --log-every 1000 --eval-examples 0 --pass-ratio 10)
fast() {  # the fast host's ranks' own words/s (ranks 0 and 1), their mean
  sed -n 's/.*own words\/s per rank[^:]*: \([0-9.]*\) \([0-9.]*\) .*/\1 \2/p' "$1" | awk '{ print ($1 + $2) / 2 }'
}
declare -A got
for i in $(seq 1 "$repeats"); do
  for sync in sync async; do
    log=$(mktemp)
    timeout 300 "$cluster" run --ppn 2 -- -n 4 "$exe" "${args[@]}" --sync "$sync" >"$log" 2>&1 || true
    v=$(fast "$log")
    loss=$(sed -n 's/^result:.* final_loss=\([^ ]*\).*/\1/p' "$log")
    echo "run $i $sync: fast host's words/s ${v:-?} final loss ${loss:-?}"
    got[$sync]="${got[$sync]:-} ${v:-}"
    rm -f "$log"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR) print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }
s=$(echo "${got[sync]}" | median) a=$(echo "${got[async]}" | median)
echo "median words/s of px0's ranks (px1 at 100mbit, px0 at 1gbit), --arch $arch: sync $s, async $a, async/sync $(awk -v a="$a" -v s="$s" 'BEGIN { if (s > 0) printf "%.2f", a / s }')x"
