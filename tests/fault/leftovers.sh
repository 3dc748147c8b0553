#!/bin/sh
# The processes that carry PARALLAX_DRILL_TAG=<tag> in their environment
# (a drill's launcher sets it; hydra passes the environment on to the ranks
# and their exit monitors): waits up to <seconds> for them to end, prints a
# `ps` line for each one still running, SIGKILLs those, and exits 1 if there
# were any.
#   leftovers.sh <tag> <seconds>
# Run it without the tag in its own environment.
tag=$1; wait_s=$2
tagged() {
  grep -lzx "PARALLAX_DRILL_TAG=$tag" /proc/[0-9]*/environ 2>/dev/null | sed 's|^/proc/\([0-9]*\)/environ$|\1|'
}
end=$(( $(date +%s) + wait_s ))
left=$(tagged)
while [ -n "$left" ] && [ "$(date +%s)" -lt "$end" ]; do
  sleep 0.5
  left=$(tagged)
done
[ -z "$left" ] && exit 0
# shellcheck disable=SC2086
ps -o pid,ppid,pgid,stat,wchan:32,etimes,args -p "$(echo $left | tr ' ' ',')"
# shellcheck disable=SC2086
kill -KILL $left 2>/dev/null
exit 1
