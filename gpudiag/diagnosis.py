"""The ``Diagnosis``: everything gpudiag concluded about a job, as one versioned value.

Reports, the agent and scripts (``--json``) all read this and nothing else, so it must
round-trip through JSON exactly (``to_json`` / ``from_json``) and refuse versions it does
not understand instead of misreading them.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from gpudiag.codec import JsonValue, load_versioned
from gpudiag.errors import BadInput

DIAGNOSIS_SCHEMA_VERSION = 4
# Still read: version 1 (before the unprofiled estimate), 2 (recommendations as plain
# strings, before predictions) and 3 (before ``TimeBreakdown.host_stalled``): their new fields
# take their defaults, and a string recommendation becomes one with action "unknown" and no
# prediction (``_upgrade``).
READABLE_DIAGNOSIS_VERSIONS = (1, 2, 3, 4)


class Bottleneck(str, enum.Enum):
    COMPUTE = "compute-bound"
    MEMORY = "memory-bound"
    COMMUNICATION = "communication-bound"
    INPUT = "input-bound"
    HOST = "host-bound"
    UNKNOWN = "unknown"


@dataclass
class TimeBreakdown:
    """Where the wall time of a step (or of all steps) went, in microseconds.

    ``compute + comm_exposed + memcpy_exposed + idle == step_time``;
    ``idle == input_wait + host_overhead``. On a CPU-only trace "GPU" reads "device".
    ``host_stalled`` is the part of ``host_overhead`` the OS ran other work while an operator
    of the job waited (a busy machine): host time, but not the job's own overhead, so no
    verdict or prediction counts it as overhead a fix would remove. ``host_waiting`` is the part
    of ``host_overhead`` the training thread was runnable but waiting for a core, whoever held
    the cores (on a GPU: its schedstat run delay per step, within the step's host gaps; on the
    CPU: the stalls, as ``host_stalled``); ``host_stalled <= host_waiting <= host_overhead``.
    Its part held by the job's own workers and threads (``host_waiting - host_stalled``) is the
    job's, but launch-overhead fixes (CUDA graphs, compile) do not remove it.
    """

    step_time: float = 0.0
    gpu_busy: float = 0.0
    compute: float = 0.0
    compute_bound: float = 0.0  # part of compute spent in compute-bound kernels/ops
    memory_bound: float = 0.0  # part of compute spent in memory-bound kernels/ops
    comm_total: float = 0.0
    comm_exposed: float = 0.0
    memcpy_exposed: float = 0.0
    idle: float = 0.0
    input_wait: float = 0.0
    host_overhead: float = 0.0
    host_stalled: float = 0.0  # part of host_overhead: the OS running other processes
    host_waiting: float = 0.0  # part of host_overhead: runnable, waiting for a core (any owner)
    # What the collectives cost beyond their exposed time, both parts of ``compute`` (a CPU job
    # over gloo; 0 elsewhere): ``comm_work`` the training thread's own work for them (DDP's
    # copies into and out of its buckets, the comm hook's division), outside ``compute_bound``
    # and ``memory_bound`` (they add up to ``compute - comm_work``); ``comm_contention`` the
    # compute time the collectives' own threads took from the job's compute where the cores
    # were short (``analyzers.comm_cost``). Optional: older files read them as 0.
    comm_work: float = 0.0
    comm_contention: float = 0.0
    # The part of the exposed communication's wall time other processes took, which
    # ``own_pace.charge`` moved into ``host_stalled`` with the other CPU parts' (a CPU job only):
    # removing the wait removes that part of the wall step too, since other processes take a
    # share of the cores' time, not a fixed part of each step (``comm_cost.cost``). Optional.
    comm_stalled: float = 0.0

    def fraction(self, part: str) -> float:
        return getattr(self, part) / self.step_time if self.step_time > 0 else 0.0

    @property
    def comm_exposed_wall(self) -> float:
        """The exposed communication by the wall clock: with the part other processes took of
        it (``comm_stalled``), what a fix that removes the wait removes (``comm_cost.cost``)."""
        return self.comm_exposed + self.comm_stalled

    @property
    def own_step(self) -> float:
        """The step at the job's own pace: less the time the OS ran other processes
        (``host_stalled``), which a fix of the job's cannot remove and a busy machine adds."""
        return self.step_time - self.host_stalled


