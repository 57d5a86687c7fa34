"""The facade: trace files in, one ``Diagnosis`` out.

Each rank is loaded, analysed and reduced to small partial results before the next one is
loaded, so peak memory is one rank's columns, not the job's. With several ranks and more
than one core, ranks are analysed in worker processes (``rank_pool``), one per core unless
``jobs`` says otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpudiag import __version__
from gpudiag.analyzers.breakdown import gpu_span_breakdown, rank_breakdown, sum_breakdowns
from gpudiag.analyzers.classify import account_for_dilation, account_for_lost_events, classify
from gpudiag.analyzers.communication import collective_acc, finish_collectives
from gpudiag.analyzers.mfu import compute_mfu, note_uncosted
from gpudiag.analyzers.rank_pool import ProgressSink, RankFile, peek, run_ranks, select
from gpudiag.analyzers.roofline import BOUND_MEMORY, RooflineAcc, build_roofline, roof_violations, work_bounds
from gpudiag.analyzers.stragglers import find_stragglers, rank_spreads
from gpudiag.analyzers.trace_loader import (
    KCLASS_COMPUTE,
    RankTrace,
    check_unique_ranks,
    find_trace_files,
    load_rank,
)
from gpudiag.analyzers.trace_select import select_steps
from gpudiag.analyzers.unprofiled import estimate_unprofiled, measure_dilation
from gpudiag.devices import DevicePeak, lookup_device, match_device, user_device
from gpudiag.diagnosis import (
    DIAGNOSIS_SCHEMA_VERSION,
    Bottleneck,
    DeviceInfo,
    Diagnosis,
    Mfu,
    RankResult,
    TimeBreakdown,
    TopItem,
    Verdict,
)
from gpudiag.errors import BadInput, TraceError
from gpudiag.rundir import all_step_times, is_run_dir


@dataclass
class DeviceChoice:
    """How the user asked us to pick the device's peaks."""

    name: str | None = None
    peak_tflops: float | None = None
    peak_gbps: float | None = None
    # Called only for CPU-only traces: returns the measured CPU peak. Kept as a callable so
    # analyzers never touch hardware themselves (collectors.cpu_peak measures it).
    cpu_peak: Callable[[], DevicePeak] | None = None

    def explicit(self) -> DevicePeak | None:
        if self.peak_tflops is not None or self.peak_gbps is not None:
            if self.peak_tflops is None or self.peak_gbps is None:
                raise BadInput("--peak-tflops and --peak-gbps must be given together")
            return user_device(self.peak_tflops, self.peak_gbps, self.name or "user-specified")
        if self.name:
            return lookup_device(self.name)
        return None


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


def _top(acc: dict[str, list[float]], busy: float, n: int = 100) -> list[TopItem]:
    items = sorted(acc.items(), key=lambda kv: -kv[1][1])[:n]
    return [TopItem(name=k, calls=int(c), time_us=t, share=t / busy if busy > 0 else 0.0)
            for k, (c, t) in items]


