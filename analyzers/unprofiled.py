"""The job as it runs unobserved, estimated from its traced steps and its own step timer.

The torch profiler costs host time on every operator it records (more with recorded shapes).
On the GPU that cost does not slow the kernels; it delays their launches, so it shows up in
the trace as GPU idle gaps, which a breakdown of traced steps reads as host overhead. The
step timer runs on every step, traced or not, so ``traced median - untraced median`` is the
profiler's extra wall time per step, measured, not modelled.

The model (stated in every Diagnosis that uses it): the step is the untraced median; device
work is kept as traced; the extra wall time is removed from the host gaps first (where the
profiler's cost lands), then from the input wait (a host slowed by the profiler gives
DataLoader workers more time, so the traced input wait is, if anything, too small: taking
extra time from it is the last resort). It is unsafe, and says so, when:
- the untraced steps are not faster (the job changed phase, or the difference is noise): the
  traced breakdown is used as is;
- the device work alone is longer than the untraced step: the profiler slowed the device work
  itself (CUPTI on many tiny kernels, or CPU operators whose own time grew), so the work is
  scaled down to fit and the compute/memory split keeps its proportions;
- the device is the CPU: operator time itself carries part of the profiler's cost, so there
  the extra time is taken from operator time and the gaps between operators in proportion,
  and the input wait keeps its length.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from gpudiag.diagnosis import Dilation, TimeBreakdown

# Fewer untraced steps than this give no reference worth correcting by (a median of 2 is
# one outlier away from anything).
MIN_UNTRACED_STEPS = 3
# A dilation below 1 + this is within the step-to-step noise of most jobs: no correction.
NOISE_FLOOR = 0.02
# Interquartile range over median of the untraced steps above this: the reference is itself
# unsteady (input hiccups, a noisy neighbour), which the caveats say.
UNSTEADY_SPREAD = 0.25

MODEL = ("step = the median untraced step of the job's own step timer; device work as traced; "
         "the profiler's extra wall time (traced minus that step) removed from the host gaps "
         "first, then from the input wait")


def iqr_over_median(xs: Sequence[float]) -> float:
    """Interquartile range over the median: how unsteady a run's steps are. Quartiles as
    ``statistics.quantiles`` takes them (Weibull's p(n+1) positions). The report's "noise ±"
    and ``gpudiag diff``'s noise floor are both half of it."""
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def measure_dilation(traced_s: list[float], untraced_s: list[float]) -> Dilation | None:
    """Traced vs untraced step times (seconds) as a Dilation; None when either side is missing."""
    if not traced_s or len(untraced_s) < MIN_UNTRACED_STEPS:
        return None
    t = statistics.median(traced_s)
    u = statistics.median(untraced_s)
    if t <= 0 or u <= 0:
        return None
    return Dilation(traced_step_us=t * 1e6, untraced_step_us=u * 1e6, factor=t / u,
                    traced_steps=len(traced_s), untraced_steps=len(untraced_s),
                    untraced_spread=iqr_over_median(untraced_s), model=MODEL)


def estimate_unprofiled(traced: TimeBreakdown, dilation: Dilation, device_kind: str) -> TimeBreakdown:
    """The mean step as it runs unobserved; appends to ``dilation.caveats`` where unsafe."""
    caveats = dilation.caveats
    if dilation.untraced_spread > UNSTEADY_SPREAD:
        caveats.append(f"untraced steps vary a lot (interquartile range "
                       f"{100 * dilation.untraced_spread:.0f}% of their median): the reference step "
                       "time is itself unsteady")
    if dilation.factor < 1 - NOISE_FLOOR:
        caveats.append(f"untraced steps were slower than traced ones ({dilation.factor:.2f}x): the job "
                       "changed phase or its steps differ; the traced breakdown is used as is")
    if dilation.factor < 1 + NOISE_FLOOR or dilation.untraced_step_us >= traced.step_time:
        return replace(traced)
    # The unobserved step is the step timer's untraced median itself (not the traced mean shrunk
    # by the factor): one slow traced step (a sync, an allocation) must not leak into it.
    step = dilation.untraced_step_us
    if device_kind == "cpu":
        return _cpu_estimate(traced, step, caveats)
    work = traced.compute + traced.comm_exposed + traced.memcpy_exposed
    if work > step:
        caveats.append(f"device work alone ({work / 1e3:.3g} ms) exceeds the untraced step "
                       f"({step / 1e3:.3g} ms): the profiler slowed the device work itself; it is "
                       "scaled down to fit, keeping its proportions")
        k = step / work
        return TimeBreakdown(
            step_time=step, gpu_busy=traced.gpu_busy * k, compute=traced.compute * k,
            compute_bound=traced.compute_bound * k, memory_bound=traced.memory_bound * k,
            comm_total=traced.comm_total * k, comm_exposed=traced.comm_exposed * k,
            memcpy_exposed=traced.memcpy_exposed * k, idle=0.0, input_wait=0.0, host_overhead=0.0)
    extra = traced.step_time - step
    host = traced.host_overhead - extra
    input_wait = traced.input_wait
    if host < 0:
        input_wait = max(0.0, input_wait + host)
        host = 0.0
        caveats.append("the profiler's extra time exceeded the traced host gaps: the rest was taken "
                       "from the input wait")
    idle = step - work
    # keep the parts additive whatever rounding did: idle == input_wait + host_overhead
    host = max(0.0, idle - input_wait)
    input_wait = idle - host
    return replace(traced, step_time=step, idle=idle, input_wait=input_wait, host_overhead=host)


def _cpu_estimate(traced: TimeBreakdown, step: float, caveats: list[str]) -> TimeBreakdown:
    """The CPU as the device: the profiler's per-operator cost lands inside the operators' own
    spans as much as in the gaps between them, so both shrink by the same factor; the input
    wait (blocked on the DataLoader: I/O, decoding, a sleep) carries little of it and keeps
    its traced length unless the rest cannot absorb the extra time."""
    extra = traced.step_time - step
    ops_and_gaps = traced.compute + traced.comm_exposed + traced.memcpy_exposed + traced.host_overhead
    input_wait = traced.input_wait
    if ops_and_gaps <= 0:
        return replace(traced)
    keep = (ops_and_gaps - extra) / ops_and_gaps
    if keep < 0:
        input_wait = max(0.0, input_wait + keep * ops_and_gaps)
        keep = 0.0
        caveats.append("the profiler's extra time exceeded the traced operator and gap time: the rest "
                       "was taken from the input wait")
    caveats.append("the device is the CPU: the profiler's cost was taken from operator time and the "
                   "gaps between operators in proportion (it is paid per operator, inside and between "
                   "them), not from the input wait")
    k = keep
    out = TimeBreakdown(
        step_time=0.0, gpu_busy=traced.gpu_busy * k, compute=traced.compute * k,
        compute_bound=traced.compute_bound * k, memory_bound=traced.memory_bound * k,
        comm_total=traced.comm_total * k, comm_exposed=traced.comm_exposed * k,
        memcpy_exposed=traced.memcpy_exposed * k, input_wait=input_wait,
        host_overhead=traced.host_overhead * k)
    out.idle = out.input_wait + out.host_overhead
    # the parts add up to the untraced step; rounding and a traced input wait longer than the
    # whole untraced step (noise) are absorbed by scaling all of them to it
    total = out.compute + out.comm_exposed + out.memcpy_exposed + out.idle
    f = step / total if total > 0 else 1.0
    for name in ("gpu_busy", "compute", "compute_bound", "memory_bound", "comm_total", "comm_exposed",
                 "memcpy_exposed", "input_wait", "host_overhead", "idle"):
        setattr(out, name, getattr(out, name) * f)
    out.step_time = step
    return out
