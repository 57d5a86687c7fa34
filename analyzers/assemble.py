"""One Diagnosis from the ranks' partial results: the device, the view, the verdict, the advice.

``diagnose`` loads and analyses each rank into a small ``RankPartial``; this joins them. The
order matters and is walkable, one named step each: the device and its peaks (``job_device``: a
measured peak raised where the job outran it), the job's breakdown, the view of the step the
verdict describes (``step_view``), MFU in that view, the verdict and its deductions, the
collectives table in that view, and the advice with what each fix is predicted to be worth
(``advice``, ``whatif``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

from gpudiag import __version__
from gpudiag.analyzers import blocked, loader_cores, sync_fed, whatif
from gpudiag.analyzers.advice import recommend
from gpudiag.analyzers.advice_inputs import AdviceInputs
from gpudiag.analyzers.autocast_gemms import AutocastGemms
from gpudiag.analyzers.breakdown import sum_breakdowns
from gpudiag.analyzers.checkpoint import saves
from gpudiag.analyzers.classify import (
    HOST_NOTABLE,
    STALLED_NOTED,
    host_cause_of,
    lost_events,
    refuse_for_lost_gpu_events,
    with_deductions,
)
from gpudiag.analyzers.comm_cost import comm_cpu, with_contention
from gpudiag.analyzers.communication import Acc, finish_collectives, per_step
from gpudiag.analyzers.compile_facts import CompileFacts
from gpudiag.analyzers.host_cpu import HostCpu, loader_busy, workers_busy
from gpudiag.analyzers.host_wait import unprofiled_waits
from gpudiag.analyzers.job_device import fp32_memory_bytes, job_floor, mfu_at_own_pace, pick_device
from gpudiag.analyzers.mfu import compute_mfu, dtype_mix, note_uncosted, raise_measured_peak
from gpudiag.analyzers.own_pace import stalls_owner, untraced_wall_us
from gpudiag.analyzers.page_faults import faults
from gpudiag.analyzers.rank_facts import RankFacts
from gpudiag.analyzers.roofline import RooflineAcc, build_roofline, roof_violations
from gpudiag.analyzers.step_tail import tail
from gpudiag.analyzers.step_tail import text as tail_text
from gpudiag.analyzers.step_view import PROFILED, StepView, choose_view, traced_noise, verdicts
from gpudiag.analyzers.stragglers import find_stragglers, rank_spreads
from gpudiag.analyzers.syncs import TraceSyncs, mean_trace_syncs, sync_report
from gpudiag.analyzers.syncs import evidence as sync_evidence
from gpudiag.analyzers.traits import job_traits
from gpudiag.analyzers.unprofiled import CpuEvents
from gpudiag.census import SyncCensus
from gpudiag.devices import DevicePeak
from gpudiag.diagnosis import (
    DIAGNOSIS_SCHEMA_VERSION,
    Bottleneck,
    CollectiveStats,
    DeviceInfo,
    Diagnosis,
    HostWait,
    JobTraits,
    Mfu,
    RankResult,
    Roofline,
    Stragglers,
    SyncReport,
    TimeBreakdown,
    TopItem,
    Verdict,
)
from gpudiag.steps import WindowSteps
from gpudiag.units import ms


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
    collectives: dict[str, Acc]
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


@dataclass
class _Job:
    """What every step of ``assemble`` reads: the ranks' partials and the job's own inputs."""

    partials: list[RankPartial]
    results: list[RankResult]
    kind: str  # "gpu" or "cpu": the device that judges the job
    has_gpu: bool
    trace_dev_name: str | None
    flops_per_step: float | None
    shapes: bool  # any rank recorded operator shapes
    windows: list[WindowSteps] | None
    wait: HostWait | None
    recorded_here: bool
    # the job's own GEMM shapes timed in bf16 with autocast's casts (``autocast_gemms``)
    autocast: AutocastGemms | None = None


@dataclass
class _Tallies:
    """The ranks' kernels, operators and memory operations summed: name -> [calls, time]."""

    kernels: dict[str, list[float]]
    ops: dict[str, list[float]]
    memory_ops: dict[str, float]

    @staticmethod
    def of(partials: list[RankPartial]) -> _Tallies:
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
        return _Tallies(kernels, ops, memory_ops)