def analyze_rank(rt: RankTrace, device: DevicePeak | None) -> RankPartial:
    wb = work_bounds(rt, device)
    steps = rank_breakdown(rt, wb)
    total = sum_breakdowns([s.breakdown for s in steps])
    mean_step = total.step_time / len(steps) if steps else 0.0
    result = RankResult(rank=rt.rank, trace=rt.path, steps=steps, total=total,
                        mean_step_time=mean_step, gpu_span=gpu_span_breakdown(rt))
    roof = RooflineAcc()
    roof.add(rt, wb)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    memory_ops: dict[str, float] = defaultdict(float)
    if rt.has_gpu:
        _group(kernels, rt.gpu_name, rt.gpu_dur, rt.names)
        launch_op = _launching_op_names(rt)
        known = launch_op >= 0
        _group(ops, launch_op[known], rt.gpu_dur[known], rt.names)
        # calls are operator calls (distinct External ids), not the kernels they launched
        if known.any():
            pairs = np.unique(np.stack([launch_op[known], rt.gpu_ext[known]]), axis=1)
            ids, calls = np.unique(pairs[0], return_counts=True)
            kernels_per_op = np.bincount(launch_op[known])
            for i, c in zip(ids.tolist(), calls.tolist(), strict=True):
                ops[rt.names[i]][0] += c - int(kernels_per_op[i])
        mem = known & (rt.gpu_class == KCLASS_COMPUTE) & (wb.bound == BOUND_MEMORY)
        for n, d in zip(launch_op[mem].tolist(), rt.gpu_dur[mem].tolist(), strict=False):
            memory_ops[rt.names[n]] += d
    else:
        top = rt.cpu_is_op & (rt.cpu_depth == 0)
        _group(ops, rt.cpu_name[top], rt.cpu_dur[top], rt.names)
        mem = rt.cpu_is_op & (wb.bound == BOUND_MEMORY) & (wb.op_index >= 0)
        for n, d in zip(rt.cpu_name[mem].tolist(), rt.cpu_dur[mem].tolist(), strict=False):
            memory_ops[rt.names[n]] += d
    warnings = list(rt.warnings)
    if not steps:
        warnings.append(f"rank {rt.rank}: the trace has no events to analyse")
    elif not rt.steps:
        warnings.append(f"rank {rt.rank}: no ProfilerStep annotations; the whole trace is "
                        "analysed as one step (profile with a schedule and prof.step())")
    return RankPartial(
        result=result, has_gpu=rt.has_gpu, world_size=rt.world_size,
        device_name=rt.device_name, device_memory=rt.device_memory,
        shapes_recorded=rt.shapes_recorded, roofline=roof, collectives=collective_acc(rt),
        kernels=dict(kernels), ops=dict(ops), memory_ops=dict(memory_ops),
        dataloader_iters=rt.dataloader_iters, warnings=warnings,
        events=(rt.kept_events, rt.dropped_events),
        gpu_events=(rt.kept_gpu_events, rt.dropped_gpu_events),
    )


def _launching_op_names(rt: RankTrace) -> np.ndarray:
    """Per GPU activity, the name of the first CPU event with its External id; -1 if none."""
    out = np.full(rt.gpu_ext.size, -1, dtype=np.int64)
    has = rt.cpu_ext >= 0
    if not has.any() or out.size == 0:
        return out
    ext, first = np.unique(rt.cpu_ext[has], return_index=True)  # first occurrence of each id
    names = rt.cpu_name[has][first]
    k = np.clip(np.searchsorted(ext, rt.gpu_ext), 0, ext.size - 1)
    hit = ext[k] == rt.gpu_ext
    out[hit] = names[k[hit]]
    return out


def _group(acc: dict, name_ids: np.ndarray, dur: np.ndarray, names: list[str]) -> None:
    if name_ids.size == 0:
        return
    uniq, inv = np.unique(name_ids, return_inverse=True)
    t = np.bincount(inv, weights=dur)
    c = np.bincount(inv)
    for u, tt, cc in zip(uniq.tolist(), t.tolist(), c.tolist(), strict=False):
        a = acc[names[u]]
        a[0] += cc
        a[1] += tt


def _trace_device(path_name: str | None, memory: int | None) -> DevicePeak | None:
    if not path_name:
        return None
    dev = match_device(path_name)
    if dev is not None and dev.name.startswith("A100") and memory and memory > 60e9:
        dev = lookup_device("A100-80GB")
    return dev


def _load_and_analyze(path: str, hint: int, device: DevicePeak | None, cpu_device: DevicePeak | None,
                      steps: tuple[int, int] | None,
                      on_bytes: Callable[[int], None] | None = None) -> RankPartial:
    rt = load_rank(Path(path), rank_hint=hint, on_bytes=on_bytes)
    if steps is not None:
        rt = select_steps(rt, *steps)
    dev = device
    if dev is None:
        dev = _trace_device(rt.device_name, rt.device_memory) if rt.has_gpu else cpu_device
    return analyze_rank(rt, dev)


