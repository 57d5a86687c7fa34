"""Straggler ranks: in a synchronous job every rank waits for the slowest one."""

from __future__ import annotations

import statistics

import numpy as np

from gpudiag.diagnosis import RankResult, RankSpread, RankValue, Stragglers

# A rank whose mean step time is 10% above the median rank's holds every other rank back
# by that much each step; below that, run-to-run noise on shared clusters dominates
# (HTA's straggler analysis also flags ranks by their distance from the median).
STRAGGLER_RATIO = 1.10


def find_stragglers(ranks: list[RankResult]) -> Stragglers | None:
    times = {r.rank: r.mean_step_time for r in ranks if r.mean_step_time > 0}
    if len(times) < 2:
        return None
    med = statistics.median(times.values())
    slow = sorted(r for r, t in times.items() if t > med * STRAGGLER_RATIO)
    imbalance = (max(times.values()) - min(times.values())) / med if med > 0 else 0.0
    return Stragglers(median_step_us=med, ranks=slow, imbalance=imbalance,
                      per_rank_step_us={str(r): t for r, t in sorted(times.items())})


# Per-rank numbers summarised for jobs with many ranks: step time (stragglers) and where the
# collectives' time goes (in a synchronous job the fast ranks wait in collectives for the slow
# one, so the ranks with the most exposed communication are the ones waiting).
SPREAD_METRICS = (
    ("step_time", "mean step time"),
    ("comm_exposed", "exposed communication per step"),
    ("comm_total", "communication per step"),
    ("gpu_busy", "device busy per step"),
)
# The extreme ranks named for each metric.
SPREAD_NAMED = 5


def rank_spreads(ranks: list[RankResult]) -> list[RankSpread]:
    """Distribution (min, p10, median, p90, max) and extreme ranks of each per-step number."""
    with_steps = [r for r in ranks if r.steps and r.total.step_time > 0]
    if len(with_steps) < 2:
        return []
    out = []
    for metric, label in SPREAD_METRICS:
        vals = np.array([getattr(r.total, metric) / len(r.steps) for r in with_steps])
        if not vals.any():
            continue
        order = np.lexsort((np.array([r.rank for r in with_steps]), -vals))  # ties: lower rank
        named = min(SPREAD_NAMED, len(with_steps))
        q = np.percentile(vals, [0, 10, 50, 90, 100])
        out.append(RankSpread(
            metric=metric, label=label, ranks=len(with_steps), minimum=float(q[0]),
            p10=float(q[1]), median=float(q[2]), p90=float(q[3]), maximum=float(q[4]),
            highest=[RankValue(with_steps[i].rank, float(vals[i])) for i in order[:named]],
            lowest=[RankValue(with_steps[i].rank, float(vals[i])) for i in order[::-1][:named]],
        ))
    return out
