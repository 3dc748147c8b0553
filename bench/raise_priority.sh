#!/usr/bin/env bash
# Runs a command (one MPI rank) at raised CPU priority, so a benchmark on a
# shared machine is not timed while other jobs take its cores:
#
#   mpiexec -n 2 bench/raise_priority.sh build/bench/bench_collectives ...
#
# Linux groups processes by session ("autogroups") and shares the CPU fairly
# between groups, whatever their nice values; mpiexec starts every rank in a
# session of its own. So each rank raises its own group (needs root or
# CAP_SYS_NICE) and its nice value, then execs the command. Without the
# permission it runs the command unchanged.
echo -15 > /proc/self/autogroup 2>/dev/null || true
if nice -n -15 true 2>/dev/null; then exec nice -n -15 "$@"; fi
exec "$@"
