"""Model FLOPs utilisation: useful model FLOPs per second over the device's peak.

Model FLOPs are matmul, convolution and attention FLOPs (the PaLM paper's definition counts
the model's math, not recomputation or elementwise work); the peak is the one of the dtype
those FLOPs ran in, read from each op's recorded input types. A job that mixes dtypes (bf16
autocast keeps some matmuls in fp32) is judged against the mix: the time its FLOPs would take,
each dtype family at its own peak, over the time they took. When FLOPs or peak are unknown the
answer is "not available", never a guess.
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.devices import DTYPE_FAMILY, DevicePeak
from gpudiag.diagnosis import Mfu, RankResult
from gpudiag.units import si

MIXED = "mixed"


def dtype_mix(dtype_flops: dict[str, float]) -> dict[str, float]:
    """Share of the model FLOPs per dtype family ({} when none are known)."""
    fam: dict[str, float] = {}
    for dtype, f in dtype_flops.items():
        if f > 0:
            k = DTYPE_FAMILY.get(dtype.lower(), "fp32")
            fam[k] = fam.get(k, 0.0) + f
    total = sum(fam.values())
    return {k: v / total for k, v in sorted(fam.items(), key=lambda kv: -kv[1])} if total > 0 else {}


def mix_peak(device: DevicePeak, mix: dict[str, float]) -> tuple[float, str]:
    """The peak FLOP/s of a mix of families: 1 / sum(share / peak), and its family name."""
    if not mix:
        return device.family_peak("fp32")
    if len(mix) == 1:
        return device.family_peak(next(iter(mix)))
    return 1.0 / sum(share / device.family_peak(fam)[0] for fam, share in mix.items()), MIXED


# A job may raise a measured peak by at most this factor: a peak measured on a busy machine
# reads low by up to the share of the cores others took (the best of 1-thread and all-thread
# runs bounds that near 1.5x on this project's 2-core VM), while a trace whose FLOP rate is
# many times the peak was recorded on another device (a GPU trace whose kernels were stripped
# reads 2000x) and must not move this machine's peak.
FLOOR_RAISE_MAX = 2.0


def raise_measured_peak(device: DevicePeak | None, rates: dict[str, float], recorded_here: bool = False
                        ) -> tuple[DevicePeak | None, dict[str, float]]:
    """A measured peak (the CPU's) is a floor: where the job itself ran a family faster
    (``rates``: FLOP/s per family, from ops with exact FLOP formulas), that rate is the better
    measurement, up to ``FLOOR_RAISE_MAX`` times the peak, or without bound where the trace was
    recorded on this machine (``recorded_here``: a run directory this host wrote, with no GPU
    work): then no rate can belong to another device, and a peak measured low (under load, or
    through a slower kernel than the job's) is what was wrong. Returns the device with raised
    peaks and what was raised. Datasheet peaks are ceilings and never move
    (``roofline.roof_violations`` names work above them)."""
    if device is None or not device.source.startswith("measured"):
        return device, {}
    bound = float("inf") if recorded_here else FLOOR_RAISE_MAX
    raised = {fam: r for fam, r in rates.items()
              if device.family_peak(fam)[0] < r <= bound * device.family_peak(fam)[0]}
    if not raised:
        return device, {}
    return replace(device, flops={**device.flops, **raised}), raised


def compute_mfu(ranks: list[RankResult], device: DevicePeak | None, mix: dict[str, float],
                flops_per_step: float | None, shapes_recorded: bool,
                step_us: float | None = None, basis: str = "traced steps") -> Mfu:
    """MFU over the step time of the verdict's view (``step_us``: the unprofiled estimate's
    step, or the traced steps' mean when ``None``); ``step_time_basis`` says which."""
    if not step_us:
        step_times = [r.mean_step_time for r in ranks if r.mean_step_time > 0]
        step_us = sum(step_times) / len(step_times) if step_times else None
        basis = "traced steps"
    mfu = _mfu(ranks, device, mix, flops_per_step, shapes_recorded, step_us)
    mfu.step_time_basis = basis
    mfu.dtype_mix = dict(mix)
    if mfu.value is not None:
        mfu.reason += f" ({basis})"
    return mfu


def job_rate(ranks: list[RankResult], flops_per_step: float | None) -> float | None:
    """Model FLOPs per step per rank from the traced steps (None where unknown)."""
    if flops_per_step is not None:
        return flops_per_step
    per_rank = []
    for r in ranks:
        vals = [s.model_flops for s in r.steps if s.model_flops is not None]
        if vals:
            per_rank.append(sum(vals) / len(r.steps))
    return sum(per_rank) / len(per_rank) if per_rank else None


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


def _mix_text(mix: dict[str, float]) -> str:
    return " + ".join(f"{fam} {100 * share:.0f}%" for fam, share in mix.items())


def _mfu(ranks: list[RankResult], device: DevicePeak | None, mix: dict[str, float],
         flops_per_step: float | None, shapes_recorded: bool, step_us: float | None) -> Mfu:
    if device is None:
        return Mfu(None, "not available: unknown device peak (re-read the run with `gpudiag analyze DIR "
                   "--device NAME`, or --peak-tflops and --peak-gbps)", None, "none", None, None, step_us)
    peak, family = mix_peak(device, mix)
    if flops_per_step is not None:
        source = "--flops-per-step"
    else:
        source = "shapes"
        if not shapes_recorded or job_rate(ranks, None) is None:
            return Mfu(None, "not available: the trace has no recorded shapes of matmul/conv/"
                       "attention ops (profile with record_shapes=True, or pass --flops-per-step)",
                       None, "none", family, peak, step_us)
    flops = job_rate(ranks, flops_per_step)
    assert flops is not None
    if not step_us:
        return Mfu(None, "not available: no step time could be measured", flops, source,
                   family, peak, None)
    value = flops / (step_us * 1e-6) / peak
    if value > 1.0:
        # More FLOP/s than the device can do: the peak belongs to another device (a GPU
        # trace whose kernels were stripped, analysed against this CPU, say).
        return Mfu(None, f"not available: the FLOPs in the trace imply {100 * value:.0f}% of "
                   f"the {peak / 1e12:.4g} TFLOP/s peak, so the peak is not the device that "
                   "recorded it; re-read the run with `gpudiag analyze DIR --device NAME` (or "
                   "--peak-tflops/--peak-gbps)",
                   flops, source, family, peak, step_us)
    at = f"{family} peak" if family != MIXED else f"peak of the mix ({_mix_text(mix)})"
    reason = (f"{si(flops, 'FLOP')} per step per rank ({source}) over "
              f"{step_us / 1e3:.3g} ms per step at {peak / 1e12:.4g} TFLOP/s {at}")
    return Mfu(value, reason, flops, source, family, peak, step_us)
