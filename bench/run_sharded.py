#!/usr/bin/env python3
"""Runs bench_sharded at 2 and 4 ranks and prints the tables behind
docs/benchmarks.md ("Sharded PS and the partition count"): one step of each
architecture (time, bytes per rank against the formula of docs/design.md,
"Byte accounting", inter-host bytes with two emulated hosts) and the
partition count (measured t(P), the fit t(P) = b/P + a(P-1) + c of Parallax,
and the P that plan_partitions chose).

    bench/run_sharded.py [--build build/host] [--ranks 2 4] [--json-dir DIR]
    bench/run_sharded.py --from DIR        # tables from JSON already written

Each rank runs through bench/raise_priority.sh (raised CPU priority where
permitted) so other jobs on a shared machine disturb the timings less.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(build, ranks, out_dir):
    exe = os.path.join(build, "bench", "bench_sharded")
    if not os.access(exe, os.X_OK):
        sys.exit(f"run_sharded: {exe} not found; build the target bench_sharded first")
    os.makedirs(out_dir, exist_ok=True)
    for n in ranks:
        out = os.path.join(out_dir, f"sharded_np{n}.json")
        print(f"== {n} ranks -> {out}", file=sys.stderr)
        subprocess.run(["mpiexec", "-n", str(n), os.path.join(HERE, "raise_priority.sh"), exe,
                        f"--benchmark_out={out}", "--benchmark_out_format=json"], check=True,
                       stdout=sys.stderr)


def load(out_dir):
    runs = {}
    for name in sorted(os.listdir(out_dir)):
        if not (name.startswith("sharded_np") and name.endswith(".json")):
            continue
        with open(os.path.join(out_dir, name)) as f:
            doc = json.load(f)
        n = int(doc["context"].get("mpi_ranks", name[len("sharded_np"):-5]))
        rows = {}
        for b in doc["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration":
                continue
            key = b["run_name"].split("/iterations")[0]
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
            b["ms"] = b["real_time"] * scale
            rows[key] = b
        runs[n] = rows
    return runs


def mib(x):
    return f"{x / 2**20:.2f}"


def fit(points):
    """Least squares of t = b/P + a(P-1) + c over (P, t) points; (b, a, c)."""
    # Normal equations of the 3-parameter linear model, solved by Cramer's rule.
    xs = [(1.0 / p, p - 1.0, 1.0) for p, _ in points]
    ys = [t for _, t in points]
    m = [[sum(x[i] * x[j] for x in xs) for j in range(3)] for i in range(3)]
    v = [sum(x[i] * y for x, y in zip(xs, ys)) for i in range(3)]

    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))

    d = det(m)
    if abs(d) < 1e-30:
        return None
    sol = []
    for k in range(3):
        mk = [row[:] for row in m]
        for i in range(3):
            mk[i][k] = v[i]
        sol.append(det(mk) / d)
    return tuple(sol)


def tables(runs):
    out = []
    for n, rows in sorted(runs.items()):
        out.append(f"### {n} ranks\n")
        out.append("One step: 1,000,000 x 64 float embedding, 20,000 distinct rows (2%) per rank, "
                   "plus a 256 x 256 dense layer. Bytes are the embedding's, per step, busiest rank.\n")
        out.append("| architecture | step (ms) | sparse bytes sent/rank (MiB) | docs/design.md formula (MiB) | "
                   "sent / formula | inter-host sent (MiB) | wrong |")
        out.append("|---|---:|---:|---:|---:|---:|---:|")
        for arch in ("hybrid", "hybrid_messages", "allreduce", "ps", "hybrid_2hosts"):
            b = rows.get(f"Step/{arch}")
            if not b:
                continue
            out.append(f"| {arch} | {b['ms']:.1f} | {mib(b['sparse_sent'])} | {mib(b['formula'])} | "
                       f"{b['sparse_vs_formula']:.3f} | {mib(b.get('inter_host_sent', 0))} | {int(b.get('wrong', 0))} |")
        h, a = rows.get("Step/hybrid"), rows.get("Step/allreduce")
        if h and a:
            out.append(f"\nhybrid / allreduce: bytes **{h['sparse_sent'] / a['sparse_sent']:.2f}x**, "
                       f"step time **{h['ms'] / a['ms']:.2f}x** (speed-up {a['ms'] / h['ms']:.2f}x)")
        hm = rows.get("Step/hybrid_messages")
        if h and hm and h.get("shared"):
            out.append(f"; the hybrid reading shared shards against asking the owners (hybrid_messages): "
                       f"step time **{h['ms'] / hm['ms']:.2f}x** (speed-up {hm['ms'] / h['ms']:.2f}x), "
                       f"bytes {h['sparse_sent'] / hm['sparse_sent']:.2f}x")
        h2 = rows.get("Step/hybrid_2hosts")
        if h and h2:
            out.append(f"; with 2 emulated hosts of {n // 2} ranks and local aggregation the bytes leaving a "
                       f"host are {mib(h2['inter_host_sent'])} MiB per rank "
                       f"({h2['inter_host_sent'] / a['sparse_sent']:.2f}x allreduce's).")
        parts = sorted((int(k.split(":")[1]), b) for k, b in rows.items() if k.startswith("Partitions/P:"))
        if parts:
            out.append("\nPartition count, Zipf ids (s = 1.1), hybrid step:\n")
            out.append("| P | step (ms) | busiest owner / mean (imbalance) | fit (ms) | chosen by plan_partitions |")
            out.append("|---:|---:|---:|---:|---|")
            f = fit([(p, b["ms"]) for p, b in parts]) if len(parts) >= 3 else None
            for p, b in parts:
                fitted = f"{f[0] / p + f[1] * (p - 1) + f[2]:.1f}" if f else "-"
                out.append(f"| {p} | {b['ms']:.1f} | {b.get('imbalance', 0):.2f} | {fitted} | "
                           f"{'yes' if b.get('chosen') else ''} |")
            best = min(parts, key=lambda pb: pb[1]["ms"])
            if f:
                out.append(f"\nfit: t(P) = {f[0]:.1f}/P + {f[1]:.4f}(P-1) + {f[2]:.1f} ms; "
                           f"fastest measured P = {best[0]}")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build", "host"))
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--json-dir", default=None)
    ap.add_argument("--from", dest="src", default=None, help="only print tables from this JSON directory")
    args = ap.parse_args()
    out_dir = args.src or args.json_dir or os.path.join(args.build, "bench", "results")
    if not args.src:
        run(args.build, args.ranks, out_dir)
    print(tables(load(out_dir)))


if __name__ == "__main__":
    main()
