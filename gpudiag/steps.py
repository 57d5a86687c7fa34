"""Step-window statistics of a run: the traced steps of the trace on disk, the untraced steps
around them, and what the machine did meanwhile.

Why apart from ``rundir``: ``rundir`` knows the run directory's layout and reads its files; this
module decides which steps are the reference for which window (the phase of the job, the load
beside it), a question the analyzers ask of rows ``rundir`` has read.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.rundir import (
    PROFILER_EXPORT,
    PROFILER_TRACED,
    PROFILER_WARMUP,
    STARTUP_STEPS,
    BootstrapMeta,
    HostSample,
    StepRow,
    read_bootstrap,
    read_host_cpu,
    read_steps,
)


@dataclass
class StepTimes:
    """Step-timer wall times of one rank, split by whether the profiler was on (seconds)."""

    rank: int
    traced: list[float]  # steps whose events are in a trace
    untraced: list[float]  # profiler off, after the first STARTUP_STEPS steps
    touched: int  # steps the profiler slowed but did not trace (warm-up, export)

    def median_untraced(self) -> float | None:
        return statistics.median(self.untraced) if self.untraced else None

    def median_traced(self) -> float | None:
        return statistics.median(self.traced) if self.traced else None


def step_times(run_dir: Path, rank: int = 0, last: int | None = None) -> StepTimes | None:
    """Traced and untraced step times of ``rank`` (None without a step file for it).

    The traced steps are those of the trace on disk (a re-tracing run replaces it; the meta
    file names its steps); with several windows, the untraced reference is the steps since
    the window before it, the same phase of the job. ``last`` keeps only the most recent N
    untraced steps: what a running job does now.
    """
    boot = read_bootstrap(run_dir)
    rows = read_steps(run_dir, boot, rank).get(rank)
    if rows is None:
        return None
    return split_step_rows(rank, rows, last, boot.get(rank))


# Untraced steps taken on each side of the traced window as its reference: near enough to be
# the same phase of the job (and the same load on the machine), many enough for a median.
REFERENCE_STEPS = 10


@dataclass
class WindowSteps:
    """The traced steps of the trace on disk and the untraced steps around them (seconds)."""

    rank: int
    traced_rows: list[StepRow]
    before_rows: list[StepRow]  # untraced steps just before the window's warm-up step, in order
    after_rows: list[StepRow]  # untraced steps just after its export step, in order
    # whether torch left CUPTI attached after this window (the steps after it then pay for it on
    # a GPU: ``collectors.torch_cupti``); None: not recorded (runs from before it was)
    cupti_attached: bool | None = None
    # cores the machine kept busy outside the job's process tree while each side ran (host
    # samples overlapping it; None: no sample): tells a machine that got busier from the observer
    outside_before: float | None = None
    outside_after: float | None = None
    # the untraced steps beyond ``after_rows`` up to the next window or the end: whether a pace
    # change after the window lasted (an observer's after-effect does) or passed
    later_rows: list[StepRow] = field(default_factory=list)
    # microseconds one page fault cost the rank's process (``BootstrapMeta.fault_us``, as the
    # job's file said it: read with care); None: not measured
    fault_us: object = None

    @property
    def traced(self) -> list[float]:
        return [r.dt for r in self.traced_rows]

    @property
    def before(self) -> list[float]:
        return [r.dt for r in self.before_rows]

    @property
    def after(self) -> list[float]:
        return [r.dt for r in self.after_rows]


def window_steps(run_dir: Path, reference: int = REFERENCE_STEPS,
                 boot: dict[int, BootstrapMeta] | None = None,
                 steps: dict[int, list[StepRow]] | None = None) -> list[WindowSteps]:
    """Per rank with a step file, the traced window and up to ``reference`` untraced steps on
    each side of it: after the job's first ``STARTUP_STEPS``, past the steps that drain its
    DataLoader's queue after the window (``prefetch_depth``), and never across another window
    (the steps beyond one belong to another phase of the job, or another trace). ``boot`` and
    ``steps``: the run's bootstrap files and step rows where the caller has read them already."""
    boot = read_bootstrap(run_dir) if boot is None else boot
    steps = read_steps(run_dir, boot) if steps is None else steps
    host = read_host_cpu(run_dir)
    out = []
    for rank, rows in sorted(steps.items()):
        rows = sorted(rows, key=lambda r: r.step)
        meta = boot.get(rank)
        in_trace = set(meta.traced_steps) if meta is not None and meta.traced_steps else None
        idx = [i for i, r in enumerate(rows) if r.profiler == PROFILER_TRACED
               and (in_trace is None or r.step in in_trace)]
        if not idx:
            out.append(WindowSteps(rank, [], [], []))
            continue
        first, last = idx[0], idx[-1]
        before: list[StepRow] = []
        j = first - 1
        while j >= 0 and rows[j].profiler == PROFILER_WARMUP:
            j -= 1
        while (j >= 0 and rows[j].profiler is None and rows[j].step > STARTUP_STEPS
               and len(before) < reference):
            before.append(rows[j])
            j -= 1
        after: list[StepRow] = []
        j = last + 1
        while j < len(rows) and rows[j].profiler == PROFILER_EXPORT:
            j += 1
        drain_end = j + prefetch_depth(meta)
        while j < min(len(rows), drain_end) and rows[j].profiler is None:
            j += 1
        while j < len(rows) and rows[j].profiler is None and len(after) < reference:
            after.append(rows[j])
            j += 1
        later: list[StepRow] = []
        while j < len(rows) and rows[j].profiler is None:
            later.append(rows[j])
            j += 1
        out.append(WindowSteps(rank, [rows[i] for i in range(first, last + 1)
                                      if rows[i].profiler == PROFILER_TRACED], before[::-1], after,
                               _cupti_attached(meta), _outside(host, before), _outside(host, after),
                               later, meta.fault_us if meta is not None else None))
    return out


