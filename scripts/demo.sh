#!/usr/bin/env bash
# The parallax demo: examples/01_word_lm at an LM1B-like vocabulary (800,000
# words: its embedding and sampled-softmax tables are the sparse variables
# that make LM1B hard) and a realistic batch (1,024 words per rank), trained
# by one rank per core under each architecture, then one table:
# architecture, words/s, bytes sent per step per rank, where the step's time
# went (the model's own math, its matrix products among it, and parallax),
# final loss.
#
#   scripts/demo.sh                 # from a fresh machine: installs, builds, runs
#   DEMO_STEPS=100 scripts/demo.sh  # longer (words/s from step DEMO_WARMUP + 1, default 11)
#   DEMO_RANKS=4 scripts/demo.sh    # another rank count (default: one per core, 2 to 4)
#   DEMO_BATCH=32 scripts/demo.sh   # words per rank (default 1024)
#
# The three runs use the same seed, so they train the same model: the final
# losses agree to float noise while the bytes and the speed differ.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
build="$root/build/host"
cores="$(nproc)"
default_ranks=$((cores < 2 ? 2 : cores > 4 ? 4 : cores))
ranks="${DEMO_RANKS:-$default_ranks}"
steps="${DEMO_STEPS:-60}"
batch="${DEMO_BATCH:-1024}"
# words/s leaves out the first steps: a run's first steps touch its freshly
# grown buffers once (the all-reduce architecture's several times more memory
# than the hybrid's), which is start-up, not throughput.
warmup="${DEMO_WARMUP:-10}"
# LM1B: vocabulary 793,470, width 512, 8192 sampled classes per step, 2,560
# words per GPU. The width is scaled down so the all-reduce architecture's
# full replicas of both tables (one per rank) fit this machine's memory and
# time.
shape=(--vocab 800000 --dim 128 --sampled 8192 --context 2 --batch "$batch" --tokens 2000000)

start=$(date +%s)
echo "== building examples/01_word_lm (host configuration) in $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$cores" --target 01_word_lm
exe="$build/examples/01_word_lm"

echo "== training on $ranks ranks ($cores cores), $steps steps each: ${shape[*]}"
log="$build/demo"
mkdir -p "$log"
for arch in hybrid allreduce ps; do
  echo "-- --arch $arch"
  mpiexec -n "$ranks" "$exe" --arch "$arch" --steps "$steps" --warmup "$warmup" --log-every 20 --eval-examples 0 \
    --pass-ratio 0.95 "${shape[@]}" | tee "$log/$arch.txt"
done

echo
echo "== 01_word_lm, vocabulary 800,000, $batch words per rank, $ranks ranks, $steps steps (same seed)"
echo "   $(grep -o 'matrix products: .*' "$log/hybrid.txt")"
printf '%-10s %10s %21s %13s %8s %9s %12s\n' architecture "words/s" "bytes sent/step/rank" "model's math" "(GEMMs)" parallax \
  "final loss"
for arch in hybrid allreduce ps; do
  line=$(grep '^result:' "$log/$arch.txt")
  field() { printf '%s\n' "$line" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
  pct() { awk -v x="$1" 'BEGIN { printf "%.0f%%", 100 * x }'; }
  math=$(awk -v p="$(field parallax_share)" -v i="$(field input_share)" 'BEGIN { print 1 - p - i }')
  printf '%-10s %10s %21s %13s %8s %9s %12s\n' "$arch" "$(field samples_per_s)" \
    "$(awk -v b="$(field bytes_per_step)" 'BEGIN { printf "%.2f MiB", b / 1048576 }')" "$(pct "$math")" \
    "($(pct "$(field gemm_share)"))" "$(pct "$(field parallax_share)")" "$(field final_loss)"
done
echo "(bytes from trainer.stats(): the mean over the ranks of what each sent per step; words/s and the time"
echo " shares over steps $((warmup + 1))-$steps, the shares a mean over the ranks: the model's math is its"
echo " kernels, matrix products among them; parallax is its lookups, gradients and trainer.step(), waiting"
echo " for the other ranks included; the rest made the batches)"
echo "On one machine the ranks' bytes move through shared memory at memory speed, so the bytes the hybrid"
echo "saves cost almost nothing here; across machines each one crosses a network link, the regime the"
echo "planner (--arch auto, parallax-plan) and emulated hosts and links (PARALLAX_LINK, docs/cluster.md) are for."
echo "demo took $(( $(date +%s) - start )) s"
