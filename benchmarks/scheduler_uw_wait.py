"""Where the useful-work-weighted wait sits: EASY and gpudiag over the whole trace, per-job waits grouped.

Usage:
    python benchmarks/scheduler_uw_wait.py [--trace ../shared/clusters/philly.csv] [--nodes 80] [--seed 0]

Issue 44 asks, where the UW wait target is missed, which bursts and which jobs carry the wait.
UW wait = sum(W x wait) / sum(W), W = GPUs x duration x MFU (``scheduler/sim/metrics.py``), so it
splits exactly into each group's sum(W x wait) / sum(W): printed per MFU half, GPU class,
run length and week of submission (the weeks carrying most), for EASY and gpudiag replayed in this
process on the same jobs, with each replay's CPU time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.simulator import simulate
from gpudiag.scheduler.sim.traces import read_trace

REPO = Path(__file__).resolve().parents[1]
DAY = 86400.0


def waits(jobs, mfu, cluster: Cluster, policy: Policy) -> tuple[dict[str, np.ndarray], float]:
    """Per-job columns in job-id order (wait, GPUs, duration, MFU, submit) and the replay's CPU s."""
    cpu = time.process_time()
    res = simulate(jobs, mfu, cluster, policy)
    cpu = time.process_time() - cpu
    js = sorted(res.jobs, key=lambda s: s.job.id)
    sub = np.array([s.job.submit for s in js])
    ran = np.array([sum(e - b for b, e, _ in s.segments) for s in js])
    return {"wait": np.maximum(0.0, np.array([s.end for s in js]) - sub - ran),
            "g": np.array([s.job.gpus for s in js], dtype=float), "dur": np.array([s.duration for s in js]),
            "mfu": np.array([s.mfu for s in js]), "sub": sub}, cpu


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default=str(REPO.parent / "shared" / "clusters" / "philly.csv"))
    ap.add_argument("--nodes", type=int, default=80)
    ap.add_argument("--rack-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    tr = read_trace(a.trace)
    mfu = synthesise(tr.jobs, a.seed)
    cluster = Cluster.uniform(a.nodes, 8, a.rack_size)
    e, ce = waits(tr.jobs, mfu, cluster, Policy.easy())
    g, cg = waits(tr.jobs, mfu, cluster, Policy())
    w = e["g"] * e["dur"] * e["mfu"]
    total = w.sum()
    print(f"{Path(a.trace).name}: {len(tr.jobs)} jobs, {a.nodes} nodes x 8 GPUs, seed {a.seed}; "
          f"replay CPU s: EASY {ce:.1f}, gpudiag {cg:.1f}")

    def carried(m: np.ndarray, c: dict) -> float:
        return float((w[m] * c["wait"][m]).sum() / total / 3600)

    def table(title: str, groups: list[tuple[str, np.ndarray]]) -> None:
        print(f"\n{title}: jobs | share of W | UW wait carried h, EASY -> gpudiag | "
              "mean wait h, EASY -> gpudiag")
        for name, m in groups:
            if m.any():
                print(f"  {name:16s} {m.sum():7d} {w[m].sum() / total:7.1%}   {carried(m, e):7.2f} -> "
                      f"{carried(m, g):7.2f} ({carried(m, g) - carried(m, e):+.2f})   "
                      f"{e['wait'][m].mean() / 3600:7.2f} -> {g['wait'][m].mean() / 3600:7.2f}")

    gpus, dur, med = e["g"], e["dur"], float(np.median(e["mfu"]))
    table("all", [("all", np.ones(len(w), dtype=bool))])
    table("by MFU", [("high (>= median)", e["mfu"] >= med), ("low", e["mfu"] < med)])
    table("by GPUs", [("1", gpus == 1), ("2-8", (gpus > 1) & (gpus <= 8)),
                      ("9-32", (gpus > 8) & (gpus <= 32)), (">32", gpus > 32)])
    table("by run length", [("< 1 h", dur < 3600), ("1 h - 1 day", (dur >= 3600) & (dur < DAY)),
                            ("1 - 7 days", (dur >= DAY) & (dur < 7 * DAY)), (">= 7 days", dur >= 7 * DAY)])
    week = (e["sub"] // (7 * DAY)).astype(int)
    by_week = [(carried(week == k, e) + carried(week == k, g), k) for k in np.unique(week)]
    table("weeks of submission carrying the most",
          [(f"week {k}", week == k) for _, k in sorted(by_week)[::-1][:6]])
    top = np.zeros(len(w), dtype=bool)
    top[np.argsort(-(w * e["wait"]))[:20]] = True
    print(f"\nthe 20 jobs with the largest W x EASY wait carry {carried(top, e):.2f} h "
          f"of EASY's UW wait, {carried(top, g):.2f} h of gpudiag's; "
          f"their GPUs: {sorted({int(x) for x in gpus[top]})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
