"""What each fix is worth: the step time it predicts if it worked fully.

Daydream (Zhu et al., ATC'20) showed that the effect of an optimisation can be predicted by
replaying a trace's dependency graph with the optimised part changed. We replay the step of
the verdict's view (its breakdown: the parts add up to the step, ``diagnosis.TimeBreakdown``)
with one part removed or overlapped, and say what bounds the result:

- input wait hidden (DataLoader workers): the step loses its input wait; the rest of the step
  (compute, communication, gaps) bounds it, and enough workers are needed to produce a batch
  in that time;
- exposed communication overlapped: it is hidden behind compute, as far as the compute not
  already hiding communication reaches;
- host gaps closed (CUDA graphs, fewer larger ops): the step loses its host overhead; device
  work bounds it; ``torch.compile`` also fuses (below), so its prediction has both;
- compute at a faster dtype's peak (bf16 autocast): compute-bound fp32 work takes
  ``peak_fp32 / peak_bf16`` of its time, at the efficiency it had;
- memory-bound work fused (``torch.compile``, which also closes the host gaps): each run of
  consecutive memory-bound elementwise operators (or kernels) becomes one pass over the data,
  costing its longest member (``fusion_runs``);
- copies hidden, a straggler brought to the median rank's pace.

A prediction is an upper bound on the gain ("if the fix worked fully"); where the trace cannot
bound it, there is none, and the reason says why. Pure functions: breakdown in, seconds out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpudiag.diagnosis import TimeBreakdown


@dataclass
class Prediction:
    step_us: float | None
    why: str


def _ms(us: float) -> str:
    return f"{us / 1e3:.3g} ms"


def input_hidden(b: TimeBreakdown) -> Prediction:
    rest = b.step_time - b.input_wait
    workers = workers_needed(b)
    need = f"; needs at least {workers} DataLoader workers producing a batch in that time" \
        if workers else ""
    return Prediction(rest, f"input wait ({_ms(b.input_wait)}) hidden behind the rest of the step "
                            f"({_ms(rest)} of compute, communication and gaps), which bounds it{need}")


def workers_needed(b: TimeBreakdown) -> int | None:
    """Workers that hide a single-process loader's wait: each makes a batch in the time the
    main process now waits for one, and the rest of the step must cover it."""
    rest = b.step_time - b.input_wait
    if b.input_wait <= 0 or rest <= 0:
        return None
    return max(1, math.ceil(b.input_wait / rest))


def communication_overlapped(b: TimeBreakdown, cpu: bool = False) -> Prediction:
    hiding = b.comm_total - b.comm_exposed  # communication already hidden by compute
    capacity = max(0.0, b.compute - hiding)
    hidden = min(b.comm_exposed, capacity)
    bound = ("" if hidden >= b.comm_exposed else
             f"; only {_ms(capacity)} of compute is left to hide it behind, so "
             f"{_ms(b.comm_exposed - hidden)} stays exposed")
    # gloo's work needs a core: ranks that keep every core busy leave it none (measured on this
    # project's 2-core VM: 1 MB buckets made a 2-rank DDP step slower, 225 -> 334 ms)
    cores = ("; on the CPU, only where cores are free for the communication beside the compute"
             if cpu else "")
    return Prediction(b.step_time - hidden, f"exposed communication ({_ms(b.comm_exposed)}) "
                      f"overlapped with compute{bound}{cores}")


def host_gaps_closed(b: TimeBreakdown) -> Prediction:
    return Prediction(b.step_time - b.host_overhead,
                      f"host gaps ({_ms(b.host_overhead)}) closed; the device's own work and the "
                      "input wait bound the step")


def compiled(b: TimeBreakdown, saved_share: float | None) -> Prediction:
    """``torch.compile`` does both: the gaps between ops close (one compiled call instead of
    one dispatch per op), and runs of consecutive elementwise ops fuse into one pass."""
    fused = b.memory_bound * (saved_share or 0.0)
    return Prediction(b.step_time - b.host_overhead - fused,
                      f"host gaps ({_ms(b.host_overhead)}) closed and each run of consecutive "
                      f"memory-bound elementwise operators fused into one pass ({_ms(fused)} saved); "
                      "the operators compile does not fuse (GEMMs, convolutions) keep their time")


def copies_hidden(b: TimeBreakdown) -> Prediction:
    return Prediction(b.step_time - b.memcpy_exposed,
                      f"copies ({_ms(b.memcpy_exposed)}) overlapped with compute")


def faster_dtype(b: TimeBreakdown, fp32_share: float, ratio: float, family: str) -> Prediction:
    """Compute-bound work whose FLOPs ran in fp32 (``fp32_share`` of them) at ``ratio`` =
    peak_fp32 / peak_faster of its time."""
    part = b.compute_bound * fp32_share
    saved = part * (1 - ratio)
    return Prediction(b.step_time - saved,
                      f"compute-bound fp32 work ({_ms(part)}) at the {family} peak, "
                      f"{1 / ratio:.2g}x the fp32 one, at the same efficiency")


def halved_bytes(b: TimeBreakdown, fp32_memory_share: float, fp32_bytes: float | None,
                 bandwidth: float) -> Prediction:
    """Memory-bound fp32 work in bf16 moves half its bytes: at most half its time, and no more
    than half its bytes take at the device's bandwidth (an op bound by dispatch rather than
    bytes gains little)."""
    part = b.memory_bound * fp32_memory_share
    saved = part / 2
    bound = ""
    if fp32_bytes is not None and bandwidth > 0:
        by_bytes = fp32_bytes / 2 / bandwidth * 1e6
        if by_bytes < saved:
            saved, bound = by_bytes, (f"; half of its {fp32_bytes / 1e6:.3g} MB per step at "
                                      f"{bandwidth / 1e9:.3g} GB/s bounds the saving")
    return Prediction(b.step_time - saved, f"memory-bound fp32 work ({_ms(part)}) moving half the "
                                           f"bytes{bound}")


def straggler_fixed(b: TimeBreakdown, median_us: float, worst_us: float) -> Prediction:
    if worst_us <= 0 or median_us <= 0:
        return Prediction(None, "per-rank step times unknown")
    return Prediction(b.step_time * median_us / worst_us,
                      f"every rank at the median rank's pace ({_ms(median_us)} per traced step "
                      f"instead of {_ms(worst_us)})")


def fusion_runs(ts: np.ndarray, dur: np.ndarray, group: np.ndarray, fusable: np.ndarray,
                barrier: np.ndarray) -> tuple[float, float]:
    """(time of fusable items, time a fusion saves): items in time order per group (thread or
    stream); a run is a maximal sequence of fusable items with no other work (``barrier``)
    between them, and fused it costs its longest member."""
    sel = fusable | barrier
    if not fusable.any():
        return 0.0, 0.0
    idx = np.flatnonzero(sel)
    idx = idx[np.lexsort((ts[idx], group[idx]))]
    total = saved = 0.0
    run_sum = run_max = 0.0
    cur = None
    for g, f, d in zip(group[idx].tolist(), fusable[idx].tolist(), dur[idx].tolist(), strict=True):
        if g != cur or not f:
            saved += run_sum - run_max
            run_sum = run_max = 0.0
            cur = g
        if f:
            total += d
            run_sum += d
            run_max = max(run_max, d)
    saved += run_sum - run_max
    return total, saved
