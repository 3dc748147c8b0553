#!/usr/bin/env python3
"""Turns bench_end_to_end's JSON (one file per rank count) into the
"End to end" section of docs/benchmarks.md and a plot.

    bench/end_to_end_report.py --doc docs/benchmarks.md --plot docs/end_to_end.png \
        --command "bench/run_end_to_end.sh" e2e_np1.json e2e_np2.json ...

Only that section of the document is replaced (or appended); the rest of the
file is left as it is. With --benchmark_repetitions the median is used; several
files of one rank count (whole runs repeated, bench/run_end_to_end.sh's ROUNDS)
are pooled: each figure is then the median over the files.
"""
import argparse
import json
import os
import re
import statistics
import sys

SECTION = "## End to end"
ARCHS = ["hybrid", "allreduce", "ps"]
MODELS = ["word_lm", "word_lm_1024", "ctr", "ctr_2048", "dense_mlp", "dense_mlp_1024"]


FIGURES = ("samples_per_s", "real_time", "bytes_per_step", "bytes_per_step_max", "gemm_share", "parallax_share")


def load(paths):
    """{(model, arch, ranks): counters} from the JSON files: in each file the
    median aggregate if present, and over several files of one rank count the
    median of each figure ("rounds" says how many files)."""
    pooled, context = {}, {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context = data.get("context", context)
        runs = {}
        for b in data["benchmarks"]:
            if b.get("error_occurred"):
                sys.exit(f"{path}: {b['name']} failed: {b.get('error_message')}")
            agg = b.get("aggregate_name")
            if agg not in (None, "median"):
                continue
            name = b.get("run_name", b["name"]).split("/")
            model, arch = name[0], name[1]
            ranks = int(b["ranks"])
            key = (model, arch, ranks)
            if agg == "median" or key not in runs:
                runs[key] = b
        for key, b in runs.items():
            pooled.setdefault(key, []).append(b)
    out = {}
    for key, entries in pooled.items():
        b = dict(entries[0])
        for field in FIGURES:
            b[field] = statistics.median(e.get(field, float("nan")) for e in entries)
        b["rounds"] = len(entries)
        out[key] = b
    return out, context


def fmt_bytes(b):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.2f} {unit}"
        b /= 1024


def pct(share):
    return "" if share is None or share != share else f"{100 * share:.0f}%"


def produced_by(command):
    """The lines that quote the command behind a section."""
    return ["Produced by:", "", "```", command, "```", ""]


