#!/usr/bin/env bash
# Overlap of communication with compute (issue 22), at 2 ranks:
#   1. bench_overlap: a synthetic backward pass of --layers dense layers,
#      compute and communication each 0.25x-4x the other, with ready() per
#      layer on the communication thread (overlap), without ready() (plain),
#      ready() moving each bucket in the caller (TrainerOptions::overlap
#      off), and both with TrainerOptions::update_when_ready; then again under MPICH's asynchronous progress thread
#      (MPIR_CVAR_ASYNC_PROGRESS=1); and, as a diagnostic, with each layer's
#      compute a sleep (a core left free for the communication thread).
#   2. 03_dense_mlp and 01_word_lm with --overlap on, update and off, runs
#      taking turns, medians of samples/s.
#   3. The timeline's cost: 01_word_lm with PARALLAX_TIMELINE unset and set,
#      alternating, and bench_timeline's cost of one phase's span.
# Prints markdown tables ready to paste (docs/benchmarks.md, "Overlap of communication with compute"),
# and keeps the raw output in $OUT_DIR.
#
#   bench/run_overlap.sh                  # about 5-8 minutes on a quiet 2-core machine
#   REPS=7 bench/run_overlap.sh           # more alternating example runs (default 5)
#   GRAD_KIB=256,2048 RATIOS=0.25,0.5,1,2,4 LAYERS=8 bench/run_overlap.sh
#   PARALLAX_PREBUILT=1 bench/run_overlap.sh   # no build (the binaries in build/host)
#
# Timings are only as quiet as the machine: run it with nothing else busy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build/host"
out="${OUT_DIR:-$build/bench/overlap}"
reps="${REPS:-5}"
layers="${LAYERS:-8}"
grad_kib="${GRAD_KIB:-256,2048}"
ratios="${RATIOS:-0.25,0.5,1,2,4}"
steps="${STEPS:-8}"
rounds="${ROUNDS:-3}"
np=2

