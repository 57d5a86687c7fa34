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
from dataclasses import dataclass, field

from gpudiag.analyzers import syncs as host_syncs
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


def _gpu(a: AdviceInputs) -> bool:
    return a.device_kind == "gpu"


def _unit(a: AdviceInputs) -> str:
    return "GPU" if _gpu(a) else "CPU"


def _fp32_share(a: AdviceInputs) -> float:
    return a.mfu.dtype_mix.get("fp32", 0.0) if a.mfu.dtype_mix else (
        1.0 if a.roofline.dtype_family == "fp32" else 0.0)


def _faster(a: AdviceInputs) -> tuple[str, float] | None:
    """(family, peak_fp32 / peak_family) of the fastest family the device has over fp32."""
    fp32 = a.device_peaks.get("fp32")
    if not fp32:
        return None
    best = max(((f, p) for f, p in a.device_peaks.items() if f in ("bf16", "fp16", "tf32")),
               key=lambda fp: fp[1], default=None)
    if best is None or best[1] < FASTER_DTYPE_MIN_RATIO * fp32:
        return None
    return best[0], fp32 / best[1]


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


def _comm_text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    t = a.traits
    if t.fsdp:
        how = "overlap it with compute (FSDP backward_prefetch and forward_prefetch)"
    elif t.ddp:
        how = ("overlap it with backward: a smaller DDP bucket_cap_mb starts each bucket's "
               "all-reduce while backward still runs")
    elif t.training:
        how = ("overlap it with backward: all-reduce gradients in buckets as backward produces them "
               "(DistributedDataParallel, or async_op=True per bucket)")
    else:
        how = "overlap it with compute (async_op=True, and wait only where the result is needed)"
    less = (", send fewer bytes (bf16 gradient compression, gradient accumulation under no_sync)"
            if t.training else "")
    link = ", and check the interconnect" if _gpu(a) else ""
    return (f"Communication not overlapped with compute is {_pct(s[Bottleneck.COMMUNICATION])} of "
            f"step time{_comm_detail(a)}: {how}{less}{link}.")


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


def _syncs_apply(a: AdviceInputs) -> bool:
    if a.syncs is not None:
        return a.syncs.share >= host_syncs.SYNC_NOTABLE
    return _gpu(a) and a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE


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
    fam, ratio = _faster(a) or ("bf16", 1.0)
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


def _precision_predict(a: AdviceInputs) -> whatif.Prediction:
    fam, ratio = _faster(a) or ("fp32", 1.0)
    return whatif.faster_dtype(a.view, _fp32_share(a), ratio, fam)


def _straggler(a: AdviceInputs) -> whatif.Prediction:
    st = a.stragglers
    assert st is not None
    return whatif.straggler_fixed(a.view, st.median_step_us, st.per_rank_step_us.get(str(_worst(st)), 0))


def _none(why: str) -> Callable[[AdviceInputs], whatif.Prediction]:
    return lambda _a: whatif.Prediction(None, why)


CATALOGUE: list[Advice] = [
    Advice("dataloader-workers", lambda a, s: s[Bottleneck.INPUT] >= INPUT_MODERATE, _input_text,
           lambda a: whatif.input_hidden(a.view, job_cpu(a.traits), _gpu(a)), Bottleneck.INPUT),
    Advice("overlap-communication", lambda a, s: s[Bottleneck.COMMUNICATION] >= COMM_NOTABLE,
           _comm_text, lambda a: whatif.communication_overlapped(a.view, cpu=not _gpu(a)),
           Bottleneck.COMMUNICATION),
    # host advice on a GPU from the job's own launch overhead alone; the training thread's wait
    # for cores its own workers and threads hold has its own fix (``host_wait``)
    Advice("cuda-graphs-or-compile",
           lambda a, s: _gpu(a) and not a.traits.compiled and own_launch_share(a.view) >= HOST_NOTABLE,
           _graphs_text, lambda a: whatif.compiled(a.view, a.fusion_saved_share), Bottleneck.HOST),
    # where the syncs were counted (``syncs``), on any device, by what removing them saves;
    # else (no count at all) a compiled GPU job's host gaps, as before
    Advice("remove-host-syncs", lambda a, s: _syncs_apply(a),
           lambda a, s: host_syncs.advice_text(a.syncs) if a.syncs is not None else _syncs_text(a, s),
           lambda a: (whatif.Prediction(*host_syncs.predicted_step_us(a.syncs)) if a.syncs is not None
                      else whatif.host_gaps_closed(a.view)), Bottleneck.HOST),
    Advice("free-a-core", lambda a, s: contention_share(a.view) >= HOST_NOTABLE, _contention_text,
           lambda a: whatif.contention_removed(a.view), Bottleneck.HOST),
    Advice("compile-small-ops",
           lambda a, s: not _gpu(a) and not a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           _compile_small_text, lambda a: whatif.compiled(a.view, a.fusion_saved_share),
           Bottleneck.HOST),
    Advice("batch-small-ops",
           lambda a, s: not _gpu(a) and a.traits.compiled and s[Bottleneck.HOST] >= HOST_NOTABLE,
           _batch_small_text, lambda a: whatif.host_gaps_closed(a.view), Bottleneck.HOST),
    # torch.compile once: where the host advice above already names it, not again for memory
    Advice("fuse-memory-bound",
           lambda a, s: not a.traits.compiled and s[Bottleneck.MEMORY] >= DEVICE_NOTABLE
           and a.view.memory_bound > 0 and s[Bottleneck.HOST] < HOST_NOTABLE,
           _fuse_text, lambda a: whatif.compiled(a.view, a.fusion_saved_share), Bottleneck.MEMORY),
    Advice("bf16-activations",
           lambda a, s: s[Bottleneck.MEMORY] >= DEVICE_NOTABLE and a.view.memory_bound > 0
           and _fp32_share(a) >= 0.5 and "bf16" in a.device_peaks,
           _bf16_bytes_text,
           lambda a: whatif.halved_bytes(a.view, _fp32_share(a), a.fp32_memory_bytes, a.bandwidth),
           Bottleneck.MEMORY),
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
           lambda a, s: s[Bottleneck.COMPUTE] >= DEVICE_NOTABLE and _lower_precision_helps(a),
           _precision_text, _precision_predict, Bottleneck.COMPUTE),
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


def recommend(a: AdviceInputs) -> list[Recommendation]:
    """The fixes that apply to this job, ranked by what they are predicted to save."""
    if a.view.step_time <= 0:
        return []
    s = shares(a.view)
    step_s = a.view.step_time * 1e-6
    out: list[tuple[tuple[int, float], Recommendation]] = []
    for c in CATALOGUE:
        if not c.applies(a, s):
            continue
        p = c.predict(a)
        pred = None if p.step_us is None else max(0.0, p.step_us) * 1e-6
        gain = None if pred is None else 1 - pred / step_s
        rec = Recommendation(action=c.action, text=c.text(a, s), predicted_step_s=pred, why=p.why,
                             step_s=step_s, gain=gain)
        key = (0, -gain) if gain is not None else (1, -(s[c.addresses] if c.addresses else 1.0))
        out.append((key, rec))
    out.sort(key=lambda kv: kv[0])
    return [r for _, r in out]
