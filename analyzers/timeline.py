"""Whole-run context from a run directory: what ran, and counters over the whole run.

The traces cover a few steps; the samples cover the whole run. Reports show both, so the
counter series are reduced here (analyzers compute, reports only draw) to a bounded number
of points per series, whatever the run's length or GPU count: a 10-hour, 8-GPU run at
100 ms is 2.9 million rows, which must still make a small report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpudiag.diagnosis import RunSummary, Series, Timeline
from gpudiag.rundir import read_jsonl

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


def _bucket(t: np.ndarray, v: np.ndarray, t0: float, n: int) -> tuple[list, list]:
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
    """run.json as the Diagnosis carries it (None when the folder is not a run directory)."""
    try:
        data = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") != "gpudiag-run":
        return None
    return RunSummary(
        command=[str(c) for c in data.get("command", [])], host=str(data.get("host", "")),
        start=float(data.get("start") or 0), end=data.get("end"), status=str(data.get("status")),
        exit_code=data.get("exit_code"), signal=data.get("signal"), last_step=data.get("last_step"),
        gpus=[{k: str(v) for k, v in g.items()} for g in data.get("gpus", []) if isinstance(g, dict)],
        gpu_counters=str(data.get("gpu_counters", "")),
        versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
        notes=[str(n) for n in data.get("notes", [])],
    )


def run_timeline(run_dir: Path, max_points: int = MAX_POINTS) -> Timeline | None:
    """Counters and per-step collective time over the whole run, downsampled."""
    gpu_rows = [r for r in read_jsonl(run_dir / "samples" / "gpu.jsonl") if "gpu" in r and "t" in r]
    step_rows: dict[int, list[dict[str, Any]]] = {}
    for f in sorted((run_dir / "samples").glob("steps-rank-*.jsonl")):
        try:
            rank = int(f.stem.rsplit("-", 1)[1])
        except ValueError:
            continue
        step_rows[rank] = [r for r in read_jsonl(f) if "t" in r and "step" in r]
    times = [r["t"] for r in gpu_rows] + [r["t"] for rows in step_rows.values() for r in rows]
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
    for rank, rows in sorted(step_rows.items()):
        t = np.array([r["t"] for r in rows], dtype=float)
        dt = np.array([float(r.get("dt", 0.0)) for r in rows])
        xs, ys = _bucket(t, dt * 1e3, t0, max_points)
        series.append(Series(name="step time", unit="ms", gpu=None, rank=rank, t=xs, v=ys))
        coll = np.array([sum(float(c.get("seconds", 0.0)) for c in (r.get("collectives") or {}).values())
                         for r in rows])
        if coll.any():
            xs, ys = _bucket(t, coll * 1e3, t0, max_points)
            series.append(Series(name="collective time per step", unit="ms", gpu=None, rank=rank,
                                 t=xs, v=ys))
    meta = _jsonl_one(run_dir / "samples" / "bootstrap-rank-0.json")
    if meta and step_rows.get(0):
        skip, steps = int(meta.get("skip", 0)), int(meta.get("steps", 0))
        window = [r for r in step_rows[0] if skip + 2 <= r["step"] < skip + 2 + steps]
        if window:
            traced.append([round(window[0]["t"] - window[0].get("dt", 0) - t0, 3),
                           round(window[-1]["t"] - t0, 3)])
    return Timeline(start=t0, duration=t1 - t0, series=series, traced=traced)


def _jsonl_one(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
