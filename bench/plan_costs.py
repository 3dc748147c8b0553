#!/usr/bin/env python3
"""Calibrates plan::Model's local costs on this machine: runs bench_row_kernels'
library kernels (gather, coalesce, Adagrad update; the 1 GB table, DRAM) and
prints a [costs] section for `parallax-plan --costs` (docs/cluster.md,
"Calibration"). Rates are the benchmark's bytes_per_second counters, medians
of the repetitions.

    bench/plan_costs.py --build build/host > costs.ini
"""
import argparse, json, os, statistics, subprocess, sys

KERNELS = {"gather": "GatherRows/library/1", "coalesce": "Coalesce/library", "update": "AdagradRows/library/1"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/host")
    ap.add_argument("--repetitions", type=int, default=3)
    a = ap.parse_args()
    exe = os.path.join(a.build, "bench", "bench_row_kernels")
    pattern = "^(" + "|".join(KERNELS.values()) + ")$"
    out = subprocess.run([exe, f"--benchmark_filter={pattern}", "--benchmark_format=json",
                          f"--benchmark_repetitions={a.repetitions}"], capture_output=True, text=True, check=True).stdout
    runs = json.loads(out)["benchmarks"]
    rate = {}
    for field, name in KERNELS.items():
        got = [b["bytes_per_second"] for b in runs if b.get("run_name", b["name"]) == name and b.get("run_type") != "aggregate"]
        if not got:
            sys.exit(f"plan_costs: {name} did not run")
        rate[field] = statistics.median(got)
    print(f"# bench/plan_costs.py on {os.uname().nodename}, load {os.getloadavg()[0]:.1f}")
    print("[costs]")
    for field in ("gather", "coalesce", "update"):
        print(f"{field} = {rate[field] / 1e9:.3f}GB/s")
    print(f"dense_update = {rate['update'] / 1e9:.3f}GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
