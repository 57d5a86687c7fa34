"""What one rank's trace says beyond its breakdown, for advice: traits and fusable work.

Computed while the rank's columns are loaded (``diagnose.analyze_rank``) and kept as a few
numbers, so advice never needs the trace again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpudiag.analyzers import intervals as iv
from gpudiag.analyzers.breakdown import TINY_CPU_OP_US, CpuWork, cpu_comm_ops, op_kinds, step_windows
from gpudiag.analyzers.comm_cost import backward_time, slowed_beside
from gpudiag.analyzers.compile_facts import CompileFacts, compile_facts
from gpudiag.analyzers.op_args import KIND_ELEMENTWISE
from gpudiag.analyzers.roofline import BOUND_MEMORY, WorkBounds, is_cpu_work
from gpudiag.analyzers.stats import class_quantile
from gpudiag.analyzers.trace_loader import KCLASS_COMPUTE, RankTrace
from gpudiag.analyzers.traits import rank_traits
from gpudiag.analyzers.unprofiled import CpuEvents
from gpudiag.analyzers.whatif import fusion_runs


@dataclass
class RankFacts:
    traits: dict[str, bool] = field(default_factory=dict)
    fusable_us: float = 0.0  # memory-bound elementwise work in runs of consecutive such work
    fusion_saves_us: float = 0.0  # what fusing each run into one pass would save
    memory_bound_us: float = 0.0  # all memory-bound work (the denominator of the saving)
    # what the traced steps hold that tells the profiler's cost from the job's (per step)
    cpu_events: CpuEvents = field(default_factory=lambda: CpuEvents(0.0, 0.0))
    # what torch.compile would change in a CPU step (``compile_facts``; empty on a GPU)
    compile: CompileFacts = field(default_factory=CompileFacts)
    # the training thread's operators slower beside a collective than alone, per step, and the
    # calls compared (``comm_cost.slowed_beside``; 0 on a GPU)
    comm_slowed_us: float = 0.0
    comm_slowed_calls: int = 0
    # the backward's time per step (autograd's node evaluations, less DDP's work for the
    # collectives inside them): what a step's gradients' collectives can hide behind (CPU only)
    backward_us: float | None = None


def rank_facts(rt: RankTrace, wb: WorkBounds, cw: CpuWork | None) -> RankFacts:
    """``cw``: the rank's ``breakdown.cpu_work`` (None where a GPU is the device)."""
    traits = rank_traits(rt.names, rt.dataloader_iters)
    if rt.has_gpu:
        work = rt.gpu_class == KCLASS_COMPUTE
        op = wb.op_index
        elementwise = np.zeros(op.size, dtype=bool)
        has = op >= 0
        elementwise[has] = rt.cpu_kind[op[has]] == KIND_ELEMENTWISE
        fusable = work & (wb.bound == BOUND_MEMORY) & elementwise
        total, saved = fusion_runs(rt.gpu_ts, rt.gpu_dur, rt.gpu_stream, fusable, work & ~fusable)
        mem = float(rt.gpu_dur[work & (wb.bound == BOUND_MEMORY)].sum())
    else:
        # as the breakdown counts it: ops shorter than TINY_CPU_OP_US are host time
        assert cw is not None, "a CPU rank's facts need its cpu_work"
        work = is_cpu_work(rt, wb) & (cw.dur >= TINY_CPU_OP_US)
        fusable = work & wb.inner & (wb.bound == BOUND_MEMORY) & (rt.cpu_kind == KIND_ELEMENTWISE)
        total, saved = fusion_runs(rt.cpu_ts, cw.dur, rt.cpu_tid, fusable, work & ~fusable)
        mem = float(cw.dur[work & (wb.bound == BOUND_MEMORY)].sum())
    lo, hi, _ = step_windows(rt)
    n_steps = max(lo.size, 1)
    inside = iv.contains((lo, hi), rt.cpu_ts)
    in_compute = inside & iv.contains(cw.blocks, rt.cpu_ts) if cw is not None else np.zeros_like(inside)
    slowed = dispatched = 0.0
    if cw is not None:
        top = inside & rt.cpu_is_op & (rt.cpu_depth == 0)
        comm = cpu_comm_ops(rt)
        slowed = float(slowed_beyond_floor(rt, cw.dur, top & ~comm).sum()) / n_steps
        dispatched = float((top & ~in_compute & ~comm & ~iv.contains(cw.waits, rt.cpu_ts)).sum()) / n_steps
    # the DataLoader's own operators, recorded inside its waits where it runs in the training
    # process (num_workers=0): the profiler's cost per event lands there too
    waits = cw.waits if cw is not None else iv.merge(rt.dataloader[:, 0], rt.dataloader[:, 1])
    in_waits = float((inside & iv.contains(waits, rt.cpu_ts)).sum()) / n_steps
    beside = slowed_beside(rt, cw)
    return RankFacts(traits=traits, fusable_us=total, fusion_saves_us=saved, memory_bound_us=mem,
                     cpu_events=CpuEvents(float(inside.sum()) / n_steps, float(in_compute.sum()) / n_steps,
                                          slowed, dispatched, in_waits),
                     compile=compile_facts(rt, cw, traits["training"]),
                     comm_slowed_us=beside[0], comm_slowed_calls=beside[1],
                     backward_us=backward_time(rt, lo, hi) if cw is not None and traits["training"] else None)


# A class of operators (same name, same input shapes) with at least SLOW_MIN_CALLS calls in the
# window whose fast calls (the SLOW_FLOOR_QUANTILE of them) take at least SLOW_MIN_US: long
# enough that the profiler's fixed cost per recorded event (about a microsecond) is a small part
# of each call, so what its slower calls took beyond that floor is the call itself running slower.
SLOW_MIN_CALLS = 8
SLOW_MIN_US = 100.0
SLOW_FLOOR_QUANTILE = 0.1


def slowed_beyond_floor(rt: RankTrace, dur: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """For each operator in ``mask``: what it took beyond the floor of its class (0 for classes
    too small or too short to have one): the profiler slows long operators themselves, and that
    time is theirs, not the gaps' (``unprofiled._cpu_per_event`` says how it is used)."""
    out = np.zeros(dur.size)
    idx = np.flatnonzero(mask)
    if idx.size < SLOW_MIN_CALLS:
        return out
    d = dur[idx]
    floor, counts = class_quantile(op_kinds(rt)[idx], d, SLOW_FLOOR_QUANTILE)
    ok = (counts >= SLOW_MIN_CALLS) & (floor >= SLOW_MIN_US)
    out[idx[ok]] = np.maximum(0.0, d[ok] - floor[ok])
    return out
