"""On a CPU, operators computed only to feed values read back into Python are the host's
work, not the model's: the verdict's label counts them as host time.

Why: a metrics logger that reads 14 weight histograms with ``.tolist()`` every step runs
``histc`` for them, and ``histc`` looks like any other operator: the third blind zoo's
``metrics_log`` read compute-bound (0.37-0.79, "arithmetic intensity above the ridge point")
where removing the logging removed 62-75% of its step. The sync census (``analyzers.syncs``)
already tells which operators fed only the syncs (their results went nowhere else) and their
time per step (``SyncReport.feeding_us``); that work exists because the loop reads values
back, and its fix is the host's (read less often, keep values on the device). So the label
weighs it with the host time; the breakdown table still shows it where it ran (operators),
and the summary says how much of the host share it is.

On a GPU a sync's cost is the device idle while the host catches up, already host time in the
view; the operators feeding it are device work that overlaps the host: left as they are.
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.diagnosis import SyncReport, TimeBreakdown
from gpudiag.units import ms


def moved_us(b: TimeBreakdown, syncs: SyncReport | None, device_kind: str) -> float:
    """Operator time per step that fed only the syncs, as the view has it (at most its compute)."""
    if device_kind != "cpu" or syncs is None or syncs.feeding_us <= 0 or b.compute <= 0:
        return 0.0
    return min(syncs.feeding_us, b.compute)


def as_host(b: TimeBreakdown, us: float) -> TimeBreakdown:
    """``b`` with ``us`` of its compute (each kind in proportion) counted as host gaps: the
    step and its parts still add up."""
    if us <= 0 or b.compute <= 0:
        return b
    k = 1 - us / b.compute
    return replace(b, compute=b.compute - us, compute_bound=b.compute_bound * k,
                   memory_bound=b.memory_bound * k, gpu_busy=max(0.0, b.gpu_busy - us),
                   host_overhead=b.host_overhead + us, idle=b.idle + us)


def cause(us: float) -> str | None:
    """What a host-bound summary names of its host share: the operators that fed only the syncs
    (the CPU is not idle then: it runs no model work); None where there are none."""
    if us <= 0:
        return None
    return (f"operators computed only for values read back into Python ({ms(us)} a step: the "
            "loop's logging or checks)")
