#!/bin/sh
# Runs an example with --overlap off (no ready() calls, TrainerOptions::
# overlap false) and --overlap on (ready() per layer, the trainer's
# communication thread) under each given architecture, and checks that the
# final losses are bit-identical (final_loss_hex): ready() changes when
# gradients move, never what is summed.
#
#   same_loss_overlap.sh "<archs>" <mpiexec> <np-flag> <ranks> <example> [args...]
#
# The example must print a line "result: ... final_loss_hex=<x> ..." and exit 0.
set -eu
archs=$1 mpiexec=$2 npflag=$3 ranks=$4 exe=$5
shift 5
status=0
for arch in $archs; do
  off="" on=""
  for overlap in off on; do
    out=$("$mpiexec" "$npflag" "$ranks" "$exe" --arch "$arch" --overlap "$overlap" "$@") || {
      printf '%s\n' "$out"
      echo "same_loss_overlap: $arch --overlap $overlap run failed"
      exit 1
    }
    loss=$(printf '%s\n' "$out" | sed -n 's/^result:.* final_loss_hex=\([^ ]*\).*/\1/p')
    if [ -z "$loss" ]; then
      printf '%s\n' "$out"
      echo "same_loss_overlap: no final_loss_hex in the $arch --overlap $overlap run's output"
      exit 1
    fi
    eval "$overlap=\$loss"
  done
  if [ "$off" = "$on" ]; then
    echo "$arch: --overlap off $off, on $on: identical"
  else
    echo "$arch: --overlap off $off, on $on: DIFFERENT"
    status=1
  fi
done
if [ "$status" -eq 0 ]; then echo Passed; else echo Failed; fi
exit "$status"
