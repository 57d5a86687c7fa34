"""Advice for the job in front of it: which fixes apply, what they say, what they are worth.

Each entry of ``CATALOGUE`` is one fix with a stable id, the condition under which it applies
(read from the verdict's view and from what the trace shows of the job: training or
inference, GPU or CPU, dtype, compiled or not, optimizer, DDP/FSDP, ``traits``), its text,
and its prediction (``whatif``). A fix whose condition does not hold is never printed: an
inference loop is not told to fuse its optimizer, a CPU job is not told about TF32 or CUDA
graphs, a compiled job is not told to compile. Recommendations are ranked by the share of the
step their prediction saves; those with no prediction follow, by the share of the step they
address. Thresholds are ``classify``'s (cited there).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpudiag.analyzers import whatif
from gpudiag.analyzers.classify import (
    COMM_NOTABLE,
    DEVICE_NOTABLE,
    HOST_NOTABLE,
    INPUT_MODERATE,
    LOW_MFU,
    MEMCPY_NOTABLE,
    shares,
)
from gpudiag.analyzers.comm_cost import cost
from gpudiag.analyzers.compile_facts import CompileFacts
from gpudiag.analyzers.op_flops import MODEL_OPS
from gpudiag.diagnosis import (
    Bottleneck,
    CollectiveStats,
    HostWait,
    JobTraits,
    Mfu,
    Recommendation,
    Roofline,
    Stragglers,
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


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


def _ms(us: float) -> str:
    return f"{us / 1e3:.3g} ms"


@dataclass(frozen=True)
class Advice:
    action: str
    applies: Callable[[AdviceInputs, dict[Bottleneck, float]], bool]
    text: Callable[[AdviceInputs, dict[Bottleneck, float]], str]
    predict: Callable[[AdviceInputs], whatif.Prediction]
    addresses: Bottleneck | None  # the share it works on (orders those without a prediction)
    # a precondition the device or the machine must meet for the fix to help at all: None when
    # it holds, else why it fails (the fix is then listed as one that would not help)
    blocked: Callable[[AdviceInputs], str | None] = lambda _a: None


def _gpu(a: AdviceInputs) -> bool:
    return a.device_kind == "gpu"


def _unit(a: AdviceInputs) -> str:
    return "GPU" if _gpu(a) else "CPU"


def _fp32_share(a: AdviceInputs) -> float:
    return a.mfu.dtype_mix.get("fp32", 0.0) if a.mfu.dtype_mix else (
        1.0 if a.roofline.dtype_family == "fp32" else 0.0)


def _fastest_lower(a: AdviceInputs) -> tuple[str, float] | None:
    """(family, peak_fp32 / peak_family) of the fastest lower-precision family the device has
    a peak for, faster or not; None without an fp32 peak or any such family."""
    fp32 = a.device_peaks.get("fp32")
    if not fp32:
        return None
    best = max(((f, p) for f, p in a.device_peaks.items() if f in ("bf16", "fp16", "tf32") and p > 0),
               key=lambda fp: fp[1], default=None)
    return None if best is None else (best[0], fp32 / best[1])


def _faster(a: AdviceInputs) -> tuple[str, float] | None:
    """(family, peak_fp32 / peak_family) of the fastest family the device has over fp32, where
    it is worth the change (FASTER_DTYPE_MIN_RATIO)."""
    best = _fastest_lower(a)
    return best if best is not None and best[1] <= 1 / FASTER_DTYPE_MIN_RATIO else None


def _peaks_source(a: AdviceInputs) -> str:
    return "measured" if not _gpu(a) else "datasheet"


def _slower_dtype(a: AdviceInputs, families: tuple[str, ...]) -> str | None:
    """Why lower precision would not help on this device: its peak for every family in
    ``families`` (those the fix would use) is no faster than fp32's; None where one is. A CPU
    without bf16 units (AMX, AVX512_BF16) converts bf16 to fp32 and back around each operation:
    on this project's 2-core AMD EPYC, bf16 GEMMs ran at 0.3-30 GFLOP/s against 85-256 fp32."""
    fp32 = a.device_peaks.get("fp32")
    peaks = {f: a.device_peaks[f] for f in families if a.device_peaks.get(f)}
    if not fp32 or not peaks or max(peaks.values()) > fp32:
        return None
    each = " and ".join(f"{f} {p / 1e9:.3g} GFLOP/s ({p / fp32:.2g}x)" for f, p in peaks.items())
    return (f"this {_unit(a)}'s {_peaks_source(a)} GEMM peak{'s' if len(peaks) > 1 else ''}: {each}, "
            f"against fp32 {fp32 / 1e9:.3g} GFLOP/s: under torch.autocast its matmuls would run "
            "slower, not faster")


