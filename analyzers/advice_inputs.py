"""What advice reads (the verdict's view, the job's traits, the device's peaks) and the
helpers every piece of advice shares: the device's faster dtypes and whether lower precision
would be slower here, the job's CPU use. ``advice`` holds the catalogue, ``advice_text`` the
words."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpudiag.analyzers import whatif
from gpudiag.analyzers.autocast_gemms import AutocastGemms
from gpudiag.analyzers.checkpoint import Saves
from gpudiag.analyzers.compile_facts import CompileFacts
from gpudiag.analyzers.page_faults import Faults
from gpudiag.diagnosis import (
    Bottleneck,
    CollectiveStats,
    HostWait,
    JobTraits,
    Mfu,
    Roofline,
    Stragglers,
    SyncReport,
    TimeBreakdown,
)

# A faster dtype is worth recommending when its peak is at least this much above fp32's
# (bf16 on a GPU's tensor cores: 15x on an H100; AMX bf16 on this project's CPU: ~5x; a CPU
# without bf16 units runs it no faster, or slower).
FASTER_DTYPE_MIN_RATIO = 1.5
# Tensor cores want GEMM dimensions in multiples of 8 (fp16/bf16; NVIDIA's "Matrix
# Multiplication Background" user guide); a dimension off that grid runs padded or on CUDA cores.
TENSOR_CORE_MULTIPLE = 8


@dataclass
class AdviceInputs:
    """Everything advice reads: the verdict's view and what the trace shows of the job."""

    view: TimeBreakdown
    device_kind: str  # "gpu" or "cpu"
    device_peaks: dict[str, float]  # dtype family -> FLOP/s
    traits: JobTraits
    mfu: Mfu
    roofline: Roofline
    collectives: list[CollectiveStats] = field(default_factory=list)
    stragglers: Stragglers | None = None
    top_memory_ops: list[str] = field(default_factory=list)
    fusion_saved_share: float | None = None  # of memory-bound time, by fusing elementwise runs
    fp32_memory_bytes: float | None = None  # bytes per step of memory-bound fp32 work
    bandwidth: float = 0.0  # the device's, bytes/s
    host_wait: HostWait | None = None  # the training thread's wait for a core, and who held them
    syncs: SyncReport | None = None  # host syncs counted, with their predicted cost (``syncs``)
    # what torch.compile would change in a CPU step, as traced, and the traced breakdown they
    # were counted in (``compile_facts``): on a CPU compile's prediction counts calls
    compile_facts: CompileFacts | None = None
    traced: TimeBreakdown | None = None
    ranks: int = 1  # ranks in the diagnosis (of one machine, as gpudiag profile runs them)
    # the backward's time per step in the view (CPU traces): what gradients' collectives can
    # hide behind (``comm_cost.backward_time``); None: not told apart
    backward_us: float | None = None
    steps_per_rank: int = 0  # traced steps per rank the collectives table's counts are over
    # the verdict's label (and the runner-up it ties with): advice for it is given first
    label: Bottleneck | None = None
    tie_with: Bottleneck | None = None
    saves: Saves | None = None  # periodic torch.save on the training thread (``checkpoint``)
    faults: Faults | None = None  # pages the allocator faults in again each step (``page_faults``)
    # the job's GEMM shapes timed on this CPU in bf16 with autocast's casts (``autocast_gemms``)
    autocast: AutocastGemms | None = None
    # where the view is the traced steps for want of a trusted reference: the untraced steps'
    # median wall step around the window (us; ``own_pace.untraced_wall_us``), the frame each
    # entry's step is shown in (``advice.recommend``); None: the view's own step is that frame
    untraced_wall_us: float | None = None
    # what the view's step is, in a few words (``Recommendation.step_from``)
    view_step: str = whatif.MEAN_TRACED
    # per step, the training thread's wait for cores the job's DataLoader workers held, which the
    # label counts as input time (``analyzers.loader_cores``)
    loader_held_us: float = 0.0
    # where the view is a CPU job's unprofiled estimate: the profiler's cost per event it charged
    # and its whole cost per traced step (``Dilation.profiler_us_per_event``, ``profiler_step_us``);
    # 0: none taken out (a part of the traced step is brought to the view's pace by the step's ratio)
    profiler_us_per_event: float = 0.0
    profiler_step_us: float = 0.0
    # the mean step of the untraced steps around the traced window (us; ``Dilation.untraced_mean_us``)
    # the verdict is of; None: no reference
    reference_mean_us: float | None = None