@dataclass
class StepBreakdown:
    step: int | None  # ProfilerStep number; None for a trace without steps
    start: float  # us on the trace clock
    breakdown: TimeBreakdown
    model_flops: float | None = None


@dataclass
class GpuSpanBreakdown:
    """HTA's temporal breakdown over the same window (for cross-checking with HTA)."""

    kernel_time: float = 0.0
    idle_time: float = 0.0
    compute_time: float = 0.0
    non_compute_time: float = 0.0

    def pct(self, part: str) -> float:
        return 100.0 * getattr(self, part) / self.kernel_time if self.kernel_time > 0 else 0.0


@dataclass
class RankResult:
    rank: int
    trace: str
    steps: list[StepBreakdown]
    total: TimeBreakdown
    mean_step_time: float
    gpu_span: GpuSpanBreakdown | None = None


@dataclass
class RooflinePoint:
    op: str
    shape: str
    dtype: str
    calls: int
    flops: float
    bytes: float
    time_us: float  # device time attributed to the op
    intensity: float  # FLOP/byte
    achieved_flops: float  # FLOP/s
    attainable_flops: float  # min(peak, intensity * bandwidth)
    bound: str  # "compute" or "memory"


@dataclass
class Roofline:
    method: str  # "shapes", "kernel-names", or "none"
    peak_flops: float
    peak_bandwidth: float
    ridge_intensity: float
    dtype_family: str
    compute_bound_time: float  # us of device compute time
    memory_bound_time: float
    unattributed_time: float  # compute time with neither shapes nor a known kernel class
    points: list[RooflinePoint] = field(default_factory=list)


@dataclass
class CollectiveStats:
    collective: str
    count: int
    total_time_us: float
    exposed_time_us: float
    bytes: float | None  # total message bytes over all calls
    algbw_gbps: float | None
    busbw_gbps: float | None
    link_peak_gbps: float | None
    # per step and rank, in the verdict's view (unprofiled estimate or traced steps): the type's
    # part of the breakdown's ``comm_total`` and ``comm_exposed``, so the table and the breakdown
    # add up to the same figure by construction
    time_per_step_us: float | None = None
    exposed_per_step_us: float | None = None


@dataclass
class Mfu:
    value: float | None
    reason: str  # how it was obtained, or "not available: <why>"
    flops_per_step: float | None
    flops_source: str  # "shapes", "--flops-per-step", "none"
    dtype_family: str | None
    peak_flops: float | None
    step_time_us: float | None
    # which step time divides the FLOPs: "untraced steps" (the job's own step timer, profiler
    # off: what the job really runs at) or "traced steps" (trace only, dilated by the profiler)
    step_time_basis: str = "traced steps"
    # dtype family -> share of the model FLOPs that ran in it (from the ops' input types); with
    # more than one, ``peak_flops`` is the mix's peak: the FLOPs over the time they would take,
    # each family at its own peak
    dtype_mix: dict[str, float] = field(default_factory=dict)
    # ``value`` is at the job's own pace: ``step_time_us`` is the view's step less the part other
    # processes took (``host_stalled``, ``gpudiag.pace``). The same FLOPs over the wall-clock step,
    # and why the two differ (or that no split was recorded); empty where they are the same
    wall_value: float | None = None
    wall_step_time_us: float | None = None
    pace: str = ""
    # how far ``value`` can be trusted, 0..1 (``analyzers.job_device.mfu_confidence``): the
    # step it divides by, not the label's evidence. The label's confidence falls on a busy
    # machine (its shares move by the machine's part); MFU at the job's own pace does not, so
    # the scheduler weighs a job's MFU by this one. None: no MFU, or a file from before it
    confidence: float | None = None


@dataclass
class Stragglers:
    median_step_us: float
    ranks: list[int]  # ranks whose mean step time is well above the median
    imbalance: float  # (max - min) / median of per-rank mean step time
    per_rank_step_us: dict[str, float] = field(default_factory=dict)


