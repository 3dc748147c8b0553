#!/usr/bin/env bash
# Real hosts on this machine (scripts/cluster.sh): 02_ctr's bags pooled at
# the owners (--pooling owner) against a row per id pooled in the model
# (--pooling local), hybrid, one rank per host, whole runs alternated,
# medians. Prints docs/benchmarks.md's "Bags over real hosts" table. Needs
# root and network namespaces.
#
#   bench/run_cluster_bags.sh [BUILD=build/host] [BASE=] [ROUNDS=3] [STEPS=40] [BATCH=2048]
#       [CONFIGS="4:1gbit 2:1gbit 4:250mbit"]
#
# With BASE=<another 02_ctr>, its owner pooling runs in each round too (a
# commit before against this one, under the same load).
# BATCH is per rank (issue 39's bar: 2,048). A configuration is HOSTS:RATE.
# Every host is a namespace of this one machine: all ranks share its cores.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build/host}"
base="${BASE:-}"
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

args=(--arch hybrid --steps "$steps" --warmup 10 --log-every 1000 --eval-examples 256
     --pass-ratio 1.1 --batch "$batch")
field() { sed -n "s/^result:.* $1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
runs=("owner:$build/examples/02_ctr:owner" "local:$build/examples/02_ctr:local")
[ -n "$base" ] && runs+=("base:$base:owner")
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for c in "${configs[@]}"; do
  IFS=: read -r hosts rate <<<"$c"
  "$cluster" up "$hosts" --rate "$rate" >/dev/null
  label="$hosts.$rate"
  echo "== $hosts hosts x 1 rank, $rate: $rounds rounds, owner and local$([ -n "$base" ] && echo " and base's owner") alternated"
  for i in $(seq 1 "$rounds"); do
    for r in "${runs[@]}"; do
      IFS=: read -r p exe pooling <<<"$r"
      log="$out/$label.$p.$i.log"
      "$cluster" run --ppn 1 -- -n "$hosts" "$exe" "${args[@]}" --pooling "$pooling" >"$log" 2>&1 || true
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
echo "| hosts x ranks | link | bytes/step/rank owner | local | owner / local | calls/step owner | local | samples/s owner | local | owner / local |$([ -n "$base" ] && echo " owner before | owner / before |")"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|$([ -n "$base" ] && echo "---:|---:|")"
for c in "${configs[@]}"; do
  IFS=: read -r hosts rate <<<"$c"
  label="$hosts.$rate"
  col() { awk -v l="$label" -v p="$1" -v k="$2" '$1 == l && $2 == p { print $k }' "$out/runs"; }
  o=$(col owner 3 | median) l=$(col local 3 | median)
  ob=$(col owner 4 | tail -1) lb=$(col local 4 | tail -1)
  oc=$(col owner 5 | tail -1) lc=$(col local 5 | tail -1)
  all() { col "$1" 3 | tr '\n' ' ' | sed 's/ $//; s/ /, /g'; }
  row=$(awk -v n="$hosts" -v r="$rate" -v o="$o" -v l="$l" -v ob="$ob" -v lb="$lb" -v oc="$oc" -v lc="$lc" \
    -v oa="$(all owner)" -v la="$(all local)" 'BEGIN {
    printf "| %d x 1 | %s | %.0f | %.0f | %.3f | %s | %s | %.0f (%s) | %.0f (%s) | %.2f |", n, r, ob, lb, ob / lb, oc, lc, o, oa, l, la, o / l }')
  if [ -n "$base" ]; then
    b=$(col base 3 | median)
    row+=$(awk -v o="$o" -v b="$b" -v ba="$(all base)" 'BEGIN { printf " %.0f (%s) | %.2f |", b, ba, o / b }')
  fi
  echo "$row"
done
echo "(runs: $out/runs; logs in $out)"