def section(runs, context, command, title=SECTION, plot="end_to_end.png"):
    ranks = sorted({k[2] for k in runs})
    lines = [title, ""]
    lines.append("Whole training steps of the examples' models (`examples/0N_*/model.hpp`, the code the "
                 "examples run) under each architecture: `bench/end_to_end.cpp`, Google Benchmark through "
                 "`bench/common/harness.hpp` (fixed step counts, the slowest rank's time per step). "
                 "Bytes are what one rank sends per step, from the trainer's `CommStats` (exact): the mean "
                 "over the ranks, and the busiest rank in parentheses. The shares are of the timed steps' "
                 "time, mean over the ranks (`examples/common/profile.hpp`): the model's matrix products "
                 "(GEMMs) and parallax's calls (lookups, adding gradients, `trainer.step()`, waiting for "
                 "peers included); the rest is the model's other kernels. Shapes are in the benchmark's "
                 "header comment: `<model>` a small global batch split over the ranks, `<model>_<n>` n "
                 "samples per rank.")
    lines.append("")
    lines += produced_by(command)
    host = context.get("host_name", "?")
    cpus = context.get("num_cpus", "?")
    machine = (f"Machine: {host}, {cpus} CPUs, {context.get('mpi_library', 'MPI ?')}; "
               f"{context.get('date', '')}.")
    over = [n for n in ranks if isinstance(cpus, int) and n > cpus]
    if over:
        machine += (f" With more ranks than cores ({', '.join(map(str, over))} ranks here) every "
                    "collective waits for scheduler time slices, so per-call latency, not bytes, sets much "
                    "of the time.")
    else:
        machine += (" Every rank has cores of its own; OpenMP threads per rank: "
                    f"{context.get('omp_threads_per_rank', '?')} at {max(ranks)} ranks.")
    rounds = max(b.get("rounds", 1) for b in runs.values())
    if rounds > 1:
        machine += (f" Each figure is the median over {rounds} whole runs (rounds, each reporting the median "
                    "of its repetitions); the rounds follow one another over all the rank counts, so a slow "
                    "spell of the shared machine falls on one round of every architecture, not on all "
                    "repetitions of one, and each round starts each model with another architecture.")
    lines.append(machine)
    lines.append("")
    for model in MODELS:
        if not any(k[0] == model for k in runs):
            continue
        lines.append(f"### {model}")
        lines.append("")
        lines.append("| ranks | architecture | samples/s | ms/step | bytes sent/step/rank | GEMMs | parallax |")
        lines.append("|---:|---|---:|---:|---|---:|---:|")
        for n in ranks:
            for arch in ARCHS:
                b = runs.get((model, arch, n))
                if not b:
                    continue
                ms = b["real_time"] if b.get("time_unit") == "ms" else b["real_time"] / 1000.0
                lines.append(f"| {n} | {arch} | {b['samples_per_s']:.1f} | {ms:.1f} | "
                             f"{fmt_bytes(b['bytes_per_step'])} ({fmt_bytes(b['bytes_per_step_max'])}) | "
                             f"{pct(b.get('gemm_share'))} | {pct(b.get('parallax_share'))} |")
        lines.append("")
    lines.append("### Hybrid against all-reduce")
    lines.append("")
    lines.append("The ratios the issue sets bars for: bytes per rank (mean) and samples/s of "
                 "`arch::Hybrid` over `arch::AllReduce`.")
    lines.append("")
    lines.append("| model | ranks | bytes ratio | samples/s ratio |")
    lines.append("|---|---:|---:|---:|")
    for model in MODELS:
        for n in ranks:
            h, a = runs.get((model, "hybrid", n)), runs.get((model, "allreduce", n))
            if not h or not a:
                continue
            br = h["bytes_per_step"] / a["bytes_per_step"] if a["bytes_per_step"] else float("nan")
            sr = h["samples_per_s"] / a["samples_per_s"]
            lines.append(f"| {model} | {n} | {br:.3f} | {sr:.3f} |")
    lines.append("")
    n = max(ranks)
    verdicts = []

    def ratio(model, key):
        h, a = runs.get((model, "hybrid", n)), runs.get((model, "allreduce", n))
        return h[key] / a[key] if h and a and a[key] else None

    for model, key, what, bar, ok in [
        ("word_lm", "bytes_per_step", "bytes per rank", "<= 0.55x", lambda r: r <= 0.55),
        ("word_lm", "samples_per_s", "samples/s", ">= 1.5x", lambda r: r >= 1.5),
        ("dense_mlp", "samples_per_s", "samples/s", ">= 0.95x", lambda r: r >= 0.95),
    ]:
        r = ratio(model, key)
        if r is not None:
            verdicts.append(f"{model} {what} {r:.3f}x (bar {bar}: {'met' if ok(r) else '**not met**'})")
    if verdicts:
        lines.append(f"Bars of issue 5 at {n} ranks, hybrid against all-reduce: " + "; ".join(verdicts) + ".")
        lines.append("")
    lines.append(f"![end to end]({plot})")
    lines.append("")
    return "\n".join(lines)


def write_doc(path, text, title=SECTION):
    old = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    start = old.find(title + "\n")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = re.search(r"^## ", old[start + len(title):], flags=re.M)
        end = start + len(title) + nxt.start() if nxt else len(old)
        new = old[:start] + text + ("\n" + old[end:] if nxt else "")
    with open(path, "w") as f:
        f.write(new.rstrip("\n") + "\n")


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted({k[2] for k in runs})
    fig, axes = plt.subplots(2, len(MODELS), figsize=(4.2 * len(MODELS), 7), squeeze=False)
    for col, model in enumerate(MODELS):
        for arch, marker in zip(ARCHS, "os^"):
            xs = [n for n in ranks if (model, arch, n) in runs]
            axes[0][col].plot(xs, [runs[(model, arch, n)]["samples_per_s"] for n in xs], marker=marker, label=arch)
            axes[1][col].plot(xs, [runs[(model, arch, n)]["bytes_per_step"] / 2**20 for n in xs], marker=marker,
                              label=arch)
        axes[0][col].set_title(model)
        axes[0][col].set_ylabel("samples/s")
        axes[1][col].set_ylabel("MiB sent per step per rank")
        for row in (0, 1):
            axes[row][col].set_xlabel("ranks")
            axes[row][col].set_xticks(ranks)
            axes[row][col].set_ylim(bottom=0)
            axes[row][col].grid(alpha=0.3)
            axes[row][col].legend()
    fig.suptitle("parallax end to end: samples/s and bytes per step, by architecture")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--doc", required=True)
    p.add_argument("--plot", required=True)
    p.add_argument("--command", default="bench/run_end_to_end.sh")
    p.add_argument("--title", default=SECTION, help="the section's heading (replaced if present)")
    p.add_argument("json", nargs="+")
    a = p.parse_args()
    runs, context = load(a.json)
    text = section(runs, context, a.command, a.title, os.path.basename(a.plot))
    write_doc(a.doc, text, a.title)
    plot(runs, a.plot)
    print(text)


if __name__ == "__main__":
    main()
