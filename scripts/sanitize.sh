#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (with
# LeakSanitizer), host configuration. Suppressions: tests/sanitizers/*.supp,
# for MPICH's (and its transports') own allocations and one Thrust idiom
# only, each entry explained there. Any report fails the run.
#
#   scripts/sanitize.sh                  # tests at 1 and 2 ranks, fault drills
#   SANITIZE_LABELS='host' scripts/sanitize.sh   # every host test (slower)
#   SANITIZE_FULL_STACKS=1 scripts/sanitize.sh   # whole allocation stacks in reports (slower)
#   SANITIZER=thread scripts/sanitize.sh # the asynchronous-training and overlap tests under
#                                        # ThreadSanitizer, at 1-4 ranks
#   scripts/sanitize.sh build            # only build (scripts/test.sh builds ahead, at idle
#   scripts/sanitize.sh test             # priority, and tests later); no argument: both
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
phase="${1:-all}"
case "$phase" in all | build | test) ;; *) echo "sanitize.sh: unknown phase '$phase' (build, test or none)" >&2; exit 2 ;; esac
# setup.sh takes its arguments as packages to install: the address build is
# clang's (below), the thread build gcc's.
if [ "${SANITIZER:-address}" = thread ]; then set --; else set -- clang libclang-rt-14-dev; fi
source "$root/scripts/setup.sh"

if [ "${SANITIZER:-address}" = thread ]; then
  # ThreadSanitizer sees the threads of one process: a trainer's
  # communication thread against its caller, and the staleness clock's and
  # row locks' atomics within a rank. The ranks' concurrent access to the
  # shared shards is between processes, outside what it instruments; the
  # exact-total tests check that.
  build="$root/build/tsan"
  # Two test programs only: compiling parallax::trainers for them would cost
  # more than it saves, so they instantiate their trainers themselves.
  if [ "$phase" != test ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=None -DPARALLAX_ENABLE_CUDA=OFF \
      -DPARALLAX_BUILD_EXAMPLES=OFF -DPARALLAX_BUILD_BENCH=OFF -DPARALLAX_TRAINERS=OFF \
      -DCMAKE_CXX_FLAGS="-O1 -g1 -fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
    cmake --build "$build" -j "$(nproc)" --target test_policy_async_ps test_trainer parallax_yield
  fi
  [ "$phase" != build ] || exit 0
  export TSAN_OPTIONS="halt_on_error=1:exitcode=66"
  # UCX's memory-event hooks (ucm_madvise) crash TSan's interceptors when a
  # thread exits, as a trainer's communication thread does; parallax never
  # registers memory with UCX, so nothing needs them.
  export UCX_MEM_EVENTS=no
  # MPICH 4.0.2 (ch4:ucx) crashes in MPI_Finalize under TSan, even in a
  # program that only calls MPI_Init_thread and MPI_Finalize, so the exit
  # status says nothing: every rank must have printed Catch2's verdict
  # (after the last case, before finalising) and nobody a TSan report
  # (halt_on_error stops a rank at its first).
  # tsan_run <ranks> <test program> [filter]: every rank passes, no report.
  # Runs of more ranks than cores preload tools/yield (as the CTest entries
  # do): MPICH's blocking calls then give the core away when idle.
  # Each rank's output goes to files of its own (hydra's -outfile-pattern):
  # the ranks' streams interleave character by character on one terminal,
  # which split "All tests passed" and failed a passing run.
  tsan_run() {
    local n=$1 dir passed rank preload=()
    shift
    [ "$n" -le "$(nproc)" ] || preload=(-genv LD_PRELOAD "$build/tools/yield/libparallax_yield.so")
    dir="$build/runs/$(basename "$1")-np$n"
    rm -rf "$dir" && mkdir -p "$dir"
    mpiexec -n "$n" -outfile-pattern "$dir/out.%r" -errfile-pattern "$dir/err.%r" "${preload[@]}" "$@" \
      >/dev/null 2>&1 || true
    passed=0
    for ((rank = 0; rank < n; ++rank)); do
      grep -qs "All tests passed" "$dir/out.$rank" && passed=$((passed + 1))
    done
    if cat "$dir"/* 2>/dev/null | grep -q "ThreadSanitizer" || [ "$passed" -ne "$n" ]; then
      for ((rank = 0; rank < n; ++rank)); do
        echo "--- rank $rank:"
        cat "$dir/out.$rank" "$dir/err.$rank" 2>/dev/null || true
      done
      echo "sanitize (thread): $(basename "$1") ${2:-} FAILED at $n ranks ($passed of $n ranks passed every case)"
      exit 1
    fi
    echo "sanitize (thread): $(basename "$1") ${2:-}, $n ranks: every rank passed every case, no report"
  }
  for n in 1 2 3 4; do
    tsan_run "$n" "$build/tests/test_policy_async_ps"
    # The trainer's communication thread (ready(), prefetch(),
    # update_when_ready) against its caller.
    tsan_run "$n" "$build/tests/test_trainer" "[overlap]"
  done
  exit 0
fi
build="$root/build/sanitize"
supp="$root/tests/sanitizers"

# -O0 -g1 (line tables): the build is most of this stage's time, and -O0
# compiles these template-heavy tests fastest while the tests run on small
# data (docs/testing.md, "Sanitizers"). At -O0 every access the source makes
# stays in the code, so the sanitizers see at least what they see at -O1.
# clang, not gcc: it builds these programs under ASan + UBSan in less than
# half gcc's CPU time (gcc's UBSan instrumentation is most of the difference),
# and its UBSan checks more (pointer arithmetic on null, for one).
if [ "$phase" != test ]; then
  cmake -S "$root" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=None -DPARALLAX_ENABLE_CUDA=OFF \
    -DPARALLAX_BUILD_EXAMPLES=OFF -DPARALLAX_BUILD_BENCH=OFF \
    -DCMAKE_CXX_FLAGS="-O0 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  # Only what the tests run (tests/CMakeLists.txt: parallax_test_programs),
  # not the per-header compile checks or the packaging projects.
  cmake --build "$build" -j "$(nproc)" --target parallax_test_programs
fi
[ "$phase" != build ] || exit 0

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
# Allocation stacks are unwound by frame pointers (ASan's default): the
# suppressions name the module of the allocating frame, which that finds
# without frame pointers in MPICH, and the DWARF unwinder costs much of the
# stage's time (docs/testing.md, "Sanitizers").
# SANITIZE_FULL_STACKS=1 unwinds every frame, to read a report's whole stack.
unwind=1
[ -z "${SANITIZE_FULL_STACKS:-}" ] || unwind=0
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:fast_unwind_on_malloc=$unwind:print_suppressions=0"
# The 3- and 4-rank runs of the same tests add oversubscription, not code
# paths, and cost most of the time under ASan; the fault drills (4 ranks)
# stay: they are the paths that abort. Packaging and header checks only
# compile, and the soak measures memory, which ASan changes.
labels="${SANITIZE_LABELS:-np1|np2|fault|fuzz}"
cd "$build"
ctest -L "$labels" -LE "gpu|package|headers|soak" --output-on-failure -j "$(nproc)"
