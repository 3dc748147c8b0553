#!/usr/bin/env bash
# Real hosts on this machine (scripts/cluster.sh): 02_ctr's bags pooled at
# the owners (--pooling owner) against a row per id pooled in the model
# (--pooling local), hybrid, one rank per host, whole runs alternated,
# medians. Prints docs/benchmarks.md's "Bags over real hosts" table. Needs
# root and network namespaces.
#
#   bench/run_cluster_bags.sh [BUILD=build/host] [ROUNDS=3] [STEPS=40] [BATCH=2048]
#       [CONFIGS="4:1gbit 2:1gbit 4:250mbit"]
#
# BATCH is per rank (issue 39's bar: 2,048). A configuration is HOSTS:RATE.
# Every host is a namespace of this one machine: all ranks share its cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build/host}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-40}"
batch="${BATCH:-2048}"
read -r -a configs <<<"${CONFIGS:-4:1gbit 2:1gbit 4:250mbit}"
cluster="$root/scripts/cluster.sh"
out="$(mktemp -d /tmp/parallax-bench-cluster-bags.XXXXXX)"
trap '"$cluster" down' EXIT
# A short deadline: its grace period also bounds the wait for an MPI_Finalize
# that does not return over TCP (docs/cluster.md).
export PARALLAX_TIMEOUT_MS=5000

ctr=("$build/examples/02_ctr" --arch hybrid --steps "$steps" --warmup 10 --log-every 1000 --eval-examples 256
     --pass-ratio 1.1 --batch "$batch")
field() { sed -n "s/^result:.* $1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for c in "${configs[@]}"; do
  IFS=: read -r hosts rate <<<"$c"
  "$cluster" up "$hosts" --rate "$rate" >/dev/null
  label="$hosts.$rate"
  echo "== $hosts hosts x 1 rank, $rate: $rounds rounds, owner and local alternated"
  for i in $(seq 1 "$rounds"); do
    for p in owner local; do
      log="$out/$label.$p.$i.log"
      "$cluster" run --ppn 1 -- -n "$hosts" "${ctr[@]}" --pooling "$p" >"$log" 2>&1 || true
      sps=$(field samples_per_s "$log")
      if [ -z "$sps" ]; then
        echo "   $p: no result (see $log)"
        continue
      fi
      echo "$label $p $sps $(field bytes_per_step "$log") $(field calls_per_step "$log") $(field final_loss "$log")" >>"$out/runs"
      echo "   $p: $sps samples/s, $(field bytes_per_step "$log") B sent per step per rank," \
        "$(field calls_per_step "$log") engine calls per step, final loss $(field final_loss "$log")"
    done
  done
done

echo
echo "| hosts x ranks | link | bytes/step/rank owner | local | owner / local | calls/step owner | local | samples/s owner | local | owner / local |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for c in "${configs[@]}"; do
  IFS=: read -r hosts rate <<<"$c"
  label="$hosts.$rate"
  col() { awk -v l="$label" -v p="$1" -v k="$2" '$1 == l && $2 == p { print $k }' "$out/runs"; }
  o=$(col owner 3 | median) l=$(col local 3 | median)
  ob=$(col owner 4 | tail -1) lb=$(col local 4 | tail -1)
  oc=$(col owner 5 | tail -1) lc=$(col local 5 | tail -1)
  awk -v n="$hosts" -v r="$rate" -v o="$o" -v l="$l" -v ob="$ob" -v lb="$lb" -v oc="$oc" -v lc="$lc" 'BEGIN {
    printf "| %d x 1 | %s | %.0f | %.0f | %.3f | %s | %s | %.0f | %.0f | %.2f |\n", n, r, ob, lb, ob / lb, oc, lc, o, l, o / l }'
done
echo "(runs: $out/runs; logs in $out)"