# -- texts -------------------------------------------------------------------------------------

def job_cpu(t: JobTraits) -> whatif.JobCpu | None:
    """The job's CPU use, where the host sampler measured it and the bootstrap saw the cores."""
    if t.cores_used is None or not t.cpus:
        return None
    return whatif.JobCpu(t.cores_used, t.cpus, t.intra_op_threads or 1, t.other_cores or 0.0,
                         t.runq_cores or 0.0, t.cpu_step_s * 1e6 if t.cpu_step_s else None)


def _loading(a: AdviceInputs, cpu: whatif.JobCpu | None) -> str:
    """What the wait costs in CPU, in words: decoding needs a core per worker, storage does not."""
    if cpu is None or not a.traits.single_process_loader:
        return ""
    used = whatif.loading_cores(a.view, cpu)
    if used >= whatif.CPU_LOADING:
        w = whatif.loader_work(a.view, cpu, _gpu(a))
        beside = "its main thread" if _gpu(a) else f"the model's {cpu.model_cores} thread(s)"
        return (f" Loading is CPU work here ({_ms(w.batch_us)} per batch on the thread that makes "
                f"it): workers share the {cpu.cpus} cores with {beside}, so the cores, not the "
                "number of workers, bound the step once the wait is hidden; decoding faster or on "
                "other machines goes further.")
    return (f" The wait is not CPU work (the job's processes use {cpu.cores_used:.2g} cores): "
            "workers waiting on storage need no core of their own.")


def _input_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    workers = " with num_workers=0" if a.traits.single_process_loader else ""
    cpu = job_cpu(a.traits)
    need = whatif.workers_needed(a.view, cpu, _gpu(a)) if a.traits.single_process_loader else None
    raise_to = f" to at least {need}" if need else ""
    pin = ", set pin_memory=True" if _gpu(a) else ""
    onto = " (or onto the GPU)" if _gpu(a) else ""
    return (f"The DataLoader wait is {_pct(s[Bottleneck.INPUT])} of step time{workers}: raise "
            f"num_workers{raise_to}{pin} and prefetch_factor, and move decoding/augmentation out "
            f"of the training process{onto}.{_loading(a, cpu)}")


def _cpu_loading(a: AdviceInputs) -> bool:
    """A single-process loader whose wait is CPU work (decoding, augmenting), by the host samples."""
    cpu = job_cpu(a.traits)
    return (cpu is not None and a.traits.single_process_loader
            and whatif.loading_cores(a.view, cpu) >= whatif.CPU_LOADING)


def _cheaper_input_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    w = whatif.loader_work(a.view, job_cpu(a.traits), _gpu(a))  # type: ignore[arg-type]
    return (f"The DataLoader wait is {_pct(s[Bottleneck.INPUT])} of step time and it is CPU work "
            f"({_ms(w.batch_us)} a batch on the thread that makes it): make each batch cheaper to "
            "produce - decode once and store the decoded (or smaller) samples, move augmentation "
            "to the accelerator, or load on other machines - since workers only move that work to "
            "other cores, and only where cores are free.")


