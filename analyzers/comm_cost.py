"""What communication costs a CPU job, not only the time no operator hides it.

On a GPU, NCCL's kernels run beside the compute and what the step waits for is the exposed
time. On a CPU, gloo runs the collectives on threads of its own (``pt_gloo_runloop``,
``gloo_tcp_loop``), on the cores the ranks compute on, and DDP's reducer copies every gradient
into its bucket and back on the training thread. So a collective "hidden" behind backward still
costs: its threads take cores the compute needed, and the copies are work the step would not do
without it. Seen on a 2-core AMD EPYC: DDP over gloo with 100 MB of gradients read memory-bound
(0.85) with communication 25-29% exposed, while the same steps under ``no_sync()`` ran 126-154
ms against 348-373 ms: the collectives cost 59-62% of the step (issue 37).

Communication's cost is the sum of three measured parts, each in the view's step:
- its exposed time (the breakdown's ``comm_exposed``);
- the training thread's work for it (``TimeBreakdown.comm_work``: the reducer's spans, and its
  hooks inside AccumulateGrad, from the trace; ``breakdown.comm_work_spans``);
- the compute time the collectives took from the compute (``comm_contention``), for cores and
  memory bandwidth alike: the training thread's operators that ran beside a collective, against
  the calls of their class that ran while none was in flight (``slowed_beside``, from the trace);
  where too few calls compare, the CPU its threads ran over the step (the step timer's
  ``comm_cpu_s``, read from their schedstat), the part of it that ran while compute ran (the
  hidden share of the collectives' time), where the machine leaves fewer cores than the ranks'
  compute threads and those threads need together (host sampler, bootstrap).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.breakdown import CpuWork, comm_work_spans, cpu_comm_ops, op_kinds, step_windows
from gpudiag.analyzers.trace_loader import RankTrace
from gpudiag.diagnosis import JobTraits, TimeBreakdown
from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps

# An operator class (name and input shapes) gives the pace the calls that ran beside a collective
# are compared with where at least this many of its calls ran while none was in flight.
SLOWED_MIN_ALONE = 2


@dataclass(frozen=True)
class CommCpu:
    """CPU microseconds per step the collectives' own threads ran, per view (mean over ranks)."""

    traced_us: float | None  # mean over the traced steps
    untraced_us: float | None  # median over the untraced steps around the window


def comm_cpu(windows: list[WindowSteps] | None) -> CommCpu | None:
    """The step timer's ``comm_cpu_s`` over the traced steps and the reference around them;
    None where no step recorded it (no gloo thread, or a run from before it was recorded)."""
    if not windows:
        return None

    def per_rank(rows: list[StepRow], stat: Callable[[list[float]], float]) -> float | None:
        xs = [r.comm_cpu_s for r in rows if r.comm_cpu_s is not None]
        return stat(xs) * 1e6 if xs else None

    traced = [x for w in windows if (x := per_rank(w.traced_rows, statistics.fmean)) is not None]
    untraced = [x for w in windows
                if (x := per_rank(w.before_rows + w.after_rows, statistics.median)) is not None]
    if not traced and not untraced:
        return None
    return CommCpu(statistics.fmean(traced) if traced else None,
                   statistics.fmean(untraced) if untraced else None)


def slowed_beside(rt: RankTrace, cw: CpuWork | None) -> tuple[float, int]:
    """(us per step, calls compared): how much longer the training thread's operators took while
    a collective was in flight than the calls of their class (name and input shapes) that ran
    while none was, summed over the first kind (their class median alone as the pace): what the
    collectives' threads took from the compute, for cores and for memory bandwidth alike, in
    the traced steps. (0, 0) on a GPU, without collectives, or without a class to compare."""
    lo, hi, _ = step_windows(rt)
    if cw is None or lo.size == 0 or rt.cpu_comm_intervals.size == 0:
        return 0.0, 0
    comm = iv.merge(rt.cpu_comm_intervals[:, 0], rt.cpu_comm_intervals[:, 1])
    top = (iv.contains((lo, hi), rt.cpu_ts) & rt.cpu_is_op & (rt.cpu_depth == 0) & ~cpu_comm_ops(rt)
           & ~iv.contains(comm_work_spans(rt), rt.cpu_ts))
    idx = np.flatnonzero(top)
    if idx.size == 0:
        return 0.0, 0
    ts, dur = rt.cpu_ts[idx], cw.dur[idx]
    beside = iv.measure_in(comm, ts, ts + dur) > 0.5 * dur  # mostly inside a collective's span
    _, cls = np.unique(op_kinds(rt)[idx], return_inverse=True)
    alone_n = np.bincount(cls[~beside], minlength=cls.max() + 1)
    pace = np.full(alone_n.size, np.nan)
    for c in np.flatnonzero(alone_n >= SLOWED_MIN_ALONE).tolist():
        pace[c] = float(np.median(dur[~beside & (cls == c)]))
    ok = beside & ~np.isnan(pace[cls])
    if not ok.any():
        return 0.0, 0
    return max(0.0, float((dur[ok] - pace[cls[ok]]).sum())) / lo.size, int(ok.sum())