def diagnose(target: str | Path, choice: DeviceChoice | None = None,
             flops_per_step: float | None = None, jobs: int | None = None,
             ranks: list[int] | None = None, steps: tuple[int, int] | None = None,
             progress: ProgressSink | None = None) -> Diagnosis:
    """Analyse a trace file, a folder of rank traces, or a run directory.

    ``ranks`` keeps those ranks' files only, ``steps`` (first, last ProfilerStep number) those
    steps of each rank; ``jobs`` is the number of worker processes (default: one per core).
    The CPU peak (for traces without GPU work) is resolved once, here, before any worker
    starts: every rank is judged against the same ridge point, and workers never benchmark
    the CPU side by side.
    """
    choice = choice or DeviceChoice()
    files = select([peek(p, i) for i, p in enumerate(find_trace_files(Path(target)))], ranks)
    explicit = choice.explicit()
    cpu_device = None
    if explicit is None and choice.cpu_peak is not None and not all(f.has_device for f in files):
        cpu_device = choice.cpu_peak()

    def args(f: RankFile) -> tuple:
        return (str(f.path), f.hint, explicit, cpu_device, steps)

    partials = run_ranks(_load_and_analyze, files, args, jobs, progress)
    if (explicit is None and cpu_device is None and choice.cpu_peak is not None
            and any(not p.has_gpu for p in partials)):
        # a header that named a GPU over a trace without GPU work (rare): measure now, redo those
        cpu_device = choice.cpu_peak()
        redo = [f for f, p in zip(files, partials, strict=True) if not p.has_gpu]
        again = iter(run_ranks(_load_and_analyze, redo, args, jobs))
        partials = [next(again) if not p.has_gpu else p for p in partials]
    check_unique_ranks([(p.result.rank, p.result.trace) for p in partials])
    partials.sort(key=lambda p: p.result.rank)
    run_dir = Path(target)
    timer = _step_timer(run_dir) if is_run_dir(run_dir) else None
    d = assemble(partials, cpu_device, explicit, flops_per_step, [str(f.path) for f in files], timer)
    if is_run_dir(run_dir):
        from gpudiag.analyzers.timeline import run_summary, run_timeline

        d.run = run_summary(run_dir)
        d.timeline = run_timeline(run_dir)
    return d


def _step_timer(run_dir: Path) -> tuple[list[float], list[float]]:
    """(traced, untraced) step seconds of all ranks, pooled: in a synchronous job every rank
    runs at the job's pace, and pooling keeps one slow rank's steps in the reference."""
    traced: list[float] = []
    untraced: list[float] = []
    for st in all_step_times(run_dir):
        traced.extend(st.traced)
        untraced.extend(st.untraced)
    return traced, untraced