@dataclass
class RankValue:
    rank: int
    value: float


@dataclass
class RankSpread:
    """One per-rank number over all ranks: its distribution and the extreme ranks, so that a
    job of 128 ranks reads as a few lines instead of 128 rows. Values are per step (us)."""

    metric: str  # a TimeBreakdown field: "step_time", "comm_exposed", ...
    label: str  # what a person reads: "mean step time", ...
    ranks: int
    minimum: float
    p10: float
    median: float
    p90: float
    maximum: float
    highest: list[RankValue] = field(default_factory=list)  # largest first
    lowest: list[RankValue] = field(default_factory=list)  # smallest first


@dataclass
class DeviceInfo:
    name: str
    source: str
    kind: str  # "gpu" or "cpu"
    peak_flops: dict[str, float] = field(default_factory=dict)
    bandwidth: float = 0.0
    trace_device_name: str | None = None


@dataclass
class TopItem:
    name: str
    calls: int
    time_us: float
    share: float  # of device busy time


@dataclass
class Recommendation:
    """One fix, and the step time it predicts if it worked fully (``analyzers.whatif``)."""

    action: str  # stable id: "dataloader-workers", "overlap-communication", ...
    text: str
    predicted_step_s: float | None  # None where no prediction is possible (``why`` says why)
    why: str = ""  # how the prediction was made and what bounds it, or why there is none
    step_s: float | None = None  # the step time it starts from (the verdict's view)
    # what step_s is, in a few words ("median untraced step", "mean traced step"): fixes start
    # from different steps (a save's cost lives in the mean, the view holds the median), and
    # blind check 39 could not tell which baseline each ratio was of
    step_from: str = ""
    gain: float | None = None  # 1 - predicted / step: the share of the step the fix saves
    # the step at the prediction's faster end, where it states a range (``why`` says what each
    # end assumes): torch.compile on a CPU, whose compiled calls' cost only a run can settle
    best_step_s: float | None = None


@dataclass
class Deduction:
    """One caveat's cost to the verdict's confidence (a named constant in ``classify``)."""

    reason: str
    amount: float


@dataclass
class Verdict:
    label: Bottleneck
    confidence: float  # 0..1
    confidence_level: str  # "high" / "medium" / "low"
    summary: str  # one sentence with the deciding numbers
    evidence: dict[str, float]
    secondary: Bottleneck | None
    recommendations: list[Recommendation]
    # every caveat that lowered the confidence, and by how much
    deductions: list[Deduction] = field(default_factory=list)
    # the runner-up, when the label's margin over it is within the step-time noise: a tie
    tie_with: Bottleneck | None = None
    noise: float | None = None  # step-time noise (half the interquartile range over the median)
    # fixes that apply to the job's bottleneck but would not speed it up here: a prediction not
    # faster than today's step, or a precondition the device or the machine fails (bf16 slower
    # than fp32, no core for DataLoader workers); each ``why`` says which (``advice.recommend``).
    # Optional: a diagnosis written before it reads an empty list.
    not_advised: list[Recommendation] = field(default_factory=list)


@dataclass
class RunSummary:
    """The run.json of a ``gpudiag profile`` run, as reports show it."""

    command: list[str]
    host: str
    start: float
    end: float | None
    status: str
    exit_code: int | None
    signal: str | None
    last_step: int | None
    gpus: list[dict[str, str]] = field(default_factory=list)
    gpu_counters: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Series:
    name: str
    unit: str
    gpu: int | None
    rank: int | None
    t: list[float]  # seconds since the run's first sample
    v: list[float]


@dataclass
class Timeline:
    """Counters over the whole run, already downsampled for drawing."""

    start: float  # unix time of t = 0
    duration: float
    series: list[Series] = field(default_factory=list)
    traced: list[list[float]] = field(default_factory=list)  # [start, end] spans, seconds


# Untraced steps whose mean is this much above their median are skewed: a few long steps hold
# much of the time (a loader whose batch is ready or not: blind check 20's FFT loader with one
# worker ran steps of 1-170 ms, median 4.77 ms, mean ~40), and a window of a few traced steps
# compared with their median read "the profiler slowed traced steps 6.1x".
DILATION_SKEWED = 1.25


