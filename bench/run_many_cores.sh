#!/usr/bin/env bash
# What a machine with many cores shows that the 2-core CI machine cannot
# (docs/benchmarks.md, "On 16 cores"): every rank has a core of its own and
# a spare one for its communication thread.
#   1. bench_overlap's synthetic backward pass at 2, 4 and 8 ranks: the
#      communication thread against the bar of "Overlap" (1.2 x max(compute,
#      communication) + the last bucket), arithmetic compute.
#   2. 03_dense_mlp and 01_word_lm with --overlap on, update and off at 4
#      ranks, runs taking turns, medians of samples/s.
#   3. hybrid against all-reduce (bench/run_arch_ratio.sh) for 01_word_lm
#      and 02_ctr at 4 and 8 ranks.
# Prints markdown tables and keeps the raw output in $OUT_DIR.
#
#   bench/run_many_cores.sh                      # the binaries in build/host
#   BUILD=build/gpu bench/run_many_cores.sh      # or another build's (a CUDA
#                                                # build with host copies)
#   RANKS="2 4 8" REPS=3 ROUNDS=3 bench/run_many_cores.sh
#   RANKS="" RATIO_RANKS="4 8" RATIO_EXAMPLES=word_lm bench/run_many_cores.sh   # parts only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD:-$root/build/host}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
out="${OUT_DIR:-$build/bench/many_cores}"
read -r -a ranks <<<"${RANKS-2 4 8}"  # RANKS="": no synthetic pass
reps="${REPS:-3}"
rounds="${ROUNDS:-3}"
example_np="${EXAMPLE_RANKS:-4}"
ratio_ranks="${RATIO_RANKS-4 8}"
cores="$(nproc)"
mkdir -p "$out"
rm -f "$out"/*.txt
for np in "${ranks[@]+"${ranks[@]}"}"; do
  if [ $((2 * np)) -gt "$cores" ]; then
    echo "run_many_cores: $np ranks need $((2 * np)) cores (one and a spare each); this machine has $cores" >&2
    exit 1
  fi
done

for np in "${ranks[@]+"${ranks[@]}"}"; do
  echo "== bench_overlap, $np ranks" >&2
  mpiexec -n "$np" "$build/bench/bench_overlap" --layers 8 --grad-kib 256,2048 --ratios 0.25,0.5,1,2,4 --steps 8 \
    --rounds 3 | tee "$out/synthetic_np$np.txt" >&2
done

mlp_args=(--hidden 512 --batch 512 --steps "${MLP_STEPS:-80}" --warmup 10 --log-every 1000 --eval-examples 512 --margin -1 --threads 1)
lm_args=(--vocab 100000 --dim 64 --sampled 1024 --batch 512 --steps "${LM_STEPS:-40}" --warmup 5 --log-every 1000
         --tokens 300000 --eval-examples 0 --pass-ratio 2 --threads 1)
[ -n "${EXAMPLE_RANKS-4}" ] && for r in $(seq "$reps"); do
  case $((r % 3)) in
    0) order="on update off" ;;
    1) order="update off on" ;;
    *) order="off on update" ;;
  esac
  for o in $order; do
    echo "== examples at $example_np ranks, round $r, --overlap $o" >&2
    mpiexec -n "$example_np" "$build/examples/03_dense_mlp" "${mlp_args[@]}" --overlap "$o" | grep '^result:' >>"$out/mlp_$o.txt"
    mpiexec -n "$example_np" "$build/examples/01_word_lm" "${lm_args[@]}" --overlap "$o" | grep '^result:' >>"$out/lm_$o.txt"
  done
done

for np in $ratio_ranks; do
  echo "== hybrid / allreduce, $np ranks" >&2
  ROUNDS="$rounds" "$root/bench/run_arch_ratio.sh" "$build/examples/01_word_lm" "$np" --vocab 100000 --dim 64 \
    --sampled 1024 --batch 128 --steps 40 --warmup 5 --log-every 1000 --tokens 300000 --eval-examples 0 \
    --pass-ratio 2 --threads 1 | tee -a "$out/ratio.txt"
  if [[ " ${RATIO_EXAMPLES:-word_lm ctr} " == *" ctr "* ]]; then
    ROUNDS="$rounds" "$root/bench/run_arch_ratio.sh" "$build/examples/02_ctr" "$np" --batch 256 --steps 40 \
      --warmup 5 --log-every 1000 --eval-examples 256 --threads 1 | tee -a "$out/ratio.txt"
  fi
done

commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
python3 - "$out" "$commit" "$example_np" "${ranks[@]+"${ranks[@]}"}" <<'EOF'
import os, statistics, sys
out, commit, example_np, ranks = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
fields = lambda line: dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
cpu = open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].splitlines()[0].strip()
print(f"Machine: `{cpu}`, {os.cpu_count()} hardware threads; MPICH; commit `{commit}`.\n")
if ranks: print("### Synthetic backward pass (8 layers, a bucket per layer; medians, ms): communication thread against the bar\n")
if ranks:
    print("| ranks | gradient / layer | compute / comm | compute | comm | last bucket | overlap (thread) | bar "
          "| overlap / bar | update when ready / bar |")
    print("|---|---|---|---|---|---|---|---|---|---|")
for np in ranks:
    with open(os.path.join(out, f"synthetic_np{np}.txt")) as f:
        pts = [fields(l) for l in f if l.startswith("point ")]
    met = 0
    for p in pts:
        c, m, bar = float(p["compute_us"]), float(p["comm_us"]), float(p["bar_us"])
        o, e = float(p["overlap_us"]), float(p["early_us"])
        met += o <= bar
        print(f"| {np} | {float(p['grad_kib']):g} KiB | {c / m:.2f} | {c / 1e3:.2f} | {m / 1e3:.2f} "
              f"| {float(p['last_us']) / 1e3:.2f} | {o / 1e3:.2f} | {bar / 1e3:.2f} | {o / bar:.2f} | {e / bar:.2f} |")
    print(f"| {np} | **bar met at {met} of {len(pts)} points** | | | | | | | | |")
if os.path.exists(os.path.join(out, "mlp_off.txt")):
  print(f"\n### The examples at {example_np} ranks, --overlap on and update against off (runs taking turns, medians)\n")
  print("| example | off | on | update | on / off | update / off | runs off | runs on | runs update |")
  print("|---|---|---|---|---|---|---|---|---|")
  for label, key in (("03_dense_mlp", "mlp"), ("01_word_lm", "lm")):
    rate = lambda o: [float(fields(l)["samples_per_s"]) for l in open(os.path.join(out, f"{key}_{o}.txt"))]
    off, on, up = rate("off"), rate("on"), rate("update")
    mo, mn, mu = statistics.median(off), statistics.median(on), statistics.median(up)
    runs = lambda xs: ", ".join(f"{x:.0f}" for x in xs)
    print(f"| {label} | {mo:.0f} | {mn:.0f} | {mu:.0f} | {mn / mo:.3f} | {mu / mo:.3f} | {runs(off)} | {runs(on)} "
          f"| {runs(up)} |")
if os.path.exists(os.path.join(out, "ratio.txt")):
  print("\n### hybrid against all-reduce (bench/run_arch_ratio.sh)\n")
  print(open(os.path.join(out, "ratio.txt")).read())
EOF
