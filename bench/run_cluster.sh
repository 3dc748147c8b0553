#!/usr/bin/env bash
# Real hosts on this machine (scripts/cluster.sh): what the links give
# (bench_pingpong), and the hybrid against the all-reduce architecture over
# them, whole runs alternated, medians. Prints docs/benchmarks.md's
# "Real hosts" tables. Needs root and network namespaces.
#
#   bench/run_cluster.sh [BUILD=build/host] [ROUNDS=3] [STEPS=60] [CONFIGS="word_lm:2:1gbit ..."]
#       [PINGPONG=1] [CPUS=1]
#
# 01_word_lm at the demo's vocabulary and width with a global batch of 32
# words (16 per rank on 2 hosts, 8 on 4), one rank per host, at 1 Gbit/s and
# 250 Mbit/s; 02_ctr at 4 hosts x 1 rank, 1 Gbit/s, a global batch of 2,048.
# Each configuration also runs --arch auto twice, with PARALLAX_PLAN_LINK set
# to the link's rate and bench_pingpong's latency between hosts, and set to
# "measure" (the link timed at start-up), and prints the plan's predicted step
# against the measured one. CONFIGS (MODEL:HOSTS:RATE
# words) picks some of the configurations; PINGPONG=0 leaves the links out.
# Every host is a namespace of this one machine: all ranks share its cores,
# or, with CPUS=1 (scripts/cluster.sh up --cpus), each host has CPUs of its
# own (nproc / hosts of them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build/host}"
rounds="${ROUNDS:-3}"
steps="${STEPS:-60}"
cluster="$root/scripts/cluster.sh"
out="$(mktemp -d /tmp/parallax-bench-cluster.XXXXXX)"
trap '"$cluster" down' EXIT
# A short deadline: its grace period also bounds the wait for an MPI_Finalize
# that does not return over TCP (docs/cluster.md).
export PARALLAX_TIMEOUT_MS=10000

lm=("$build/examples/01_word_lm" --vocab 800000 --dim 128 --sampled 8192 --context 2 --tokens 2000000
    --steps "$steps" --warmup 10 --log-every 1000 --eval-examples 0 --pass-ratio 0.99)
ctr=("$build/examples/02_ctr" --steps "$steps" --warmup 10 --log-every 1000 --eval-examples 256 --pass-ratio 1.1)
field() { sed -n "s/^result:.* $1=\([^ ]*\).*/\1/p" "$2" | tail -1; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

[ "${PINGPONG:-1}" = 0 ] || echo "== links: bench_pingpong, 2 hosts x 2 ranks"
for rate in $([ "${PINGPONG:-1}" = 0 ] || echo 1gbit none); do
  "$cluster" up 2 --rate "$rate" >/dev/null
  echo "-- rate $rate"
  # bench_pingpong is plain MPI: its MPI_Finalize can hang over TCP (docs/cluster.md)
  timeout 60 "$cluster" run --ppn 2 -- -n 4 "$build/bench/bench_pingpong" $((8 << 20)) 10 | sed "s/^/   /" || true
done

# run LABEL HOSTS RATE ARCH ARGS...: one run; appends "label arch samples/s bytes" to $out/runs.
run() {
  local label="$1" hosts="$2" rate="$3" arch="$4"
  shift 4
  local log="$out/$label.$arch.log"
  "$cluster" run --ppn 1 -- -n "$hosts" "$@" --arch "$arch" >"$log" 2>&1 || true
  local sps bytes
  sps=$(field samples_per_s "$log") bytes=$(field bytes_per_step "$log")
  if [ -z "$sps" ]; then
    echo "   $label $arch: no result (see $log)"
    return
  fi
  echo "$label $arch $sps $bytes $(field final_loss "$log") $(field bytes_per_step_max "$log") $(field calls_per_step "$log")" >>"$out/runs"
  echo "   $label $arch: $sps samples/s, $bytes B sent per step per rank, $(field calls_per_step "$log") engine calls" \
    "per step, final loss $(field final_loss "$log")"
}

configs=()
for hosts in 2 4; do
  for rate in 1gbit 250mbit; do configs+=("word_lm:$hosts:$rate"); done
done
configs+=("ctr:4:1gbit")
[ -z "${CONFIGS:-}" ] || read -r -a configs <<<"$CONFIGS"
for c in "${configs[@]}"; do
  IFS=: read -r model hosts rate <<<"$c"
  "$cluster" up "$hosts" --rate "$rate" ${CPUS:+--cpus} >/dev/null
  label="$model.$hosts.$rate"
  echo "== $label: $rounds rounds, hybrid and allreduce alternated"
  for i in $(seq 1 "$rounds"); do
    for arch in hybrid allreduce; do
      if [ "$model" = word_lm ]; then run "$label" "$hosts" "$rate" "$arch" "${lm[@]}" --batch $((32 / hosts))
      else run "$label" "$hosts" "$rate" "$arch" "${ctr[@]}" --batch $((2048 / hosts)); fi
    done
  done
  plan_link=$(case "$rate" in 1gbit) echo 1Gbit/s ;; 250mbit) echo 250Mbit/s ;; esac),65us
  if [ "$model" = word_lm ]; then args=("${lm[@]}" --batch $((32 / hosts))); else args=("${ctr[@]}" --batch $((2048 / hosts))); fi
  for link in "$plan_link" measure; do
    tag=$([ "$link" = measure ] && echo measured || echo nominal)
    log="$out/$label.auto.$tag.log"
    PARALLAX_PLAN_LINK="$link" "$cluster" run --ppn 1 -- -n "$hosts" "${args[@]}" --arch auto >"$log" 2>&1 || true
    echo "   $label --arch auto (PARALLAX_PLAN_LINK=$link): $(grep -h 'inter-host' "$log" | sed 's/;.*//')"
    echo "     $(grep -h '^plan:' "$log" || echo 'no plan line')"
    grep -h '^plan:' "$log" | sed "s|^|$label ($tag link) |" >>"$out/plans" || true
  done
