#!/usr/bin/env python3
"""plan::Model against measured steps on emulated hosts (docs/cluster.md).

For each example, rank count, host count (1 or 2 emulated hosts) and link
speed, runs the example under `--arch hybrid` and `--arch allreduce`
(alternating) and once under `--arch auto --steps 1`, which prints the
model's predicted communication of every architecture for that job. The
step's compute and local work are taken from the same architecture's run on
one host (no link), so the prediction for a case is

    predicted = measured(1 host) - model comm(1 host) + model comm(case)

and the one-host cases are the calibration, not predictions. `--overlap
off`: the model credits no overlap of communication with compute. Prints a
markdown table: measured and predicted step (ms) per architecture, the
error, and whether the predicted best is the measured best.

    bench/run_plan_validation.py --build build/host --examples 01_word_lm --ranks 2 4 --links 1 10 100
"""
import argparse, os, re, statistics, subprocess, sys

SHAPES = {
    # small shapes: seconds per run on the 2-core machine
    "01_word_lm": ["--vocab", "200000", "--dim", "64", "--sampled", "2048", "--tokens", "400000",
                   "--eval-examples", "0", "--pass-ratio", "100", "--threads", "1"],
    "02_ctr": ["--max-rows", "100000", "--eval-examples", "240", "--pass-ratio", "100", "--threads", "1"],
}
BATCH = {"01_word_lm": 256, "02_ctr": 512}  # global batch per step


def run(exe, ranks, per_host, link, arch, steps, extra):
    env = dict(os.environ)
    env["PARALLAX_RANKS_PER_HOST"] = str(per_host)
    if link:
        env["PARALLAX_LINK"] = f"{link}Gbit/s,20us"
    else:
        env.pop("PARALLAX_LINK", None)
    cmd = ["mpiexec", "-n", str(ranks), exe, "--arch", arch, "--steps", str(steps), "--log-every", "1000",
           "--warmup", "3", "--overlap", "off", "--batch", str(BATCH[os.path.basename(exe)] // ranks)] + extra
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600).stdout
    return out


def comm_of(out):
    """The model's predicted comm (ms) per architecture from --arch auto's table."""
    got = {}
    for m in re.finditer(r"^\s*(hybrid|allreduce|ps)\s+step\s+[0-9.]+ ms\s+\(comm\s+([0-9.]+)", out, re.M):
        got[m.group(1)] = float(m.group(2))
    return got


def step_ms(out, exe):
    m = re.search(r"samples_per_s=([0-9.]+)", out)
    if not m:
        raise RuntimeError("no result line:\n" + out[-2000:])
    return BATCH[os.path.basename(exe)] / float(m.group(1)) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build/host")
    ap.add_argument("--examples", nargs="+", default=["01_word_lm", "02_ctr"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--links", nargs="+", type=float, default=[1, 10, 100])
    ap.add_argument("--steps", type=int, default=23)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    rows, errors, agree = [], [], []
    for ex in a.examples:
        exe = os.path.join(a.build, "examples", ex)
        for n in a.ranks:
            base, base_comm = {}, None
            for hosts, links in [(1, [0])] + [(2, a.links)]:
                for link in links:
                    per_host = n // hosts
                    comm = comm_of(run(exe, n, per_host, link, "auto", 1, SHAPES[ex]))
                    measured = {"hybrid": [], "allreduce": []}
                    for r in range(a.rounds):
                        for arch in (["hybrid", "allreduce"] if r % 2 == 0 else ["allreduce", "hybrid"]):
                            measured[arch].append(step_ms(run(exe, n, per_host, link, arch, a.steps, SHAPES[ex]), exe))
                    med = {k: statistics.median(v) for k, v in measured.items()}
                    if hosts == 1:
                        base, base_comm = med, comm
                        pred = dict(med)
                    else:
                        pred = {k: base[k] - base_comm[k] + comm[k] for k in med}
                        for k in med:
                            errors.append(abs(pred[k] - med[k]) / med[k])
                        best_m = min(med, key=med.get)
                        best_p = min(pred, key=pred.get)
                        differ = max(med.values()) / min(med.values()) > 1.15
                        agree.append((not differ) or best_m == best_p)
                    row = (f"| {ex} | {n} | {hosts} | {link if link else '-'} | {med['hybrid']:.1f} | {pred['hybrid']:.1f} | "
                           f"{med['allreduce']:.1f} | {pred['allreduce']:.1f} | {min(med, key=med.get)} | "
                           f"{min(pred, key=pred.get)} | {os.getloadavg()[0]:.1f} |")
                    print(row, flush=True)
                    rows.append(row)
    print("\n| example | ranks | hosts | Gbit/s | hybrid ms | predicted | allreduce ms | predicted | best | predicted best | load |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|")
    print("\n".join(rows))
    if errors:
        print(f"\nerror |predicted - measured| / measured over {len(errors)} predictions: median "
              f"{statistics.median(errors):.1%}, max {max(errors):.1%}; predicted best = measured best where they "
              f"differ by > 15%: {sum(agree)}/{len(agree)}")


if __name__ == "__main__":
    sys.exit(main())
