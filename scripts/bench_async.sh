#!/bin/sh
# Asynchronous training against synchronous, with a straggler: 01_word_lm on
# 4 ranks, rank 3's compute slowed 2x; the median over the other ranks of
# each rank's own words/s, per configuration, alternating the configurations
# for ROUNDS rounds; then the final loss of sync and async (no straggler) at
# 2 and 4 ranks on the same samples.
#   scripts/bench_async.sh [build dir] [rounds] [shape]
# shape small (default): --dim 32, 64 words per rank per step (communication
# bound); large: --dim 64 --sampled 512, 1024 words per rank (compute bound),
# 60 steps, and no loss runs.
set -eu
B=${1:-build/host}
ROUNDS=${2:-5}
SHAPE=${3:-small}
LM="$B/examples/01_word_lm --vocab 20000 --tokens 200000 --threads 1 --eval-examples 0"
if [ "$SHAPE" = large ]; then
  RUN="--dim 64 --sampled 512 --batch 1024 --steps 60 --log-every 60"
else
  RUN="--dim 32 --sampled 256 --batch 64 --steps 300 --log-every 300"
fi
med() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
uptime
for r in $(seq "$ROUNDS"); do
  for cfg in "sync:--arch ps --sync sync" "hsync:--arch hybrid --sync sync" "s0:--arch ps --sync async --staleness 0" \
             "s4:--arch ps --sync async --staleness 4" "sinf:--arch ps --sync async --staleness -1"; do
    name=${cfg%%:*}; args=${cfg#*:}
    v=$(nice -n 19 mpiexec -n 4 $LM $args $RUN --slow-rank 3 --slow-factor 2 |
        sed -n 's/.*others_samples_per_s=\([0-9.]*\).*/\1/p')
    echo "$name $v" >> /tmp/bench_async.$$
    echo "round $r $name others_words_per_s=$v"
  done
done
for name in sync hsync s0 s4 sinf; do
  printf "%s median %s\n" "$name" "$(grep "^$name " /tmp/bench_async.$$ | cut -d' ' -f2 | med)"
done
rm -f /tmp/bench_async.$$
[ "$SHAPE" = large ] && { uptime; exit 0; }
for n in 2 4; do
  for cfg in "--arch ps --sync sync" "--arch ps --sync async --staleness 4" "--arch hybrid --sync sync" "--arch hybrid --sync async --staleness 4"; do
    l=$(nice -n 19 mpiexec -n $n $LM --dim 32 --sampled 256 $cfg --batch $((512 / n)) --steps 300 --log-every 50 | sed -n 's/.*final_loss=\([0-9.]*\) .*/\1/p')
    echo "loss np$n $cfg: $l"
  done
done
uptime