@dataclass
class Dilation:
    """How much observing the job slowed it, from the job's own step timer.

    The profiler adds host time to every op it records; that time shows up in the trace as GPU
    idle gaps, which a breakdown of traced steps reads as host overhead. The step timer runs on
    every step, traced or not, so it measures the slowdown directly.
    """

    traced_step_us: float  # the traced view's step: the mean of the traced steps (the breakdown's)
    untraced_step_us: float  # median wall time of the reference's steps, profiler off (step timer)
    factor: float  # traced / untraced
    traced_steps: int
    untraced_steps: int
    untraced_spread: float  # interquartile range / median of the untraced steps: run noise
    model: str  # how the unprofiled breakdown was estimated, in one sentence
    caveats: list[str] = field(default_factory=list)  # where that estimate is unsafe, and why
    # (3) the reference: untraced steps just before and just after the traced window (same
    # phase of the job), their medians, and whether the estimate could be trusted; when not,
    # the verdict falls back to the traced view and ``caveats`` say why
    reference: str = "all untraced steps"
    before_step_us: float | None = None
    after_step_us: float | None = None
    load_change: float = 0.0  # |before / after - 1|: the job's pace changed across the window
    trusted: bool = True
    # (4) the job's step numbers the reference used, and why the untraced steps on one side
    # were left out (None: both sides used): the observer slowed those after the window (CUPTI
    # left attached, the export's aftermath), or the job was still warming up before it
    reference_steps: list[int] = field(default_factory=list)
    left_out: str | None = None
    left_out_side: str | None = None  # "before" or "after" the window, where one was left out
    # the mean of the reference's steps (the job's throughput pace): beside the median where the
    # steps are skewed (``unprofiled.SKEWED``), whose few traced steps no median or mean of the
    # untraced ones can correct
    untraced_mean_us: float | None = None
    # the profiler's cost per event it recorded, where a CPU job's estimate charged it per event
    # (``unprofiled._cpu_per_event``): a part of the traced step loses it once per event in it
    profiler_us_per_event: float | None = None
    # ...and the profiler's whole cost per traced step it charged so (its events', and an
    # in-process DataLoader's, measured in its wait): the traced step less it is the job's pace
    profiler_step_us: float | None = None
    # the training thread's wait in next(loader) in the reference's steps, their median (us; the
    # step timer's DataLoader hook): a CPU job's loader in the training process pays the
    # profiler's cost inside the traced wait, this is the wait without it; None: not recorded
    untraced_input_us: float | None = None

    @property
    def skewed(self) -> bool:
        """The untraced steps' mean is over ``DILATION_SKEWED`` times their median."""
        mean = self.untraced_mean_us
        return mean is not None and mean > DILATION_SKEWED * self.untraced_step_us


@dataclass
class HostWait:
    """How long the training thread waited for a core, from the job's step timer
    (``/proc/thread-self/schedstat`` read at each step's end: ``analyzers.host_wait``), and who
    held the cores meanwhile, from the host sampler's CPU figures over the untraced steps."""

    recorded: bool  # the step rows carry the thread's run delay
    note: str  # one sentence: what was measured, or why the split is missing
    traced_wait_us: float | None = None  # mean per traced step
    untraced_wait_us: float | None = None  # median per reference (untraced) step
    untraced_run_us: float | None = None  # the thread on a core, median per reference step
    # of the CPU that competed with the training thread over the untraced steps: the job's own
    # (its DataLoader workers, intra-op threads) and processes outside it; None: not sampled
    own_share: float | None = None
    other_share: float | None = None
    # the largest wait of the job's other threads (intra-op, DataLoader workers), median per
    # reference step; None: not recorded (``collectors.thread_waits``)
    untraced_peer_wait_us: float | None = None
    # the part of the step other processes took (``gpudiag.pace``): per reference step (median
    # wall step less median own step) and mean per traced step
    untraced_machine_us: float | None = None
    traced_machine_us: float | None = None
    # the training thread asleep per reference step outside the DataLoader, collectives and
    # torch.save (median; ``analyzers.blocked``): a blocking call of the job's; None: not recorded
    untraced_blocked_us: float | None = None
    # the reference steps' wall clock (median): what ``untraced_machine_us`` is a part of
    untraced_wall_us: float | None = None
    # torch's intra-op threads where the job ran more than one under OMP_WAIT_POLICY=PASSIVE:
    # they sleep at each parallel region's end, which the training thread's clocks cannot tell
    # from a blocking call's sleep (``analyzers.blocked``); None: not so, or not recorded
    passive_threads: int | None = None
    # the training thread's whole sleep outside the DataLoader, collectives and torch.save per
    # reference step (median; ``host_wait.asleep_s``), and the times it was put back on a core
    # (median; schedstat's count): what the passive policy's advice reads (``omp_wait``)
    untraced_asleep_us: float | None = None
    untraced_slices: float | None = None


