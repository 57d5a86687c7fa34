"""What one rank's trace says beyond its breakdown, for advice: traits and fusable work.

Computed while the rank's columns are loaded (``diagnose.analyze_rank``) and kept as a few
numbers, so advice never needs the trace again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpudiag.analyzers.breakdown import (
    TINY_CPU_OP_US,
    cpu_compute_intervals,
    step_windows,
    unstalled_dur,
)
from gpudiag.analyzers.op_args import KIND_ELEMENTWISE
from gpudiag.analyzers.roofline import BOUND_MEMORY, WorkBounds, is_cpu_work
from gpudiag.analyzers.trace_loader import KCLASS_COMPUTE, RankTrace
from gpudiag.analyzers.traits import rank_traits
from gpudiag.analyzers.whatif import fusion_runs


@dataclass
class RankFacts:
    traits: dict[str, bool] = field(default_factory=dict)
    fusable_us: float = 0.0  # memory-bound elementwise work in runs of consecutive such work
    fusion_saves_us: float = 0.0  # what fusing each run into one pass would save
    memory_bound_us: float = 0.0  # all memory-bound work (the denominator of the saving)
    # recorded CPU events per traced step, and those starting inside the CPU's compute blocks:
    # the profiler pays its cost per recorded event (unprofiled._cpu_estimate)
    events_per_step: float = 0.0
    events_in_compute_per_step: float = 0.0
    stalled_us_per_step: float = 0.0  # CPU operator time the OS did not run (breakdown.unstalled_dur)


def rank_facts(rt: RankTrace, wb: WorkBounds) -> RankFacts:
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
        work = is_cpu_work(rt, wb) & (rt.cpu_dur >= TINY_CPU_OP_US)
        fusable = work & wb.inner & (wb.bound == BOUND_MEMORY) & (rt.cpu_kind == KIND_ELEMENTWISE)
        total, saved = fusion_runs(rt.cpu_ts, rt.cpu_dur, rt.cpu_tid, fusable, work & ~fusable)
        mem = float(rt.cpu_dur[work & (wb.bound == BOUND_MEMORY)].sum())
    lo, hi, _ = step_windows(rt)
    n_steps = max(lo.size, 1)
    inside = np.zeros(rt.cpu_ts.size, dtype=bool)
    if lo.size:
        k = np.searchsorted(lo, rt.cpu_ts, side="right") - 1
        inside = (k >= 0) & (rt.cpu_ts < hi[np.clip(k, 0, None)])
    in_compute = np.zeros(rt.cpu_ts.size, dtype=bool)
    if not rt.has_gpu and inside.any():
        comp = cpu_compute_intervals(rt)
        if comp[0].size:
            j = np.searchsorted(comp[0], rt.cpu_ts, side="right") - 1
            in_compute = inside & (j >= 0) & (rt.cpu_ts < comp[1][np.clip(j, 0, None)])
    stalled = 0.0
    if not rt.has_gpu:
        top = inside & rt.cpu_is_op & (rt.cpu_depth == 0)
        stalled = float((rt.cpu_dur - unstalled_dur(rt))[top].sum()) / n_steps
    return RankFacts(traits=traits, fusable_us=total, fusion_saves_us=saved, memory_bound_us=mem,
                     events_per_step=float(inside.sum()) / n_steps,
                     events_in_compute_per_step=float(in_compute.sum()) / n_steps,
                     stalled_us_per_step=stalled)