def _comm_detail(a: AdviceInputs) -> str:
    if not a.collectives:
        return ""
    c = a.collectives[0]
    out = f" ({c.collective}"
    if c.exposed_per_step_us is not None:
        out += f": {_ms(c.exposed_per_step_us)} exposed per step"
    if c.busbw_gbps is not None:
        out += f", bus bandwidth {c.busbw_gbps:.3g} GB/s"
        if c.link_peak_gbps:
            out += f" = {_pct(c.busbw_gbps / c.link_peak_gbps)} of the link's peak"
    return out + ")"


def _exposed(a: AdviceInputs) -> float:
    return a.view.comm_exposed / a.view.step_time if a.view.step_time > 0 else 0.0


def _comm_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    t = a.traits
    if t.fsdp:
        how = "overlap it with compute (FSDP backward_prefetch and forward_prefetch)"
    elif t.ddp:
        per_step = _collectives_per_step(a)
        how = ("overlap it with backward: a smaller DDP bucket_cap_mb starts each bucket's "
               "all-reduce while backward still runs" if per_step is not None and per_step < 2 else
               f"overlap the last of it with backward: DDP already all-reduces {per_step:.0f} buckets "
               "a step while backward runs, so what is left exposed is the last buckets' (a smaller "
               "bucket_cap_mb makes them smaller)" if per_step is not None else
               "overlap it with backward (DDP's bucket_cap_mb sets how early each all-reduce starts)")
    elif t.training:
        how = ("overlap it with backward: all-reduce gradients in buckets as backward produces them "
               "(DistributedDataParallel, or async_op=True per bucket)")
    else:
        how = "overlap it with compute (async_op=True, and wait only where the result is needed)"
    link = ", and check the interconnect" if _gpu(a) else ""
    return (f"Communication not overlapped with compute is {_pct(_exposed(a))} of step time"
            f"{_comm_detail(a)}: {how}{link}.")


def _collectives_per_step(a: AdviceInputs) -> float | None:
    """All-reduces (or the job's busiest collective) per step and rank, in the view."""
    if not a.collectives or not a.steps_per_rank:
        return None
    return a.collectives[0].count / a.steps_per_rank


def _comm_cost_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    b = a.view
    parts = [f"{_ms(b.comm_exposed)} exposed"]
    if b.comm_work > 0:
        parts.append(f"{_ms(b.comm_work)} of the training thread's copies into and out of DDP's buckets")
    if b.comm_contention > 0:
        parts.append(f"{_ms(b.comm_contention)} of compute time its threads took from the ranks' cores")
    k = whatif.ACCUMULATE_STEPS
    return (f"Communication costs {_pct(s[Bottleneck.COMMUNICATION])} of step time "
            f"({', '.join(parts)}): all-reduce less often - accumulate gradients over {k} micro-batches "
            "under DDP's no_sync() and all-reduce on the last (each step then moves the same bytes "
            f"for {k} times the samples, where the larger effective batch suits the training) - or send "
            "fewer bytes (DDP's bf16_compress_hook or fp16_compress_hook, PowerSGD)"
            + ("; on a CPU, gloo's threads run on the ranks' own cores: where the ranks share one "
               "machine, one process with more intra-op threads needs no all-reduce at all"
               if not _gpu(a) and a.ranks > 1 else "")
            + ".")


def own_launch_share(b: TimeBreakdown) -> float:
    """The job's own host work (Python, launches, syncs) over the step: the host gaps less the
    training thread's wait for a core (``host_waiting``), which no launch-overhead fix removes."""
    waiting = max(b.host_waiting, b.host_stalled)
    return (b.host_overhead - waiting) / b.step_time if b.step_time > 0 else 0.0


def contention_share(b: TimeBreakdown) -> float:
    """The training thread's wait for cores the job's own workers and threads held, over the step."""
    return max(0.0, b.host_waiting - b.host_stalled) / b.step_time if b.step_time > 0 else 0.0


