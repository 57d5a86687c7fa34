"""A job's stalls as ``gpudiag fleet`` reads them: stretches when it finished no step.

The agent exports ``gpudiag_job_stalled_seconds`` (docs/stall.md) only while a job is stalled:
a sample of value s at t says the job has finished no step since t - s. So a stall is dated back
to the job's last step (``gpudiag_job_last_step_timestamp_seconds``), not to when its limit ran
out, and the agent's MFU for the stretch in between (its last one, kept until the stall was
found) does not count (``fleet._job_row``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from gpudiag.live.fleet_query import Series

Spans = list[tuple[float, float, str]]


def stall_spans(series: list[Series], last_steps: list[Series] | None = None) -> dict[str, Spans]:
    """job_id -> its stalled stretches (since, until, cause), disjoint and in order. In a window
    ending at t, the largest stalled seconds s were at its last stalled sample; with the job's
    last step at l (``gpudiag_job_last_step_timestamp_seconds``, the step before the stall) the
    stretch is exactly (l, l + s], whatever the windows' edges. Without it: (t - s, t], up to a
    window late."""
    steps: dict[tuple[str, float], float] = {}
    for s in last_steps or []:
        job = s.labels.get("job_id", "")
        for t, v in s.points:
            steps[(job, t)] = max(v, steps.get((job, t), v))
    raw: dict[str, Spans] = defaultdict(list)
    for s in series:
        job = s.labels.get("job_id", "")
        for t, v in s.points:
            last = steps.get((job, t))
            # the last step is the stall's start unless the job stepped again later in the window
            # (a second's grace: the agent's clock took the sample a moment after Prometheus did)
            span = (last, last + v) if last is not None and last <= t - v + 1.0 else (t - v, t)
            raw[job].append((*span, s.labels.get("cause", "") or "unknown"))
    out: dict[str, Spans] = {}
    for job, spans in raw.items():
        merged: Spans = []
        for lo, hi, cause in sorted(spans):
            if merged and lo <= merged[-1][1]:
                if hi > merged[-1][1]:   # the later point's cause: the verdict, once it was known
                    merged[-1] = (merged[-1][0], hi, cause)
            else:
                merged.append((lo, hi, cause))
        out[job] = merged
    return out


def stalled_at(spans: Spans, t: float) -> str | None:
    """The cause of a stall the job was in at ``t`` (None: it was not stalled then)."""
    i = bisect.bisect_left(spans, (t,)) - 1
    for lo, hi, cause in spans[max(0, i):i + 2]:
        if lo < t <= hi:
            return cause
    return None


def stalled_in(spans: Spans, lo: float, hi: float) -> tuple[float, str | None]:
    """Seconds of (lo, hi] the job was stalled, and the cause of most of them."""
    total, best, cause = 0.0, 0.0, None
    for a, b, c in spans[max(0, bisect.bisect_left(spans, (lo,)) - 1):]:
        if a >= hi:
            break
        overlap = min(b, hi) - max(a, lo)
        if overlap > 0:
            total += overlap
            if overlap > best:
                best, cause = overlap, c
    return total, cause
