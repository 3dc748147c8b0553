#!/usr/bin/env bash
# One host: 02_ctr's bags pooled at the owners (--pooling owner) against a
# row per id pooled in the model (--pooling local), hybrid, whole runs
# alternated, medians. Prints docs/benchmarks.md's "Bags: pooling at the
# owner in 02_ctr" table. With BASE=<another 02_ctr>, its owner pooling
# runs in each round too (a commit before against this one, same load).
#
#   bench/run_bags.sh [BUILD=build/host] [BASE=] [ROUNDS=3] [STEPS=40] [BATCH=2048] [RANKS="4 2"]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build/host}"
base="${BASE:-}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-40}"
batch="${BATCH:-2048}"
read -r -a ranks <<<"${RANKS:-4 2}"
out="$(mktemp -d /tmp/parallax-bench-bags.XXXXXX)"

args=(--arch hybrid --steps "$steps" --warmup 10 --log-every 1000 --eval-examples 256 --pass-ratio 1.1 --batch "$batch")
field() { sed -n "s/^result:.* $1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
runs=("owner:$build/examples/02_ctr:owner" "local:$build/examples/02_ctr:local")
[ -n "$base" ] && runs+=("base:$base:owner")

for n in "${ranks[@]}"; do
  echo "== $n ranks: $rounds rounds, ${#runs[@]} runs alternated"
  for i in $(seq 1 "$rounds"); do
    for r in "${runs[@]}"; do
      IFS=: read -r label exe p <<<"$r"
      log="$out/$n.$label.$i.log"
      mpiexec -n "$n" "$exe" "${args[@]}" --pooling "$p" >"$log" 2>&1 || true
      sps=$(field samples_per_s "$log")
      [ -z "$sps" ] && { echo "   $label: no result (see $log)"; continue; }
      echo "$n $label $sps $(field bytes_per_step "$log") $(field calls_per_step "$log") $(field final_loss "$log")" >>"$out/runs"
      echo "   $label: $sps samples/s, $(field bytes_per_step "$log") B/step/rank, $(field calls_per_step "$log") calls/step, loss $(field final_loss "$log")"
    done
  done
done

echo
echo "| ranks | bytes/step/rank owner | local | owner / local | samples/s owner | local | owner / local |$([ -n "$base" ] && echo " owner before | owner / before |")"
echo "|---:|---:|---:|---:|---:|---:|---:|$([ -n "$base" ] && echo "---:|---:|")"
for n in "${ranks[@]}"; do
  col() { awk -v n="$n" -v l="$1" -v k="$2" '$1 == n && $2 == l { print $k }' "$out/runs"; }
  all() { col "$1" 3 | tr '\n' ' ' | sed 's/ $//; s/ /, /g'; }
  o=$(col owner 3 | median) l=$(col local 3 | median) ob=$(col owner 4 | tail -1) lb=$(col local 4 | tail -1)
  row=$(awk -v n="$n" -v o="$o" -v l="$l" -v ob="$ob" -v lb="$lb" -v oa="$(all owner)" -v la="$(all local)" 'BEGIN {
    printf "| %d | %.0f | %.0f | %.3f | %.0f (%s) | %.0f (%s) | %.2f |", n, ob, lb, ob / lb, o, oa, l, la, o / l }')
  if [ -n "$base" ]; then
    b=$(col base 3 | median)
    row+=$(awk -v o="$o" -v b="$b" -v ba="$(all base)" 'BEGIN { printf " %.0f (%s) | %.2f |", b, ba, o / b }')
  fi
  echo "$row"
done
echo "(runs: $out/runs; logs in $out)"
