#!/bin/sh
# 02_ctr --dynamic at several rank counts on the same global batch: the
# tables' last statistics (inserts, evictions, admissions refused, hit
# rate: DynamicPS sends every key to its owner, and AllGatherv every key to
# every replica, so they are one process's)
# are identical, and the final and held-out losses within a relative
# tolerance of the first run's (the MLPs' gradients are summed in another
# order at each rank count).
#
#   dynamic_ranks.sh <tolerance> <global batch> "<ranks...>" <mpiexec> <np-flag> <example> [args...]
#
# Prints "Passed" last when the runs agree.
set -eu
tol=$1 global=$2 counts=$3 mpiexec=$4 npflag=$5 exe=$6
shift 6
first_stats="" first_losses="" status=0
for n in $counts; do
  out=$("$mpiexec" "$npflag" "$n" "$exe" --dynamic --batch $((global / n)) "$@") || {
    printf '%s\n' "$out" >&2
    echo "dynamic_ranks: the run at $n ranks failed"
    echo Failed
    exit 1
  }
  stats=$(printf '%s\n' "$out" | grep '^  tables at step' | tail -n 1 | sed 's/.*\(inserts [^;]*\);.*/\1/')
  losses=$(printf '%s\n' "$out" | sed -n 's/^result:.* final_loss=\([^ ]*\) .* heldout_loss=\([^ ]*\) .*/\1 \2/p')
  echo "$n ranks: $stats; final and held-out loss $losses"
  if [ -z "$stats" ] || [ -z "$losses" ]; then
    printf '%s\n' "$out" >&2
    echo "dynamic_ranks: no table statistics or result line at $n ranks"
    echo Failed
    exit 1
  fi
  if [ -z "$first_stats" ]; then
    first_stats=$stats first_losses=$losses
    continue
  fi
  [ "$stats" = "$first_stats" ] || { echo "  statistics DIFFERENT from the first run's"; status=1; }
  echo "$first_losses $losses" | awk -v tol="$tol" '{
    for (i = 1; i <= 2; ++i) {
      d = $(i + 2) - $i; if (d < 0) d = -d
      if (d > tol * ($i < 0 ? -$i : $i)) { printf "  loss %d DIFFERENT: %s against %s\n", i, $(i + 2), $i; exit 1 }
    }
  }' || status=1
done
if [ "$status" -eq 0 ]; then echo Passed; else echo Failed; fi
exit "$status"
