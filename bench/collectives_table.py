#!/usr/bin/env python3
"""Tables of bench_collectives results, as in docs/benchmarks.md.

Reads Google Benchmark JSON files written by bench_collectives (any number,
any rank counts; several runs and --benchmark_repetitions are pooled), takes
the median of every figure over the runs of each benchmark, and prints
markdown tables per rank count: all-reduce variants, the RingAllReduce /
MPI_Allreduce busbw ratios with the issue-2 bar, tensor fusion, and
AllGatherv against MPI_Allgatherv.

    bench/collectives_table.py results/np2_*.json results/np4_*.json
    bench/collectives_table.py --summary results/np2_*.json   # the short table of scripts/demo.sh
"""
import argparse
import json
import re
import statistics
import sys
from collections import defaultdict

ALLREDUCE = ["RingAllReduce", "RingAllReduce/ring", "RingAllReduce/native", "MPI_Allreduce"]
ALLGATHER = ["AllGatherv", "MPI_Allgatherv"]
BAR_RATIO = 0.9          # RingAllReduce busbw >= 0.9x MPI_Allreduce ...
BAR_FROM_BYTES = 1 << 20  # ... at every size >= 1 MiB
BAR_FUSION = 1.3         # fused 256 x 16 KiB <= 1.3x one 4 MiB RingAllReduce
FUSED = "FusedRingAllReduce/256x16KiB"
FUSED_ARENA = "FusedRingAllReduce/256x16KiB/arena"
FUSED_PEER = ("RingAllReduce", 4 << 20)


def human_bytes(b):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale and b % scale == 0:
            return f"{b // scale} {unit}"
    return f"{b} B"


def split_name(run_name):
    """'RingAllReduce/ring/4096/iterations:200/manual_time' -> ('RingAllReduce/ring', 4096)."""
    parts = [p for p in run_name.split("/") if not p.startswith("iterations:") and p not in ("manual_time", "real_time")]
    if parts and re.fullmatch(r"\d+", parts[-1]):
        return "/".join(parts[:-1]), int(parts[-1])
    return "/".join(parts), None


def load(paths):
    """{ranks: {(variant, bytes): {"time_us": [...], "algbw": [...], ...}}}"""
    data = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    labels = defaultdict(dict)
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ranks = int(doc.get("context", {}).get("mpi_ranks", 0))
        for b in doc.get("benchmarks", []):
            if b.get("run_type", "iteration") != "iteration":
                continue  # aggregates are recomputed from the runs
            key = split_name(b.get("run_name", b["name"]))
            rec = data[ranks][key]
            if b.get("error_occurred"):
                rec["errors"].append(b.get("error_message", "error"))
                continue
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b.get("time_unit", "ns")]
            rec["time_us"].append(b["real_time"] * scale)
            for counter in ("algbw", "busbw", "wrong", "bytes_sent"):
                if counter in b:
                    rec[counter].append(b[counter])
            if b.get("label"):
                labels[ranks][key] = b["label"]
    return data, labels


def med(rec, field):
    v = rec.get(field) if rec else None
    return statistics.median(v) if v else None


def fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def gbs(x):
    return "-" if x is None else f"{x / 1e9:.2f}"


def runs(rec):
    return len(rec.get("time_us", [])) if rec else 0


def allreduce_tables(ranks, d, labels, out):
    sizes = sorted({b for (v, b) in d if v in ALLREDUCE and b is not None})
    n_runs = max((runs(d[k]) for k in d), default=0)
    out.append(f"#### All-reduce, {ranks} ranks (median of {n_runs} runs)\n")
    out.append("| size | variant | time (us) | algbw (GB/s) | busbw (GB/s) | wrong |")
    out.append("|---:|---|---:|---:|---:|---:|")
    for s in sizes:
        for v in ALLREDUCE:
            rec = d.get((v, s))
            if not rec:
                continue
            name = v + (f" ({labels[(v, s)]})" if (v, s) in labels and v == "RingAllReduce" else "")
            wrong = med(rec, "wrong")
            err = " ERROR" if rec.get("errors") else ""
            out.append(f"| {human_bytes(s)} | {name} | {fmt(med(rec, 'time_us'), 1)} | {gbs(med(rec, 'algbw'))} "
                       f"| {gbs(med(rec, 'busbw'))} | {fmt(wrong, 0)}{err} |")
    out.append("")
    out.append(f"#### busbw ratio to MPI_Allreduce, {ranks} ranks\n")
    out.append("| size | RingAllReduce (automatic) | ring forced | native forced | bar (>= 0.9 at >= 1 MiB) |")
    out.append("|---:|---:|---:|---:|---|")
    verdicts = []
    for s in sizes:
        base = med(d.get(("MPI_Allreduce", s)), "busbw")
        ratios = []
        for v in ALLREDUCE[:3]:
            x = med(d.get((v, s)), "busbw")
            ratios.append(x / base if x is not None and base else None)
        bar = "-"
        if s >= BAR_FROM_BYTES and ratios[0] is not None:
            ok = ratios[0] >= BAR_RATIO
            verdicts.append(ok)
            bar = "met" if ok else "NOT met"
        out.append(f"| {human_bytes(s)} | {fmt(ratios[0])} | {fmt(ratios[1])} | {fmt(ratios[2])} | {bar} |")
    out.append("")
    return verdicts


