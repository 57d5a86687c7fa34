"""One Diagnosis from the ranks' partial results: the device, the view, the verdict, the advice.

``diagnose`` loads and analyses each rank into a small ``RankPartial``; this joins them. The
order matters and is walkable: the device and its peaks (a measured peak raised where the job
outran it), the job's breakdown, the view of the step the verdict describes (``step_view``),
MFU in that view, the verdict and its deductions, the collectives table in that view, and the
advice with what each fix is predicted to be worth (``advice``, ``whatif``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from gpudiag import __version__
from gpudiag.analyzers.advice import AdviceInputs, recommend
from gpudiag.analyzers.breakdown import sum_breakdowns
from gpudiag.analyzers.checkpoint import saves
from gpudiag.analyzers.classify import (
    HOST_NOTABLE,
    lost_events,
    refuse_for_lost_gpu_events,
    with_deductions,
)
from gpudiag.analyzers.comm_cost import comm_cpu, with_contention
from gpudiag.analyzers.communication import finish_collectives, per_step
from gpudiag.analyzers.compile_facts import CompileFacts
from gpudiag.analyzers.host_cpu import HostCpu, loader_busy
from gpudiag.analyzers.host_wait import unprofiled_waits
from gpudiag.analyzers.mfu import compute_mfu, dtype_mix, note_uncosted, raise_measured_peak
from gpudiag.analyzers.own_pace import with_wall
from gpudiag.analyzers.rank_facts import RankFacts
from gpudiag.analyzers.roofline import RooflineAcc, build_roofline, roof_violations
from gpudiag.analyzers.step_view import PROFILED, StepView, choose_view, traced_noise, verdicts
from gpudiag.analyzers.stragglers import find_stragglers, rank_spreads
from gpudiag.analyzers.syncs import TraceSyncs, mean_trace_syncs, sync_report
from gpudiag.analyzers.syncs import evidence as sync_evidence
from gpudiag.analyzers.traits import job_traits
from gpudiag.analyzers.unprofiled import CpuEvents
from gpudiag.census import SyncCensus
from gpudiag.devices import DTYPE_FAMILY, DevicePeak, lookup_device, match_device
from gpudiag.diagnosis import (
    DIAGNOSIS_SCHEMA_VERSION,
    Bottleneck,
    DeviceInfo,
    Diagnosis,
    HostWait,
    Mfu,
    RankResult,
    TimeBreakdown,
    TopItem,
    Verdict,
)
from gpudiag.steps import WindowSteps


@dataclass
class RankPartial:
    """What survives of one rank after its columns are dropped (picklable, small)."""

    result: RankResult
    has_gpu: bool
    world_size: int | None
    device_name: str | None
    device_memory: int | None
    shapes_recorded: bool
    roofline: RooflineAcc
    collectives: dict
    kernels: dict[str, list[float]]
    ops: dict[str, list[float]]
    memory_ops: dict[str, float]
    dataloader_iters: list[str]
    warnings: list[str] = field(default_factory=list)
    # (kept, dropped) timed events, all and GPU only: what the trace lost lowers the confidence
    events: tuple[int, int] = (0, 0)
    gpu_events: tuple[int, int] = (0, 0)
    facts: RankFacts = field(default_factory=RankFacts)
    syncs: TraceSyncs = field(default_factory=TraceSyncs)  # the traced steps' sync events


def _top(acc: dict[str, list[float]], busy: float, n: int = 100) -> list[TopItem]:
    items = sorted(acc.items(), key=lambda kv: -kv[1][1])[:n]
    return [TopItem(name=k, calls=int(c), time_us=t, share=t / busy if busy > 0 else 0.0)
            for k, (c, t) in items]


def trace_device(path_name: str | None, memory: int | None) -> DevicePeak | None:
    if not path_name:
        return None
    dev = match_device(path_name)
    if dev is not None and dev.name.startswith("A100") and memory and memory > 60e9:
        dev = lookup_device("A100-80GB")
    return dev


def assemble(partials: list[RankPartial], cpu_device: DevicePeak | None, explicit: DevicePeak | None,
             flops_per_step: float | None, sources: list[str],
             windows: list[WindowSteps] | None = None, workers: list[int] | None = None,
             host: HostCpu | None = None, wait: HostWait | None = None,
             census: dict[int, SyncCensus] | None = None, recorded_here: bool = False) -> Diagnosis:
    """One Diagnosis from the ranks' partial results; ``windows`` are the job's own step timer
    around the traced window when the input is a run directory (``steps.window_steps``);
    ``wait``: the training thread's wait for a core (``host_wait``), already charged to a GPU
    rank's traced steps, here to the unprofiled estimate; ``census``: per rank, the host syncs
    the bootstrap saw in one step (``syncs``); ``recorded_here``: a run directory this host wrote,
    whose rates may raise a measured peak without bound (``mfu.raise_measured_peak``)."""
    warnings: list[str] = []
    for p in partials:
        warnings.extend(p.warnings)
    has_gpu = any(p.has_gpu for p in partials)
    trace_dev_name = next((p.device_name for p in partials if p.device_name), None)
    device, kind = _pick_device(partials, cpu_device, explicit, has_gpu, trace_dev_name, warnings)

    roof_acc = RooflineAcc()
    for p in partials:
        roof_acc.merge(p.roofline)
    # only a trace recorded here can prove this machine faster (one that names a GPU cannot)
    device, raised = raise_measured_peak(device, roof_acc.model_rates() if not trace_dev_name else {},
                                         recorded_here and not has_gpu)
    shapes = any(p.shapes_recorded for p in partials)
    collectives = finish_collectives([p.collectives for p in partials], device if has_gpu else None)
    results = [p.result for p in partials]
    world = next((p.world_size for p in partials if p.world_size), None)
    if world and world > len(results):
        warnings.append(f"{len(results)} of {world} ranks present: job-level numbers describe "
                        "these ranks only")
    stragglers = find_stragglers(results)
    mix = dtype_mix(dict(roof_acc.dtype_flops))

    with_steps = [r for r in results if r.steps]
    if with_steps:
        per_rank = [sum_breakdowns([s.breakdown for s in r.steps], divide_by=len(r.steps))
                    for r in with_steps]
        breakdown = sum_breakdowns(per_rank, divide_by=len(per_rank))
    else:
        breakdown = TimeBreakdown()
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    memory_ops: dict[str, float] = defaultdict(float)
    for p in partials:
        for src, dst in ((p.kernels, kernels), (p.ops, ops)):
            for k, (c, t) in src.items():
                dst[k][0] += c
                dst[k][1] += t
        for k, t in p.memory_ops.items():
            memory_ops[k] += t
    # top items' shares: of device busy time on a GPU; of operator time on the CPU (the
    # breakdown's busy time leaves out tiny ops and stalls, which the operator totals include)
    busy = (sum(r.total.gpu_busy for r in results) if has_gpu
            else sum(t for _, t in ops.values()))
    around = [r for w in windows or [] if w.rank == min(x.rank for x in windows or [w])
              for r in (*w.before_rows, *w.after_rows)]
    traits = job_traits([p.facts.traits for p in partials], workers, host, loader_busy(around))
    n_steps = max((len(r.steps) if r.steps and r.steps[0].step is not None else 0)
                  for r in results) if results else 0
    view = None
    traced_verdict = None
    syncs = None
    if breakdown.step_time > 0:
        facts = [p.facts for p in partials]
        events = CpuEvents.mean([f.cpu_events for f in facts])
        view = choose_view(breakdown, results, windows, kind, events)
        if view.unprofiled is not None:
            # a GPU's from the reference steps' own wait; the CPU's are its stalls
            est = unprofiled_waits(view.unprofiled, wait, kind)
            view = replace(view, unprofiled=est,
                           breakdown=est if view.breakdown is view.unprofiled else view.breakdown)
        cc = comm_cpu(windows) if kind == "cpu" else None
        slowed = (sum(f.comm_slowed_us for f in facts) / len(facts),
                  sum(f.comm_slowed_calls for f in facts) / len(facts))
        if kind == "cpu" and (cc is not None or slowed[1] > 0):
            # gloo's threads share the ranks' cores: what they took is communication's
            breakdown = with_contention(breakdown, cc and cc.traced_us, traits, len(partials), *slowed)
            if view.unprofiled is not None:
                est = with_contention(view.unprofiled, cc and cc.untraced_us, traits, len(partials),
                                      *slowed, traced=breakdown)
                view = replace(view, unprofiled=est,
                               breakdown=est if view.breakdown is view.unprofiled else view.breakdown)
            else:
                view = replace(view, breakdown=breakdown)
        warnings.extend(view.warnings)
        mfu = _mfu_at_own_pace(results, device, mix, flops_per_step, shapes, view, wait)
        if not trace_dev_name:
            device, mfu, more = _job_floor(device, mfu, mix, results, flops_per_step, shapes, view, wait,
                                           recorded_here and not has_gpu)
            raised.update(more)
        roofline = build_roofline(roof_acc, device)
        traced_mfu = compute_mfu(results, device, mix, flops_per_step, shapes)
        verdict, traced_verdict = verdicts(
            view, breakdown, device_kind=kind, roofline=roofline, mfu=mfu, traced_mfu=traced_mfu,
            n_steps=n_steps, traced_noise_=traced_noise(results, windows), events=events)
        syncs = sync_report(min(census.items())[1] if census else None,
                            mean_trace_syncs([p.syncs for p in partials]), kind, view.breakdown,
                            breakdown)
        if syncs is not None:
            verdict = replace(verdict, evidence={**verdict.evidence, **sync_evidence(syncs)})
        steps_summed = sum(len(r.steps) for r in results)
        collectives = per_step(collectives, [p.collectives for p in partials], steps_summed,
                               view.breakdown.comm_total, view.breakdown.comm_exposed)
        top_memory = [k for k, _ in sorted(memory_ops.items(), key=lambda kv: -kv[1])]
        mem = sum(f.memory_bound_us for f in facts)
        saved = sum(f.fusion_saves_us for f in facts)
        advised = recommend(AdviceInputs(
            view=view.breakdown, device_kind=kind, device_peaks=dict(device.flops) if device else {},
            traits=traits, mfu=mfu, roofline=roofline, collectives=collectives, stragglers=stragglers,
            top_memory_ops=top_memory, fusion_saved_share=saved / mem if mem > 0 and saved > 0 else None,
            fp32_memory_bytes=_fp32_memory_bytes(roof_acc, device, sum(len(r.steps) for r in results)),
            bandwidth=device.bandwidth if device else 0.0, host_wait=wait, syncs=syncs,
            compile_facts=CompileFacts.mean([f.compile for f in facts]), traced=breakdown,
            ranks=len(partials), steps_per_rank=steps_summed // max(len(results), 1),
            backward_us=_backward(facts, view.breakdown, breakdown),
            label=verdict.label,
            tie_with=verdict.tie_with, saves=saves(windows)))
        verdict = replace(verdict, recommendations=advised.advised, not_advised=advised.not_advised)
    else:
        roofline = build_roofline(roof_acc, device)
        verdict = Verdict(label=Bottleneck.UNKNOWN, confidence=0.0, confidence_level="none",
                          summary="nothing to analyse: the trace holds no timed events",
                          evidence={}, secondary=None, recommendations=[])
        mfu = Mfu(None, "not available: no steps", None, "none", None, None, None)
    warnings.extend(roof_violations(roof_acc, device))
    if roofline.method == "kernel-names" and has_gpu:
        if shapes:
            warnings.append("most GPU time could not be attributed to operators with recorded "
                            "shapes (CUDA graphs or custom kernels): compute/memory split comes "
                            "from kernel names")
        else:
            warnings.append("no operator shapes recorded: compute/memory split comes from kernel "
                            "names (profile with record_shapes=True for a roofline)")
    unsplit = kind == "gpu" and wait is not None and not wait.recorded
    if unsplit and breakdown.fraction("host_overhead") >= HOST_NOTABLE:  # worth splitting there
        warnings.append(wait.note)
    if breakdown.host_stalled > 0 and kind == "cpu":
        warnings.append(f"{breakdown.host_stalled / 1e3:.3g} ms per traced step the OS ran other work "
                        "while an operator of the job waited (operators 20x slower than the median of "
                        "their kind: a busy machine): host time, shown apart from the job's own "
                        "overhead; no verdict or prediction counts it as overhead a fix removes")
    for fam, rate in raised.items():
        warnings.append(f"the job ran {fam} at {rate / 1e9:.4g} GFLOP/s, above the measured peak: a "
                        "measured peak is a floor, so it is raised to that")
    mfu = note_uncosted(mfu, roof_acc.uncosted_share())
    kept, lost = (sum(p.events[i] for p in partials) for i in (0, 1))
    gpu_kept, gpu_lost = (sum(p.gpu_events[i] for p in partials) for i in (0, 1))
    lost_cost = lost_events(lost, kept + lost)
    verdict = refuse_for_lost_gpu_events(with_deductions(verdict, lost_cost), gpu_lost,
                                         gpu_kept + gpu_lost)
    if traced_verdict is not None:
        traced_verdict = with_deductions(traced_verdict, lost_cost)
    if verdict.label is Bottleneck.UNKNOWN and gpu_lost:
        mfu = Mfu(None, "not available: the trace lost most of its GPU events", None, "none", None,
                  None, None)
    dev_info = DeviceInfo(
        name=device.name if device else (trace_dev_name or ("CPU" if kind == "cpu" else "unknown")),
        source=device.source if device else "unknown", kind=kind,
        peak_flops=dict(device.flops) if device else {},
        bandwidth=device.bandwidth if device else 0.0, trace_device_name=trace_dev_name,
    )
    return Diagnosis(
        schema_version=DIAGNOSIS_SCHEMA_VERSION, gpudiag_version=__version__, sources=sources,
        device=dev_info, world_size=world, ranks=results, breakdown=breakdown, verdict=verdict,
        mfu=mfu, roofline=roofline, communication=collectives, stragglers=stragglers,
        top_kernels=_top(kernels, busy), top_ops=_top(ops, busy), warnings=_dedupe(warnings),
        basis=view.basis if view else PROFILED, dilation=view.dilation if view else None,
        unprofiled=view.unprofiled if view else None, traced_verdict=traced_verdict, traits=traits,
        rank_spread=rank_spreads(results), host_wait=wait, syncs=syncs,
    )


def _backward(facts: list[RankFacts], view: TimeBreakdown, traced: TimeBreakdown) -> float | None:
    """The backward's time per step in the view (the ranks' mean, brought to the view's pace by
    the compute's ratio); None where a rank's trace does not tell it apart."""
    times = [f.backward_us for f in facts]
    if not times or any(t is None for t in times):
        return None
    k = view.compute / traced.compute if traced.compute > 0 else 1.0
    return sum(times) / len(times) * k


def _fp32_memory_bytes(acc: RooflineAcc, device: DevicePeak | None, steps: int) -> float | None:
    """Bytes per (rank, step) moved by memory-bound fp32 operators (below their ridge point)."""
    if device is None or steps <= 0 or not acc.groups:
        return None
    total = 0.0
    for (_op, _shape, dt), (_calls, flops, nbytes, _t) in acc.groups.items():
        fp32 = DTYPE_FAMILY.get(dt.lower(), "fp32") == "fp32"
        if nbytes > 0 and fp32 and flops / nbytes < device.ridge(dt):
            total += nbytes
    return total / steps


def _pick_device(partials: list[RankPartial], cpu_device: DevicePeak | None,
                 explicit: DevicePeak | None, has_gpu: bool, trace_dev_name: str | None,
                 warnings: list[str]) -> tuple[DevicePeak | None, str]:
    """The device whose peaks judge the job, and its kind; warnings say where they came from."""
    if explicit is not None:
        return explicit, "gpu" if has_gpu else "cpu"
    if has_gpu:
        mem = next((p.device_memory for p in partials if p.device_name), None)
        device = trace_device(trace_dev_name, mem)
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
    elif any(p.roofline.groups for p in partials):
        warnings.append("no CPU peak available: roofline from op names only")
    return cpu_device, "cpu"


def _mfu_at_own_pace(results: list[RankResult], device: DevicePeak | None, mix: dict[str, float],
                     flops_per_step: float | None, shapes: bool, view: StepView,
                     wait: HostWait | None) -> Mfu:
    """MFU over the view's step at the job's own pace (less ``host_stalled``: what other
    processes took), with the wall-clock MFU beside it (``own_pace.with_wall``)."""
    b = view.breakdown
    own = compute_mfu(results, device, mix, flops_per_step, shapes, b.step_time - b.host_stalled,
                      view.mfu_basis)
    wall = compute_mfu(results, device, mix, flops_per_step, shapes, b.step_time, view.mfu_basis)
    return with_wall(own, wall, b, wait.recorded if wait is not None else None)


def _job_floor(device: DevicePeak | None, mfu: Mfu, mix: dict[str, float], results: list[RankResult],
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
    return device, _mfu_at_own_pace(results, device, mix, flops_per_step, shapes, view, wait), raised


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


