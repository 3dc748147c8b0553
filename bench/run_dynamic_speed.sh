#!/usr/bin/env bash
# The speed bar of dynamic tables (issue 38; docs/benchmarks.md, "02_ctr
# --dynamic against fixed tables"): examples/02_ctr --dynamic against the
# same model and stream with fixed sparse tables of the same live rows
# (--dynamic-fixed: a Variable per feature of --dynamic-capacity x ranks
# rows in all, each key hashed into it), alternated ROUNDS times at RANKS
# ranks under ARCH. Prints each run's samples/s, then the medians and their
# ratio (dynamic / fixed). With BASE=<another 02_ctr binary>, its --dynamic
# run joins each round and the last line adds dynamic / base.
#
#   bench/run_dynamic_speed.sh [build-dir]      # default build dir: build/host
#
# Environment: RANKS=2, ARCH=hybrid, ROUNDS=5, STEPS=200, BATCH=1024 (per
# rank), CAPACITY=100000 (rows per rank over the 8 tables), EXTRA=<more options>,
# BASE=<02_ctr of another commit>.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build/host}"
bin="$build/examples/02_ctr"
ranks="${RANKS:-2}" arch="${ARCH:-hybrid}" rounds="${ROUNDS:-5}" steps="${STEPS:-200}" batch="${BATCH:-1024}"
capacity="${CAPACITY:-100000}" base="${BASE:-}"
if [ ! -x "$bin" ]; then
  echo "run_dynamic_speed: $bin not found; build it first: cmake --build $build --target 02_ctr" >&2
  exit 1
fi
if [ -n "$base" ] && [ ! -x "$base" ]; then
  echo "run_dynamic_speed: BASE=$base is not an executable" >&2
  exit 1
fi
# The held-out batch is one step's global batch, so that it fits the tables as a step does.
common=(--dynamic --threads 1 --lr 0.5 --arch "$arch" --batch "$batch" --steps "$steps" --log-every "$steps"
        --warmup $((steps / 10)) --dynamic-capacity "$capacity" --eval-examples $((batch * ranks)) --pass-ratio 1
        ${EXTRA:-})
echo "mpiexec -n $ranks $bin ${common[*]} [--dynamic-fixed]" >&2
modes=(dynamic fixed)
[ -n "$base" ] && modes+=(base)
dyn=() fix=() bas=()
for ((r = 1; r <= rounds; ++r)); do
  for mode in "${modes[@]}"; do
    flag=() exe="$bin"
    [ "$mode" = fixed ] && flag=(--dynamic-fixed)
    [ "$mode" = base ] && exe="$base"
    sps=$(mpiexec -n "$ranks" "$exe" "${common[@]}" "${flag[@]}" | sed -n 's/^result:.* samples_per_s=\([^ ]*\) .*/\1/p')
    echo "round $r $mode: $sps samples/s"
    case "$mode" in
      dynamic) dyn+=("$sps") ;;
      fixed) fix+=("$sps") ;;
      base) bas+=("$sps") ;;
    esac
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
md=$(median "${dyn[@]}") mf=$(median "${fix[@]}") mb=""
[ -n "$base" ] && mb=$(median "${bas[@]}")
awk -v d="$md" -v f="$mf" -v b="$mb" -v n="$ranks" -v a="$arch" 'BEGIN {
  printf "%s, %d ranks: median samples/s dynamic %.0f, fixed %.0f: dynamic / fixed %.2f", a, n, d, f, d / f
  if (b != "") printf "; base dynamic %.0f: dynamic / base %.2f", b, d / b
  printf "\n"
}'