def fusion_line(ranks, d, out):
    fused = med(d.get((FUSED, None)), "time_us")
    peer = med(d.get(FUSED_PEER), "time_us")
    if fused is None or peer is None:
        return None
    ratio = fused / peer
    ok = ratio <= BAR_FUSION
    out.append(f"#### Tensor fusion, {ranks} ranks\n")
    out.append("| case | time (us) | busbw (GB/s) |")
    out.append("|---|---:|---:|")
    out.append(f"| {FUSED} | {fmt(fused, 1)} | {gbs(med(d.get((FUSED, None)), 'busbw'))} |")
    arena = d.get((FUSED_ARENA, None))
    if arena:
        out.append(f"| {FUSED_ARENA} | {fmt(med(arena, 'time_us'), 1)} | {gbs(med(arena, 'busbw'))} |")
    out.append(f"| RingAllReduce/4194304 | {fmt(peer, 1)} | {gbs(med(d.get(FUSED_PEER), 'busbw'))} |")
    out.append(f"\nfused / one 4 MiB all-reduce = **{ratio:.2f}x** (bar <= {BAR_FUSION}x: {'met' if ok else 'NOT met'})"
               + (f"; with the tensors in one arena {med(arena, 'time_us') / peer:.2f}x" if arena else "") + "\n")
    return ok


def allgather_table(ranks, d, out):
    sizes = sorted({b for (v, b) in d if v in ALLGATHER and b is not None})
    if not sizes:
        return
    out.append(f"#### AllGatherv, {ranks} ranks (size = each rank's payload; algbw counts the gathered bytes)\n")
    out.append("| size | variant | time (us) | algbw (GB/s) | busbw (GB/s) | bytes sent/rank | wrong | busbw ratio |")
    out.append("|---:|---|---:|---:|---:|---:|---:|---:|")
    for s in sizes:
        base = med(d.get(("MPI_Allgatherv", s)), "busbw")
        for v in ALLGATHER:
            rec = d.get((v, s))
            if not rec:
                continue
            bw = med(rec, "busbw")
            ratio = fmt(bw / base) if (v == "AllGatherv" and bw is not None and base) else ""
            sent = med(rec, "bytes_sent")
            out.append(f"| {human_bytes(s)} | {v} | {fmt(med(rec, 'time_us'), 1)} | {gbs(med(rec, 'algbw'))} "
                       f"| {gbs(bw)} | {'-' if sent is None else int(sent)} | {fmt(med(rec, 'wrong'), 0)} | {ratio} |")
    out.append("")


def summary(ranks, d, out):
    """The short table scripts/demo.sh prints."""
    out.append(f"{ranks} ranks: all-reduce busbw (GB/s), median of runs")
    out.append(f"{'size':>8}  {'RingAllReduce':>13}  {'ring forced':>11}  {'MPI_Allreduce':>13}  {'ratio':>6}")
    for s in sorted({b for (v, b) in d if v == "MPI_Allreduce"}):
        ring = med(d.get(("RingAllReduce", s)), "busbw")
        forced = med(d.get(("RingAllReduce/ring", s)), "busbw")
        base = med(d.get(("MPI_Allreduce", s)), "busbw")
        ratio = ring / base if ring and base else None
        out.append(f"{human_bytes(s):>8}  {gbs(ring):>13}  {gbs(forced):>11}  {gbs(base):>13}  {fmt(ratio):>6}")
    fused = med(d.get((FUSED, None)), "time_us")
    peer = med(d.get(FUSED_PEER), "time_us")
    if fused and peer:
        out.append(f"fusion: 256 x 16 KiB in {fused:.0f} us vs one 4 MiB RingAllReduce in {peer:.0f} us"
                   f" -> {fused / peer:.2f}x (bar <= {BAR_FUSION}x)")
    out.append("")
    out.append(f"{ranks} ranks: sparse all-gather busbw (GB/s), per-rank payload")
    out.append(f"{'size':>8}  {'AllGatherv':>10}  {'MPI_Allgatherv':>14}  {'ratio':>6}")
    for s in sorted({b for (v, b) in d if v == "MPI_Allgatherv"}):
        a = med(d.get(("AllGatherv", s)), "busbw")
        m = med(d.get(("MPI_Allgatherv", s)), "busbw")
        out.append(f"{human_bytes(s):>8}  {gbs(a):>10}  {gbs(m):>14}  {fmt(a / m if a and m else None):>6}")
    wrong = sum(sum(rec.get("wrong", [])) for rec in d.values())
    errors = sum(len(rec.get("errors", [])) for rec in d.values())
    out.append(f"result checks: wrong = {wrong:.0f}, errors = {errors}")
    out.append("")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="bench_collectives --benchmark_out files")
    ap.add_argument("--summary", action="store_true", help="short plain-text table (scripts/demo.sh)")
    args = ap.parse_args()
    data, labels = load(args.json)
    out = []
    failed = False
    for ranks in sorted(data):
        d = data[ranks]
        if args.summary:
            summary(ranks, d, out)
            continue
        out.append(f"### {ranks} ranks\n")
        verdicts = allreduce_tables(ranks, d, labels[ranks], out)
        fusion_ok = fusion_line(ranks, d, out)
        allgather_table(ranks, d, out)
        met = sum(verdicts)
        out.append(f"Bar at {ranks} ranks: RingAllReduce busbw >= {BAR_RATIO}x MPI_Allreduce at "
                   f"{met}/{len(verdicts)} sizes >= 1 MiB; fusion "
                   f"{'-' if fusion_ok is None else ('met' if fusion_ok else 'NOT met')}.\n")
    for rec in (r for d in data.values() for r in d.values()):
        if rec.get("errors") or any(w != 0 for w in rec.get("wrong", [])):
            failed = True
    print("\n".join(out))
    if failed:
        print("some results were wrong or failed; see the 'wrong' column", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
