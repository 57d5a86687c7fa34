"""The fleet's tables made from its job rows: per team and user, per node, the fixes that win
most, the jobs that lost most, and the label mix over time. Pure functions (``fleet.summarise``
calls them); the page renders what they return.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudiag.live.fleet_model import Fix, Group, JobRow, LabelMix, NodeRow

if TYPE_CHECKING:
    from gpudiag.live.fleet_model import FleetSummary
    from gpudiag.live.fleet_query import FleetData, Grid

TOP_FIXES = 3          # the headline: the three fixes that win most
TOP_LOST = 20
# label-mix buckets: the smallest that keeps the chart to MAX_BUCKETS bars (a week: days)
BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 3 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 32


def groups(rows: list[JobRow], attr: str, previous: FleetSummary | None = None) -> list[Group]:
    """Per team or user (``attr``), largest first; with the previous period's hours where the
    same name held GPUs then."""
    out: dict[str, Group] = {}
    for r in rows:
        name = getattr(r, attr)
        g = out.setdefault(name, Group(name))
        g.jobs += 1
        g.gpu_hours += r.gpu_hours
        g.useful_gpu_hours += r.useful_gpu_hours
        g.no_mfu_gpu_hours += r.no_mfu_gpu_hours
        g.no_signal_gpu_hours += r.no_signal_gpu_hours
        g.idle_gpu_hours += r.idle_gpu_hours
        g.stalled_gpu_hours += r.stalled_gpu_hours
        g.lost_gpu_hours += r.lost_gpu_hours
    if previous is not None:
        before = {g.name: g for g in (previous.teams if attr == "team" else previous.users)}
        for g in out.values():
            p = before.get(g.name)
            g.previous_gpu_hours = p.gpu_hours if p else 0.0
            g.previous_useful_gpu_hours = p.useful_gpu_hours if p else 0.0
    return sorted(out.values(), key=lambda g: (-g.gpu_hours, g.name))


def fixes_of(rows: list[JobRow], weeks: float, top: int = TOP_FIXES) -> list[Fix]:
    """The ``top`` jobs whose recommendation wins the most GPU-hours, per week at the range's
    rate (``weeks``: the range's length in weeks)."""
    best = sorted((r for r in rows if r.fix_gpu_hours > 0), key=lambda r: (-r.fix_gpu_hours, r.job_id))[:top]
    return [Fix(job_id=r.job_id, user=r.user, team=r.team, action=r.action or "", label=r.label,
                step_s=r.step_s or 0.0, predicted_step_s=r.predicted_step_s or 0.0, gpu_hours=r.gpu_hours,
                win_gpu_hours=r.fix_gpu_hours,
                win_gpu_hours_per_week=r.fix_gpu_hours / weeks if weeks > 0 else 0.0) for r in best]


def most_lost(rows: list[JobRow], top: int = TOP_LOST) -> list[dict[str, Any]]:
    best = sorted((r for r in rows if r.lost_gpu_hours > 0), key=lambda r: (-r.lost_gpu_hours, r.job_id))
    return [{"job_id": r.job_id, "lost_gpu_hours": r.lost_gpu_hours, "cause": r.lost_cause}
            for r in best[:top]]


def bucket_for(grid: Grid) -> float:
    span = grid.end - grid.start
    for b in BUCKETS_S:
        if b >= grid.step and math.ceil(span / b) + 1 <= MAX_BUCKETS:
            return float(b)
    return float(BUCKETS_S[-1])


def label_mix(mix: dict[float, dict[str, float]], grid: Grid) -> LabelMix:
    """Held GPU-hours per label per bucket (UTC-aligned: a day starts at 00:00 UTC); a window
    counts in the bucket its end falls in (its last millisecond, as (t - step, t])."""
    b = bucket_for(grid)
    first = math.floor((grid.start + 1e-3) / b) * b
    n = max(1, math.floor((grid.end - 1e-3 - first) / b) + 1)
    names = sorted({lab for cell in mix.values() for lab in cell})
    out = {lab: [0.0] * n for lab in names}
    for end, cell in mix.items():
        t = end - 1e-3
        i = min(n - 1, max(0, math.floor((t - first) / b)))
        for lab, v in cell.items():
            out[lab][i] += v / 3600
    return LabelMix(b, [first + i * b for i in range(n)], out)


def nodes_of(rows: list[JobRow], nodes: dict[str, Any], data: FleetData) -> list[NodeRow]:
    """Per node (the agent's ``instance``): GPU-hours held by jobs, their useful share (each
    job's useful hours split by where it held its GPUs), idle, held by no job. ``nodes``:
    ``fleet.held_time``'s per-node totals."""
    by_job = {r.job_id: r for r in rows}
    out = []
    for inst, n in nodes.items():
        row = NodeRow(inst, int(max(n.gpus_at.values(), default=0)), 0, 0.0, 0.0, n.idle_s / 3600,
                      n.held.get("", 0.0) / 3600, data.interval(inst))
        for job, secs in n.held.items():
            r = by_job.get(job)
            if not job or r is None:
                continue
            row.jobs += 1
            row.gpu_hours += secs / 3600
            if r.gpu_hours > 0:
                row.useful_gpu_hours += r.useful_gpu_hours * (secs / 3600) / r.gpu_hours
        out.append(row)
    return sorted(out, key=lambda n: n.instance)
