#!/bin/sh
# 16-bit tables and compressed exchanges against float, per example and
# rank count: the same steps, seed and data; prints each run's final loss,
# table bytes on the busiest rank and bytes sent per step per rank, then the
# ratios (16-bit / float). docs/benchmarks.md, "Half precision".
#
#   bench/run_half_precision.sh [build dir] [ranks...]
#
# 02_ctr pools its bags the same way in both runs, at the rows' owners
# unless POOLING says otherwise (owner, local, auto): the comparison is of
# precisions, not of pooling.
set -eu
build=${1:-build/host}
shift || true
ranks=${*:-2 4}
mpiexec=${MPIEXEC:-mpiexec}
pooling=${POOLING:-owner}

run() {  # example, ranks, table type, compress, extra args: "loss bytes_per_step table_bytes"
  ex=$1 np=$2 tt=$3 cc=$4
  shift 4
  out=$($mpiexec -n "$np" "$build/examples/$ex" --seed 7 --table-type "$tt" --compress "$cc" "$@" 2>&1) || true
  loss=$(printf '%s\n' "$out" | sed -n 's/^result:.* final_loss=\([^ ]*\).*/\1/p')
  bytes=$(printf '%s\n' "$out" | sed -n 's/^result:.* bytes_per_step=\([^ ]*\).*/\1/p')
  table=$(printf '%s\n' "$out" | sed -n 's/^tables: .*, \([0-9]*\) at most on a rank.*/\1/p')
  echo "$loss $bytes $table"
}

printf '%-10s %5s %-13s %12s %14s %14s\n' example ranks run final_loss bytes/step table_bytes
for np in $ranks; do
  for spec in "02_ctr --arch hybrid --steps 100 --batch 256 --pooling $pooling --eval-examples 1024" \
              "01_word_lm --arch hybrid --steps 100 --batch 256 --eval-examples 0"; do
    set -- $spec
    ex=$1
    shift
    f=$(run "$ex" "$np" f32 none "$@")
    h=$(run "$ex" "$np" bf16 bf16 "$@")
    set -- $f $h
    printf '%-10s %5s %-13s %12s %14s %14s\n' "$ex" "$np" "f32,none" "$1" "$2" "$3"
    printf '%-10s %5s %-13s %12s %14s %14s\n' "$ex" "$np" "bf16,bf16" "$4" "$5" "$6"
    awk -v fl="$1" -v fb="$2" -v ft="$3" -v hl="$4" -v hb="$5" -v ht="$6" -v ex="$ex" -v np="$np" 'BEGIN {
      printf "%-10s %5s ratios: loss %+.3f%%, bytes/step %.3fx, table bytes %.3fx\n", ex, np,
             100 * (hl - fl) / fl, hb / fb, ht / ft }'
  done
done
