"""Per-step time breakdown of one rank: where did each step's wall time go?

Definitions (GPU traces), all as interval unions so overlapping streams are not counted
twice:
  gpu_busy       union of kernels, memcpys and memsets
  compute        union of computation kernels (HTA's class: not NCCL, not Memcpy/Memset)
  comm_exposed   communication kernels while no computation kernel runs on any stream
  memcpy_exposed memory activity while neither compute nor communication runs
  idle           step time - gpu_busy, split into
  input_wait     idle while the host is inside a DataLoader ``__next__``
  host_overhead  the rest of idle: launch gaps, Python, synchronisation

On a CPU-only trace the CPU is the device: compute is operator time, communication is
gloo / ``record_param_comms`` time, and input wait is DataLoader time. Operators shorter
than ``TINY_CPU_OP_US`` are counted as host overhead: their cost is dispatch, not work; so
are operators far below both roofs (``roofline.below_both_roofs``: 4-row LayerNorms taking
30 us for 8 KB), whatever their length.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.roofline import (
    BOUND_COMPUTE,
    BOUND_MEMORY,
    WorkBounds,
    below_both_roofs,
    is_cpu_work,
)
from gpudiag.analyzers.stats import class_quantile
from gpudiag.analyzers.trace_columns import CPU_COMM_RE
from gpudiag.analyzers.trace_loader import KCLASS_COMM, KCLASS_COMPUTE, RankTrace
from gpudiag.devices import DevicePeak
from gpudiag.diagnosis import GpuSpanBreakdown, StepBreakdown, TimeBreakdown

# An eager PyTorch CPU op costs ~5-20 us of dispatcher/Python overhead before any math
# (PyTorch performance tuning guide; the profiler adds its own few us per op). An op
# shorter than this is dominated by that overhead: it is host time, not device work.
TINY_CPU_OP_US = 20.0


def step_windows(rt: RankTrace) -> tuple[np.ndarray, np.ndarray, list[int | None]]:
    """[start, end) of each step on the host clock: from its start to the next step's start.

    The GPU runs behind the host (a step's kernels often execute during the next step), so
    windows follow the host's step boundaries: in steady state each window then holds one
    step's worth of GPU work, and the step time is the training loop's period. The last
    step ends where its annotation ends; its GPU work that spills past the trace is not
    counted, as the spill into each window from the step before it is.
    Without ``ProfilerStep`` annotations the whole trace is one window.
    """
    if rt.steps:
        starts = np.array([s[1] for s in rt.steps])
        ends = np.array([s[2] for s in rt.steps])
        ends[:-1] = starts[1:]  # the gap before the next step (logging, eval) belongs to this one
        return starts, ends, [s[0] for s in rt.steps]
    lo, hi = [], []
    if rt.cpu_ts.size:
        lo.append(rt.cpu_ts.min())
        hi.append((rt.cpu_ts + rt.cpu_dur).max())
    if rt.gpu_ts.size:
        lo.append(rt.gpu_ts.min())
        hi.append((rt.gpu_ts + rt.gpu_dur).max())
    if not lo:
        return np.empty(0), np.empty(0), []
    return np.array([min(lo)]), np.array([max(hi)]), [None]


def _split(values: np.ndarray, starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum of values whose start lies in each window."""
    out = np.zeros(lo.size)
    if values.size == 0 or lo.size == 0:
        return out
    k = np.searchsorted(lo, starts, side="right") - 1
    ok = (k >= 0) & (starts < hi[np.clip(k, 0, None)])
    np.add.at(out, k[ok], values[ok])
    return out


@dataclass
class _StepParts:
    """Per step (one array element a step): the device's measures a breakdown is made of."""

    busy: np.ndarray
    compute: np.ndarray
    comm_total: np.ndarray
    comm_exposed: np.ndarray
    memcpy_exposed: np.ndarray
    input_wait: np.ndarray
    comm_work: np.ndarray  # the training thread's own work for the collectives, inside compute
    compute_bound: np.ndarray  # the known compute-bound work
    memory_bound: np.ndarray  # the known memory-bound work
    stalled: np.ndarray  # the OS running other work in the host gaps


def rank_breakdown(rt: RankTrace, wb: WorkBounds, cw: CpuWork | None) -> list[StepBreakdown]:
    """``cw``: the rank's ``cpu_work`` (None where a GPU is the device)."""
    lo, hi, numbers = step_windows(rt)
    if lo.size == 0:
        return []
    dl = cw.waits if cw is not None else iv.merge(rt.dataloader[:, 0], rt.dataloader[:, 1])
    if rt.has_gpu:
        parts = _gpu_parts(rt, wb, dl, lo, hi)
    else:
        assert cw is not None, "a CPU rank's breakdown needs its cpu_work"
        parts = _cpu_parts(rt, wb, cw, dl, lo, hi)
    return _steps(parts, lo, hi, numbers, _model_flops(rt, wb, lo, hi))


def _gpu_parts(rt: RankTrace, wb: WorkBounds, dl: iv.Intervals, lo: np.ndarray, hi: np.ndarray
               ) -> _StepParts:
    """A GPU's steps: kernels by class, communication exposed where no compute runs beside it."""
    end = rt.gpu_ts + rt.gpu_dur
    cls = rt.gpu_class
    allg = iv.merge(rt.gpu_ts, end)
    comp = iv.merge(rt.gpu_ts[cls == KCLASS_COMPUTE], end[cls == KCLASS_COMPUTE])
    comm = iv.merge(rt.gpu_ts[cls == KCLASS_COMM], end[cls == KCLASS_COMM])
    other = iv.merge(rt.gpu_ts[cls > KCLASS_COMM], end[cls > KCLASS_COMM])
    work = cls == KCLASS_COMPUTE
    return _StepParts(
        busy=iv.measure_in(allg, lo, hi), compute=iv.measure_in(comp, lo, hi),
        comm_total=iv.measure_in(comm, lo, hi),
        comm_exposed=iv.measure_in(iv.subtract(comm, comp), lo, hi),
        memcpy_exposed=iv.measure_in(iv.subtract(other, iv.union(comp, comm)), lo, hi),
        input_wait=iv.measure_in(iv.subtract(dl, allg), lo, hi), comm_work=np.zeros(lo.size),
        compute_bound=_split(rt.gpu_dur[work & (wb.bound == BOUND_COMPUTE)],
                             rt.gpu_ts[work & (wb.bound == BOUND_COMPUTE)], lo, hi),
        memory_bound=_split(rt.gpu_dur[work & (wb.bound == BOUND_MEMORY)],
                            rt.gpu_ts[work & (wb.bound == BOUND_MEMORY)], lo, hi),
        stalled=np.zeros(lo.size))


def _cpu_parts(rt: RankTrace, wb: WorkBounds, cw: CpuWork, dl: iv.Intervals, lo: np.ndarray,
               hi: np.ndarray) -> _StepParts:
    """A CPU's steps. The collective's own calls (c10d::, record_param_comms, gloo:) are
    communication, not compute; everything else the threads run is. Gloo runs a collective on
    its own threads (DDP's reducer launches one per bucket during backward): it is exposed only
    where no compute runs beside it, as on a GPU, and hidden where backward overlaps it.
    Operators below both roofs are per-call cost: host overhead, out of compute (``cw.work``)."""
    real = cw.blocks
    comm = iv.merge(rt.cpu_comm_intervals[:, 0], rt.cpu_comm_intervals[:, 1])
    comm_x = iv.subtract(comm, iv.union(real, dl))
    compute = iv.measure_in(cw.work, lo, hi)
    comm_exposed = iv.measure_in(comm_x, lo, hi)
    # the training thread's own work for the collectives (DDP's bucket copies and division):
    # communication's cost inside the compute blocks, outside the compute/memory split
    for_comm = comm_work_spans(rt)
    # compute-bound share from the innermost costed ops (or top-level ops by name); those
    # below both roofs are out of ``cw.work`` but stay in the proportions, which also split
    # the work of unknown bound (uncosted ops: a loss's scalar ``rsub`` beside its ``clamp``):
    # without them a per-sample loss's uncosted calls read as its model's GEMMs, compute
    work = is_cpu_work(rt, wb) & (cw.dur >= TINY_CPU_OP_US) & ~iv.contains(for_comm, rt.cpu_ts)
    return _StepParts(
        busy=compute + comm_exposed, compute=compute, comm_total=iv.measure_in(comm, lo, hi),
        comm_exposed=comm_exposed, memcpy_exposed=np.zeros(lo.size),
        input_wait=iv.measure_in(dl, lo, hi),
        comm_work=iv.measure_in(iv.subtract(cw.work, iv.subtract(cw.work, for_comm)), lo, hi),
        compute_bound=_split(cw.dur[work & (wb.bound == BOUND_COMPUTE)],
                             rt.cpu_ts[work & (wb.bound == BOUND_COMPUTE)], lo, hi),
        memory_bound=_split(cw.dur[work & (wb.bound == BOUND_MEMORY)],
                            rt.cpu_ts[work & (wb.bound == BOUND_MEMORY)], lo, hi),
        # the stalls are out of the compute blocks: in the host gaps, as the part of the host
        # overhead that was the OS running other work, not the job
        stalled=iv.measure_in(iv.subtract(cw.stalls, iv.union(real, iv.union(comm, dl))), lo, hi))


def _steps(p: _StepParts, lo: np.ndarray, hi: np.ndarray, numbers: list[int | None],
           flops: np.ndarray | None) -> list[StepBreakdown]:
    """Each step's breakdown from its parts. Work of unknown bound (no shapes, no telling
    kernel name) is split like the known work, so compute_bound + memory_bound == compute
    whenever anything is known."""
    step = hi - lo
    known = p.compute_bound + p.memory_bound
    idle = np.maximum(step - p.busy, 0.0)
    input_wait = np.minimum(p.input_wait, idle)
    with np.errstate(divide="ignore", invalid="ignore"):
        cb_frac = np.where(known > 0, p.compute_bound / known, 0.0)
        mb_frac = np.where(known > 0, p.memory_bound / known, 0.0)
    compute, comm_work, stalled = p.compute, p.comm_work, p.stalled
    out = []
    for i in range(lo.size):
        split = compute[i] - min(comm_work[i], compute[i])  # what the compute/memory split covers
        tb = TimeBreakdown(
            step_time=float(step[i]), gpu_busy=float(p.busy[i]), compute=float(compute[i]),
            compute_bound=float(split * cb_frac[i]), memory_bound=float(split * mb_frac[i]),
            comm_work=float(compute[i] - split),
            comm_total=float(p.comm_total[i]), comm_exposed=float(p.comm_exposed[i]),
            memcpy_exposed=float(p.memcpy_exposed[i]), idle=float(idle[i]),
            input_wait=float(input_wait[i]), host_overhead=float(idle[i] - input_wait[i]),
            host_stalled=float(min(stalled[i], idle[i] - input_wait[i])),
            # on the CPU the stalls are all the waiting the trace shows; on a GPU the step
            # timer's run delay fills it (``host_wait.with_waits``)
            host_waiting=float(min(stalled[i], idle[i] - input_wait[i])),
        )
        out.append(StepBreakdown(step=numbers[i], start=float(lo[i]), breakdown=tb,
                                 model_flops=None if flops is None else float(flops[i])))
    return out


# DDP's reducer names its own work (``torch::distributed::reducer::copy_`` into a bucket,
# ``torch.distributed.ddp.reducer::copy_bucket_to_grad`` back); its autograd hook runs inside
# ``AccumulateGrad``'s evaluation, where the comm hook also divides the bucket by the world size.
_REDUCER_RE = re.compile(r"reducer::")
_ACCUMULATE_EVAL = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
_ACCUMULATE_OP = "torch::autograd::AccumulateGrad"


def comm_work_spans(rt: RankTrace) -> iv.Intervals:
    """When the training thread worked for the collectives: DDP's reducer's own spans, and its
    hooks (an AccumulateGrad evaluation less the accumulation itself) in a rank where the
    reducer ran. Empty for a job without DDP's reducer (user hooks are not the reducer's)."""
    names = rt.names
    red = np.array([bool(_REDUCER_RE.search(n)) for n in names] or [False], dtype=bool)
    if not rt.cpu_name.size or not red[rt.cpu_name].any():
        return iv.EMPTY
    end = rt.cpu_ts + rt.cpu_dur
    mask = red[rt.cpu_name]
    ev = np.array([n == _ACCUMULATE_EVAL for n in names], dtype=bool)[rt.cpu_name]
    op = np.array([n == _ACCUMULATE_OP for n in names], dtype=bool)[rt.cpu_name]
    hooks = iv.subtract(iv.merge(rt.cpu_ts[ev], end[ev]), iv.merge(rt.cpu_ts[op], end[op]))
    return iv.union(iv.merge(rt.cpu_ts[mask], end[mask]), hooks)


def cpu_comm_ops(rt: RankTrace) -> np.ndarray:
    """Mask of CPU events that are a collective's own call, not work."""
    ids = np.array([bool(CPU_COMM_RE.match(n)) for n in rt.names], dtype=bool)
    return ids[rt.cpu_name] if rt.cpu_name.size and ids.size else np.zeros(rt.cpu_ts.size, dtype=bool)


# An operator that ran this many times longer than the fastest call of its kind (same name and
# shapes, at least STALL_MIN_CALLS calls), by at least STALL_MIN_US, was not computing all that
# time: the OS had descheduled its thread (a busy machine, a page-fault storm). Its excess is host
# time, not work. Seen on this project's shared 2-core VM at load average 15: aten::mul, 8 us,
# took 12-20 ms once in each traced step, and the breakdown read those stalls as memory-bound work.
# The fastest call, not the median, is the kind's own time (timeit's reasoning: a repeat is only
# ever slowed by what else runs): where most traced steps were crowded the median is itself a
# stall. CI's 2-core run of 2026-12-03, eight test workers beside it: the input-bound workload's
# 16x64 addmm took 4-108 ms in four of its five steps (0.05 ms alone), the median read as its
# time, and the stretched tiny operators made the job host-bound (48%) where its DataLoader took
# 94% of the step alone; 3 of 8 copies run at once read so, none with the fastest call.
STALL_FACTOR = 20.0
STALL_MIN_US = 1000.0
STALL_MIN_CALLS = 5


def op_kinds(rt: RankTrace) -> np.ndarray:
    """Each CPU event's kind, an integer: its name and its input shapes (-1: none recorded)."""
    kinds: np.ndarray = rt.cpu_name.astype(np.int64) * (len(rt.names) + 1) + (rt.cpu_shape + 1)
    return kinds


def stalls(rt: RankTrace) -> iv.Intervals:
    """When the OS ran other work inside the job's operators: each stalled operator's time
    beyond its kind's fastest call, at its end (where in the call the trace cannot say), merged over
    every depth, so a stall inside an operator that is not itself 20x its kind (a copy inside
    ``aten::to``) counts once. A kind is a name and its input shapes: by name alone, the
    gradient of a 2048x2048 weight (``aten::add_``, 2.5 ms of real memory traffic) read as a
    stall beside the biases' 10 us adds. So where the trace has shapes, an operator recorded
    without any (``AccumulateGrad``, ``aten::to``: big and small alike under one name) is not
    judged: a stall inside it is its children's, which have shapes."""
    dur = rt.cpu_dur
    if dur.size == 0:
        return iv.EMPTY
    own, counts = class_quantile(op_kinds(rt), dur, 0.0)
    judged = rt.cpu_is_op & ((rt.cpu_shape >= 0) | (rt.cpu_shape.max() < 0))
    stalled = (judged & (counts >= STALL_MIN_CALLS) & (dur > STALL_FACTOR * own)
               & (dur - own > STALL_MIN_US))
    return iv.merge((rt.cpu_ts + own)[stalled], (rt.cpu_ts + dur)[stalled])


@dataclass(frozen=True)
class CpuWork:
    """A CPU rank's operators as the breakdown counts them. The breakdown, the collectives'
    overlap and the rank's facts all need them, and each costs a pass over every event (a
    per-class minimum, an interval merge): made once per rank by ``cpu_work``."""

    dur: np.ndarray  # each event's duration less the stalls inside it
    stalls: iv.Intervals  # the OS running other work (``stalls``)
    blocks: iv.Intervals  # the compute blocks (``cpu_compute_intervals``)
    waits: iv.Intervals  # the DataLoader waits, merged
    # per event: a work item below both roofs (``roofline.below_both_roofs``): per-call cost
    dispatch: np.ndarray
    # the compute blocks less those items and the pieces under ``TINY_CPU_OP_US`` they leave:
    # the work the breakdown counts (``blocks`` stay the thread's busy time, which hides a
    # collective whether it dispatches or computes)
    work: iv.Intervals


def cpu_work(rt: RankTrace, wb: WorkBounds | None = None, device: DevicePeak | None = None
             ) -> CpuWork | None:
    """None for a rank with GPU activity: there the GPU is the device. Without ``wb`` and
    ``device`` no operator is judged below the roofs (``CpuWork.dispatch`` all False)."""
    if rt.has_gpu:
        return None
    st = stalls(rt)
    dur = rt.cpu_dur - iv.measure_in(st, rt.cpu_ts, rt.cpu_ts + rt.cpu_dur)
    waits = iv.merge(rt.dataloader[:, 0], rt.dataloader[:, 1])
    blocks = cpu_compute_intervals(rt, st, waits)
    disp = (below_both_roofs(rt, wb, dur, device) if wb is not None
            else np.zeros(rt.cpu_ts.size, dtype=bool))
    work = blocks
    if disp.any():
        left = iv.subtract(blocks, iv.merge(rt.cpu_ts[disp], (rt.cpu_ts + rt.cpu_dur)[disp]))
        big = (left[1] - left[0]) >= TINY_CPU_OP_US
        work = (left[0][big], left[1][big])
    return CpuWork(dur=dur, stalls=st, blocks=blocks, waits=waits, dispatch=disp, work=work)


def cpu_compute_intervals(rt: RankTrace, stalled: iv.Intervals, waits: iv.Intervals) -> iv.Intervals:
    """The CPU's work as the breakdown counts it: blocks of (non-collective) operators at least
    ``TINY_CPU_OP_US`` long once the ``stalled`` time is out of them, outside DataLoader
    ``waits``."""
    ops = rt.cpu_is_op & ~cpu_comm_ops(rt)
    op_u = iv.subtract(iv.merge(rt.cpu_ts[ops], (rt.cpu_ts + rt.cpu_dur)[ops]), stalled)
    big = (op_u[1] - op_u[0]) >= TINY_CPU_OP_US
    return iv.subtract((op_u[0][big], op_u[1][big]), waits)


def work_intervals(rt: RankTrace, cw: CpuWork | None) -> iv.Intervals:
    """What hides a collective: computation kernels on a GPU; on the CPU, operator blocks and
    DataLoader waits (the thread is busy either way)."""
    if cw is None:
        c = rt.gpu_class == KCLASS_COMPUTE
        return iv.merge(rt.gpu_ts[c], (rt.gpu_ts + rt.gpu_dur)[c])
    return iv.union(cw.blocks, cw.waits)


def _model_flops(rt: RankTrace, wb: WorkBounds, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    mask = rt.cpu_is_model_flop & wb.inner
    if not mask.any():
        return None
    return _split(rt.cpu_flops[mask], rt.cpu_ts[mask], lo, hi)


def sum_breakdowns(parts: list[TimeBreakdown], divide_by: int = 1) -> TimeBreakdown:
    out = TimeBreakdown()
    for p in parts:
        for f in out.__dataclass_fields__:
            setattr(out, f, getattr(out, f) + getattr(p, f))
    if divide_by > 1:
        for f in out.__dataclass_fields__:
            setattr(out, f, getattr(out, f) / divide_by)
    return out


def gpu_span_breakdown(rt: RankTrace) -> GpuSpanBreakdown | None:
    """HTA's ``get_temporal_breakdown`` for this rank, computed our way.

    Same window as HTA: with two or more steps, only GPU work launched before the last
    step starts (HTA drops the last, possibly truncated, iteration); then idle / compute /
    non-compute over the span from the first GPU activity's start to the last one's end.
    """
    if not rt.has_gpu:
        return None
    keep = np.ones(rt.gpu_ts.size, dtype=bool)
    if len(rt.steps) >= 2:
        last_start = max(s[1] for s in rt.steps)
        keep = np.isfinite(rt.gpu_launch_ts) & (rt.gpu_launch_ts < last_start)
    if not keep.any():
        return None
    ts = rt.gpu_ts[keep]
    end = ts + rt.gpu_dur[keep]
    allg = iv.merge(ts, end)
    span = float(allg[1][-1] - allg[0][0])
    busy = iv.total(allg)
    comp_mask = rt.gpu_class[keep] == KCLASS_COMPUTE
    compute = iv.total(iv.merge(ts[comp_mask], end[comp_mask]))
    idle = span - busy
    return GpuSpanBreakdown(kernel_time=span, idle_time=idle, compute_time=compute,
                            non_compute_time=span - compute - idle)
