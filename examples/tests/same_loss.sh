#!/bin/sh
# Runs an example several ways on the same seed and checks that the final
# losses agree.
#
#   same_loss.sh within <tolerance> "<runs>" <mpiexec> <np-flag> <ranks> <example> [args...]
#     Each run (a comma-separated list of option sets, e.g. "--arch hybrid,
#     --arch ps"): final_loss within a relative tolerance of the first run's
#     (float noise: the runs sum the same gradients in different orders).
#   same_loss.sh overlap "<archs>" <mpiexec> <np-flag> <ranks> <example> [args...]
#     Under each given architecture, --overlap off (no ready() or prefetch()
#     calls, TrainerOptions::overlap false) and on, and under the first one
#     also --overlap update (TrainerOptions::update_when_ready): final_loss_hex
#     bit-identical (overlap changes when gradients and rows move and when
#     updates are applied, never what is summed or read).
#
# The example must print a line "result: ... final_loss=<x> final_loss_hex=<x> ..."
# and exit 0. Prints "Passed" last when the losses agree.
set -eu
mode=$1 param=$2
shift 2
runs=""
if [ "$mode" = within ]; then
  runs=$1
  shift
fi
mpiexec=$1 npflag=$2 ranks=$3 exe=$4
shift 4

# final <field> <what> [example args...]: runs the example and prints the
# value of <field> in its result line.
final() {
  field=$1 what=$2
  shift 2
  out=$("$mpiexec" "$npflag" "$ranks" "$exe" "$@") || {
    printf '%s\n' "$out" >&2
    echo "same_loss: the $what run failed" >&2
    return 1
  }
  value=$(printf '%s\n' "$out" | sed -n "s/^result:.* $field=\([^ ]*\).*/\1/p")
  if [ -z "$value" ]; then
    printf '%s\n' "$out" >&2
    echo "same_loss: no $field in the $what run's output" >&2
    return 1
  fi
  printf '%s\n' "$value"
}

case $mode in
within)
  losses=""
  count=0
  rest=$runs
  while [ -n "$rest" ]; do
    run=${rest%%,*}
    case $rest in *","*) rest=${rest#*,} ;; *) rest="" ;; esac
    # shellcheck disable=SC2086
    loss=$(final final_loss "$run" $run "$@")
    echo "$run: final loss $loss"
    losses="$losses $loss"
    count=$((count + 1))
  done
  if [ "$count" -lt 2 ]; then
    echo "same_loss.sh: 'within' needs two runs or more, got $count"
    echo Failed
    exit 1
  fi
  # shellcheck disable=SC2086
  echo $losses | awk -v tol="$param" '{
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
  ;;
overlap)
  status=0
  ways="on update"
  for arch in $param; do
    off=$(final final_loss_hex "$arch --overlap off" --arch "$arch" --overlap off "$@")
    for way in $ways; do
      loss=$(final final_loss_hex "$arch --overlap $way" --arch "$arch" --overlap "$way" "$@")
      if [ "$off" = "$loss" ]; then
        echo "$arch: --overlap off $off, $way $loss: identical"
      else
        echo "$arch: --overlap off $off, $way $loss: DIFFERENT"
        status=1
      fi
    done
    ways="on"
  done
  if [ "$status" -eq 0 ]; then echo Passed; else echo Failed; fi
  exit "$status"
  ;;
*)
  echo "same_loss.sh: the mode is 'within' or 'overlap', got '$mode'" >&2
  exit 2
  ;;
esac