def _contention_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    t = a.traits
    workers = max(t.dataloader_workers, default=0)
    free = (f" ({t.cpus} cores, {workers} DataLoader workers, {t.intra_op_threads} intra-op "
            "threads)" if t.cpus and t.intra_op_threads else "")
    whose = ("while the job's own workers and threads hold them"
             if a.host_wait is None or a.host_wait.own_share is not None else
             "(who held them the host sampler could not say: where it is the job's own workers and "
             "threads)")
    return (f"The training thread waits for a core {_pct(contention_share(a.view))} of step time "
            f"{whose}{free}: leave it a core - fewer "
            "intra-op threads (torch.set_num_threads), DataLoader workers sized to the cores left "
            "free, augmentation moved to the GPU (torchvision.transforms.v2 on CUDA tensors).")


def _graphs_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"The GPU is idle {_pct(own_launch_share(a.view))} of step time on the job's own host "
            "work (launches, Python, syncs) with no input wait: capture "
            "the step with CUDA graphs or torch.compile(mode='reduce-overhead'), remove host syncs "
            "(.item(), .cpu(), print of tensors) from the loop, and grow the batch so each launch "
            "does more work.")


def _syncs_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"The GPU is idle {_pct(s[Bottleneck.HOST])} of step time with no input wait although "
            "the step is compiled: remove host syncs (.item(), .cpu(), print of tensors) and graph "
            "breaks from the loop, and grow the batch so each launch does more work.")


def _compile_small_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"{_pct(s[Bottleneck.HOST])} of step time is dispatch overhead and gaps between "
            "operators (many tiny ops): fuse them with torch.compile, batch the work into fewer, "
            "larger tensor ops, and vectorise Python loops.")


def _batch_small_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"{_pct(s[Bottleneck.HOST])} of step time is dispatch overhead and gaps between "
            "operators although the step is compiled: batch the work into fewer, larger tensor "
            "ops, vectorise Python loops, and grow the batch.")


def _largest(a: AdviceInputs) -> str:
    return f" (largest: {', '.join(a.top_memory_ops[:3])})" if a.top_memory_ops else ""


def _fuse_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    fusable = [n for n in a.top_memory_ops if n not in MODEL_OPS]
    largest = f" (largest: {', '.join(fusable[:3])})" if fusable else ""
    return (f"Memory-bound {_unit(a)} work is {_pct(s[Bottleneck.MEMORY])} of step time"
            f"{largest}: fuse chains of elementwise and normalisation ops with torch.compile, "
            "so each reads and writes its data once (it also closes the gaps between ops).")


def _bf16_bytes_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"Memory-bound {_unit(a)} work is {_pct(s[Bottleneck.MEMORY])} of step time in fp32"
            f"{_largest(a)}: keep activations in bf16 (torch.autocast) to halve the bytes moved.")


def _fused_opt_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return ("The optimizer updates parameters one tensor at a time: pass foreach=True (or "
            "fused=True) to it, so each update is a few large kernels instead of many small ones.")


def _copies_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    f = a.view.memcpy_exposed / a.view.step_time
    return (f"Memory copies not hidden by compute are {_pct(f)} of step time: use pinned host "
            "memory with non_blocking=True copies and avoid per-step host<->device transfers.")


def _precision_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    fam, ratio = _faster(a) or _fastest_lower(a) or ("bf16", 1.0)
    mfu = f", MFU {_pct(a.mfu.value)}" if a.mfu.value is not None else ""
    if _gpu(a):
        how = "run matmuls in bf16 (torch.autocast)" + (
            " or allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True)"
            if "tf32" in a.device_peaks else "")
    else:
        how = ("run matmuls in bf16 (torch.autocast('cpu', dtype=torch.bfloat16)): this CPU's "
               f"measured {fam} GEMM peak is {1 / ratio:.2g}x its fp32 one")
    return (f"Compute-bound {_unit(a)} work is {_pct(s[Bottleneck.COMPUTE])} of step time in fp32"
            f"{mfu}: {how}.")


def _attention_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return ("Attention is built from matmuls and a softmax: use "
            "torch.nn.functional.scaled_dot_product_attention (fused, flash/memory-efficient "
            "kernels), which never writes the attention matrix to memory.")