@dataclass
class _Analysed:
    """What the steps say: the view of the step, its verdict, MFU and advice."""

    device: DevicePeak | None
    breakdown: TimeBreakdown  # the traced steps', with communication's contention where measured
    view: StepView
    verdict: Verdict
    traced_verdict: Verdict | None
    mfu: Mfu
    roofline: Roofline
    collectives: list[CollectiveStats]
    syncs: SyncReport | None
    raised: dict[str, float]  # dtype family -> the rate a measured peak was raised to
    # per step, the training thread's wait for cores its DataLoader workers held: the label's
    # input time and the advice's (``loader_cores``), one figure for both
    loader_held_us: float = 0.0


def assemble(partials: list[RankPartial], cpu_device: DevicePeak | None, explicit: DevicePeak | None,
             flops_per_step: float | None, sources: list[str],
             windows: list[WindowSteps] | None = None, workers: list[int] | None = None,
             host: HostCpu | None = None, wait: HostWait | None = None,
             census: dict[int, SyncCensus] | None = None, recorded_here: bool = False,
             autocast: AutocastGemms | None = None) -> Diagnosis:
    """One Diagnosis from the ranks' partial results; ``windows`` are the job's own step timer
    around the traced window when the input is a run directory (``steps.window_steps``);
    ``wait``: the training thread's wait for a core (``host_wait``), already charged to a GPU
    rank's traced steps, here to the unprofiled estimate; ``census``: per rank, the host syncs
    the bootstrap saw in one step (``syncs``); ``recorded_here``: a run directory this host wrote,
    whose rates may raise a measured peak without bound (``mfu.raise_measured_peak``);
    ``autocast``: its GEMMs timed here in bf16 (``collectors.gemm_probe``)."""
    warnings = [w for p in partials for w in p.warnings]
    has_gpu = any(p.has_gpu for p in partials)
    trace_dev_name = next((p.device_name for p in partials if p.device_name), None)
    device, kind = pick_device(
        cpu_device, explicit, has_gpu, trace_dev_name,
        next((p.device_memory for p in partials if p.device_name), None),
        any(p.roofline.groups for p in partials), warnings)
    roof_acc = RooflineAcc()
    for p in partials:
        roof_acc.merge(p.roofline)
    # only a trace recorded here can prove this machine faster (one that names a GPU cannot)
    device, raised = raise_measured_peak(device, roof_acc.model_rates() if not trace_dev_name else {},
                                         recorded_here and not has_gpu)
    job = _Job(partials, [p.result for p in partials], kind, has_gpu, trace_dev_name, flops_per_step,
               any(p.shapes_recorded for p in partials), windows, wait, recorded_here, autocast)
    collectives = finish_collectives([p.collectives for p in partials], device if has_gpu else None)
    world = _world_size(job, warnings)
    stragglers = find_stragglers(job.results)
    breakdown = _job_breakdown(job.results)
    tallies = _Tallies.of(partials)
    traits = _traits(job, workers, host)
    done = (_analyse(job, device, roof_acc, breakdown, traits, collectives, stragglers, tallies,
                     census, warnings) if breakdown.step_time > 0 else None)
    if done is not None:
        device, breakdown, roofline, verdict, mfu = (done.device, done.breakdown, done.roofline,
                                                     done.verdict, done.mfu)
        collectives = done.collectives
        raised.update(done.raised)
    else:
        roofline, verdict, mfu = _nothing_to_analyse(roof_acc, device)
    warnings.extend(_closing_warnings(job, roof_acc, device, roofline, breakdown, raised,
                                      traits.dataloader_workers))
    mfu = note_uncosted(mfu, roof_acc.uncosted_share())
    verdict, traced_verdict, mfu = _charged_lost_events(
        partials, verdict, done.traced_verdict if done else None, mfu)
    view = done.view if done else None
    busy = _busy(job, tallies)
    return Diagnosis(
        schema_version=DIAGNOSIS_SCHEMA_VERSION, gpudiag_version=__version__, sources=sources,
        device=_device_info(job, device), world_size=world, ranks=job.results, breakdown=breakdown,
        verdict=verdict, mfu=mfu, roofline=roofline, communication=collectives,
        stragglers=stragglers, top_kernels=_top(tallies.kernels, busy),
        top_ops=_top(tallies.ops, busy), warnings=_dedupe(warnings),
        basis=view.basis if view else PROFILED, dilation=view.dilation if view else None,
        unprofiled=view.unprofiled if view else None, traced_verdict=traced_verdict, traits=traits,
        rank_spread=rank_spreads(job.results), host_wait=wait, syncs=done.syncs if done else None,
    )


