#!/usr/bin/env python3
"""Turns scripts/gpu-check.sh's results (build/cuda/gpu-results/) into the
"GPU" section of docs/benchmarks.md.

    bench/gpu_report.py --doc docs/benchmarks.md --command "scripts/gpu-check.sh" build/cuda/gpu-results

Only that section of the document is replaced (or appended).
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from end_to_end_report import produced_by, write_doc  # noqa: E402  (shared with the end-to-end report)

SECTION = "## GPU"
KERNEL_BAR = 0.40  # issue 4: coalesce and lookup reach >= 40% of the copy bandwidth


def load(results):
    runs = {}
    context = {}
    for path in sorted(glob.glob(os.path.join(results, "bench_gpu_np*.json"))):
        with open(path) as f:
            data = json.load(f)
        ranks = int(re.search(r"np(\d+)", os.path.basename(path)).group(1))
        context.setdefault(ranks, data.get("context", {}))
        for b in data["benchmarks"]:
            if b.get("aggregate_name") not in (None, "median"):
                continue
            name = b.get("run_name", b["name"]).split("/iterations")[0]
            runs[(ranks, name)] = b
    summary = {}
    path = os.path.join(results, "summary.json")
    if os.path.exists(path):
        with open(path) as f:
            summary = json.load(f)
    return runs, context, summary


def us(b):
    t = b["real_time"]
    return {"ns": t / 1000.0, "us": t, "ms": t * 1000.0, "s": t * 1e6}[b.get("time_unit", "ns")]


def section(runs, context, summary, command):
    lines = [SECTION, ""]
    one = context.get(1, {})
    lines.append(f"GPU: {summary.get('gpu', one.get('gpu', '?'))} (driver {summary.get('driver', '?')}), "
                 f"{one.get('num_cpus', '?')} CPU cores, {' '.join(one.get('mpi_library', 'MPI ?').split())}; "
                 f"{summary.get('date', one.get('date', ''))}; commit `{summary.get('git_commit', '?')[:7]}`, "
                 f"NCCL {summary.get('nccl_version', '?')}. Tests: {summary.get('ctest', '?')}; NCCL's channels "
                 f"between ranks: {summary.get('nccl_transports', '?')}.")
    lines.append("")
    lines += produced_by(command)
    lines.append("### Kernels (1 rank)")
    lines.append("")
    lines.append(f"Bandwidth counts the bytes a kernel must read and write at least; `of memcpy` is the fraction of "
                 f"the device-to-device `cudaMemcpy` bandwidth measured in the same binary "
                 f"({float(one.get('memcpy_d2d_GBps', 0)):.0f} GB/s, read + write). Bar: >= {KERNEL_BAR:.2f}.")
    lines.append("")
    lines.append("| kernel | time | GB/s | of memcpy | bar |")
    lines.append("|---|---:|---:|---:|---|")
    for (ranks, name), b in sorted(runs.items()):
        if ranks != 1 or name.startswith("allreduce"):
            continue
        frac = b.get("of_memcpy", 0.0)
        verdict = "" if name.startswith("memcpy") else ("met" if frac >= KERNEL_BAR else "**not met**")
        lines.append(f"| `{name}` | {us(b):.0f} us | {b.get('GB/s', 0):.0f} | {frac:.3f} | {verdict} |")
    lines.append("")
    lines.append("### All-reduce of a device buffer")
    lines.append("")
    lines.append("Time per call (the slowest rank's) and the ratio to the plain baseline (staged copies + "
                 "`MPI_Allreduce`). With more than one rank, the ranks share the one GPU (engine::MpiStaged; "
                 "engine::Nccl needs a GPU per rank). `ring_mpi_staged` forces the ring; under `automatic` "
                 "RingAllReduce takes `mpi_staged_native` for device memory.")
    lines.append("")
    lines.append("| ranks | size | variant | time | algbw | vs baseline |")
    lines.append("|---:|---|---|---:|---:|---:|")
    def size_key(name):
        m = re.match(r"\d+", name.split("/")[-1])
        return int(m.group(0)) if m else 0

    for (ranks, name), b in sorted(runs.items(), key=lambda kv: (kv[0][0], size_key(kv[0][1]), kv[0][1])):
        # One rank moves nothing, except through NCCL (its launch and
        # in-place kernel, the floor of every NCCL call).
        if not name.startswith("allreduce") or (ranks < 2 and "/nccl/" not in name):
            continue
        _, variant, size = name.split("/")
        base = runs.get((ranks, f"allreduce/baseline_copy_mpi_copy/{size}"))
        if ranks == 1:  # NCCL's floor: a call's launch, no bytes between ranks
            lines.append(f"| 1 | {size} | {variant} | {us(b):.1f} us | | |")
            continue
        ratio = f"{us(base) / us(b):.2f}x" if base and variant != "baseline_copy_mpi_copy" else ""
        alg = b.get("algbw", 0) / 1e9
        lines.append(f"| {ranks} | {size} | {variant} | {us(b):.1f} us | {alg:.2f} GB/s | {ratio} |")
    lines.append("")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--doc", required=True)
    p.add_argument("--command", default="scripts/gpu-check.sh")
    p.add_argument("results", help="gpu-check.sh's results folder")
    a = p.parse_args()
    runs, context, summary = load(a.results)
    text = section(runs, context, summary, a.command)
    write_doc(a.doc, text, SECTION)
    print(text)


if __name__ == "__main__":
    main()