def _shapes_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"MFU is {_pct(a.mfu.value or 0.0)} and the largest GEMMs have dimensions that are not "
            f"multiples of {TENSOR_CORE_MULTIPLE}: pad hidden sizes, vocabulary and batch to "
            "multiples of 64 so they run on tensor cores without padding.")


def _near_peak_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    return (f"Compute-bound {_unit(a)} work is {_pct(s[Bottleneck.COMPUTE])} of step time at MFU "
            f"{_pct(a.mfu.value or 0.0)}, near what the math allows: gains now come from doing "
            "fewer FLOPs (a smaller model, less recomputation) or from more devices.")


def _straggler_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    st = a.stragglers
    assert st is not None
    worst = _worst(st)
    slow = st.per_rank_step_us.get(str(worst), 0) / st.median_step_us - 1
    return (f"Rank {worst} is {_pct(slow)} slower per step than the median rank; every other rank "
            "waits for it at each collective: check that node's clocks and thermals, its input "
            "shard, and CPU contention.")


def _worst(st: Stragglers) -> int:
    return max(st.ranks, key=lambda r: st.per_rank_step_us.get(str(r), 0))


# -- conditions --------------------------------------------------------------------------------

def _bad_gemm_shapes(a: AdviceInputs) -> bool:
    for p in a.roofline.points[:10]:
        if p.bound != "compute" or p.op not in ("aten::mm", "aten::addmm", "aten::bmm",
                                               "aten::linear", "aten::matmul", "aten::baddbmm"):
            continue
        dims = [int(x) for x in re.findall(r"\d+", p.shape)]
        if any(d > 1 and d % TENSOR_CORE_MULTIPLE for d in dims):
            return True
    return False


def _lower_precision_helps(a: AdviceInputs) -> bool:
    return _fp32_share(a) >= 0.5 and _faster(a) is not None


def _lower_precision_applies(a: AdviceInputs) -> bool:
    """Mostly fp32 work on a device whose lower-precision peak is worth the change, or slower
    than fp32 (then it is listed as a fix that would not help, ``_slower_dtype``); a family a
    little faster (under FASTER_DTYPE_MIN_RATIO) is not worth the change and is not named."""
    best = _fastest_lower(a)
    return _fp32_share(a) >= 0.5 and best is not None and (best[1] >= 1 or _faster(a) is not None)


def _precision_predict(a: AdviceInputs) -> whatif.Prediction:
    fam, ratio = _faster(a) or _fastest_lower(a) or ("fp32", 1.0)
    return whatif.faster_dtype(a.view, _fp32_share(a), ratio, fam)


def _bf16_bytes_predict(a: AdviceInputs) -> whatif.Prediction:
    """Half the bytes of the memory-bound fp32 work; autocast also runs the matmuls in bf16, so
    where the device's bf16 peak is below fp32's their time grows by the peaks' ratio."""
    fp32, bf16 = a.device_peaks.get("fp32"), a.device_peaks.get("bf16")
    ratio = fp32 / bf16 if fp32 and bf16 else 1.0
    return whatif.halved_bytes(a.view, _fp32_share(a), a.fp32_memory_bytes, a.bandwidth,
                               gemm_ratio=ratio)


def _compiled(a: AdviceInputs) -> whatif.Prediction:
    """torch.compile's step: on a GPU its launch gaps closed and elementwise runs fused; on a
    CPU, where the operators are the host's work, its calls counted (``whatif.compiled_cpu``)."""
    f = a.compile_facts
    if _gpu(a) or f is None or f.calls <= 0 or a.traced is None:
        return whatif.compiled(a.view, a.fusion_saved_share)
    return whatif.compiled_cpu(a.view, a.traced, f.calls, f.kernels, f.graphs, f.extern_us, f.kept_us,
                               f.syncs)


def _straggler(a: AdviceInputs) -> whatif.Prediction:
    st = a.stragglers
    assert st is not None
    return whatif.straggler_fixed(a.view, st.median_step_us, st.per_rank_step_us.get(str(_worst(st)), 0))


def _none(why: str) -> Callable[[AdviceInputs], whatif.Prediction]:
    return lambda _a: whatif.Prediction(None, why)