def _world_size(job: _Job, warnings: list[str]) -> int | None:
    """The job's world size as the traces record it; a warning where ranks are missing."""
    world = next((p.world_size for p in job.partials if p.world_size), None)
    if world and world > len(job.results):
        warnings.append(f"{len(job.results)} of {world} ranks present: job-level numbers describe "
                        "these ranks only")
    return world


def _job_breakdown(results: list[RankResult]) -> TimeBreakdown:
    """The job's step: each rank's mean step, then the ranks' mean."""
    with_steps = [r for r in results if r.steps]
    if not with_steps:
        return TimeBreakdown()
    per_rank = [sum_breakdowns([s.breakdown for s in r.steps], divide_by=len(r.steps))
                for r in with_steps]
    return sum_breakdowns(per_rank, divide_by=len(per_rank))


def _busy(job: _Job, tallies: _Tallies) -> float:
    """What the top items' shares are of: device busy time on a GPU; operator time on the CPU
    (the breakdown's busy time leaves out tiny ops and stalls, which the operator totals include)."""
    if job.has_gpu:
        return sum(r.total.gpu_busy for r in job.results)
    return sum(t for _, t in tallies.ops.values())


def _traits(job: _Job, workers: list[int] | None, host: HostCpu | None) -> JobTraits:
    """The job's traits, the loader's busy share and its workers' time a step read from the
    lowest rank's untraced steps."""
    windows = job.windows or []
    around = [r for w in windows if w.rank == min(x.rank for x in windows)
              for r in (*w.before_rows, *w.after_rows)]
    return job_traits([p.facts.traits for p in job.partials], workers, host, loader_busy(around),
                      workers_busy(around))


def _analyse(job: _Job, device: DevicePeak | None, roof_acc: RooflineAcc, breakdown: TimeBreakdown,
             traits: JobTraits, collectives: list[CollectiveStats], stragglers: Stragglers | None,
             tallies: _Tallies, census: dict[int, SyncCensus] | None,
             warnings: list[str]) -> _Analysed:
    """A job with timed steps: its view, MFU, verdict (with its syncs' evidence) and advice."""
    facts = [p.facts for p in job.partials]
    events = CpuEvents.mean([f.cpu_events for f in facts])
    view, breakdown = _view(job, breakdown, traits, facts, events)
    warnings.extend(view.warnings)
    mix = dtype_mix(dict(roof_acc.dtype_flops))
    mfu = mfu_at_own_pace(job.results, device, mix, job.flops_per_step, job.shapes, view, job.wait)
    raised: dict[str, float] = {}
    if not job.trace_dev_name:
        device, mfu, raised = job_floor(device, mfu, mix, job.results, job.flops_per_step,
                                         job.shapes, view, job.wait,
                                         job.recorded_here and not job.has_gpu)
    roofline = build_roofline(roof_acc, device)
    traced_mfu = compute_mfu(job.results, device, mix, job.flops_per_step, job.shapes)
    n_steps = max((len(r.steps) if r.steps and r.steps[0].step is not None else 0)
                  for r in job.results) if job.results else 0
    syncs = sync_report(min(census.items())[1] if census else None,
                        mean_trace_syncs([p.syncs for p in job.partials]), job.kind,
                        view.breakdown, breakdown)
    # the label weighs operators that fed only the syncs as host work (``sync_fed``)
    fed = sync_fed.moved_us(view.breakdown, syncs, job.kind)
    # a host-bound summary names what of its host share was measured apart
    asleep = blocked.cause(view.breakdown, job.wait, job.kind == "gpu")
    named = [c for c in (sync_fed.cause(fed), asleep) if c is not None]
    # and the training thread's wait for cores its DataLoader workers held as input (``loader_cores``)
    labelled = sync_fed.as_host(view.breakdown, fed)
    held = loader_cores.held_us(labelled, job.wait, traits, view.basis == PROFILED, job.kind)
    verdict, traced_verdict = verdicts(
        replace(view, breakdown=loader_cores.as_input(labelled, held)), breakdown,
        device_kind=job.kind, roofline=roofline, mfu=mfu, traced_mfu=traced_mfu,
        n_steps=n_steps, traced_noise_=traced_noise(job.results, job.windows), events=events,
        host_cause=host_cause_of(named, rest=asleep is not None),
        input_cause=loader_cores.cause(held, labelled.own_step))
    if syncs is not None:
        verdict = replace(verdict, evidence={**verdict.evidence, **sync_evidence(syncs)})
    steps_summed = sum(len(r.steps) for r in job.results)
    collectives = per_step(collectives, [p.collectives for p in job.partials], steps_summed,
                           view.breakdown.comm_total, view.breakdown.comm_exposed)
    done = _Analysed(device, breakdown, view, verdict, traced_verdict, mfu, roofline, collectives,
                     syncs, raised, held)
    inputs = _advice_inputs(job, done, traits, stragglers, tallies, roof_acc, facts)
    advised = recommend(inputs)
    done.verdict = replace(verdict, recommendations=advised.advised,
                           not_advised=advised.not_advised)
    return done


