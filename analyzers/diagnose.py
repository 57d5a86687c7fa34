"""The facade: trace files in, one ``Diagnosis`` out.

Each rank is loaded, analysed and reduced to small partial results before the next one is
loaded, so peak memory is one rank's columns, not the job's. With several ranks and more
than one core, ranks are analysed in worker processes (``rank_pool``), one per core unless
``jobs`` says otherwise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpudiag.analyzers.assemble import RankPartial, assemble
from gpudiag.analyzers.autocast_gemms import AutocastGemms, Probe, gemm_work, sizeable, summarise
from gpudiag.analyzers.breakdown import (
    cpu_work,
    gpu_span_breakdown,
    rank_breakdown,
    step_windows,
    sum_breakdowns,
    work_intervals,
)
from gpudiag.analyzers.communication import collective_acc
from gpudiag.analyzers.host_cpu import HostCpu, host_cpu, rows_cpu
from gpudiag.analyzers.host_wait import host_wait, with_waits
from gpudiag.analyzers.job_device import fp32_memory_bytes, trace_device
from gpudiag.analyzers.rank_facts import rank_facts
from gpudiag.analyzers.rank_pool import ProgressSink, RankFile, peek, run_ranks, select
from gpudiag.analyzers.roofline import BOUND_MEMORY, RooflineAcc, work_bounds
from gpudiag.analyzers.syncs import trace_syncs
from gpudiag.analyzers.trace_loader import (
    KCLASS_COMPUTE,
    RankTrace,
    check_unique_ranks,
    find_trace_files,
    load_rank,
)
from gpudiag.analyzers.trace_select import select_steps
from gpudiag.census import SyncCensus
from gpudiag.devices import DevicePeak, lookup_device, user_device
from gpudiag.diagnosis import Diagnosis, HostWait, RankResult
from gpudiag.errors import BadInput, TraceError
from gpudiag.pace import at_own_pace, loads_in_thread
from gpudiag.rundir import is_run_dir, read_bootstrap, read_host_cpu, read_run, read_steps, read_syncs
from gpudiag.steps import WindowSteps, window_steps


@dataclass
class DeviceChoice:
    """How the user asked us to pick the device's peaks."""

    name: str | None = None
    peak_tflops: float | None = None
    peak_gbps: float | None = None
    # Called only for CPU-only traces: returns the measured CPU peak. Kept as a callable so
    # analyzers never touch hardware themselves (collectors.cpu_peak measures it).
    cpu_peak: Callable[[], DevicePeak] | None = None
    # Called with the FLOP/s per dtype family a job ran above the measured CPU peak: a measured
    # peak is a floor, so the collector keeps the higher figure (collectors.cpu_peak.raise_floor).
    peak_floor: Callable[[dict[str, float]], None] | None = None
    # Called with the job's Linear layers and lone GEMM shapes (``autocast_gemms.Probe``): their
    # time as bf16 autocast runs them over fp32's, timed on this machine (collectors.gemm_probe);
    # only for a trace recorded here
    gemm_probe: Callable[[list[Probe]], dict[Probe, float]] | None = None
    # This machine's host name, where the caller measures the CPU peak here: a run directory
    # that names it was recorded on the machine whose peak it is judged against, so a job that
    # ran faster than that peak proves the peak low, whatever the factor (``mfu.raise_measured_peak``).
    host: str | None = None

    def explicit(self) -> DevicePeak | None:
        if self.peak_tflops is not None or self.peak_gbps is not None:
            if self.peak_tflops is None or self.peak_gbps is None:
                raise BadInput("--peak-tflops and --peak-gbps must be given together")
            return user_device(self.peak_tflops, self.peak_gbps, self.name or "user-specified")
        if self.name:
            return lookup_device(self.name)
        return None


