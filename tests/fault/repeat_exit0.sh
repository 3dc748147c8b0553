#!/usr/bin/env bash
# The exit0 drill (one rank of 4 calls _exit(0) at step 3) N times, with the
# exit monitor and without it (PARALLAX_EXIT_MONITOR=0): counts the runs whose
# job status was 0 and those where rank 0 named the vanished rank.
#
#   tests/fault/repeat_exit0.sh build/host/tests/fault/fault_drill [N=20]
set -u
drill=$1; n=${2:-20}; logs=$(mktemp -d)
for monitor in 1 0; do
  zero=0; statuses=""
  for i in $(seq "$n"); do
    PARALLAX_EXIT_MONITOR=$monitor PARALLAX_TIMEOUT_MS=3000 timeout 120 mpiexec -n 4 "$drill" --mode exit0 --victim 2 \
      --at-step 3 --steps 8 --timeout-ms 3000 > "$logs/m$monitor-$i.log" 2>&1
    rc=$?; statuses="$statuses $rc"; [ $rc -eq 0 ] && zero=$((zero + 1))
  done
  named=$(grep -l "rank 0 gave up.*Rank 2 did not arrive" "$logs"/m$monitor-*.log | wc -l)
  echo "PARALLAX_EXIT_MONITOR=$monitor: $n runs, job status 0 in $zero (statuses:$statuses); rank 0 named rank 2 in $named"
done
rm -rf "$logs"