def _view(job: _Job, breakdown: TimeBreakdown, traits: JobTraits, facts: list[RankFacts],
          events: CpuEvents) -> tuple[StepView, TimeBreakdown]:
    """The view of the step the verdict describes, with the reference steps' own wait for a
    core, and on a CPU what gloo's threads took of the ranks' cores charged to communication;
    and the traced steps' breakdown with that contention."""
    split = job.wait.traced_machine_us if job.wait is not None and job.wait.recorded else None
    view = choose_view(breakdown, job.results, job.windows, job.kind, events, split)
    if view.unprofiled is not None:
        # a GPU's from the reference steps' own wait; the CPU's are its stalls
        est = unprofiled_waits(view.unprofiled, job.wait, job.kind)
        view = replace(view, unprofiled=est,
                       breakdown=est if view.breakdown is view.unprofiled else view.breakdown)
    cc = comm_cpu(job.windows) if job.kind == "cpu" else None
    slowed = (sum(f.comm_slowed_us for f in facts) / len(facts),
              sum(f.comm_slowed_calls for f in facts) / len(facts))
    if not (job.kind == "cpu" and (cc is not None or slowed[1] > 0)):
        return view, breakdown
    # gloo's threads share the ranks' cores: what they took is communication's
    ranks = len(job.partials)
    breakdown = with_contention(breakdown, cc.traced_us if cc is not None else None, traits, ranks,
                                *slowed)
    if view.unprofiled is None:
        return replace(view, breakdown=breakdown), breakdown
    est = with_contention(view.unprofiled, cc.untraced_us if cc is not None else None, traits, ranks,
                          *slowed, traced=breakdown)
    return replace(view, unprofiled=est,
                   breakdown=est if view.breakdown is view.unprofiled else view.breakdown), breakdown


def _advice_inputs(job: _Job, done: _Analysed, traits: JobTraits, stragglers: Stragglers | None,
                   tallies: _Tallies, roof_acc: RooflineAcc, facts: list[RankFacts]) -> AdviceInputs:
    """What advice reads of the job, in the verdict's view."""
    device, view = done.device, done.view
    # the profiler's cost the unprofiled view's estimate charged (none in a traced view)
    charged = view.dilation if view.basis != PROFILED else None
    top_memory = [k for k, _ in sorted(tallies.memory_ops.items(), key=lambda kv: -kv[1])]
    mem = sum(f.memory_bound_us for f in facts)
    saved = sum(f.fusion_saves_us for f in facts)
    steps_summed = sum(len(r.steps) for r in job.results)
    return AdviceInputs(
        view=view.breakdown, device_kind=job.kind,
        device_peaks=dict(device.flops) if device else {}, traits=traits, mfu=done.mfu,
        roofline=done.roofline, collectives=done.collectives, stragglers=stragglers,
        top_memory_ops=top_memory, fusion_saved_share=saved / mem if mem > 0 and saved > 0 else None,
        fp32_memory_bytes=fp32_memory_bytes(roof_acc, device, steps_summed),
        bandwidth=device.bandwidth if device else 0.0, host_wait=job.wait, syncs=done.syncs,
        compile_facts=CompileFacts.mean([f.compile for f in facts]), traced=done.breakdown,
        ranks=len(job.partials), steps_per_rank=steps_summed // max(len(job.results), 1),
        backward_us=_backward(facts, view.breakdown, done.breakdown),
        label=done.verdict.label, tie_with=done.verdict.tie_with, saves=saves(job.windows),
        faults=faults(job.windows), autocast=job.autocast,
        untraced_wall_us=(untraced_wall_us(job.windows) if job.windows and view.basis == PROFILED
                          and view.dilation is not None else None),
        view_step=whatif.MEDIAN_UNTRACED if view.basis != PROFILED else whatif.MEAN_TRACED,
        loader_held_us=done.loader_held_us,
        profiler_us_per_event=(charged.profiler_us_per_event or 0.0) if charged is not None else 0.0,
        profiler_step_us=(charged.profiler_step_us or 0.0) if charged is not None else 0.0,
        reference_mean_us=view.dilation.untraced_mean_us if view.dilation is not None else None)