CATALOGUE: list[Advice] = [
    Advice("dataloader-workers", lambda a, s: s[Bottleneck.INPUT] >= INPUT_MODERATE, _input_text,
           lambda a: whatif.input_hidden(a.view, job_cpu(a.traits), _gpu(a)), Bottleneck.INPUT,
           blocked=lambda a: whatif.no_core_for_workers(a.view, job_cpu(a.traits), _gpu(a))),
    Advice("cheaper-input", lambda a, s: s[Bottleneck.INPUT] >= INPUT_MODERATE and _cpu_loading(a),
           _cheaper_input_text,
           _none("how much cheaper a batch gets is the job's choice: each ms of a batch's work "
                 "removed is a ms of the wait, while the main thread loads"), Bottleneck.INPUT),
    Advice("overlap-communication", lambda a, s: _exposed(a) >= COMM_NOTABLE,
           _comm_text,
           lambda a: whatif.communication_overlapped(a.view, cpu=not _gpu(a), backward_us=a.backward_us),
           Bottleneck.COMMUNICATION),
    Advice("all-reduce-less-often",
           lambda a, s: a.traits.training and s[Bottleneck.COMMUNICATION] >= COMM_NOTABLE,
           _comm_cost_text, lambda a: whatif.accumulated(a.view, cost(a.view)),
           Bottleneck.COMMUNICATION),
    # host advice on a GPU from the job's own launch overhead alone; the training thread's wait
    # for cores its own workers and threads hold has its own fix (``host_wait``)
    Advice("cuda-graphs-or-compile",
           lambda a, s: _gpu(a) and not a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE,
           _graphs_text, lambda a: whatif.compiled(a.view, a.fusion_saved_share), Bottleneck.HOST),
    Advice("remove-host-syncs",
           lambda a, s: _gpu(a) and a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE,
           _syncs_text, lambda a: whatif.host_gaps_closed(a.view), Bottleneck.HOST),
    Advice("free-a-core", lambda a, s: contention_share(a.view) >= HOST_NOTABLE, _contention_text,
           lambda a: whatif.contention_removed(a.view), Bottleneck.HOST),
    Advice("compile-small-ops",
           lambda a, s: not _gpu(a) and not a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           _compile_small_text, _compiled, Bottleneck.HOST),
    Advice("batch-small-ops",
           lambda a, s: not _gpu(a) and a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           _batch_small_text, lambda a: whatif.host_gaps_closed(a.view), Bottleneck.HOST),
    # torch.compile once: where the host advice above already names it, not again for memory
    Advice("fuse-memory-bound",
           lambda a, s: not a.traits.compiled and s[Bottleneck.MEMORY] >= DEVICE_NOTABLE
           and a.view.memory_bound > 0 and s[Bottleneck.HOST] < HOST_NOTABLE,
           _fuse_text, _compiled, Bottleneck.MEMORY),
    Advice("bf16-activations",
           lambda a, s: s[Bottleneck.MEMORY] >= DEVICE_NOTABLE and a.view.memory_bound > 0
           and _fp32_share(a) >= 0.5 and "bf16" in a.device_peaks,
           _bf16_bytes_text, _bf16_bytes_predict, Bottleneck.MEMORY,
           blocked=lambda a: _slower_dtype(a, ("bf16",))),
    Advice("fused-optimizer",
           lambda a, s: a.traits.optimizer and not a.traits.fused_optimizer
           and max(s[Bottleneck.MEMORY], s[Bottleneck.HOST]) >= DEVICE_NOTABLE,
           _fused_opt_text,
           _none("the optimizer's share of the step is not separated in the breakdown"),
           Bottleneck.MEMORY),
    Advice("pinned-async-copies",
           lambda a, s: _gpu(a) and a.view.step_time > 0
           and a.view.memcpy_exposed / a.view.step_time >= MEMCPY_NOTABLE,
           _copies_text, lambda a: whatif.copies_hidden(a.view), Bottleneck.MEMORY),
    Advice("lower-precision",
           lambda a, s: s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and _lower_precision_applies(a),
           _precision_text, _precision_predict, Bottleneck.COMPUTE,
           blocked=lambda a: _slower_dtype(a, ("bf16", "fp16", "tf32"))),
    Advice("fused-attention",
           lambda a, s: _gpu(a) and a.traits.attention and not a.traits.sdpa
           and s[Bottleneck.COMPUTE] + s[Bottleneck.MEMORY] >= DEVICE_NOTABLE,
           _attention_text,
           _none("the trace does not show how much of the matmul and softmax time a fused kernel "
                 "would keep"), Bottleneck.COMPUTE),
    Advice("tensor-core-shapes",
           lambda a, s: _gpu(a) and s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and a.mfu.value is not None
           and a.mfu.value < LOW_MFU and _bad_gemm_shapes(a),
           _shapes_text, _none("the speed of a padded GEMM depends on the kernel chosen"),
           Bottleneck.COMPUTE),
    Advice("fewer-flops",
           lambda a, s: s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and a.mfu.value is not None
           and a.mfu.value >= LOW_MFU and not _lower_precision_helps(a),
           _near_peak_text, _none("a smaller model or more devices change the job, not its speed"),
           Bottleneck.COMPUTE),
    Advice("fix-straggler", lambda a, s: a.stragglers is not None and bool(a.stragglers.ranks),
           _straggler_text, _straggler, None),
]
ACTIONS = [c.action for c in CATALOGUE]