# A job's file may claim any depth; beyond this many batches, no reference would be left after it.
MAX_PREFETCH = 64


def prefetch_depth(meta: BootstrapMeta | None) -> int:
    """The steps after a window that take the batches a DataLoader's workers queued while the
    traced steps ran slow: they get each batch at once, faster than the job's pace, and are no
    reference for it (a loader's job beside a load read its own pace 0.44-0.92 of its timer's,
    its after-steps those draining the queue). 0 without workers or a record of them."""
    n = meta.dataloader_prefetch if meta is not None else 0
    return min(n, MAX_PREFETCH) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _cupti_attached(meta: BootstrapMeta | None) -> bool | None:
    rec = meta.cupti_teardown if meta is not None else {}
    if "teardown" not in rec:
        return None
    return bool(rec.get("cuda")) and not rec["teardown"]


def _outside(host: list[HostSample], rows: list[StepRow]) -> float | None:
    """Mean cores busy outside the job over the host samples whose interval overlaps ``rows``."""
    if not rows:
        return None
    lo, hi = min(r.t - r.dt for r in rows), max(r.t for r in rows)
    vals = [h.machine_busy - h.cores for prev, h in zip(host, host[1:], strict=False)
            if h.machine_busy is not None and prev.t < hi and h.t > lo]
    return statistics.fmean(vals) if vals else None


def split_step_rows(rank: int, rows: list[StepRow], last: int | None = None,
                    meta: BootstrapMeta | None = None) -> StepTimes:
    in_trace = set(meta.traced_steps) if meta is not None and meta.traced_steps else None
    traced = [r.dt for r in rows if r.profiler == PROFILER_TRACED
              and (in_trace is None or r.step in in_trace)]
    touched = sum(1 for r in rows if r.profiler in (PROFILER_WARMUP, PROFILER_EXPORT))
    since = STARTUP_STEPS
    if meta is not None and len(meta.windows) > 1 and isinstance(meta.windows[-2].get("last"), int):
        since = max(since, meta.windows[-2]["last"])
    untraced = [r.dt for r in rows if r.profiler is None and r.step > since]
    if last is not None:
        untraced = untraced[-last:]
    return StepTimes(rank=rank, traced=traced, untraced=untraced, touched=touched)
