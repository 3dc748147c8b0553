#!/usr/bin/env bash
# The memory and loss bar of dynamic tables (issue 38; docs/benchmarks.md,
# "Dynamic tables on a growing stream"): 02_ctr --dynamic at RANKS ranks on
# a stream of about KEYS distinct 64-bit ids (half the ids from a Zipf pool
# that grows every step, half seen once), first with CAPACITY rows per rank
# (eviction, LRU), then, unless UNBOUNDED=0, with a capacity that holds
# every key (no eviction: the unbounded table), for the same steps. Prints
# each run's table lines and then, per run: the largest resident memory
# of a rank (VmHWM) against its tables' bytes, its growth over the process
# before the model, the final training loss and the held-out loss, and
# the bounded run's losses against the unbounded one's.
#
#   bench/run_dynamic_bar.sh [build-dir]      # default build dir: build/host
#
# Environment: RANKS=4, KEYS=10000000, CAPACITY=100000, BATCH=4096 (per
# rank), FEATURES=8, UNBOUNDED=1, OUT=<dir> (default <build-dir>/bench/results),
# EXTRA=<more 02_ctr options>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
build="${1:-$root/build/host}"
bin="$build/examples/02_ctr"
ranks="${RANKS:-4}" keys="${KEYS:-10000000}" capacity="${CAPACITY:-100000}" batch="${BATCH:-4096}"
features="${FEATURES:-8}" unbounded="${UNBOUNDED:-1}" out="${OUT:-$build/bench/results}"
if [ ! -x "$bin" ]; then
  echo "run_dynamic_bar: $bin not found; build it first: cmake --build $build --target 02_ctr" >&2
  exit 1
fi
mkdir -p "$out"
# Half of each step's ids are seen once: steps for `keys` of them.
global=$((batch * ranks))
steps=$(( (keys + global * features / 2 - 1) / (global * features / 2) ))
common=(--dynamic --threads 1 --lr 0.5 --batch "$batch" --steps "$steps" --log-every $(( (steps + 9) / 10 ))
        --dynamic-features "$features" --dynamic-head-fraction 0.5 --dynamic-head 100000 --dynamic-growth 1000
        --eval-examples 16384 --pass-ratio 1 ${EXTRA:-})

run() {  # run <name> <capacity>
  local log="$out/dynamic_bar_${1}_np${ranks}_k${keys}_c${2}_b${batch}.log"
  echo "== $1: $ranks ranks, capacity $2 rows per rank, $steps steps of $global examples -> $log" >&2
  echo "   mpiexec -n $ranks $bin ${common[*]} --dynamic-capacity $2" >&2
  mpiexec -n "$ranks" "$bin" "${common[@]}" --dynamic-capacity "$2" > "$log" || true  # --pass-ratio 1: reports only
  grep -E '^  tables at step|^  stream|^result' "$log" >&2
  awk -v name="$1" '
    /^  tables at step/ {
      match($0, /tables [0-9.]+ [KMG]iB/); t = substr($0, RSTART + 7, RLENGTH - 7)
      match($0, /VmHWM [0-9.]+ [KMG]iB/); h = substr($0, RSTART + 6, RLENGTH - 6)
      match($0, /\(([0-9.]+) x the tables\)/); r = substr($0, RSTART + 1, RLENGTH - 13) + 0
      if (r > worst) worst = r
      match($0, /evictions [0-9]+/); ev = substr($0, RSTART + 10, RLENGTH - 10)
    }
    /^result:/ {
      match($0, /final_loss=[^ ]+/); fl = substr($0, RSTART + 11, RLENGTH - 11)
      match($0, /heldout_loss=[^ ]+/); hl = substr($0, RSTART + 13, RLENGTH - 13)
    }
    END {
      printf "%s: tables %s a rank, VmHWM %s (largest rank), VmHWM - before the model <= %.3f x the tables at every sample, evictions %s, final loss %s, held-out loss %s\n", name, t, h, worst, ev, fl, hl
    }' "$log"
}
bounded=$(run bounded "$capacity")
echo "$bounded"
if [ "$unbounded" = 1 ]; then
  # Every key fits: the distinct keys of a rank's share, with a quarter to
  # spare for the owners' imbalance.
  big=$(( (keys + (100000 + 1000 * steps) * features) * 5 / 4 / ranks + features * 1000 ))
  free=$(run unbounded "$big")
  echo "$free"
  echo "$bounded
$free" | awk '{ match($0, /final loss [^,]+/); f[NR] = substr($0, RSTART + 11, RLENGTH - 11) + 0
                 match($0, /held-out loss [^ ]+/); h[NR] = substr($0, RSTART + 14) + 0 }
    END { printf "bounded / unbounded: final loss %.4f, held-out loss %.4f\n", f[1] / f[2], h[1] / h[2] }'
fi
