#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz/fuzz_*.cpp: the checkpoint
# manifest and rank-file readers, the examples' text-corpus and Criteo TSV
# readers) for a bounded time each, under AddressSanitizer and
# UndefinedBehaviorSanitizer. A crash fails the run and leaves its input in
# build/fuzz/crashes/<target>/; copy it into tests/fuzz/corpus/<target>/ and
# it becomes a regression test (CTest replays every corpus file in every
# build: fuzz_replay_<target>).
#
#   scripts/fuzz.sh              # 30 s per target
#   FUZZ_SECONDS=600 scripts/fuzz.sh
#   scripts/fuzz.sh build        # only build; scripts/fuzz.sh run: only run
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/setup.sh" clang libclang-rt-14-dev
seconds="${FUZZ_SECONDS:-30}"
phase="${1:-all}"
case "$phase" in all | build | run) ;; *) echo "fuzz.sh: unknown phase '$phase' (build, run or none)" >&2; exit 2 ;; esac
build="$root/build/fuzz"

targets=()
for src in "$root"/tests/fuzz/fuzz_*.cpp; do
  t="$(basename "$src" .cpp)"
  targets+=("$t")
done
if [ "$phase" != run ]; then
  # Only the fuzz targets are needed: no examples, benchmarks or CUDA.
  CXX=clang++ CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPARALLAX_ENABLE_CUDA=OFF \
    -DPARALLAX_FUZZ=ON -DPARALLAX_BUILD_EXAMPLES=OFF -DPARALLAX_BUILD_BENCH=OFF >/dev/null
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi
[ "$phase" != build ] || exit 0

# One fuzzer per core at a time: each is single-threaded.
fuzz_one() {
  local t="$1" name="${1#fuzz_}"
  local work="$build/work/$name" crashes="$build/crashes/$name"
  rm -rf "$work"
  mkdir -p "$work" "$crashes"
  # The working corpus starts from the seeds; new inputs stay in build/.
  if ! "$build/tests/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$crashes/" "$work" "$root/tests/fuzz/corpus/$name" >"$build/$name.log" 2>&1; then
    echo "FUZZ FAILURE in $t: input and log in $crashes/ and $build/$name.log" >&2
    tail -40 "$build/$name.log" >&2
    return 1
  fi
  echo "== $t: $seconds s (seeds: tests/fuzz/corpus/$name): $(grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/$name.log" | tr '\n' ' ')"
}

status=0
jobs="$(nproc)"
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  pids=()
  for t in "${targets[@]:i:jobs}"; do
    fuzz_one "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
done
exit $status
