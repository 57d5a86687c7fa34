"""Straggler ranks: in a synchronous job every rank waits for the slowest one."""

from __future__ import annotations

import statistics

from gpudiag.diagnosis import RankResult, Stragglers

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