def on_gpu(a: AdviceInputs) -> bool:
    return a.device_kind == "gpu"


def device_unit(a: AdviceInputs) -> str:
    return "GPU" if on_gpu(a) else "CPU"


def fp32_share(a: AdviceInputs) -> float:
    return a.mfu.dtype_mix.get("fp32", 0.0) if a.mfu.dtype_mix else (
        1.0 if a.roofline.dtype_family == "fp32" else 0.0)


def fastest_lower(a: AdviceInputs) -> tuple[str, float] | None:
    """(family, peak_fp32 / peak_family) of the fastest lower-precision family the device has
    a peak for, faster or not; None without an fp32 peak or any such family."""
    fp32 = a.device_peaks.get("fp32")
    if not fp32:
        return None
    best = max(((f, p) for f, p in a.device_peaks.items() if f in ("bf16", "fp16", "tf32") and p > 0),
               key=lambda fp: fp[1], default=None)
    return None if best is None else (best[0], fp32 / best[1])


def faster_dtype(a: AdviceInputs) -> tuple[str, float] | None:
    """(family, peak_fp32 / peak_family) of the fastest family the device has over fp32, where
    it is worth the change (FASTER_DTYPE_MIN_RATIO)."""
    best = fastest_lower(a)
    return best if best is not None and best[1] <= 1 / FASTER_DTYPE_MIN_RATIO else None


def _peaks_source(a: AdviceInputs) -> str:
    return "measured" if not on_gpu(a) else "datasheet"


def slower_dtype(a: AdviceInputs, families: tuple[str, ...]) -> str | None:
    """Why lower precision would not help on this device: its peak for every family in
    ``families`` (those the fix would use) is no faster than fp32's; None where one is. A CPU
    without bf16 units (AMX, AVX512_BF16) converts bf16 to fp32 and back around each operation:
    on this project's 2-core AMD EPYC, bf16 GEMMs ran at 0.3-30 GFLOP/s against 85-256 fp32."""
    fp32 = a.device_peaks.get("fp32")
    peaks = {f: a.device_peaks[f] for f in families if a.device_peaks.get(f)}
    if not fp32 or not peaks or max(peaks.values()) > fp32:
        return None
    each = " and ".join(f"{f} {p / 1e9:.3g} GFLOP/s ({p / fp32:.2g}x)" for f, p in peaks.items())
    return (f"this {device_unit(a)}'s {_peaks_source(a)} GEMM peak{'s' if len(peaks) > 1 else ''}: {each}, "
            f"against fp32 {fp32 / 1e9:.3g} GFLOP/s: under torch.autocast its matmuls would run "
            "slower, not faster")


def job_cpu(t: JobTraits) -> whatif.JobCpu | None:
    """The job's CPU use, where the host sampler measured it and the bootstrap saw the cores."""
    if t.cores_used is None or not t.cpus:
        return None
    return whatif.JobCpu(t.cores_used, t.cpus, t.intra_op_threads or 1, t.other_cores or 0.0,
                         t.runq_cores or 0.0, t.cpu_step_s * 1e6 if t.cpu_step_s else None,
                         t.loader_busy, t.proc_cores, t.wants, t.others_runnable)


def has_workers(a: AdviceInputs) -> bool:
    """The job's DataLoader has worker processes already (as the bootstrap saw them)."""
    return any(n > 0 for n in a.traits.dataloader_workers)


def worker_count(a: AdviceInputs) -> int:
    """The workers the job's DataLoader has, where the bootstrap saw one count (several loaders
    with different counts: which one the step waits on is not known, 0)."""
    counts = [n for n in a.traits.dataloader_workers if n > 0]
    return counts[0] if len(counts) == 1 else 0