_BACKWARD = "autograd::engine::evaluate_function: "


def backward_time(rt: RankTrace, lo: np.ndarray, hi: np.ndarray) -> float:
    """Per step, the time autograd evaluated nodes (the backward), less the training thread's
    work for the collectives inside them (DDP's hooks): what gradients' collectives can hide
    behind (``whatif.communication_overlapped``)."""
    if lo.size == 0:
        return 0.0
    node = np.array([n.startswith(_BACKWARD) for n in rt.names] or [False], dtype=bool)
    mask = node[rt.cpu_name] if rt.cpu_name.size else np.zeros(0, dtype=bool)
    spans = iv.subtract(iv.merge(rt.cpu_ts[mask], (rt.cpu_ts + rt.cpu_dur)[mask]), comm_work_spans(rt))
    return float(iv.measure_in(spans, lo, hi).sum()) / lo.size


def contention(b: TimeBreakdown, cpu_us: float | None, traits: JobTraits | None, ranks: int) -> float:
    """Compute time per step the collectives' threads took, in ``b``'s step (0 where nothing
    says they did). Their CPU over the step counts where it ran beside compute (the share of the
    collectives' time no exposed wait covers: while the training thread waits, its core is free
    for them) and where the cores were short: the machine's cores less the other work's and the
    ranks' compute threads', against the cores the collectives' threads kept busy while they
    ran. At most the compute the trace shows, less the training thread's own work for them."""
    if not cpu_us or b.comm_total <= 0 or b.compute <= 0 or traits is None or not traits.cpus:
        return 0.0
    threads = max(1, min(traits.intra_op_threads or 1, traits.cpus))
    free = traits.cpus - (traits.other_cores or 0.0) - max(ranks, 1) * threads
    busy = cpu_us / b.comm_total * max(ranks, 1)  # cores the ranks' collectives' threads used
    short = 1.0 if free <= 0 else max(0.0, 1.0 - free / busy)
    hidden = max(0.0, b.comm_total - b.comm_exposed) / b.comm_total
    return min(cpu_us * hidden * short, max(0.0, b.compute - b.comm_work))


# Calls per rank compared beside and apart from the collectives that make the trace's measure of
# the slowdown stand (``slowed_beside``); fewer, and the threads' CPU time (``contention``) is used.
SLOWED_MIN_CALLS = 5


def with_contention(b: TimeBreakdown, cpu_us: float | None, traits: JobTraits | None, ranks: int,
                    slowed_us: float = 0.0, slowed_calls: float = 0.0,
                    traced: TimeBreakdown | None = None) -> TimeBreakdown:
    """``b`` with ``comm_contention`` set: the trace's measure of the compute slowed beside the
    collectives (``slowed_beside``, per traced step, brought to ``b``'s pace by the compute's
    ratio to the ``traced`` breakdown's) where enough calls were compared; else the threads' CPU
    time where the cores were short (``contention``). At most the compute less the training
    thread's own work for the collectives."""
    if b.comm_total <= 0:
        return b
    if slowed_calls >= SLOWED_MIN_CALLS:
        k = b.compute / traced.compute if traced is not None and traced.compute > 0 else 1.0
        c = min(slowed_us * k, max(0.0, b.compute - b.comm_work))
    else:
        c = contention(b, cpu_us, traits, ranks)
    return replace(b, comm_contention=c) if c > 0 else b


def cost(b: TimeBreakdown) -> float:
    """Communication's cost per step in ``b``: exposed (by the wall clock: with the part other
    processes took of it, ``comm_stalled``), the training thread's work for it, and the compute
    its threads took (the ``classify.shares`` communication share, times the step). Why the wall
    clock for the exposed wait too: a 2-rank gloo job whose all-reduce was 92% of its step read
    host-bound beside a test suite, its exposed wait taken at its own pace (11.4 ms) over the
    wall step (31.2 ms), 36%, and its 1 ms of Python scaled up to the rest."""
    return b.comm_exposed_wall + min(b.compute, b.comm_work + b.comm_contention)
