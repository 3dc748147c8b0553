#!/bin/sh
# Runs an example under each architecture with the same seed and checks that
# the final losses agree within a relative tolerance (float noise: the
# architectures sum the same gradients in different orders).
#
#   same_loss.sh <tolerance> <mpiexec> <np-flag> <ranks> <example> [args...]
#
# The example must print a line "result: ... final_loss=<x> ..." and exit 0.
set -eu
tol=$1 mpiexec=$2 npflag=$3 ranks=$4 exe=$5
shift 5
losses=""
for arch in hybrid allreduce ps; do
  out=$("$mpiexec" "$npflag" "$ranks" "$exe" --arch "$arch" "$@") || {
    printf '%s\n' "$out"
    echo "same_loss: $arch run failed"
    exit 1
  }
  loss=$(printf '%s\n' "$out" | sed -n 's/^result:.* final_loss=\([^ ]*\).*/\1/p')
  if [ -z "$loss" ]; then
    printf '%s\n' "$out"
    echo "same_loss: no final_loss in the $arch run's output"
    exit 1
  fi
  echo "$arch: final loss $loss"
  losses="$losses $loss"
done
# shellcheck disable=SC2086
echo $losses | awk -v tol="$tol" '{
  worst = 0
  for (i = 2; i <= NF; ++i) {
    d = $i - $1; if (d < 0) d = -d
    r = d / ($1 < 0 ? -$1 : $1)
    if (r > worst) worst = r
  }
  printf "largest relative difference to hybrid: %.3g (tolerance %s)\n", worst, tol
  if (worst > tol) { print "Failed"; exit 1 }
  print "Passed"
}'