def _nothing_to_analyse(roof_acc: RooflineAcc, device: DevicePeak | None
                        ) -> tuple[Roofline, Verdict, Mfu]:
    """A trace without timed steps: its roofline, and no verdict or MFU."""
    verdict = Verdict(label=Bottleneck.UNKNOWN, confidence=0.0, confidence_level="none",
                      summary="nothing to analyse: the trace holds no timed events",
                      evidence={}, secondary=None, recommendations=[])
    mfu = Mfu(None, "not available: no steps", None, "none", None, None, None)
    return build_roofline(roof_acc, device), verdict, mfu


def _closing_warnings(job: _Job, roof_acc: RooflineAcc, device: DevicePeak | None,
                      roofline: Roofline, breakdown: TimeBreakdown,
                      raised: dict[str, float], workers: list[int] | None = None) -> list[str]:
    """What the reader must know of the numbers: roofs outrun, a split from kernel names, a host
    wait not split, a busy machine's stalls, a measured peak raised."""
    warnings = roof_violations(roof_acc, device)
    saved = saves(job.windows)
    long_steps = tail(job.windows, saved.per_step_us if saved is not None else 0.0)
    if long_steps is not None:
        warnings.append(tail_text(long_steps, workers or []))
    if roofline.method == "kernel-names" and job.has_gpu:
        if job.shapes:
            warnings.append("most GPU time could not be attributed to operators with recorded "
                            "shapes (CUDA graphs or custom kernels): compute/memory split comes "
                            "from kernel names")
        else:
            warnings.append("no operator shapes recorded: compute/memory split comes from kernel "
                            "names (profile with record_shapes=True for a roofline)")
    wait = job.wait
    unsplit = job.kind == "gpu" and wait is not None and not wait.recorded
    if wait is not None and unsplit and breakdown.fraction("host_overhead") >= HOST_NOTABLE:
        warnings.append(wait.note)  # worth splitting there
    # from a share worth naming on (the verdict's own threshold): blind check 18 read "a busy
    # machine" for 0.08 ms of an 18 ms step (0.5%) on a machine nobody else used
    if breakdown.fraction("host_stalled") >= STALLED_NOTED and job.kind == "cpu":
        machine = wait.traced_machine_us if wait is not None and wait.recorded else None
        warnings.append(f"{ms(breakdown.host_stalled)} per traced step the OS ran other work "
                        "while an operator of the job waited (operators 20x slower than the median of "
                        f"their kind: {stalls_owner(breakdown.host_stalled, machine)}): host time, shown "
                        "apart from the job's own overhead; no verdict or prediction counts it as "
                        "overhead a fix removes")
    for fam, rate in raised.items():
        warnings.append(f"the job ran {fam} at {rate / 1e9:.4g} GFLOP/s, above the measured peak: a "
                        "measured peak is a floor, so it is raised to that")
    return warnings


def _charged_lost_events(partials: list[RankPartial], verdict: Verdict,
                         traced_verdict: Verdict | None, mfu: Mfu
                         ) -> tuple[Verdict, Verdict | None, Mfu]:
    """What the trace lost lowers the verdicts' confidence; most GPU events lost, no verdict
    and no MFU."""
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
    return verdict, traced_verdict, mfu


def _device_info(job: _Job, device: DevicePeak | None) -> DeviceInfo:
    name = device.name if device else (job.trace_dev_name or ("CPU" if job.kind == "cpu" else "unknown"))
    return DeviceInfo(
        name=name, source=device.source if device else "unknown", kind=job.kind,
        peak_flops=dict(device.flops) if device else {},
        bandwidth=device.bandwidth if device else 0.0, trace_device_name=job.trace_dev_name,
    )


def _backward(facts: list[RankFacts], view: TimeBreakdown, traced: TimeBreakdown) -> float | None:
    """The backward's time per step in the view (the ranks' mean, brought to the view's pace by
    the compute's ratio); None where a rank's trace does not tell it apart."""
    times = [f.backward_us for f in facts if f.backward_us is not None]
    if not times or len(times) < len(facts):
        return None
    k = view.compute / traced.compute if traced.compute > 0 else 1.0
    return sum(times) / len(times) * k


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


