#!/usr/bin/env bash
# The parallax demo: examples/01_word_lm at an LM1B-like vocabulary (800,000
# words: its embedding and sampled-softmax tables are the sparse variables
# that make LM1B hard) trained by 4 MPI ranks under each architecture, then
# one table: architecture, words/s, bytes sent per step per rank, final loss.
#
#   scripts/demo.sh                 # from a fresh machine: installs, builds, runs
#   DEMO_STEPS=60 scripts/demo.sh   # shorter (words/s still from step DEMO_WARMUP + 1, default 21)
#   DEMO_RANKS=2 scripts/demo.sh    # another rank count
#
# The three runs use the same seed, so they train the same model: the final
# losses agree to float noise while the bytes and the speed differ.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh"
build="$root/build/host"
ranks="${DEMO_RANKS:-4}"
steps="${DEMO_STEPS:-100}"
# words/s leaves out the first steps: a run's first steps touch its freshly
# grown buffers once (the all-reduce architecture's several times more memory
# than the hybrid's), which is start-up, not throughput.
warmup="${DEMO_WARMUP:-20}"
# LM1B: vocabulary 793,470, width 512, 8192 sampled classes per step. The width
# is scaled down so the all-reduce architecture's full replicas of both tables
# (one per rank) fit this machine's memory and time.
shape=(--vocab 800000 --dim 128 --sampled 8192 --context 2 --batch 32 --tokens 2000000)

start=$(date +%s)
echo "== building examples/01_word_lm (host configuration) in $build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPARALLAX_ENABLE_CUDA=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target 01_word_lm
exe="$build/examples/01_word_lm"

echo "== training on $ranks ranks, $steps steps each: ${shape[*]}"
log="$build/demo"
mkdir -p "$log"
for arch in hybrid allreduce ps; do
  echo "-- --arch $arch"
  mpiexec -n "$ranks" "$exe" --arch "$arch" --steps "$steps" --warmup "$warmup" --log-every 20 --eval-examples 0 --pass-ratio 0.95 \
    "${shape[@]}" | tee "$log/$arch.txt"
done

echo
echo "== 01_word_lm, vocabulary 800,000, $ranks ranks, $steps steps (same seed)"
printf '%-10s %12s %22s %12s\n' architecture "words/s" "bytes sent/step/rank" "final loss"
for arch in hybrid allreduce ps; do
  line=$(grep '^result:' "$log/$arch.txt")
  field() { printf '%s\n' "$line" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
  printf '%-10s %12s %22s %12s\n' "$arch" "$(field samples_per_s)" \
    "$(awk -v b="$(field bytes_per_step)" 'BEGIN { printf "%.2f MiB", b / 1048576 }')" "$(field final_loss)"
done
echo "(bytes from trainer.stats(): the mean over the ranks of what each sent per step; words/s over steps $((warmup + 1))-$steps)"
echo "demo took $(( $(date +%s) - start )) s"
