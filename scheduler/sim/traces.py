"""Job traces the simulator replays: Philly, the Tiresias 60-job trace, and Slurm ``sacct`` exports.

The format is recognised from the header; an unusable file is a one-line ``BadInput``, an unusable
row is dropped and counted by reason. Keys: sacct ``user/JobName``, Tiresias ``model_name/num_gpu``,
Philly a *sweep* (one team and GPU count, submissions at most ``SWEEP_GAP_S`` apart).
docs/scheduler-modelling.md, "Keys".
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpudiag.durations import slurm_duration
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Tier

SWEEP_GAP_S = 600.0

PHILLY_COLS = ("timestamp", "duration", "num_gpus", "cluster")
TIRESIAS_COLS = ("job_id", "num_gpu", "submit_time", "duration")
SACCT_COLS = ("JobID", "Submit", "Elapsed")


@dataclass(slots=True)
class TraceJob:
    id: int
    submit: float
    duration: float
    gpus: int
    team: str
    key: str
    user: str = ""
    tier: Tier = Tier.RESERVED
    estimate: float | None = None   # a time limit, when the trace has one
    name: str = ""                  # the trace's own job id


@dataclass
class Trace:
    fmt: str
    jobs: list[TraceJob]
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1


def read_trace(path: str | Path) -> Trace:
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as f:
            head = f.readline()
            f.seek(0)
            delim = "|" if head.count("|") > head.count(",") else ","
            rows = list(csv.DictReader(f, delimiter=delim))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise BadInput(f"cannot read trace {p}: {getattr(e, 'strerror', None) or e}") from None
    cols = set(rows[0]) if rows else {c.strip() for c in head.strip().split(delim)}
    if delim == "|" or "JobID" in cols:
        trace = _sacct(rows, cols)
    elif "timestamp" in cols or "cluster" in cols:
        trace = _philly(rows, cols)
    elif "job_id" in cols or "num_gpu" in cols:
        trace = _tiresias(rows, cols)
    else:
        raise BadInput(f"{p}: unknown trace format (header: {head.strip()[:80]}); expected Philly "
                       f"({','.join(PHILLY_COLS)}), Tiresias ({','.join(TIRESIAS_COLS)}) or "
                       "sacct --parsable2")
    if not trace.jobs:
        raise BadInput(f"{p}: no usable jobs ({_rejections(trace.rejected) or 'empty'})")
    trace.jobs.sort(key=lambda j: (j.submit, j.id))
    t0 = trace.jobs[0].submit
    for j in trace.jobs:
        j.submit -= t0
    return trace


def _epoch(s: str) -> float:
    """ISO time in seconds; a time without zone is read as UTC (a local zone's DST would shift jobs)."""
    t = datetime.fromisoformat(s.strip())
    return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()


def _rejections(rej: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(rej.items()))


def _need(cols: set[str], need: tuple[str, ...], fmt: str) -> None:
    missing = [c for c in need if c not in cols]
    if missing:
        raise BadInput(f"{fmt} trace lacks column(s) {', '.join(missing)}")


def _num(s: str | None) -> float:
    v = float(s) if s not in (None, "") else math.nan
    if not math.isfinite(v):
        raise ValueError(s)
    return v


def _check(trace: Trace, dur: float, gpus: float) -> bool:
    if dur <= 0:
        trace.reject("non-positive duration")
        return False
    if gpus < 1 or gpus != int(gpus):
        trace.reject("no GPUs" if gpus < 1 else "fractional GPUs")
        return False
    return True


def _philly(rows: list[dict], cols: set[str]) -> Trace:
    _need(cols, PHILLY_COLS, "Philly")
    trace = Trace("philly", [])
    for i, r in enumerate(rows):
        try:
            t = _epoch(r["timestamp"])
            dur, g = _num(r["duration"]), _num(r["num_gpus"])
        except (ValueError, AttributeError):
            trace.reject("unparsable row")
            continue
        if _check(trace, dur, g):
            vc = (r["cluster"] or "").strip() or "unknown"
            trace.jobs.append(TraceJob(i, t, dur, int(g), vc, "", name=str(i)))
    last: dict[tuple[str, int], tuple[float, str]] = {}
    for j in sorted(trace.jobs, key=lambda j: (j.submit, j.id)):
        prev = last.get((j.team, j.gpus))
        same_sweep = prev is not None and j.submit - prev[0] <= SWEEP_GAP_S
        key = j.key = prev[1] if same_sweep else f"{j.team}/{j.gpus}g/{j.id}"
        last[(j.team, j.gpus)] = (j.submit, key)
    return trace


def _tiresias(rows: list[dict], cols: set[str]) -> Trace:
    _need(cols, TIRESIAS_COLS, "Tiresias")
    trace = Trace("tiresias", [])
    for i, r in enumerate(rows):
        try:
            jid, t = int(_num(r["job_id"])), _num(r["submit_time"])
            dur, g = _num(r["duration"]), _num(r["num_gpu"])
        except (ValueError, AttributeError):
            trace.reject("unparsable row")
            continue
        if _check(trace, dur, g):
            model = (r.get("model_name") or "").strip() or "unknown"
            trace.jobs.append(TraceJob(jid if jid >= 0 else i, t, dur, int(g), "default",
                                       f"{model}/{int(g)}g", name=str(jid)))
    return trace


_GPU_TRES = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")
_GPU_GRES = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


def _sacct_tier(qos: str) -> Tier:
    q = qos.lower()
    if any(w in q for w in ("spot", "preempt", "scav", "low")):
        return Tier.SPOT
    if any(w in q for w in ("demand", "high", "urgent")):
        return Tier.ON_DEMAND
    return Tier.RESERVED


def _sacct(rows: list[dict], cols: set[str]) -> Trace:
    _need(cols, SACCT_COLS, "sacct")
    gpu_cols = [c for c in ("AllocTRES", "ReqTRES", "AllocGRES", "ReqGRES") if c in cols]
    if not gpu_cols:
        raise BadInput("sacct trace lacks a GPU column (AllocTRES, ReqTRES, AllocGRES or ReqGRES)")
    trace = Trace("sacct", [])
    for i, r in enumerate(rows):
        jid = (r.get("JobID") or "").strip()
        if "." in jid:        # job steps (123.batch, 123.0) repeat their job
            continue
        try:
            t = _epoch(r["Submit"])
            dur = slurm_duration(r["Elapsed"])
            limit = r.get("Timelimit", "").strip()
            est = slurm_duration(limit) if limit and limit[0].isdigit() else None
        except (ValueError, AttributeError):
            trace.reject("unparsable row")
            continue
        g = 0
        for c in gpu_cols:
            m = (_GPU_TRES if "TRES" in c else _GPU_GRES).search(r.get(c) or "")
            if m:
                g = int(m.group(1))
                break
        if not _check(trace, dur, g):
            continue
        user = (r.get("User") or "").strip()
        team = (r.get("Account") or "").strip() or user or "default"
        name = (r.get("JobName") or "").strip()
        trace.jobs.append(TraceJob(i, t, dur, g, team, f"{user}/{name}", user,
                                   _sacct_tier(r.get("QOS") or ""), est, jid))
    return trace
