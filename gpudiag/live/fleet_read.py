"""How ``gpudiag fleet`` reads a range: the queries of ``fleet_query`` over the windows, the
per-GPU ones for the nodes of older agents, the scheduler's counters, and what each sample
stands for (its target's scrape interval). The only place that decides what is asked in which
order; ``fleet_query`` holds the queries and how an answer is cut, parsed and joined.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from gpudiag import contract as c
from gpudiag.live.fleet_query import (
    QUERIES,
    QUERY_TIMEOUT_S,
    SCHEDULER_COUNTERS,
    SPAN_POINTS,
    FleetData,
    Grid,
    Series,
    instant_query,
    read_series,
    regex_of,
)
from gpudiag.live.prom_client import Prometheus, PrometheusUnavailable

# Agents from before gpudiag_gpus_held export only per-GPU series: for their nodes ({i}, a regex
# of instances) the same GPU time is counted from gpudiag_gpu_up, 8x the samples to read on
# 8-GPU nodes (no idle: they did not mark it). Filled in window by window where a node has no
# gpudiag_gpus_held (an agent upgraded within the range counts from gpudiag_gpu_up before).
_UP = c.GPU_UP + '{instance=~"{i}"}[{w}]'
OLD_AGENT_QUERIES: dict[str, str] = {
    "gpu_samples": f"sum by (instance, job_id) (count_over_time({_UP}))",
    "gpu_presence": f"max by (instance, job_id) (count_over_time({_UP}))",
}


def scheduler_counters(prom: Prometheus, start: float, end: float,
                       timeout: float = QUERY_TIMEOUT_S) -> list[dict[str, Any]]:
    """Each ``gpudiag_scheduler_*_total`` counter's ``increase`` over (start, end], per series
    and then summed by action and tier: a reset on one instance is that series' reset."""
    data = prom.get("/api/v1/label/__name__/values",
                    {"match[]": f'{{__name__=~"{SCHEDULER_COUNTERS}"}}', "start": f"{start:.3f}",
                     "end": f"{end:.3f}"}, timeout + 5)
    names = sorted(str(n) for n in data) if isinstance(data, list) else []
    width = f"{max(1, int(round((end - start) * 1000)))}ms"
    out = []
    for name in names:
        for r in instant_query(prom, f"sum by (action, tier) (increase({name}[{width}]))", end, timeout):
            try:
                v = float(r.get("value", [0, "nan"])[1])
            except (TypeError, ValueError, IndexError):
                continue
            if math.isfinite(v):
                m = r.get("metric") or {}
                out.append({"metric": name, "action": str(m.get("action", "")),
                            "tier": str(m.get("tier", "")), "count": v})
    return sorted(out, key=lambda d: (d["metric"], d["action"], d["tier"]))


class UnknownInterval(PrometheusUnavailable):
    """Samples of an instance whose scrape interval nothing states."""


def resolve_intervals(instances: set[str], targets: dict[str, float],
                      explicit: float | None) -> tuple[dict[str, float], list[str]]:
    """instance -> seconds per sample, and notes for the page. ``explicit`` (--scrape-interval)
    wins; else the interval Prometheus scrapes the instance at now; an instance it no longer
    scrapes (an agent removed) takes the interval most of the others have, and the page says
    so. UnknownInterval when nothing says."""
    if explicit is not None:
        return ({i: explicit for i in instances},
                [f"every sample counted as {explicit:g} s (--scrape-interval)"])
    known = {i: targets[i] for i in instances if i in targets}
    pool = list(known.values()) or list(targets.values())
    missing = sorted(instances - set(known))
    if missing and not pool:
        raise UnknownInterval(f"Prometheus does not say how often it scrapes {missing[0]} (no "
                              "/api/v1/targets, or no active target): give --scrape-interval")
    notes = []
    if missing:
        common = Counter(pool).most_common(1)[0][0]
        known.update({i: common for i in missing})
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        notes.append(f"{shown}: no longer scraped; samples counted at {common:g} s, the interval of "
                     "the other targets")
    return known, notes


def old_agents(prom: Prometheus, grid: Grid, samples: list[Series], timeout: float) -> list[str]:
    """Nodes whose per-job GPU series do not cover the range: no gpudiag_gpus_held at all (an
    agent from before it), or only from a later window (upgraded, or started, within the range).
    From the index (label values), not the samples: cheap."""
    data = prom.get("/api/v1/label/instance/values",
                    {"match[]": c.GPU_UP, "start": f"{grid.start:.3f}", "end": f"{grid.end:.3f}"},
                    timeout + 5)
    index = grid.indexer()
    first: dict[str, int] = {}
    for s in samples:
        inst = s.labels.get("instance", "")
        if s.points:
            first[inst] = min(first.get(inst, grid.n), index(s.points[0][0]))
    return sorted(str(i) for i in (data if isinstance(data, list) else []) if first.get(str(i), 1) > 0)


def fill(primary: list[Series], fallback: list[Series]) -> tuple[list[Series], int]:
    """``primary``'s series, each window it lacks taken from ``fallback`` (PromQL's ``or``, window
    by window and series by series), and how many windows were taken."""
    out = {tuple(sorted(s.labels.items())): s for s in primary}
    added = 0
    for s in fallback:
        key = tuple(sorted(s.labels.items()))
        have = out.get(key)
        if have is None:
            out[key] = Series(s.labels, list(s.points))
            added += len(s.points)
            continue
        times = {t for t, _ in have.points}
        new = [p for p in s.points if p[0] not in times]
        if new:
            have.points = sorted(have.points + new)
            added += len(new)
    return list(out.values()), added


# the previous period is compared by its totals and its teams' and users' hours: neither the
# label mix nor the labels' confidence is shown for it
PREVIOUS_QUERIES = [n for n in QUERIES if n not in ("label_samples", "confidence")]


def read_fleet(prom: Prometheus, grid: Grid, targets: dict[str, float], explicit: float | None = None,
               span_points: int = SPAN_POINTS, timeout: float = QUERY_TIMEOUT_S,
               requested: tuple[float, float] | None = None,
               names: list[str] | None = None) -> tuple[FleetData, list[str]]:
    """Every query over ``grid`` (or ``names``; and the per-GPU ones for nodes of older
    agents), the scheduler's counters over it, and the intervals of the instances found:
    (the data, notes)."""
    data = FleetData(prom.base, grid, read_series(prom, grid, span_points, timeout, names=names),
                     requested=requested or (grid.start, grid.end))
    notes = []
    old = old_agents(prom, grid, data.series["gpu_samples"], timeout)
    if old:
        regex = regex_of(old)
        extra = read_series(prom, grid, span_points, timeout,
                            exprs={n: q.replace("{i}", regex) for n, q in OLD_AGENT_QUERIES.items()})
        added = 0
        for name, series in extra.items():
            data.series[name], n = fill(data.series[name], series)
            added += n
        if added:
            shown = ", ".join(old[:3]) + (f" and {len(old) - 3} more" if len(old) > 3 else "")
            notes.append(f"{shown}: GPU-hours (where the agent exported no {c.GPUS_HELD}) counted from "
                         f"{c.GPU_UP}, without idle GPU-hours (an agent from before this version)")
    instances = {s.labels.get("instance", "") for ss in data.series.values() for s in ss}
    data.intervals, interval_notes = resolve_intervals(instances, targets, explicit)
    notes += interval_notes
    data.scheduler = scheduler_counters(prom, grid.start, grid.end, timeout)
    return data, notes
