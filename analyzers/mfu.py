"""Model FLOPs utilisation: useful model FLOPs per second over the device's peak.

Model FLOPs are matmul, convolution and attention FLOPs (the PaLM paper's definition counts
the model's math, not recomputation or elementwise work); the peak is the one of the dtype
those FLOPs ran in. When either is unknown the answer is "not available", never a guess.
"""

from __future__ import annotations

from gpudiag.devices import DTYPE_FAMILY, DevicePeak
from gpudiag.diagnosis import Mfu, RankResult
from gpudiag.units import si


def compute_mfu(ranks: list[RankResult], device: DevicePeak | None, dtype: str,
                flops_per_step: float | None, shapes_recorded: bool,
                untraced_step_us: float | None = None) -> Mfu:
    """MFU over the job's real step time when its step timer gives one (``untraced_step_us``:
    the median step with the profiler off), else over the traced steps, which the profiler
    slowed, so that MFU reads low; ``step_time_basis`` says which."""
    if untraced_step_us:
        step_us, basis = untraced_step_us, "untraced steps"
    else:
        step_times = [r.mean_step_time for r in ranks if r.mean_step_time > 0]
        step_us = sum(step_times) / len(step_times) if step_times else None
        basis = "traced steps"
    mfu = _mfu(ranks, device, dtype, flops_per_step, shapes_recorded, step_us)
    mfu.step_time_basis = basis
    if mfu.value is not None:
        mfu.reason += f" ({basis})"
    return mfu


# Below this share of device time in uncosted ops the MFU reason does not mention them.
UNCOSTED_NOTE_SHARE = 0.01


def note_uncosted(mfu: Mfu, share: float | None) -> Mfu:
    """Say in the reason how much device time went to ops without a FLOP formula (custom and
    fused kernels, ops we do not know): MFU counts none of their FLOPs, so it reads low by up
    to their share if they did model math."""
    if (mfu.value is not None and mfu.flops_source == "shapes" and share is not None
            and share >= UNCOSTED_NOTE_SHARE):
        mfu.reason += (f"; {100 * share:.0f}% of device time is in ops without a FLOP formula, "
                       "whose FLOPs it does not count")
    return mfu


def _mfu(ranks: list[RankResult], device: DevicePeak | None, dtype: str,
         flops_per_step: float | None, shapes_recorded: bool, step_us: float | None) -> Mfu:
    if device is None:
        return Mfu(None, "not available: unknown device peak (pass --device or --peak-tflops "
                   "and --peak-gbps)", None, "none", None, None, step_us)
    peak, family = device.peak_for(dtype)
    if flops_per_step is not None:
        source = "--flops-per-step"
        flops = flops_per_step
    else:
        per_rank = []
        for r in ranks:
            vals = [s.model_flops for s in r.steps if s.model_flops is not None]
            if vals:
                per_rank.append(sum(vals) / len(r.steps))
        if not per_rank or not shapes_recorded:
            return Mfu(None, "not available: the trace has no recorded shapes of matmul/conv/"
                       "attention ops (profile with record_shapes=True, or pass --flops-per-step)",
                       None, "none", DTYPE_FAMILY.get(dtype, family), peak, step_us)
        flops = sum(per_rank) / len(per_rank)
        source = "shapes"
    if not step_us:
        return Mfu(None, "not available: no step time could be measured", flops, source,
                   family, peak, None)
    value = flops / (step_us * 1e-6) / peak
    if value > 1.0:
        # More FLOP/s than the device can do: the peak belongs to another device (a GPU
        # trace whose kernels were stripped, analysed against this CPU, say).
        return Mfu(None, f"not available: the FLOPs in the trace imply {100 * value:.0f}% of "
                   f"the {peak / 1e12:.4g} TFLOP/s peak, so the peak is not the device that "
                   "recorded it; pass --device or --peak-tflops/--peak-gbps",
                   flops, source, family, peak, step_us)
    reason = (f"{si(flops, 'FLOP')} per step per rank ({source}) over "
              f"{step_us / 1e3:.3g} ms per step at {peak / 1e12:.4g} TFLOP/s {family} peak")
    return Mfu(value, reason, flops, source, family, peak, step_us)
