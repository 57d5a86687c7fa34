"""Whole-run context from a run directory: what ran, and counters over the whole run.

The traces cover a few steps; the samples cover the whole run. Reports show both, so the
counter series are reduced here (analyzers compute, reports only draw) to a bounded number
of points per series, whatever the run's length or GPU count: a 10-hour, 8-GPU run at
100 ms is 2.9 million rows, which must still make a small report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpudiag.diagnosis import RunSummary, Series, Timeline
from gpudiag.rundir import PROFILER_TRACED, gpu_samples_path, is_run_dir, read_jsonl, read_run, read_steps

MAX_POINTS = 400
# (row key, series name, unit). GPM metrics first; the legacy utilisation is kept as the
# coarse fallback for GPUs without GPM.
GPU_SERIES = [
    ("gpm_sm_activity", "SM activity", "%"),
    ("gpm_any_tensor_activity", "tensor activity", "%"),
    ("gpm_dram_bw_util", "DRAM bandwidth", "%"),
    ("util_gpu", "GPU utilisation (legacy)", "%"),
    ("power_mw", "power", "W"),
]


def _bucket(t: np.ndarray, v: np.ndarray, t0: float, n: int) -> tuple[list[float], list[float]]:
    """Mean per time bucket, at most n buckets; empty buckets are dropped."""
    if t.size == 0:
        return [], []
    # buckets span the series' own time range, so a short burst inside a long run keeps
    # its resolution; x stays seconds since the run's start
    edges = np.linspace(float(t.min()), float(t.max()) + 1e-9, min(n, t.size) + 1)
    k = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, edges.size - 2)
    sums = np.bincount(k, weights=v, minlength=edges.size - 1)
    counts = np.bincount(k, minlength=edges.size - 1)
    keep = counts > 0
    mids = (edges[:-1] + edges[1:]) / 2
    return (np.round(mids[keep] - t0, 3).tolist(), np.round(sums[keep] / counts[keep], 3).tolist())


def run_summary(run_dir: Path) -> RunSummary | None:
    """run.json as the Diagnosis carries it (None when the folder is not a run directory).

    A run.json of a schema this gpudiag does not read is an error, not a silent "no run".
    """
    if not is_run_dir(run_dir):
        return None
    info = read_run(run_dir)
    return RunSummary(
        command=[str(c) for c in info.command], host=str(info.host), start=float(info.start or 0),
        end=info.end, status=str(info.status), exit_code=info.exit_code, signal=info.signal,
        last_step=info.last_step,
        gpus=[{k: str(v) for k, v in g.items()} for g in info.gpus if isinstance(g, dict)],
        gpu_counters=str(info.gpu_counters),
        versions={str(k): str(v) for k, v in (info.versions or {}).items()},
        notes=[str(n) for n in info.notes],
    )


def run_timeline(run_dir: Path, max_points: int = MAX_POINTS) -> Timeline | None:
    """Counters and per-step collective time over the whole run, downsampled."""
    gpu_rows = [r for r in read_jsonl(gpu_samples_path(run_dir)) if "gpu" in r and "t" in r]
    step_rows = read_steps(run_dir)
    times = [r["t"] for r in gpu_rows] + [r.t for rows in step_rows.values() for r in rows]
    if not times:
        return None
    t0, t1 = float(min(times)), float(max(times))
    series: list[Series] = []
    for gpu in sorted({int(r["gpu"]) for r in gpu_rows}):
        rows = [r for r in gpu_rows if r["gpu"] == gpu]
        for key, name, unit in GPU_SERIES:
            pts = [(r["t"], r[key]) for r in rows if isinstance(r.get(key), (int, float))
                   and not isinstance(r.get(key), bool)]
            if not pts:
                continue
            t = np.array([p[0] for p in pts], dtype=float)
            v = np.array([p[1] for p in pts], dtype=float)
            if unit == "W":
                v = v / 1000.0  # NVML reports milliwatts
            xs, ys = _bucket(t, v, t0, max_points)
            series.append(Series(name=name, unit=unit, gpu=gpu, rank=None, t=xs, v=ys))
    traced: list[list[float]] = []
    for rank, steps in sorted(step_rows.items()):
        t = np.array([r.t for r in steps], dtype=float)
        dt = np.array([float(r.dt) for r in steps])
        xs, ys = _bucket(t, dt * 1e3, t0, max_points)
        series.append(Series(name="step time", unit="ms", gpu=None, rank=rank, t=xs, v=ys))
        coll = np.array([sum(float(c.get("seconds", 0.0)) for c in (r.collectives or {}).values())
                         for r in steps])
        if coll.any():
            xs, ys = _bucket(t, coll * 1e3, t0, max_points)
            series.append(Series(name="collective time per step", unit="ms", gpu=None, rank=rank,
                                 t=xs, v=ys))
    # traced spans: runs of rank 0's steps the bootstrap marked as traced
    span: list[float] | None = None
    for r in step_rows.get(0, []):
        if r.profiler == PROFILER_TRACED:
            start, end = round(r.t - r.dt - t0, 3), round(r.t - t0, 3)
            if span is None:
                span = [start, end]
                traced.append(span)
            else:
                span[1] = end
        else:
            span = None
    return Timeline(start=t0, duration=t1 - t0, series=series, traced=traced)