def assemble(partials: list[RankPartial], cpu_device: DevicePeak | None, explicit: DevicePeak | None,
             flops_per_step: float | None, sources: list[str],
             timer: tuple[list[float], list[float]] | None = None) -> Diagnosis:
    """One Diagnosis from the ranks' partial results; ``timer`` is the job's own step timer
    (traced, untraced seconds) when the input is a run directory."""
    warnings: list[str] = []
    for p in partials:
        warnings.extend(p.warnings)
    has_gpu = any(p.has_gpu for p in partials)
    trace_dev_name = next((p.device_name for p in partials if p.device_name), None)
    device: DevicePeak | None
    if explicit is not None:
        device = explicit
        kind = "gpu" if has_gpu else "cpu"
    elif has_gpu:
        mem = next((p.device_memory for p in partials if p.device_name), None)
        device = _trace_device(trace_dev_name, mem)
        kind = "gpu"
        if device is None:
            warnings.append(
                f"unknown device {trace_dev_name or '(not recorded in the trace)'}: no peak "
                "FLOP/s or bandwidth, so no MFU and a roofline from kernel names only; pass "
                "--device NAME or --peak-tflops/--peak-gbps"
            )
    else:
        kind = "cpu"
        if trace_dev_name:
            warnings.append(f"no GPU activity in the trace although it names {trace_dev_name}: "
                            "analysed with the CPU as the device")
        else:
            warnings.append("no GPU activity in the trace: analysed with the CPU as the device")
        device = cpu_device
        if device is not None:
            warnings.append(f"CPU peak {device.peak_for('float')[0] / 1e9:.3g} GFLOP/s and "
                            f"{device.bandwidth / 1e9:.3g} GB/s measured on this machine; if "
                            "the trace came from another host pass --peak-tflops/--peak-gbps")
        if explicit is None and any(p.roofline.groups for p in partials) and device is None:
            warnings.append("no CPU peak available: roofline from op names only")

    roof_acc = RooflineAcc()
    for p in partials:
        roof_acc.merge(p.roofline)
    roofline = build_roofline(roof_acc, device)
    warnings.extend(roof_violations(roof_acc, device))
    shapes = any(p.shapes_recorded for p in partials)
    if roofline.method == "kernel-names" and has_gpu:
        if shapes:
            warnings.append("most GPU time could not be attributed to operators with recorded "
                            "shapes (CUDA graphs or custom kernels): compute/memory split comes "
                            "from kernel names")
        else:
            warnings.append("no operator shapes recorded: compute/memory split comes from kernel "
                            "names (profile with record_shapes=True for a roofline)")
    collectives = finish_collectives([p.collectives for p in partials], device if has_gpu else None)
    results = [p.result for p in partials]
    world = next((p.world_size for p in partials if p.world_size), None)
    if world and world > len(results):
        warnings.append(f"{len(results)} of {world} ranks present: job-level numbers describe "
                        "these ranks only")
    stragglers = find_stragglers(results)
    dtype = roof_acc.dominant_dtype()
    mfu = compute_mfu(results, device, dtype, flops_per_step, shapes)

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
    busy = sum(r.total.gpu_busy for r in results)
    dl_iters = sorted({it for p in partials for it in p.dataloader_iters})
    n_steps = max((len(r.steps) if r.steps and r.steps[0].step is not None else 0)
                  for r in results) if results else 0
    dilation = unprofiled = traced_verdict = None
    basis = "profiled-steps"
    if breakdown.step_time > 0:
        top_memory = [k for k, _ in sorted(memory_ops.items(), key=lambda kv: -kv[1])]

        def verdict_of(b: TimeBreakdown, m: Mfu) -> Verdict:
            return classify(b, device_kind=kind, roofline=roofline, mfu=m, collectives=collectives,
                            stragglers=stragglers, n_steps=n_steps, dataloader_iters=dl_iters,
                            top_memory_ops=top_memory)

        verdict = verdict_of(breakdown, mfu)
        dilation = measure_dilation(*timer) if timer is not None else None
        if dilation is not None:
            unprofiled = estimate_unprofiled(breakdown, dilation, kind)
            mfu = compute_mfu(results, device, dtype, flops_per_step, shapes,
                              untraced_step_us=dilation.untraced_step_us)
            traced_verdict = verdict
            verdict = account_for_dilation(verdict_of(unprofiled, mfu), dilation.factor)
            basis = "unprofiled-estimate"
        elif timer is not None:
            warnings.append(f"the step timer holds {len(timer[1])} untraced steps (after the first "
                            "ones): too few to measure the profiler's slowdown; the breakdown, verdict "
                            "and MFU describe the profiled steps (run more steps)")
    else:
        verdict = Verdict(label=Bottleneck.UNKNOWN, confidence=0.0, confidence_level="none",
                          summary="nothing to analyse: the trace holds no timed events",
                          evidence={}, secondary=None, recommendations=[])
        mfu = Mfu(None, "not available: no steps", None, "none", None, None, None)
    mfu = note_uncosted(mfu, roof_acc.uncosted_share())
    kept, lost = (sum(p.events[i] for p in partials) for i in (0, 1))
    gpu_kept, gpu_lost = (sum(p.gpu_events[i] for p in partials) for i in (0, 1))
    verdict = account_for_lost_events(verdict, lost, kept + lost, gpu_lost, gpu_kept + gpu_lost)
    if traced_verdict is not None:
        traced_verdict = account_for_lost_events(traced_verdict, lost, kept + lost, gpu_lost,
                                                 gpu_kept + gpu_lost)
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
        basis=basis, dilation=dilation, unprofiled=unprofiled, traced_verdict=traced_verdict,
        rank_spread=rank_spreads(results),
    )


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


__all__ = ["DeviceChoice", "diagnose", "TraceError"]
