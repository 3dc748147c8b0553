#!/bin/sh
# Runs example 05 at one rank count with every given stage count and both
# schedules, same seed and global batch, and checks that the final losses
# agree within a relative tolerance (float noise: the stages' replicas sum
# their gradients in different orders and micro-batches split the sums).
#
#   same_loss_stages.sh <tolerance> "<stage counts>" <mpiexec> <np-flag> <ranks> <example> [args...]
set -eu
tol=$1 stages=$2 mpiexec=$3 npflag=$4 ranks=$5 exe=$6
shift 6
losses=""
for s in $stages; do
  for schedule in gpipe 1f1b; do
    out=$("$mpiexec" "$npflag" "$ranks" "$exe" --stages "$s" --schedule "$schedule" "$@") || {
      printf '%s\n' "$out"
      echo "same_loss_stages: the run with $s stages ($schedule) failed"
      exit 1
    }
    loss=$(printf '%s\n' "$out" | sed -n 's/^result:.* final_loss=\([^ ]*\).*/\1/p')
    if [ -z "$loss" ]; then
      printf '%s\n' "$out"
      echo "same_loss_stages: no final_loss in the output of $s stages ($schedule)"
      exit 1
    fi
    echo "$s stages, $schedule: final loss $loss"
    losses="$losses $loss"
  done
done
# shellcheck disable=SC2086
echo $losses | awk -v tol="$tol" '{
  worst = 0
  for (i = 2; i <= NF; ++i) {
    d = $i - $1; if (d < 0) d = -d
    r = d / ($1 < 0 ? -$1 : $1)
    if (r > worst) worst = r
  }
  printf "largest relative difference to the first run: %.3g (tolerance %s)\n", worst, tol
  if (worst > tol) { print "Failed"; exit 1 }
  print "Passed"
}'