@dataclass
class SyncSite:
    """One line of the job's code that read device values back, as the census saw it."""

    site: str  # "train.py:42" (relative to the job's working directory where it lies inside it)
    function: str  # the job's function there ("main"; "step via clip_grad_norm_" through torch)
    kind: str  # ".item()", ".cpu()", "bool(tensor)", "nonzero (data-dependent shape)", ...
    per_step: float  # calls per step
    host_us: float  # per step, time inside these calls (on a GPU: the wait for the device too)


@dataclass
class SyncReport:
    """Host syncs (``analyzers.syncs``): calls that make the host wait for device values, counted
    per step with their call sites, and what removing them is predicted to save.

    On a GPU a sync drains the queue and the device idles while the host catches up; on a CPU
    nothing is queued, so a sync costs its host work: the call and the operators computed only
    to feed it. ``saving_us`` is that cost per step in the verdict's view; ``assumption`` says
    how it was predicted."""

    per_step: float  # sync calls per step (the census's step, else the traced steps' mean)
    by_kind: dict[str, float]  # calls per step by kind
    sites: list[SyncSite]  # busiest first (the census's; empty without one)
    source: str  # where the counts come from, in words
    trace_per_step: float | None  # sync events per traced step in the trace (scalar reads,
    # data-dependent shapes, device waits): the count across every traced step
    host_us: float  # per step: time inside the sync calls
    feeding_ops: float  # per step: operators whose results fed only the syncs
    feeding_us: float  # per step: their time
    device_idle_us: float | None  # GPU: per step, device idle at the syncs (the verdict's view)
    saving_us: float  # per step: predicted saving if the syncs' lines were removed
    step_us: float  # the verdict's step the saving is taken from
    assumption: str
    census_step: int | None = None  # the job's step number the census observed
    notes: list[str] = field(default_factory=list)
    # the operators whose results fed only syncs, per step (calls, time; share: of feeding_us)
    feeding_top: list[TopItem] = field(default_factory=list)
    # the step at the job's own pace (less the time other processes held its cores,
    # ``gpudiag.pace``): what the share is of, as the label's shares are (None: written before)
    own_step_us: float | None = None
    # per step: the job's Python right after the syncs and their feeding operators, up to the
    # next torch call (CPU; in the saving)
    after_us: float = 0.0
    # per step: sync calls made inside an nn.Module call (a forward's read-backs, which split a
    # compiled graph), by the census; None: no census, or one written before it was read
    in_module_per_step: float | None = None

    @property
    def share(self) -> float:
        """The saving's share of the step at the job's own pace: a load spike that stretches the
        wall-clock step does not make the syncs cheaper (a blind job with 85 syncs a step read
        0.1-0.3% of a spiked wall step, 4.7-5.3% of its own)."""
        step = self.own_step_us if self.own_step_us else self.step_us
        return self.saving_us / step if step > 0 else 0.0


