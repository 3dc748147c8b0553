#!/usr/bin/env python3
"""Turns bench_dense_math's JSON into the tables of docs/benchmarks.md,
"Realistic workloads", "Dense math": every product of the examples' steps as examples::gemm runs
it, against cblas_sgemm at the same m, n, k (packed, no transposes) and
against the functor it replaced, then each model's products together.

    build/host/bench/bench_dense_math --benchmark_repetitions=5 \\
        --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \\
        --benchmark_out_format=json --benchmark_out=dense_math.json
    bench/dense_math_report.py dense_math.json

With repetitions the median of each is used.
"""
import json
import sys


def load(path):
    """{name: (CPU seconds per iteration, flops per second, registration order, "mxnxk")}, the
    median where repeated. CPU time, as Google Benchmark's rate counters use: the bench runs one
    thread, so on a shared machine it leaves out the time the thread waited for a core."""
    with open(path) as f:
        data = json.load(f)
    runs = {}
    for b in data["benchmarks"]:
        agg = b.get("aggregate_name")
        if agg not in (None, "median"):
            continue
        name = b.get("run_name", b["name"])
        if agg is None and name in runs:
            continue
        scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        runs[name] = (b["cpu_time"] * scale, b.get("flops", 0.0), b.get("family_index", 0),
                      "x".join(str(int(b[d])) for d in "mnk" if d in b))
    return runs, data.get("context", {})


def main():
    runs, context = load(sys.argv[1])
    peak = runs["sgemm/square/1024"][1] if "sgemm/square/1024" in runs else float("nan")
    products = sorted((n[len("gemm/"):] for n in runs if n.startswith("gemm/")), key=lambda p: runs["gemm/" + p][2])
    print(f"BLAS: {context.get('gemm', '?')}; one thread. The machine's SGEMM at 1024^3: {peak / 1e9:.1f} GFLOP/s.")
    print()
    print("| product | m x n x k | gemm GFLOP/s | SGEMM, same m n k | gemm / SGEMM | functor GFLOP/s | gemm / functor (time) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    totals = {}
    for p in products:
        model = p.split("/")[0]
        g_t, g_f, _, shape = runs["gemm/" + p]
        s_t, s_f = runs["sgemm/" + p][:2]
        f = runs["functor/" + p][:2] if "functor/" + p in runs else None
        t = totals.setdefault(model, {"gemm": 0.0, "sgemm": 0.0, "functor": 0.0, "flops": 0.0})
        flops = g_f * g_t
        t["gemm"] += g_t
        t["sgemm"] += s_t
        t["flops"] += flops
        t["functor"] += f[0] if f else float("nan")
        functor = f"{f[1] / 1e9:.1f} | {f[0] / g_t:.1f}x" if f else "| "
        print(f"| {p} | {shape} | {g_f / 1e9:.1f} | {s_f / 1e9:.1f} | {g_f / s_f:.2f} | {functor} |")
    print()
    print("Each model's products together (a step's worth, one of each): GFLOP/s as total FLOPs over total time.")
    print()
    print("| model | gemm GFLOP/s | / SGEMM at the same shapes | / SGEMM at 1024^3 | functors GFLOP/s | gemm / functors (time) |")
    print("|---|---:|---:|---:|---:|---:|")
    for model, t in totals.items():
        rate = t["flops"] / t["gemm"]
        print(f"| {model} | {rate / 1e9:.1f} | {t['sgemm'] / t['gemm']:.2f} | {rate / peak:.2f} | "
              f"{t['flops'] / t['functor'] / 1e9:.1f} | {t['functor'] / t['gemm']:.1f}x |")
    if "layer/word_lm/blas" in runs and "layer/word_lm/functor" in runs:
        b, f = runs["layer/word_lm/blas"][0], runs["layer/word_lm/functor"][0]
        print()
        print(f"word_lm's sampled softmax, forward and backward whole (its gathers and scatters included, the "
              f"softmax left out): SampledSoftmax {b * 1e3:.1f} ms, the functors {f * 1e3:.1f} ms: {f / b:.2f}x.")


if __name__ == "__main__":
    main()
