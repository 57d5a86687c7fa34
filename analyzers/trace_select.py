"""Part of a rank's trace: the steps ``--steps FIRST-LAST`` asks for, as if only they were traced.

Every analysis then reads the narrower columns unchanged, so the breakdown, roofline, top
kernels and collectives all describe the same steps. A step's window runs from its start to
the next step's start (``breakdown.step_windows``); GPU work is kept when it overlaps a kept
window (it runs behind the host). On a GPU trace every CPU operator is kept: operators only
name and cost the kernels (a kernel early in a step was often launched in the step before),
and what is summed is the kernels. On a CPU-only trace the operators are the work: those
starting in a kept window are kept.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpudiag.analyzers.trace_columns import RankTrace


def select_steps(rt: RankTrace, first: int, last: int) -> RankTrace:
    """The columns of ProfilerSteps ``first``..``last``; a warning when none was traced."""
    steps = sorted(rt.steps, key=lambda s: s[1])
    keep = [i for i, s in enumerate(steps) if first <= s[0] <= last]
    if not keep:
        traced = f"{min(s[0] for s in steps)}-{max(s[0] for s in steps)}" if steps else "none"
        empty = _mask(rt, np.zeros(rt.gpu_ts.size, bool), np.zeros(rt.cpu_ts.size, bool),
                      lo=np.empty(0), hi=np.empty(0))
        empty.steps = []
        empty.warnings = [*rt.warnings, f"rank {rt.rank}: no step in {first}-{last} was traced "
                          f"(traced steps: {traced})"]
        return empty
    lo = np.array([steps[i][1] for i in keep])
    hi = np.array([steps[i + 1][1] if i + 1 < len(steps) else steps[i][2] for i in keep])
    gpu_end = rt.gpu_ts + rt.gpu_dur
    gpu = _overlaps(rt.gpu_ts, gpu_end, lo, hi)
    cpu = np.ones(rt.cpu_ts.size, bool) if rt.has_gpu else _starts_in(rt.cpu_ts, lo, hi)
    out = _mask(rt, gpu, cpu, lo, hi)
    out.steps = [(s, a, b) for (s, a, _), b in zip((steps[i] for i in keep), hi.tolist(), strict=True)]
    return out


def _starts_in(ts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    k = np.searchsorted(lo, ts, side="right") - 1
    return (k >= 0) & (ts < hi[np.clip(k, 0, None)]) if lo.size else np.zeros(ts.size, bool)


def _overlaps(start: np.ndarray, end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Intervals that overlap any of the sorted, disjoint windows."""
    if lo.size == 0:
        return np.zeros(start.size, bool)
    # the first window ending after the interval starts must begin before it ends
    k = np.searchsorted(hi, start, side="right")
    ok = k < lo.size
    return ok & (lo[np.clip(k, 0, lo.size - 1)] < end)


def _mask(rt: RankTrace, gpu: np.ndarray, cpu: np.ndarray, lo: np.ndarray, hi: np.ndarray
          ) -> RankTrace:
    changes = {f.name: getattr(rt, f.name)[gpu] for f in dataclasses.fields(rt)
               if f.name.startswith("gpu_")}
    changes.update({f.name: getattr(rt, f.name)[cpu] for f in dataclasses.fields(rt)
                    if f.name.startswith("cpu_") and f.name != "cpu_comm_intervals"})
    for name in ("dataloader", "cpu_comm_intervals"):
        iv = getattr(rt, name)
        changes[name] = iv[_overlaps(iv[:, 0], iv[:, 1], lo, hi)]
    ts = np.array([c["ts"] for c in rt.collectives], dtype=np.float64)
    ends = ts + np.array([c["dur"] for c in rt.collectives], dtype=np.float64)
    keep = _overlaps(ts, ends, lo, hi).tolist()
    changes["collectives"] = [c for c, k in zip(rt.collectives, keep, strict=True) if k]
    changes["kept_gpu_events"] = int(gpu.sum())
    # nesting as in the whole trace (an op's parent may start before the first kept step)
    changes["_depth"] = None if rt.has_gpu else rt.cpu_depth[cpu]
    return dataclasses.replace(rt, **changes)