def analyze_rank(rt: RankTrace, device: DevicePeak | None) -> RankPartial:
    wb = work_bounds(rt, device)
    cw = cpu_work(rt, wb, device)
    steps = rank_breakdown(rt, wb, cw)
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
            ids, calls = _distinct_pairs_per_first(launch_op[known], rt.gpu_ext[known])
            kernels_per_op = np.bincount(launch_op[known])
            for i, c in zip(ids.tolist(), calls.tolist(), strict=True):
                ops[rt.names[i]][0] += c - int(kernels_per_op[i])
        mem = known & (rt.gpu_class == KCLASS_COMPUTE) & (wb.bound == BOUND_MEMORY)
        _sum_by_name(memory_ops, launch_op[mem], rt.gpu_dur[mem], rt.names)
    else:
        top = rt.cpu_is_op & (rt.cpu_depth == 0)
        _group(ops, rt.cpu_name[top], rt.cpu_dur[top], rt.names)
        mem = rt.cpu_is_op & (wb.bound == BOUND_MEMORY) & (wb.op_index >= 0)
        _sum_by_name(memory_ops, rt.cpu_name[mem], rt.cpu_dur[mem], rt.names)
    warnings = list(rt.warnings)
    if not steps:
        warnings.append(f"rank {rt.rank}: the trace has no events to analyse")
    elif not rt.steps:
        warnings.append(f"rank {rt.rank}: no ProfilerStep annotations; the whole trace is "
                        "analysed as one step (profile with a schedule and prof.step())")
    return RankPartial(
        result=result, has_gpu=rt.has_gpu, world_size=rt.world_size,
        device_name=rt.device_name, device_memory=rt.device_memory,
        shapes_recorded=rt.shapes_recorded, roofline=roof,
        collectives=collective_acc(rt, work_intervals(rt, cw), *step_windows(rt)[:2]),
        kernels=dict(kernels), ops=dict(ops), memory_ops=dict(memory_ops),
        dataloader_iters=rt.dataloader_iters, warnings=warnings,
        events=(rt.kept_events, rt.dropped_events),
        gpu_events=(rt.kept_gpu_events, rt.dropped_gpu_events), facts=rank_facts(rt, wb, cw),
        syncs=trace_syncs(rt),
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


def _distinct_pairs_per_first(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each distinct ``first``, how many distinct ``second`` go with it), sorted by ``first``.

    ``np.unique(..., axis=1)`` gives the same, but it sorts the pairs as opaque structured
    records: 60 ms per rank of the 8-rank benchmark, half of the rank's analysis, against
    ~3 ms for two integer sort keys.
    """
    order = np.lexsort((second, first))
    f, s = first[order], second[order]
    new = np.ones(f.size, dtype=bool)
    new[1:] = (f[1:] != f[:-1]) | (s[1:] != s[:-1])
    return np.unique(f[new], return_counts=True)


def _sum_by_name(acc: dict[str, float], name_ids: np.ndarray, dur: np.ndarray,
                 names: list[str]) -> None:
    """``acc[name] += dur`` per event, names in order of first appearance (ties in a later
    sort by time keep that order). ``np.bincount`` adds each name's durations in event order,
    as the per-event loop it replaces did, so the sums are the same to the last bit."""
    if name_ids.size == 0:
        return
    uniq, first, inv = np.unique(name_ids, return_index=True, return_inverse=True)
    sums = np.bincount(inv, weights=dur)
    for k in np.argsort(first, kind="stable").tolist():
        acc[names[int(uniq[k])]] += float(sums[k])


def _group(acc: dict[str, list[float]], name_ids: np.ndarray, dur: np.ndarray, names: list[str]) -> None:
    if name_ids.size == 0:
        return
    uniq, inv = np.unique(name_ids, return_inverse=True)
    t = np.bincount(inv, weights=dur)
    c = np.bincount(inv)
    for u, tt, cc in zip(uniq.tolist(), t.tolist(), c.tolist(), strict=False):
        a = acc[names[u]]
        a[0] += cc
        a[1] += tt


def _load_and_analyze(path: str, hint: int, device: DevicePeak | None, cpu_device: DevicePeak | None,
                      steps: tuple[int, int] | None,
                      on_bytes: Callable[[int], None] | None = None) -> RankPartial:
    rt = load_rank(Path(path), rank_hint=hint, on_bytes=on_bytes)
    if steps is not None:
        rt = select_steps(rt, *steps)
    dev = device
    if dev is None:
        dev = trace_device(rt.device_name, rt.device_memory) if rt.has_gpu else cpu_device
    return analyze_rank(rt, dev)


@dataclass
class _RunInputs:
    """What a run directory adds to its traces: the job's own step timer around the traced
    window, its loader workers, its processes' cores, the wait for a core, the host syncs."""

    windows: list[WindowSteps] | None = None
    workers: list[int] | None = None
    host: HostCpu | None = None
    wait: HostWait | None = None
    census: dict[int, SyncCensus] | None = None

    @staticmethod
    def read(run_dir: Path, partials: list[RankPartial]) -> _RunInputs:
        """Read them; where the wait was measured, each rank's traced steps take it (the
        machine's part, and on a GPU its host gaps' wait)."""
        census = read_syncs(run_dir, _cwd(run_dir))
        boot = read_bootstrap(run_dir)
        steps_read = read_steps(run_dir, boot)
        samples = read_host_cpu(run_dir)
        # the job's own pace: every step less the part other processes took (gpudiag.pace), on a
        # GPU never below the device's busy time per traced step
        own = at_own_pace(steps_read, samples, boot, device_busy_s([p.result for p in partials if p.has_gpu]))
        windows = window_steps(run_dir, boot=boot, steps=own)
        workers = [w for m in boot.values() for w in m.dataloader_workers]
        host = host_cpu(samples, steps_read, boot)
        wait = host_wait(windows, own, host, samples, boot)
        if host is None and any(workers):  # a short job: its workers' CPU from the step rows
            host = rows_cpu(steps_read, boot)
        if wait is not None:  # the traced steps hold the machine's part, a GPU's host gaps the wait
            traced = {w.rank: w.traced_rows for w in windows}
            for p in partials:
                p.result = with_waits(p.result, traced.get(p.result.rank, []), wait,
                                      "gpu" if p.has_gpu else "cpu", loads_in_thread(boot.get(p.result.rank)))
        return _RunInputs(windows, workers, host, wait, census)


def device_busy_s(results: Sequence[RankResult]) -> dict[int, float]:
    """Per rank of a GPU job, the median of its traced steps' device busy time (seconds): what
    no wait of the host for a core can shorten a step below (``gpudiag.pace.own_step_seconds``)."""
    return {r.rank: statistics.median(s.breakdown.gpu_busy for s in r.steps) / 1e6
            for r in results if r.steps}


def diagnosis_device_busy_s(d: Diagnosis) -> dict[int, float]:
    """``device_busy_s`` of a finished diagnosis: its ranks where it ran on a GPU, else none (a
    CPU's own pace has no device floor). ``gpudiag diff`` and the live signal read it."""
    return device_busy_s(d.ranks) if d.device is not None and d.device.kind == "gpu" else {}


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

    def args(f: RankFile) -> tuple[object, ...]:
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
    run = _RunInputs.read(run_dir, partials) if is_run_dir(run_dir) else _RunInputs()
    here = cpu_device is not None and _recorded_on(run_dir, choice.host)
    d = assemble(partials, cpu_device, explicit, flops_per_step, [str(f.path) for f in files],
                 run.windows, run.workers, run.host, run.wait, run.census, recorded_here=here,
                 autocast=_autocast(partials, cpu_device, choice) if here else None)
    if d.device.source.startswith("measured") and cpu_device is not None and choice.peak_floor:
        raised = {f: v for f, v in d.device.peak_flops.items() if v > cpu_device.flops.get(f, 0.0)}
        if raised:
            choice.peak_floor(raised)
    if is_run_dir(run_dir):
        from gpudiag.analyzers.timeline import run_summary, run_timeline

        d.run = run_summary(run_dir)
        d.timeline = run_timeline(run_dir)
    return d


def _autocast(partials: list[RankPartial], cpu_device: DevicePeak | None,
              choice: DeviceChoice) -> AutocastGemms | None:
    """The job's fp32 layers and GEMMs timed in bf16 as autocast runs them, on the CPU that ran
    them: only where its bf16 peak beats fp32's (else lower precision is not advised at all)
    and the job ran on the CPU."""
    if (choice.gemm_probe is None or cpu_device is None or any(p.has_gpu for p in partials)
            or cpu_device.flops.get("bf16", 0.0) <= cpu_device.flops.get("fp32", 0.0)):
        return None
    acc = RooflineAcc()
    for p in partials:
        acc.merge(p.roofline)
    ridge = cpu_device.ridge("float")
    works = sizeable(gemm_work(acc.groups, ridge), acc.cb_time + acc.mb_time)
    if not works:
        return None
    return summarise(works, choice.gemm_probe([w.probe for w in works]), acc.cb_time,
                     acc.mb_time, fp32_memory_bytes(acc, cpu_device, 1) or 0.0)


def _recorded_on(run_dir: Path, host: str | None) -> bool:
    """Whether the run directory was written on ``host`` (its run.json's host name)."""
    if host is None or not is_run_dir(run_dir):
        return False
    try:
        return read_run(run_dir).host == host
    except BadInput:
        return False


def _cwd(run_dir: Path) -> str | None:
    """The job's working directory (run.json), against which call sites are shown."""
    try:
        return read_run(run_dir).cwd
    except BadInput:
        return None


__all__ = ["DeviceChoice", "diagnose", "TraceError"]
