"""The device whose peaks judge a job, and its MFU against them at the job's own pace.

Where the peaks come from matters to every number after them, so each choice leaves a warning
that says it: the device asked for, the one the trace names (an A100 with over 60 GB is the
80 GB part), or this machine's CPU measured here, a floor raised where the job outran it.
"""

from __future__ import annotations

from gpudiag.analyzers.mfu import compute_mfu, raise_measured_peak
from gpudiag.analyzers.own_pace import with_wall
from gpudiag.analyzers.roofline import RooflineAcc
from gpudiag.analyzers.step_view import UNPROFILED, StepView, traced_step_floor
from gpudiag.devices import DTYPE_FAMILY, DevicePeak, lookup_device, match_device
from gpudiag.diagnosis import HostWait, Mfu, RankResult


def trace_device(path_name: str | None, memory: int | None) -> DevicePeak | None:
    if not path_name:
        return None
    dev = match_device(path_name)
    if dev is not None and dev.name.startswith("A100") and memory and memory > 60e9:
        dev = lookup_device("A100-80GB")
    return dev


def fp32_memory_bytes(acc: RooflineAcc, device: DevicePeak | None, steps: int) -> float | None:
    """Bytes per (rank, step) moved by memory-bound fp32 operators (below their ridge point)."""
    if device is None or steps <= 0 or not acc.groups:
        return None
    total = 0.0
    for (_op, _shape, dt), (_calls, flops, nbytes, _t) in acc.groups.items():
        fp32 = DTYPE_FAMILY.get(dt.lower(), "fp32") == "fp32"
        if nbytes > 0 and fp32 and flops / nbytes < device.ridge(dt):
            total += nbytes
    return total / steps


def pick_device(cpu_device: DevicePeak | None, explicit: DevicePeak | None, has_gpu: bool,
                trace_dev_name: str | None, trace_dev_memory: int | None, op_rates: bool,
                warnings: list[str]) -> tuple[DevicePeak | None, str]:
    """The device whose peaks judge the job, and its kind; warnings say where they came from.
    ``trace_dev_memory``: the memory of the device the trace names; ``op_rates``: the trace
    timed costed operators (a roofline from their names without a CPU peak)."""
    if explicit is not None:
        return explicit, "gpu" if has_gpu else "cpu"
    if has_gpu:
        device = trace_device(trace_dev_name, trace_dev_memory)
        if device is None:
            warnings.append(
                f"unknown device {trace_dev_name or '(not recorded in the trace)'}: no peak "
                "FLOP/s or bandwidth, so no MFU and a roofline from kernel names only; pass "
                "--device NAME or --peak-tflops/--peak-gbps to `gpudiag analyze`"
            )
        return device, "gpu"
    if trace_dev_name:
        warnings.append(f"no GPU activity in the trace although it names {trace_dev_name}: "
                        "analysed with the CPU as the device")
    else:
        warnings.append("no GPU activity in the trace: analysed with the CPU as the device")
    if cpu_device is not None:
        peaks = ", ".join(f"{f} {v / 1e9:.3g}" for f, v in cpu_device.flops.items())
        warnings.append(f"CPU peaks (GFLOP/s) {peaks} and {cpu_device.bandwidth / 1e9:.3g} GB/s "
                        "measured on this machine; if the trace came from another host, give "
                        "`gpudiag analyze` --peak-tflops/--peak-gbps")
    elif op_rates:
        warnings.append("no CPU peak available: roofline from op names only")
    return cpu_device, "cpu"


# What each doubt about the step MFU divides by takes from its confidence (``mfu_confidence``).
# The traced steps are the profiler's (dilated, or held to a side of the window where the
# reference disagreed), so MFU there is a bound, not the job's figure; a step without its split
# holds other processes' time; the step's own spread (half the IQR over the median) is taken
# as it is, up to MFU_NOISE_MAX.
MFU_TRACED_DOUBT = 0.3
MFU_NOT_SPLIT_DOUBT = 0.3
MFU_NOISE_MAX = 0.3


def mfu_confidence(mfu: Mfu, view: StepView, recorded: bool | None) -> float | None:
    """How far the MFU can be trusted, 0..1: 1 less the doubts about the step it divides by (the
    FLOPs are the trace's shapes or the job's own figure, and the peak the device's, in every
    case where there is a value). None without a value."""
    if mfu.value is None:
        return None
    doubt = min(MFU_NOISE_MAX, view.noise or 0.0)
    if view.basis != UNPROFILED:
        doubt += MFU_TRACED_DOUBT
    if recorded is False:
        doubt += MFU_NOT_SPLIT_DOUBT
    return round(max(0.0, 1.0 - doubt), 3)


def mfu_at_own_pace(results: list[RankResult], device: DevicePeak | None, mix: dict[str, float],
                     flops_per_step: float | None, shapes: bool, view: StepView,
                     wait: HostWait | None) -> Mfu:
    """MFU over the view's step at the job's own pace (less ``host_stalled``: what other
    processes took), with the wall-clock MFU beside it (``own_pace.with_wall``)."""
    b = view.breakdown
    floor = traced_step_floor(view)
    held = floor if floor is not None and b.own_step < floor else None
    own = compute_mfu(results, device, mix, flops_per_step, shapes, held or b.own_step, view.mfu_basis)
    wall = compute_mfu(results, device, mix, flops_per_step, shapes, b.step_time, view.mfu_basis)
    traced = wait.traced_machine_us if wait is not None and view.basis != UNPROFILED else None
    out = with_wall(own, wall, b, wait.recorded if wait is not None else None, traced)
    if held is not None and out.value is not None:
        out.reason += (f"; held to {held / 1e3:.3g} ms, the faster side of the untraced steps "
                       f"around the window: the traced steps read {b.own_step / 1e3:.3g} ms at the "
                       "job's own pace, faster than the job ran unobserved, which the profiler cannot cause")
    out.confidence = mfu_confidence(out, view, wait.recorded if wait is not None else None)
    return out


def job_floor(device: DevicePeak | None, mfu: Mfu, mix: dict[str, float], results: list[RankResult],
               flops_per_step: float | None, shapes: bool, view: StepView, wait: HostWait | None,
               recorded_here: bool = False) -> tuple[DevicePeak | None, Mfu, dict[str, float]]:
    """A job whose model FLOPs per step over its step time exceed a measured peak (one dtype
    family) proves the machine does at least that: the peak is raised and MFU recomputed."""
    if (mfu.value is not None or device is None or not device.source.startswith("measured")
            or len(mix) > 1 or not mfu.flops_per_step or not mfu.step_time_us):
        return device, mfu, {}
    family = next(iter(mix), "fp32")
    device, raised = raise_measured_peak(
        device, {family: mfu.flops_per_step / (mfu.step_time_us * 1e-6)}, recorded_here)
    if not raised:
        return device, mfu, {}
    return device, mfu_at_own_pace(results, device, mix, flops_per_step, shapes, view, wait), raised
