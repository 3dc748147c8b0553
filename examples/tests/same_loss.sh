#!/bin/sh
# Runs an example several ways on the same seed and checks that the final
# losses agree.
#
#   same_loss.sh within <tolerance> "<runs>" <mpiexec> <np-flag> <ranks> <example> [args...]
#     Each run (a comma-separated list of option sets, e.g. "--arch hybrid,
#     --arch ps"): final_loss within a relative tolerance of the first run's
#     (float noise: the runs sum the same gradients in different orders).
#   same_loss.sh twin <tolerance> "<archs>" <mpiexec> <np-flag> <ranks> <example> <cuda twin> [args...]
#     Under each given architecture, the host example and its CUDA twin (the
#     same source through nvcc, training in device memory) on the same
#     arguments: final_loss within a relative tolerance of the host's (cuBLAS
#     and OpenBLAS sum a product's terms in different orders). Prints
#     whether the two are also bit-identical. The twin's runs take
#     $TWIN_LAUNCHER between mpiexec and the program, and $TWIN_ARGS after
#     the common arguments, where set.
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
if [ "$mode" = within ] || [ "$mode" = twin ]; then
  runs=$1
  shift
fi
mpiexec=$1 npflag=$2 ranks=$3 exe=$4
shift 4
twin=""
if [ "$mode" = twin ]; then
  twin=$1
  shift
fi

# final <field> <what> [example args...]: runs the example ($program, by
# default $exe) and prints the value of <field> in its result line (field
# "line": the whole line).
final() {
  field=$1 what=$2
  shift 2
  # shellcheck disable=SC2086
  out=$("$mpiexec" "$npflag" "$ranks" ${launcher:-} "${program:-$exe}" "$@" ${extra:-}) || {
    printf '%s\n' "$out" >&2
    echo "same_loss: the $what run failed" >&2
    return 1
  }
  if [ "$field" = line ]; then
    value=$(printf '%s\n' "$out" | grep '^result:' || true)
  else
    value=$(printf '%s\n' "$out" | sed -n "s/^result:.* $field=\([^ ]*\).*/\1/p")
  fi
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
twin)
  status=0
  for arch in $runs; do
    # One run each: the loss and its bits from the same result line.
    program=$exe
    line=$(final line "$arch on the host" --arch "$arch" "$@")
    host=$(printf '%s\n' "$line" | sed -n 's/.* final_loss=\([^ ]*\).*/\1/p')
    host_hex=$(printf '%s\n' "$line" | sed -n 's/.* final_loss_hex=\([^ ]*\).*/\1/p')
    program=$twin launcher=${TWIN_LAUNCHER:-} extra=${TWIN_ARGS:-}
    line=$(final line "$arch on the GPU" --arch "$arch" "$@")
    launcher="" extra=""
    cuda=$(printf '%s\n' "$line" | sed -n 's/.* final_loss=\([^ ]*\).*/\1/p')
    cuda_hex=$(printf '%s\n' "$line" | sed -n 's/.* final_loss_hex=\([^ ]*\).*/\1/p')
    verdict=$(echo "$host $cuda" | awk -v tol="$param" '{
      d = $2 - $1; if (d < 0) d = -d
      r = d / ($1 < 0 ? -$1 : $1)
      printf "relative difference %.3g (tolerance %s)", r, tol
      if (r > tol) printf ": TOO FAR"
    }')
    same="different bits"
    if [ -z "$host_hex" ] || [ -z "$cuda_hex" ]; then same="bits not printed (no final_loss_hex)"
    elif [ "$host_hex" = "$cuda_hex" ]; then same="bit-identical"; fi
    echo "$arch: host $host, GPU $cuda: $verdict, $same"
    case $verdict in *"TOO FAR"*) status=1 ;; esac
  done
  if [ "$status" -eq 0 ]; then echo Passed; else echo Failed; fi
  exit "$status"
  ;;
*)
  echo "same_loss.sh: the mode is 'within', 'twin' or 'overlap', got '$mode'" >&2
  exit 2
  ;;
esac