done

echo
echo "| model | hosts x ranks | link | hybrid samples/s | all-reduce samples/s | hybrid / all-reduce | bytes/step/rank hybrid | all-reduce | calls/step hybrid | all-reduce | hybrid step ms | its busiest rank's bytes on the link, ms |"
echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for c in "${configs[@]}"; do
  IFS=: read -r model hosts rate <<<"$c"
  label="$model.$hosts.$rate"
  h=$(awk -v l="$label" '$1 == l && $2 == "hybrid" { print $3 }' "$out/runs" | median)
  a=$(awk -v l="$label" '$1 == l && $2 == "allreduce" { print $3 }' "$out/runs" | median)
  hb=$(awk -v l="$label" '$1 == l && $2 == "hybrid" { print $4 }' "$out/runs" | tail -1)
  ab=$(awk -v l="$label" '$1 == l && $2 == "allreduce" { print $4 }' "$out/runs" | tail -1)
  hmax=$(awk -v l="$label" '$1 == l && $2 == "hybrid" { print $6 }' "$out/runs" | tail -1)
  hc=$(awk -v l="$label" '$1 == l && $2 == "hybrid" { print $7 }' "$out/runs" | tail -1)
  ac=$(awk -v l="$label" '$1 == l && $2 == "allreduce" { print $7 }' "$out/runs" | tail -1)
  batch=$([ "$model" = word_lm ] && echo 32 || echo 2048)
  bits=$(case "$rate" in 1gbit) echo 1e9 ;; 250mbit) echo 2.5e8 ;; esac)
  awk -v m="$model" -v n="$hosts" -v r="$rate" -v h="$h" -v a="$a" -v hb="$hb" -v ab="$ab" -v hmax="$hmax" -v b="$batch" -v bits="$bits" \
    -v hc="$hc" -v ac="$ac" 'BEGIN {
    printf "| %s | %d x 1 | %s | %.0f | %.0f | %.2f | %.0f | %.0f | %s | %s | %.1f | %.1f |\n", m, n, r, h, a, h / a, hb, ab,
      hc, ac, 1000 * b / h, 1000 * hmax * 8 / bits }'
done
echo
echo "predicted against measured (--arch auto):"
sed 's/^/  /' "$out/plans" 2>/dev/null || true
echo "(runs: $out/runs)"