@dataclass
class Advised:
    """The fixes to do, first those for the verdict's label; and those that apply to the job's
    bottleneck but would not speed it up here (``Verdict.not_advised``)."""

    advised: list[Recommendation]
    not_advised: list[Recommendation]


def _not_helping(rec: Recommendation, reason: str, keep_prediction: bool) -> Recommendation:
    """The fix as one that would not help: the reason, and the prediction where it is the reason
    (a precondition that fails makes the prediction, which assumed it, meaningless)."""
    if not keep_prediction:
        return replace(rec, why=f"would not help: {reason}", predicted_step_s=None, gain=None)
    return replace(rec, why=f"would not help: {reason}" + (f". The prediction: {rec.why}" if rec.why else ""))


def recommend(a: AdviceInputs) -> Advised:
    """The fixes that apply to this job: first those for the verdict's label (or its tie), then
    the others, each group ranked by what they are predicted to save. A fix is never listed as a
    thing to do where it would not speed the job up: its precondition fails here (``Advice
    .blocked``), or its predicted step is not faster than today's; it goes to ``not_advised``
    with the reason instead."""
    if a.view.step_time <= 0:
        return Advised([], [])
    s = shares(a.view)
    step_s = a.view.step_time * 1e-6
    fits = {x for x in (a.label, a.tie_with) if x is not None}
    out: list[tuple[tuple[int, int, float], Recommendation]] = []
    refused: list[Recommendation] = []
    for c in CATALOGUE:
        if not c.applies(a, s):
            continue
        p = c.predict(a)
        pred = None if p.step_us is None else max(0.0, p.step_us) * 1e-6
        gain = None if pred is None else 1 - pred / step_s
        rec = Recommendation(action=c.action, text=c.text(a, s), predicted_step_s=pred, why=p.why,
                             step_s=step_s, gain=gain)
        blocked = c.blocked(a)
        if blocked is not None:
            refused.append(_not_helping(rec, blocked, keep_prediction=False))
            continue
        if gain is not None and gain <= 0:
            refused.append(_not_helping(
                rec, f"its predicted step ({_ms(pred * 1e6)}) is not faster than today's "
                     f"({_ms(step_s * 1e6)})", keep_prediction=True))
            continue
        first = 0 if c.addresses in fits else 1
        key = (first, 0, -gain) if gain is not None else (
            first, 1, -(s[c.addresses] if c.addresses else 1.0))
        out.append((key, rec))
    out.sort(key=lambda kv: kv[0])
    return Advised([r for _, r in out], refused)
