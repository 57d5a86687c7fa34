"""The load sweep behind ``gpudiag sim --sweep``: every policy at every load and seed, and the ablation.

Windows of ``window_jobs`` consecutive trace jobs (a sweep is a few hundred replays in 15 minutes
on two cores) in three families: ``arrivals`` (submit times scaled to the load), ``cluster`` (the
node count giving the load), ``windows`` (Pollux/Sia's 160 jobs of an 8-hour window on 64 GPUs);
the ablation switches off one ``ABLATION_FIELDS`` field at a time. docs/scheduler.md, "Evaluation:
load sweeps".
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from gpudiag.scheduler.model import Cluster, Policy
from gpudiag.scheduler.sim.fairness import quota_attainment
from gpudiag.scheduler.sim.metrics import summarise
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.simulator import SimResult, simulate
from gpudiag.scheduler.sim.tiresias import simulate_tiresias
from gpudiag.scheduler.sim.traces import TraceJob

POLICIES = ("fifo", "easy", "tiresias", "gpudiag")
BASELINE = "easy"
# The policy's terms, by Policy field: efficiency (MFU in the order), team_queues (fair share
# across teams), reclaim (quota reclaim) and waste_charge (waste charged to a team's use).
ABLATION_FIELDS = ("efficiency", "team_queues", "reclaim", "waste_charge")
NOT_IN_BUILD = "not in this build"
GPUS_PER_NODE = 8
# the gpudiag policy's fields the CLI sets (commands/policy_options.py), carried to every variant
OPTION_FIELDS = ("min_runtime_s", "max_efficiency_delay_s")
POLLUX_JOBS, POLLUX_HOURS, POLLUX_NODES = 160, 8.0, 8   # Pollux/Sia: 160 jobs, 8 h, 64 GPUs


def policy_named(name: str, base: Policy | None = None) -> Policy | None:
    """The Policy of a ``--policy`` name (None: Tiresias, which has its own simulator). ``base``
    carries option changes of the gpudiag policy (``--min-runtime``...) to every policy."""
    fields = {} if base is None else {f: getattr(base, f) for f in OPTION_FIELDS}
    if name == "tiresias":
        return None
    pol = {"fifo": Policy.fifo(), "easy": Policy.easy()}.get(name, Policy())
    return dataclasses.replace(pol, **fields)


def replay(jobs: list[TraceJob], mfu: dict, cluster: Cluster, policy: Policy | None) -> SimResult:
    return simulate_tiresias(jobs, mfu, cluster) if policy is None else simulate(jobs, mfu, cluster, policy)


def ablations(base: Policy) -> dict[str, Policy | str]:
    """Variant name -> gpudiag with that field off, or why there is none (``NOT_IN_BUILD``)."""
    have = {f.name for f in dataclasses.fields(base)}
    out: dict[str, Policy | str] = {}
    for name in ABLATION_FIELDS:
        if name not in have:
            out[f"gpudiag -{name}"] = NOT_IN_BUILD
            continue
        default = getattr(base, name)
        if isinstance(default, bool | int | float) and not default:
            out[f"gpudiag -{name}"] = f"already off in Policy() (Policy.{name} = {default!r})"
        elif isinstance(default, bool | int | float):
            out[f"gpudiag -{name}"] = dataclasses.replace(base, **{name: type(default)(0)})
        else:
            out[f"gpudiag -{name}"] = f"not a switch (Policy.{name} is a {type(default).__name__})"
    return out


@dataclass
class Scenario:
    family: str
    load: float          # the load asked for (windows: the one the window offers)
    seed: int
    nodes: int
    jobs: list[TraceJob]
    mfu: dict
    offered: float       # the offered load of this scenario's jobs on its cluster


def offered_load(jobs: list[TraceJob], gpus: int) -> float:
    """sum(GPUs x duration) / (cluster GPUs x arrival span) over the jobs that fit."""
    fit = [j for j in jobs if j.gpus <= gpus]
    if not fit:
        return 0.0
    span = max(j.submit for j in fit) - min(j.submit for j in fit)
    work = sum(j.gpus * j.duration for j in fit)
    return work / (gpus * span) if span > 0 else math.inf


def window(jobs: list[TraceJob], size: int, seed: int) -> list[TraceJob]:
    """``size`` consecutive jobs from a start drawn from ``seed``, submit times from 0."""
    if size >= len(jobs):
        start, size = 0, len(jobs)
    else:
        start = int(np.random.default_rng(seed).integers(0, len(jobs) - size + 1))
    part = jobs[start:start + size]
    return [dataclasses.replace(j, submit=j.submit - part[0].submit) for j in part]


def pollux_window(jobs: list[TraceJob], seed: int, n: int = POLLUX_JOBS, hours: float = POLLUX_HOURS
                  ) -> list[TraceJob] | None:
    """``n`` jobs sampled from an ``hours`` span of submissions that holds at least ``n``; None if
    the trace has no such span."""
    sub = np.array([j.submit for j in jobs])
    ends = np.searchsorted(sub, sub + hours * 3600.0)
    ok = np.flatnonzero(ends - np.arange(len(sub)) >= n)
    if not len(ok):
        return None
    rng = np.random.default_rng(seed)
    i = int(ok[rng.integers(len(ok))])
    pick = np.sort(rng.choice(np.arange(i, ends[i]), size=n, replace=False))
    t0 = jobs[pick[0]].submit
    return [dataclasses.replace(jobs[k], submit=jobs[k].submit - t0) for k in pick]


def scenarios(jobs: list[TraceJob], loads: list[float], seeds: list[int], nodes: int, window_jobs: int,
              pollux_windows: int) -> list[Scenario]:
    out = []
    for seed in seeds:
        part = window(jobs, window_jobs, seed)
        mfu = synthesise(part, seed)
        gpus = nodes * GPUS_PER_NODE
        base = offered_load(part, gpus)
        work = base * gpus
        for load in loads:
            f = base / load
            scaled = [dataclasses.replace(j, submit=j.submit * f) for j in part]
            out.append(Scenario("arrivals", load, seed, nodes, scaled, mfu, offered_load(scaled, gpus)))
            n = max(1, round(work / (GPUS_PER_NODE * load)), -(-max(j.gpus for j in part) // GPUS_PER_NODE))
            out.append(Scenario("cluster", load, seed, n, part, mfu, offered_load(part, n * GPUS_PER_NODE)))
    for k in range(pollux_windows):
        w = pollux_window(jobs, k)
        if w is None:
            break
        g = POLLUX_NODES * GPUS_PER_NODE
        out.append(Scenario("windows", offered_load(w, g), k, POLLUX_NODES, w, synthesise(w, k),
                            offered_load(w, g)))
    return out


def arrival_utilisation(res: SimResult) -> float:
    """Share of the cluster's GPU-time held by jobs between the first and the last arrival.

    Why beside ``gpu_utilisation`` (over the makespan): a window of a heavy-tailed trace drains
    for weeks after its last arrival (Philly's longest jobs run 50 days), which says nothing about
    how busy the cluster was while jobs kept coming; this is the utilisation that tells whether
    the cluster queued, the condition of issue 20's targets."""
    end = max((s.job.submit for s in res.jobs), default=0.0)
    if end <= 0:
        return 0.0
    held = sum(s.job.gpus * max(0.0, min(e, end) - b) for s in res.jobs for b, e, _ in s.segments)
    return held / (res.total_gpus * end)


def _one(task: tuple) -> tuple[int, str, dict | None, float]:
    i, variant, sc, policy = task
    t0 = time.perf_counter()
    res = replay(sc.jobs, sc.mfu, Cluster.uniform(sc.nodes, GPUS_PER_NODE), policy)
    m = summarise(res) if res.jobs else None
    if m is not None:
        m.update(quota_attainment(m["team_share"]), offered_load=round(sc.offered, 4), nodes=sc.nodes,
                 arrival_utilisation=round(arrival_utilisation(res), 4))
    return i, variant, m, time.perf_counter() - t0


def run_sweep(jobs: list[TraceJob], loads: list[float], seeds: list[int], nodes: int, window_jobs: int,
              pollux_windows: int, base: Policy, processes: int | None = None,
              progress: Callable[[str], None] = lambda _: None) -> dict:
    """Every (scenario, variant) replay over ``processes`` worker processes; the raw results."""
    t0 = time.perf_counter()
    scs = scenarios(jobs, loads, seeds, nodes, window_jobs, pollux_windows)
    abl = ablations(dataclasses.replace(Policy(), **{f: getattr(base, f) for f in OPTION_FIELDS}))
    tasks = []
    for i, sc in enumerate(scs):
        for name in POLICIES:
            tasks.append((i, name, sc, policy_named(name, base)))
        if sc.family == "arrivals":
            tasks += [(i, v, sc, p) for v, p in abl.items() if isinstance(p, Policy)]
    # the longest first (most jobs, highest load), so no worker is left with a long one at the end
    tasks.sort(key=lambda t: -len(t[2].jobs) * t[2].load)
    runs: list[dict] = []
    procs = max(1, processes or os.cpu_count() or 1)
    with ProcessPoolExecutor(procs) as pool:
        for k, (i, variant, m, wall) in enumerate(pool.map(_one, tasks, chunksize=1)):
            sc = scs[i]
            runs.append({"family": sc.family, "load": sc.load, "seed": sc.seed, "variant": variant,
                         "metrics": m, "wall_s": round(wall, 2)})
            progress(f"{k + 1}/{len(tasks)} {sc.family} load {sc.load:.2f} seed {sc.seed} {variant} "
                     f"{wall:.1f} s")
    return {"runs": runs, "ablation": {v: (p if isinstance(p, str) else "off") for v, p in abl.items()},
            "wall_s": round(time.perf_counter() - t0, 1), "processes": procs,
            "scenarios": len(scs), "replays": len(tasks)}
