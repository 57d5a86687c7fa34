"""Collective communication: per collective type, time, exposure and bandwidth.

Bandwidths follow nccl-tests (doc/PERFORMANCE.md): algbw = S / t with S the collective's
data size, busbw = algbw x a factor that makes every collective comparable with the link's
peak: all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n (S = the whole gathered /
scattered buffer), all_to_all (n-1)/n, broadcast, reduce and send/recv 1.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.trace_loader import KCLASS_COMM, RankTrace
from gpudiag.devices import DTYPE_BYTES, DevicePeak
from gpudiag.diagnosis import CollectiveStats

_CANON = [
    (re.compile(r"all_?reduce", re.I), "all_reduce"),
    (re.compile(r"all_?gather|allgather", re.I), "all_gather"),
    (re.compile(r"reduce_?scatter", re.I), "reduce_scatter"),
    (re.compile(r"all_?to_?all", re.I), "all_to_all"),
    (re.compile(r"broadcast", re.I), "broadcast"),
    (re.compile(r"sendrecv|send|recv", re.I), "send_recv"),
    (re.compile(r"barrier", re.I), "barrier"),
    (re.compile(r"reduce", re.I), "reduce"),
    (re.compile(r"gather", re.I), "gather"),
    (re.compile(r"scatter", re.I), "scatter"),
]

_BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


# one collective type's sums over a rank's calls (``_new_acc`` names them), summed across ranks
Acc = dict[str, float]


def _one(_n: int) -> float:
    """The bus factor of a collective whose traffic is its bytes (a broadcast, a send)."""
    return 1.0


def canonical_collective(name: str) -> str:
    for rx, canon in _CANON:
        if rx.search(name):
            return canon
    return "other"


def _bytes(kind: str, info: dict[str, Any]) -> float | None:
    size = DTYPE_BYTES.get(str(info.get("dtype") or "").lower())
    if size is None:
        return None
    i, o = info.get("in_nelems"), info.get("out_nelems")
    if kind in ("all_gather", "reduce_scatter"):
        n = max(x for x in (i, o, 0) if x is not None)
    else:
        n = i if i is not None else o
    return None if not n else float(n) * size


def _new_acc() -> Acc:
    return {"count": 0, "time": 0.0, "exposed": 0.0, "bytes": 0.0, "bytes_time": 0.0,
            "busbw_num": 0.0, "time_in_steps": 0.0, "exposed_in_steps": 0.0}


def collective_acc(rt: RankTrace, work: iv.Intervals, lo: np.ndarray, hi: np.ndarray
                   ) -> dict[str, Acc]:
    """Per collective type sums for one rank (merged across ranks by ``finish``).

    ``work`` is what the breakdown counts as the device's work (compute kernels, or the CPU's
    operator blocks and DataLoader waits): a collective is exposed only where none of it runs,
    whichever thread or stream launched it, blocking or not, so the table and the breakdown
    use one definition. ``lo``/``hi`` are the step windows: the per-step figures count only
    what lies inside them, as the breakdown does.
    """
    acc: dict[str, Acc] = defaultdict(_new_acc)
    by_ts = {c["ts"]: c for c in rt.collectives}
    if rt.has_gpu:
        mask = rt.gpu_class == KCLASS_COMM
        ts = rt.gpu_ts[mask]
        dur = rt.gpu_dur[mask]
        names = [rt.names[i] for i in rt.gpu_name[mask].tolist()]
    else:
        ts = np.array([c["ts"] for c in rt.collectives], dtype=np.float64)
        dur = np.array([c["dur"] for c in rt.collectives], dtype=np.float64)
        names = [c["name"] for c in rt.collectives]
    kinds = [canonical_collective((by_ts.get(t) or {}).get("name") or n)
             for n, t in zip(names, ts.tolist(), strict=True)]
    hidden = iv.measure_in(work, ts, ts + dur) if ts.size else np.empty(0)
    for kind, t, d, h in zip(kinds, ts.tolist(), dur.tolist(), hidden.tolist(),
                                   strict=True):
        info = by_ts.get(t, {})
        a = acc[kind]
        a["count"] += 1
        a["time"] += d
        a["exposed"] += max(d - h, 0.0)
        b = _bytes(kind, info) if info else None
        if b is None or d <= 0:
            continue
        n = info.get("group_size") or rt.world_size or 1
        a["bytes"] += b
        a["bytes_time"] += d
        a["busbw_num"] += b * _BUS_FACTOR.get(kind, _one)(max(n, 1))
    arr = np.array(kinds, dtype=object)
    for kind in set(kinds):
        sel = arr == kind
        mine = iv.merge(ts[sel], (ts + dur)[sel])
        acc[kind]["time_in_steps"] += float(iv.measure_in(mine, lo, hi).sum())
        acc[kind]["exposed_in_steps"] += float(iv.measure_in(iv.subtract(mine, work), lo, hi).sum())
    return dict(acc)


def per_step(stats: list[CollectiveStats], acc_parts: list[dict[str, Acc]], steps: int,
             comm_total: float, comm_exposed: float) -> list[CollectiveStats]:
    """Each type's share of the breakdown's communication, per step and rank.

    The shares come from the time each type took inside the step windows (and the part of it
    no work hid); the figures are those shares of the breakdown's own ``comm_total`` and
    ``comm_exposed`` (of the verdict's view), so the table adds up to the breakdown exactly,
    whatever the view. ``steps`` is the number of (rank, step) windows summed over.
    """
    tot: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for part in acc_parts:
        for kind, a in part.items():
            tot[kind][0] += a.get("time_in_steps", 0.0)
            tot[kind][1] += a.get("exposed_in_steps", 0.0)
    sum_t = sum(v[0] for v in tot.values())
    sum_x = sum(v[1] for v in tot.values())
    out = []
    for c in stats:
        t, x = tot.get(c.collective, (0.0, 0.0))
        out.append(replace(c, time_per_step_us=comm_total * t / sum_t if sum_t > 0 else
                           (c.total_time_us / steps if steps else None),
                           exposed_per_step_us=comm_exposed * x / sum_x if sum_x > 0 else 0.0))
    return out


def finish_collectives(parts: list[dict[str, Acc]], device: DevicePeak | None
                       ) -> list[CollectiveStats]:
    acc: dict[str, Acc] = defaultdict(_new_acc)
    for part in parts:
        for kind, a in part.items():
            mine = acc[kind]
            for k, v in a.items():
                mine[k] += v
    out = []
    link = device.interconnect / 1e9 if device is not None and device.interconnect else None
    for kind, a in sorted(acc.items(), key=lambda kv: -kv[1]["time"]):
        algbw = busbw = None
        if a["bytes_time"] > 0:
            algbw = a["bytes"] / (a["bytes_time"] * 1e-6) / 1e9
            busbw = a["busbw_num"] / (a["bytes_time"] * 1e-6) / 1e9
        out.append(CollectiveStats(
            collective=kind, count=int(a["count"]), total_time_us=a["time"], exposed_time_us=a["exposed"],
            bytes=a["bytes"] if a["bytes"] > 0 else None, algbw_gbps=algbw, busbw_gbps=busbw,
            link_peak_gbps=link,
        ))
    return out
