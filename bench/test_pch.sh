#!/usr/bin/env bash
# What the host tests' precompiled header (tests/CMakeLists.txt,
# PARALLAX_TEST_PCH) saves: each given test source compiled with the build's
# own command, with the PCH and without it (the same command less its
# `-include .../cmake_pch.hxx`), alternated, ROUNDS times; prints user + system
# CPU seconds of each and the totals.
#
#   bench/test_pch.sh BUILD_DIR [ROUNDS] [SOURCE...]
#
# BUILD_DIR: a host build configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
# and PARALLAX_TEST_PCH=ON whose parallax_test_pch target is built.
# SOURCE: paths below tests/ (default: a sample from small to large).
set -euo pipefail
build=$(cd "$1" && pwd)
rounds=${2:-1}
shift $(($# >= 2 ? 2 : $#))
sources=("$@")
[[ ${#sources[@]} -gt 0 ]] || sources=(types.cpp bags.cpp context.cpp policy/allgatherv.cpp optim.cpp
                                        policy/sharded_ps.cpp trainer/bags.cpp checkpoint.cpp)
[[ -f "$build/compile_commands.json" ]] || {
  echo "test_pch.sh: $build has no compile_commands.json (configure it with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
  exit 2
}
here=$(cd "$(dirname "$0")/.." && pwd)
# command_for <source> <with|without>: the build's command, its output sent to /dev/null.
command_for() {
  python3 - "$build/compile_commands.json" "$here/tests/$1" "$2" <<'PY'
import json, shlex, sys
db, src, mode = sys.argv[1], sys.argv[2], sys.argv[3]
for e in json.load(open(db)):
    if e["file"] == src:
        args = shlex.split(e["command"])
        out, skip = [], False
        for i, a in enumerate(args):
            if skip:
                skip = False
                continue
            if a == "-o":
                out += ["-o", "/dev/null"]
                skip = True
                continue
            if a in ("-MD",) or a.startswith("-MF") or a.startswith("-MT"):
                if a in ("-MF", "-MT"):
                    skip = True
                continue
            if mode == "without" and a == "-include" and args[i + 1].endswith("cmake_pch.hxx"):
                skip = True
                continue
            out.append(a)
        print(e["directory"])
        print(shlex.join(out))
        sys.exit(0)
sys.exit("no compile command for " + src)
PY
}
declare -A total=([with]=0 [without]=0)
for ((r = 1; r <= rounds; ++r)); do
  for s in "${sources[@]}"; do
    for mode in without with; do
      mapfile -t cmd < <(command_for "$s" "$mode")
      (cd "${cmd[0]}" && /usr/bin/time -o /tmp/test_pch.time.$$ -f "%U %S" bash -c "${cmd[1]}" >/dev/null 2>/tmp/test_pch.err.$$)
      t=$(tail -n 1 /tmp/test_pch.time.$$)
      grep -q "invalid-pch\|not used because" /tmp/test_pch.err.$$ 2>/dev/null && { echo "PCH rejected for $s"; cat /tmp/test_pch.err.$$; }
      cpu=$(awk '{printf "%.2f", $1 + $2}' <<<"$t")
      total[$mode]=$(awk -v a="${total[$mode]}" -v b="$cpu" 'BEGIN{printf "%.2f", a + b}')
      printf "round %d  %-24s %-8s %6.2f s CPU  (load %s)\n" "$r" "$s" "$mode" "$cpu" "$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
rm -f /tmp/test_pch.err.$$ /tmp/test_pch.time.$$
echo "total without the PCH: ${total[without]} s CPU; with it: ${total[with]} s CPU (${#sources[@]} sources x $rounds rounds)"