@dataclass
class JobTraits:
    """What the trace shows of the job, so that advice fits it (``analyzers.traits``)."""

    training: bool = False  # backward ops present
    optimizer: bool = False  # an optimizer step ran
    fused_optimizer: bool = False  # foreach or fused optimizer kernels already
    compiled: bool = False  # torch.compile'd regions
    ddp: bool = False
    fsdp: bool = False
    attention: bool = False  # attention built from matmul + softmax
    sdpa: bool = False  # fused scaled_dot_product_attention
    single_process_loader: bool = False  # a DataLoader with num_workers=0
    dataloader_workers: list[int] = field(default_factory=list)  # as the bootstrap saw them
    # the job's processes' mean CPU cores over its untraced steps (analyzers.host_cpu), and the
    # cores it could use and its torch threads: what a DataLoader wait costs in CPU
    cores_used: float | None = None
    runq_cores: float | None = None  # cores' worth of waiting runnable for a core
    other_cores: float | None = None  # cores the machine's other work kept busy meanwhile
    cpus: int | None = None
    intra_op_threads: int | None = None
    cpu_step_s: float | None = None  # the untraced step cores_used was measured over
    # of cores_used, the training processes' own (the rest: their DataLoader workers'); None:
    # not recorded
    proc_cores: float | None = None
    # the training thread's time on a core or waiting for one while in next(loader), over its
    # time there (the step timer's DataLoader hook, untraced steps): with num_workers=0, a
    # loader that decodes reads near 1, one waiting on storage (or asleep) near 0; None: not
    # recorded
    loader_busy: float | None = None
    # the DataLoader workers' time on a core or waiting for one per untraced step (s; each
    # worker's busiest thread's schedstat, summed over the workers): a batch's time, one batch a
    # step (``whatif.loader_pace``)
    workers_busy_s: float | None = None
    # cores' worth the job's threads wanted (on a core or waiting for one), and the machine's
    # runnable tasks outside the job, over its untraced steps: the fair share a DataLoader
    # worker more would have (``whatif.JobCpu.cores_with``); None: not recorded
    wants: float | None = None
    others_runnable: float | None = None


