#!/usr/bin/env python3
"""Renders a parallax timeline (the Chrome trace PARALLAX_TIMELINE=<path> or
TrainerOptions::timeline writes) as a PNG: one horizontal track per rank,
with a row for the caller's thread and one for the trainer's communication
thread (what ready() started), every phase a coloured box (phases inside a
call drawn lower and thinner than the call), the user's time between the
trainer's calls in grey, and a legend.

    PARALLAX_TIMELINE=/tmp/lm.json mpiexec -n 4 build/host/examples/01_word_lm --steps 6 ...
    python3 bench/timeline_png.py /tmp/lm.json docs/timeline_word_lm.png --last-steps 3

Needs matplotlib (pip install matplotlib, or Debian's python3-matplotlib for
/usr/bin/python3).
"""

import argparse
import json
import re
import sys


def phase_key(name, category):
    """The legend entry of a span: its name without bucket numbers and sizes."""
    if category == "user":
        return "user (between trainer calls)"
    key = re.sub(r"\s*\(\d[^)]*\)", "", name)  # "(1024 B)"
    key = re.sub(r"bucket \d+", "bucket", key)
    return key


def load(path):
    with open(path) as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    if not events:
        sys.exit(f"timeline_png: {path} holds no spans")
    return events


def with_depths(events):
    """Nesting depth of every span within its (rank, thread) row."""
    rows = {}
    for e in events:
        rows.setdefault((e["pid"], e.get("tid", 0)), []).append(e)
    out = []
    for row in rows.values():
        row.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in row:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 1e-3:
                stack.pop()
            out.append((e, len(stack)))
            stack.append(e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the Chrome trace JSON a parallax timeline wrote")
    ap.add_argument("png", help="the PNG to write")
    ap.add_argument("--last-steps", type=int, default=0,
                    help="show only the time of rank 0's last N step() calls and what preceded them "
                         "back to the step before (0: the whole trace)")
    ap.add_argument("--from-ms", type=float, default=None, help="start of the window shown (ms)")
    ap.add_argument("--to-ms", type=float, default=None, help="end of the window shown (ms)")
    ap.add_argument("--title", default=None)
    ap.add_argument("--width", type=float, default=13.0, help="inches")
    ap.add_argument("--dpi", type=int, default=110)
    args = ap.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("timeline_png: matplotlib is missing; install it with `pip install matplotlib` "
                 "(or Debian's python3-matplotlib and run /usr/bin/python3)")

    events = load(args.trace)
    lo = min(e["ts"] for e in events)
    hi = max(e["ts"] + e["dur"] for e in events)
    if args.last_steps > 0:
        steps = sorted((e for e in events if e["pid"] == 0 and e["name"] == "step"), key=lambda e: e["ts"])
        if len(steps) < args.last_steps:
            sys.exit(f"timeline_png: the trace holds {len(steps)} steps on rank 0, fewer than --last-steps")
        first = len(steps) - args.last_steps
        lo = steps[first - 1]["ts"] + steps[first - 1]["dur"] if first > 0 else lo
        hi = steps[-1]["ts"] + steps[-1]["dur"]
    if args.from_ms is not None:
        lo = args.from_ms * 1000
    if args.to_ms is not None:
        hi = args.to_ms * 1000
    shown = [(e, d) for e, d in with_depths(events) if e["ts"] + e["dur"] > lo and e["ts"] < hi]

    # Colours: the phases that take the most time first.
    total = {}
    for e, _ in shown:
        k = phase_key(e["name"], e.get("cat", ""))
        total[k] = total.get(k, 0) + min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)
    keys = sorted(total, key=lambda k: -total[k])
    # tab20 without its greys (grey is the user's time)
    palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (14, 15)]
    colours, i = {}, 0
    for k in keys:
        if k.startswith("user"):
            colours[k] = (0.80, 0.80, 0.80)
        else:
            colours[k] = palette[i % len(palette)]
            i += 1

    ranks = sorted({e["pid"] for e in events})
    threads = sorted({e.get("tid", 0) for e in events})
    rows_per_rank = len(threads)
    row_height = 1.0
    fig_h = 1.6 + 0.55 * len(ranks) * rows_per_rank + 0.22 * ((len(keys) + 2) // 3)
    fig, ax = plt.subplots(figsize=(args.width, fig_h))
    yticks, ylabels = [], []
    for ri, r in enumerate(ranks):
        for ti, t in enumerate(threads):
            y = (len(ranks) - 1 - ri) * (rows_per_rank + 0.4) + (rows_per_rank - 1 - ti)
            yticks.append(y + 0.4)
            ylabels.append(f"rank {r}" + ("" if rows_per_rank == 1 else (" caller" if t == 0 else " comm. thread")))
            for e, depth in shown:
                if e["pid"] != r or e.get("tid", 0) != t:
                    continue
                k = phase_key(e["name"], e.get("cat", ""))
                h = 0.8 * (0.62 ** depth)
                start = max(e["ts"], lo)
                width = min(e["ts"] + e["dur"], hi) - start
                ax.broken_barh([((start - lo) / 1000, width / 1000)], (y, h), facecolors=colours[k],
                               edgecolors="none")
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlim(0, (hi - lo) / 1000)
    ax.set_xlabel(f"milliseconds (from {lo / 1000:.1f} ms into the trace)")
    ax.set_title(args.title or f"parallax timeline: {args.trace}")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(facecolor=colours[k], label=k) for k in keys]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(args.png, dpi=args.dpi)
    print(f"timeline_png: wrote {args.png} ({len(shown)} spans, {len(ranks)} ranks, "
          f"{(hi - lo) / 1000:.1f} ms shown)")


if __name__ == "__main__":
    main()