if [ -z "${PARALLAX_PREBUILT:-}" ]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target bench_overlap bench_timeline 01_word_lm 03_dense_mlp
fi
mkdir -p "$out"
rm -f "$out"/*.txt "$out"/*.json
echo "== load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

# 1. The synthetic backward pass, plain MPICH and with its progress thread.
bench=(mpiexec -n "$np" "$build/bench/bench_overlap" --layers "$layers" --grad-kib "$grad_kib" --ratios "$ratios"
       --steps "$steps" --rounds "$rounds")
echo "== bench_overlap" >&2
"${bench[@]}" | tee "$out/synthetic.txt" >&2
echo "== bench_overlap, MPIR_CVAR_ASYNC_PROGRESS=1" >&2
MPIR_CVAR_ASYNC_PROGRESS=1 "${bench[@]}" | tee "$out/synthetic_async.txt" >&2
# The diagnostic: a layer's compute sleeps, leaving the core to the
# communication thread (as beside a GPU kernel, or with a spare core per rank).
echo "== bench_overlap --compute sleep" >&2
"${bench[@]}" --compute sleep | tee "$out/synthetic_sleep.txt" >&2

# 2. The examples, --overlap on, update and off, taking turns.
mlp_args=(--hidden 512 --batch 512 --steps 80 --warmup 10 --log-every 1000 --eval-examples 512 --margin -1)
lm_args=(--vocab 100000 --dim 64 --sampled 1024 --batch 512 --steps 40 --warmup 5 --log-every 1000
         --tokens 300000 --eval-examples 0 --pass-ratio 2)
run_example() {  # <file> <exe> <args...>: appends the result line
  local file=$1 exe=$2
  shift 2
  mpiexec -n "$np" "$build/examples/$exe" "$@" | grep '^result:' >>"$out/$file"
}
for r in $(seq "$reps"); do
  echo "== examples, round $r of $reps; load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  case $((r % 3)) in
    0) order="on update off" ;;
    1) order="update off on" ;;
    *) order="off on update" ;;
  esac
  for o in $order; do
    run_example "mlp_$o.txt" 03_dense_mlp "${mlp_args[@]}" --overlap "$o"
    run_example "lm_$o.txt" 01_word_lm "${lm_args[@]}" --overlap "$o"
  done
done

# 3. The timeline's cost: unset against set, alternating.
for r in $(seq "$reps"); do
  echo "== timeline cost, round $r of $reps" >&2
  order="unset set"
  [ $((r % 2)) -eq 0 ] && order="set unset"
  for t in $order; do
    if [ "$t" = set ]; then
      PARALLAX_TIMELINE="$out/timeline_lm.json" run_example "lm_timeline_set.txt" 01_word_lm "${lm_args[@]}"
    else
      run_example "lm_timeline_unset.txt" 01_word_lm "${lm_args[@]}"
    fi
  done
done
mpiexec -n 1 "$build/bench/bench_timeline" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_out_format=json --benchmark_out="$out/span.json" >&2

echo "== load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
commit="$(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- include bench examples || echo '+changes')"
python3 - "$out" "$commit" "$layers" "$reps" <<'EOF'
import json, os, re, statistics, sys
out, commit, layers, reps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def fields(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)

def points(name):
    with open(os.path.join(out, name)) as f:
        return [fields(l) for l in f if l.startswith("point ")]

def ms(us):
    return f"{float(us) / 1000:.2f}"

print(f"Machine: `{open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}`, "
      f"{os.cpu_count()} hardware threads; MPICH; commit `{commit}`; 2 ranks.\n")
print(f"### Synthetic backward pass ({layers} layers, a fusion bucket per layer; medians, ms)\n")
def synthetic_table(name):
    print("| gradient / layer | compute | comm | compute / comm | last bucket | overlap (ready, comm. thread) "
          "| plain (no ready) | ready, in caller | update when ready: thread | update when ready: caller "
          "| bound max(c, comm) + last | bar 1.2 max + last | overlap / bar | update when ready (thread) / bar "
          "| plain / (c + comm) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for p in points(name):
        c, m, last = float(p["compute_us"]), float(p["comm_us"]), float(p["last_us"])
        o, pl, q = float(p["overlap_us"]), float(p["plain_us"]), float(p["caller_us"])
        e, ec = float(p["early_us"]), float(p["early_caller_us"])
        bound, bar = float(p["bound_us"]), float(p["bar_us"])
        print(f"| {float(p['grad_kib']):g} KiB | {ms(c)} | {ms(m)} | {c / m:.2f} | {ms(last)} | {ms(o)} | {ms(pl)} "
              f"| {ms(q)} | {ms(e)} | {ms(ec)} | {ms(bound)} | {ms(bar)} | {o / bar:.2f} | {e / bar:.2f} "
              f"| {pl / (c + m):.2f} |")

synthetic_table("synthetic.txt")
print(f"\n### Diagnostic: the same with each layer's compute a sleep (a core free for the communication thread)\n")
synthetic_table("synthetic_sleep.txt")
print("\n### Progress options (the same points; step time, ms)\n")
print("| gradient / layer | compute:comm asked | (a) comm. thread | (b) ready, overlap off | (c) async progress + comm. thread "
      "| (c) async progress + ready, overlap off | (c) async progress, no ready |")
print("|---|---|---|---|---|---|---|")
for p, a in zip(points("synthetic.txt"), points("synthetic_async.txt")):
    print(f"| {float(p['grad_kib']):g} KiB | {float(p['ratio']):g} | {ms(p['overlap_us'])} | {ms(p['caller_us'])} "
          f"| {ms(a['overlap_us'])} | {ms(a['caller_us'])} | {ms(a['plain_us'])} |")

def examples(name):
    path = os.path.join(out, name)
    with open(path) as f:
        return [float(fields(l)["samples_per_s"]) for l in f]

print(f"\n### The examples, --overlap on and update against off (2 ranks, {reps} runs each taking turns, medians)\n")
print("| example | off: samples/s | on: samples/s | update: samples/s | on / off | update / off | runs off | runs on "
      "| runs update |")
print("|---|---|---|---|---|---|---|---|---|")
for label, key in (("03_dense_mlp", "mlp"), ("01_word_lm", "lm")):
    off, on, up = examples(f"{key}_off.txt"), examples(f"{key}_on.txt"), examples(f"{key}_update.txt")
    m_off, m_on, m_up = statistics.median(off), statistics.median(on), statistics.median(up)
    runs = lambda xs: ', '.join(f'{x:.0f}' for x in xs)
    print(f"| {label} | {m_off:.0f} | {m_on:.0f} | {m_up:.0f} | {m_on / m_off:.3f} | {m_up / m_off:.3f} "
          f"| {runs(off)} | {runs(on)} | {runs(up)} |")

unset, tset = examples("lm_timeline_unset.txt"), examples("lm_timeline_set.txt")
size = os.path.getsize(os.path.join(out, "timeline_lm.json"))
print(f"\n### Timeline cost (01_word_lm, 2 ranks, {reps} alternating runs each, medians)\n")
print("| PARALLAX_TIMELINE | samples/s | runs | relative |")
print("|---|---|---|---|")
print(f"| unset | {statistics.median(unset):.0f} | {', '.join(f'{x:.0f}' for x in unset)} | 1 |")
print(f"| set | {statistics.median(tset):.0f} | {', '.join(f'{x:.0f}' for x in tset)} "
      f"| {statistics.median(tset) / statistics.median(unset):.3f} |")
print(f"\nThe trace of one such run: {size / 1024:.0f} KiB of JSON.\n")
with open(os.path.join(out, "span.json")) as f:
    bench = json.load(f)["benchmarks"]
print("| one phase's span (bench_timeline) | median ns |")
print("|---|---|")
for b in bench:
    if b.get("aggregate_name") == "median":
        print(f"| {b['run_name']} | {b['real_time']:.1f} |")
EOF