@dataclass
class Diagnosis(JsonValue):
    schema_version: int
    gpudiag_version: str
    sources: list[str]
    device: DeviceInfo
    world_size: int | None
    ranks: list[RankResult]
    breakdown: TimeBreakdown  # mean per step over all ranks
    verdict: Verdict
    mfu: Mfu
    roofline: Roofline
    communication: list[CollectiveStats]
    stragglers: Stragglers | None
    top_kernels: list[TopItem]
    top_ops: list[TopItem]
    warnings: list[str]
    run: RunSummary | None = None
    timeline: Timeline | None = None
    # "profiled-steps": breakdown and verdict describe the traced steps as they ran under the
    # profiler (all a trace alone can say). "unprofiled-estimate": a step timer showed how much
    # the profiler slowed them; verdict and MFU describe the job as it runs unobserved.
    basis: str = "profiled-steps"
    dilation: Dilation | None = None
    unprofiled: TimeBreakdown | None = None  # estimated mean step of the job unobserved
    traced_verdict: Verdict | None = None  # what the traced breakdown alone would say
    traits: JobTraits | None = None  # what the trace shows of the job (advice is chosen from it)
    # per-rank numbers summarised over the ranks (2 or more ranks with steps); optional, so
    # diagnoses written before it still read
    rank_spread: list[RankSpread] = field(default_factory=list)
    # the training thread's wait for a core (run directories with a step timer; None otherwise)
    host_wait: HostWait | None = None
    # host syncs per step, their call sites and cost (None: neither a census nor sync events)
    syncs: SyncReport | None = None

    @classmethod
    def from_json(cls, text: str) -> Diagnosis:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise BadInput(f"diagnosis is not valid JSON: {e}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> Diagnosis:
        d: Diagnosis = load_versioned(cls, data, READABLE_DIAGNOSIS_VERSIONS)
        return d


# 2: step_change, basis and step_time_verdict; 3: own_pace_change; 4: tie_before/after
DIFF_SCHEMA_VERSION = 4


@dataclass
class ItemDelta:
    """One kernel or operator, mean time per step before and after (us)."""

    name: str
    before_us: float
    after_us: float
    delta_us: float
    ratio: float | None  # after / before; None when new or gone


@dataclass
class StepChange:
    """Median step time before and after, from the two runs' own step timers (profiler off),
    and whether the change is larger than run-to-run noise (``analyzers.compare.step_change``)."""

    before_median_us: float
    after_median_us: float
    change: float  # after / before - 1
    ci_low: float  # bootstrap interval of the change (ratio of medians - 1)
    ci_high: float
    confidence: float  # of that interval, e.g. 0.95
    before_steps: int
    after_steps: int
    # smallest change called significant, whatever the interval says: run-to-run noise (a fixed
    # floor, or half the interquartile range of either run's steps if larger)
    noise_floor: float
    significant: bool
    direction: str  # "slower", "faster" or "no significant change"
    method: str  # how the interval was obtained, in one sentence


@dataclass
class DiagnosisDiff(JsonValue):
    """Before/after comparison of two diagnoses (``gpudiag diff``)."""

    schema_version: int
    before_sources: list[str]
    after_sources: list[str]
    before: TimeBreakdown  # mean per step
    after: TimeBreakdown
    step_time_change: float | None  # after/before - 1
    label_before: Bottleneck
    label_after: Bottleneck
    mfu_before: float | None
    mfu_after: float | None
    kernels: list[ItemDelta]  # largest absolute change first
    ops: list[ItemDelta]
    device_before: str
    device_after: str
    notes: list[str] = field(default_factory=list)
    breakdown_delta: TimeBreakdown | None = None  # after - before, per step (us)
    # "unprofiled-estimate": both sides had a step timer; breakdowns, labels and MFU are those of
    # the unprofiled estimates. "profiled-steps": at least one side is traces only; all compared
    # as traced, where the profiler's own slowdown can pass for a change.
    basis: str = "profiled-steps"
    step_change: StepChange | None = None  # from the step timers; None for trace-only inputs
    step_time_verdict: str = ""  # one sentence: the change and whether it is more than noise
    # the same at the job's own pace: each step less the wait other processes caused
    # (``gpudiag.pace``); None where a side recorded no split (compared by wall clock only) or
    # for trace-only inputs. Where it and ``step_change`` disagree the verdict leads with it.
    own_pace_change: StepChange | None = None
    # one line: the machine's part of each run's step, where it differs between the runs
    machine_note: str = ""
    # the label each run's verdict stated a tie with (within the step-time noise), where the
    # label compared is that verdict's: a diff that printed "unchanged, compute-bound" of a run
    # whose own report said "a tie with communication-bound" hid it (blind check 34)
    tie_before: Bottleneck | None = None
    tie_after: Bottleneck | None = None
    # one line: how far the training thread's time on a core per step moved, where it moved by
    # half the noise floor or more and the own pace changed significantly
    # (``analyzers.compare.cpu_note``); the verdict quotes it; empty otherwise
    cpu_note: str = ""
    warnings: list[str] = field(default_factory=list)


# --- accessors: what readers outside gpudiag (an experiment tracker, a live view) take from a
# Diagnosis, in one place, so they follow it when its schema changes --------------------------

def verdict_breakdown(d: Diagnosis) -> TimeBreakdown:
    """The mean step the verdict describes: the unprofiled estimate when the run had a step
    timer, else the traced steps."""
    return d.unprofiled or d.breakdown


SHARE_PARTS = ("compute", "compute_bound", "memory_bound", "comm_exposed", "memcpy_exposed",
               "input_wait", "host_overhead", "host_stalled", "host_waiting", "idle", "comm_work",
               "comm_contention")


def summary_figures(d: Diagnosis) -> dict[str, float | str | None]:
    """Label, confidence, MFU, profiler dilation and the verdict breakdown's shares of the step
    (``share_<part>``), flat: the figures runs are compared by outside gpudiag."""
    b = verdict_breakdown(d)
    out: dict[str, float | str | None] = {
        "label": d.verdict.label.value,
        "secondary": d.verdict.secondary.value if d.verdict.secondary is not None else None,
        "confidence": d.verdict.confidence,
        "mfu": d.mfu.value,
        "dilation": d.dilation.factor if d.dilation is not None else None,
        "basis": d.basis,
        "device": d.device.name,
        "step_time_us": b.step_time,
    }
    out.update({f"share_{p}": b.fraction(p) for p in SHARE_PARTS})
    return out
