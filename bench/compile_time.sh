#!/usr/bin/env bash
# What a user pays to compile the README program (examples/00_minimal), with and without parallax::trainers, against this tree's headers
# and, optionally, another tree's (to compare with a baseline commit):
#
#   bench/compile_time.sh BUILD_DIR [BASE_INCLUDE_DIR] [ROUNDS]
#
# BUILD_DIR: a host build of this tree configured with
# -DCMAKE_EXPORT_COMPILE_COMMANDS=ON (00_minimal's command line is taken
# from its compile_commands.json, with -O2 for Release's -O3). BASE_INCLUDE_DIR:
# the include/ of another checkout (e.g. `git archive <commit> include | tar -x
# -C /tmp/base`); its variants are named base_*. Each round compiles every
# variant once, in turn (alternated, so a shared machine's load hits them
# alike), and prints user and system CPU seconds, peak RSS (kB) and the load.
set -euo pipefail
build=$(cd "$1" && pwd)
base=${2:-}
rounds=${3:-3}
here=$(cd "$(dirname "$0")/.." && pwd)
src="$here/examples/00_minimal/main.cpp"
[[ -f "$build/compile_commands.json" ]] || {
  echo "compile_time.sh: $build has no compile_commands.json (configure it with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
  exit 2
}
# The build's command for 00_minimal, without the compiler, -o, -c and the source.
flags=$(python3 - "$build/compile_commands.json" <<'PY'
import json, shlex, sys
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith("examples/00_minimal/main.cpp"):
        args = shlex.split(e["command"])[1:]
        out, skip = [], False
        for a in args:
            if skip: skip = False; continue
            if a in ("-o", "-c"): skip = True; continue
            if a.endswith("00_minimal/main.cpp"): continue
            if a == "/usr/bin/ccache" or a.endswith("/ccache"): continue
            out.append("-O2" if a == "-O3" else a)
        print(" ".join(out)); break
PY
)
compiler=$(python3 -c 'import json,shlex,sys
for e in json.load(open(sys.argv[1])):
    if e["file"].endswith("examples/00_minimal/main.cpp"): print(shlex.split(e["command"])[0]); break' "$build/compile_commands.json")
own="-I$here/include"
trainers="-include parallax/trainers.hpp -DPARALLAX_TRAINERS_LIBRARY=1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "compiler: $compiler; flags: $flags"
variants=(header trainers)
[[ -n "$base" ]] && variants=(base_header base_trainers header trainers)
for r in $(seq 1 "$rounds"); do
  for v in "${variants[@]}"; do
    inc="$own"
    [[ $v == base_* ]] && inc="-I$(cd "$base" && pwd)"
    extra=""
    [[ $v == *trainers ]] && extra="$trainers"
    load=$(cut -d' ' -f1 /proc/loadavg)
    # The variant's include directory first, so it wins over the build's -I of this tree.
    t=$({ /usr/bin/time -f '%U %S %M' "$compiler" $inc ${flags//$own/} $extra -c "$src" -o "$out/$v.o"; } 2>&1 | tail -1)
    echo "round $r $v: $t load $load"
  done
done
