"""The verdict: which single thing limits this job, how sure we are, and what to do.

Decide from the time breakdown first, because a stall (waiting for input, exposed
communication, host gaps) caps speed no matter how fast the kernels are; then split the
device-busy time by roofline into compute- and memory-bound. The label is the largest share
of step time, with one override from XProf: input wait at or above ``INPUT_HIGH`` of step
time is "highly input-bound" whatever else is going on, because nothing else can be
improved until the GPU is fed.
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.diagnosis import (
    Bottleneck,
    CollectiveStats,
    Mfu,
    Roofline,
    Stragglers,
    TimeBreakdown,
    Verdict,
)

# XProf (TensorFlow/JAX profiler) input-pipeline analysis: >= 20% of step time waiting for
# input is "highly input-bound", 5-20% "moderately".
INPUT_HIGH = 0.20
INPUT_MODERATE = 0.05
# PyTorch profiler TensorBoard plugin recommendations fire at DataLoader time > 5% and
# communication > 10% of step time.
COMM_NOTABLE = 0.10
# Host gaps and a device side worth naming as secondary: same 10% as communication.
HOST_NOTABLE = 0.10
DEVICE_NOTABLE = 0.10
# Memcpy not hidden by compute above this deserves its own recommendation (PyTorch plugin
# uses 5% for "memcpy" time in its overview as well).
MEMCPY_NOTABLE = 0.05
# MFU under this on a compute-bound job means the math is running far from peak.
LOW_MFU = 0.30

# Confidence of the label (0..1). Our own calibration, not a published figure: the label is
# the largest share of step time, so how sure we are grows with its margin over the runner-up.
# A tie (margin 0) is a coin toss between two labels, hence the 0.5 base; every point of
# margin adds a point of confidence.
CONFIDENCE_BASE = 0.5
# A label that wins by a whole step (margin 1.0) is still capped: the breakdown itself carries
# measurement error (profiler dilation, a few traced steps), so we never claim certainty.
CONFIDENCE_MAX = 0.95
# Even a near-tie names the larger share correctly more often than not; below this floor the
# margin alone would say "no idea", which understates a label that did come out on top.
CONFIDENCE_MARGIN_FLOOR = 0.3
# Penalties for what the label rests on. Kernel-name classes (no shapes) misjudge kernels whose
# name does not say what they do; with no roofline at all compute vs memory is a default, not a
# measurement; a single traced step cannot show step-to-step variation.
PENALTY_KERNEL_NAMES = 0.2
PENALTY_NO_ROOFLINE = 0.3
PENALTY_ONE_STEP = 0.1
# The floor after penalties: a label is always the best guess there is, never 0.
CONFIDENCE_MIN = 0.05
# Levels shown beside the number: "high" above three in four, "low" below a coin toss.
CONFIDENCE_HIGH = 0.75
CONFIDENCE_MEDIUM = 0.5

_NOTABLE = {
    Bottleneck.INPUT: INPUT_MODERATE,
    Bottleneck.COMMUNICATION: COMM_NOTABLE,
    Bottleneck.HOST: HOST_NOTABLE,
    Bottleneck.COMPUTE: DEVICE_NOTABLE,
    Bottleneck.MEMORY: DEVICE_NOTABLE,
}


# Events a trace lost (negative, missing or implausible durations, unreadable JSON): the
# breakdown describes what is left. Every point of share lost costs a point of confidence once
# at least LOST_NOTABLE is gone; with LOST_REFUSE or more of the GPU's own events gone, there
# is no verdict to give: the GPU's time is mostly unknown, so any label would be a guess.
LOST_NOTABLE = 0.01
LOST_PENALTY_PER_SHARE = 1.0
LOST_REFUSE = 0.5


# Traced steps slowed this much or more are mostly the profiler's own cost (at 5x, 80% of each
# traced step): how the remaining, real step divides between its parts is then a model, not a
# measurement, whatever the estimate does. Its label loses this much confidence and says why.
EXTREME_DILATION = 5.0
PENALTY_EXTREME_DILATION = 0.3


def account_for_dilation(v: Verdict, factor: float | None) -> Verdict:
    """The verdict of an unprofiled estimate, its confidence lowered when the profiler dwarfed
    the job's own work in the traced steps."""
    if factor is None or factor < EXTREME_DILATION:
        return v
    conf = max(CONFIDENCE_MIN, v.confidence - PENALTY_EXTREME_DILATION)
    level = ("high" if conf >= CONFIDENCE_HIGH else "medium" if conf >= CONFIDENCE_MEDIUM else "low")
    return replace(v, confidence=round(conf, 2), confidence_level=level,
                   summary=f"{v.summary} (confidence lowered: the profiler slowed the traced steps "
                           f"{factor:.0f}x, so the split of the real step is estimated, not measured; "
                           "trace a larger batch or fewer, larger ops)")


def account_for_lost_events(v: Verdict, lost: int, total: int, gpu_lost: int, gpu_total: int
                            ) -> Verdict:
    """The verdict, its confidence lowered (or refused) for what the trace lost, and why."""
    if gpu_total > 0 and gpu_lost / gpu_total >= LOST_REFUSE:
        return replace(v, label=Bottleneck.UNKNOWN, confidence=0.0, confidence_level="none",
                       secondary=None, recommendations=[],
                       summary=(f"no verdict: {gpu_lost} of {gpu_total} GPU events (kernels, copies) were "
                                "unusable (negative, missing or implausible durations), so the GPU's time "
                                "is mostly unknown; re-record the trace"))
    share = lost / total if total > 0 else 0.0
    if share < LOST_NOTABLE:
        return v
    conf = max(CONFIDENCE_MIN, v.confidence - LOST_PENALTY_PER_SHARE * share)
    level = ("high" if conf >= CONFIDENCE_HIGH else "medium" if conf >= CONFIDENCE_MEDIUM else "low")
    return replace(v, confidence=round(conf, 2), confidence_level=level,
                   summary=f"{v.summary} (confidence lowered: {_pct(share)} of the trace's timed events "
                           "were unusable)")


def shares(b: TimeBreakdown) -> dict[Bottleneck, float]:
    """Fraction of step time each bottleneck accounts for; they sum to 1."""
    if b.step_time <= 0:
        return {k: 0.0 for k in _NOTABLE}
    known = b.compute_bound + b.memory_bound
    if known > 0:
        cb = b.compute * b.compute_bound / known
        mb = b.compute * b.memory_bound / known
    else:
        cb, mb = b.compute, 0.0  # unknown split: counted as compute, confidence lowered
    st = b.step_time
    return {
        Bottleneck.COMPUTE: cb / st,
        Bottleneck.MEMORY: (mb + b.memcpy_exposed) / st,
        Bottleneck.COMMUNICATION: b.comm_exposed / st,
        Bottleneck.INPUT: b.input_wait / st,
        Bottleneck.HOST: b.host_overhead / st,
    }


def classify(b: TimeBreakdown, *, device_kind: str, roofline: Roofline, mfu: Mfu,
             collectives: list[CollectiveStats], stragglers: Stragglers | None,
             n_steps: int, dataloader_iters: list[str], top_memory_ops: list[str]) -> Verdict:
    s = shares(b)
    ranked = sorted(s.items(), key=lambda kv: -kv[1])
    label, top = ranked[0]
    if s[Bottleneck.INPUT] >= INPUT_HIGH:
        label, top = Bottleneck.INPUT, s[Bottleneck.INPUT]
    others = [(k, v) for k, v in ranked if k != label]
    second_share = others[0][1] if others else 0.0
    secondary = next((k for k, v in others if v >= _NOTABLE[k]), None)

    margin = top - second_share
    confidence = min(CONFIDENCE_MAX, max(CONFIDENCE_MARGIN_FLOOR, CONFIDENCE_BASE + margin))
    why_lower = []
    if label in (Bottleneck.COMPUTE, Bottleneck.MEMORY):
        if roofline.method == "kernel-names":
            confidence -= PENALTY_KERNEL_NAMES
            why_lower.append("compute/memory split from kernel names, not shapes")
        elif roofline.method == "none" or b.compute_bound + b.memory_bound <= 0:
            confidence -= PENALTY_NO_ROOFLINE
            why_lower.append("no roofline information")
    if n_steps <= 1:
        confidence -= PENALTY_ONE_STEP
        why_lower.append("fewer than two profiler steps")
    confidence = max(CONFIDENCE_MIN, confidence)
    level = ("high" if confidence >= CONFIDENCE_HIGH else "medium" if confidence >= CONFIDENCE_MEDIUM
             else "low")

    evidence = {f"{k.value} share": round(v, 4) for k, v in s.items()}
    evidence["step time ms"] = round(b.step_time / 1e3, 3)
    if mfu.value is not None:
        evidence["mfu"] = round(mfu.value, 4)
    unit = "GPU" if device_kind == "gpu" else "CPU"
    summary = _summary(label, s, b, unit, mfu)
    if why_lower:
        summary += f" (confidence lowered: {'; '.join(why_lower)})"
    recs = _recommendations(s, b, unit, mfu, roofline, collectives, stragglers, dataloader_iters,
                            top_memory_ops)
    return Verdict(label=label, confidence=round(confidence, 2), confidence_level=level,
                   summary=summary, evidence=evidence, secondary=secondary, recommendations=recs)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


def _summary(label: Bottleneck, s: dict[Bottleneck, float], b: TimeBreakdown, unit: str,
             mfu: Mfu) -> str:
    ms = b.step_time / 1e3
    if label is Bottleneck.INPUT:
        return (f"{_pct(s[label])} of each {ms:.3g} ms step is spent waiting for the DataLoader "
                f"while the {unit} is idle")
    if label is Bottleneck.COMMUNICATION:
        return (f"{_pct(s[label])} of each {ms:.3g} ms step is communication not overlapped "
                f"with compute")
    if label is Bottleneck.HOST:
        return (f"the {unit} is idle for {_pct(s[label])} of each {ms:.3g} ms step without "
                f"waiting for input: launch, Python and synchronisation overhead")
    mfu_txt = f", MFU {_pct(mfu.value)}" if mfu.value is not None else ""
    if label is Bottleneck.COMPUTE:
        return (f"{_pct(s[label])} of each {ms:.3g} ms step is compute-bound {unit} work "
                f"(arithmetic intensity above the ridge point){mfu_txt}")
    return (f"{_pct(s[label])} of each {ms:.3g} ms step is memory-bound {unit} work "
            f"(arithmetic intensity below the ridge point){mfu_txt}")


def _recommendations(s: dict[Bottleneck, float], b: TimeBreakdown, unit: str, mfu: Mfu,
                     roofline: Roofline, collectives: list[CollectiveStats],
                     stragglers: Stragglers | None, dataloader_iters: list[str],
                     top_memory_ops: list[str]) -> list[str]:
    recs: list[tuple[float, str]] = []
    inp = s[Bottleneck.INPUT]
    if inp >= INPUT_MODERATE:
        single = any("SingleProcess" in it for it in dataloader_iters)
        workers = " with num_workers=0" if single else ""
        recs.append((inp, f"The DataLoader wait is {_pct(inp)} of step time{workers}: raise "
                     "num_workers, set pin_memory=True and prefetch_factor, and move decoding/"
                     "augmentation out of the training process (or onto the GPU)."))
    comm = s[Bottleneck.COMMUNICATION]
    if comm >= COMM_NOTABLE:
        detail = ""
        if collectives:
            c = collectives[0]
            detail = f" ({c.collective}: {c.count} calls, {c.exposed_time_us / 1e3:.3g} ms exposed"
            if c.busbw_gbps is not None:
                detail += f", bus bandwidth {c.busbw_gbps:.3g} GB/s"
                if c.link_peak_gbps:
                    detail += f" = {_pct(c.busbw_gbps / c.link_peak_gbps)} of the link's peak"
            detail += ")"
        recs.append((comm, f"Communication not overlapped with compute is {_pct(comm)} of step "
                     f"time{detail}: overlap it with backward (DDP bucket_cap_mb, FSDP prefetch), "
                     "reduce bytes (bf16 gradients, gradient accumulation), check the interconnect."))
    host = s[Bottleneck.HOST]
    if host >= HOST_NOTABLE:
        if unit == "GPU":
            recs.append((host, f"The GPU is idle {_pct(host)} of step time with no input wait: "
                         "remove host syncs (.item(), .cpu(), print of tensors) from the loop, "
                         "capture the step with CUDA graphs or torch.compile(mode='reduce-overhead'), "
                         "and grow the batch so each launch does more work."))
        else:
            recs.append((host, f"{_pct(host)} of step time is dispatch overhead and gaps between "
                         "operators (many tiny ops): batch the work into fewer, larger tensor ops, "
                         "vectorise Python loops, or fuse with torch.compile."))
    mem = s[Bottleneck.MEMORY]
    if mem >= DEVICE_NOTABLE:
        ops = f" (largest: {', '.join(top_memory_ops[:3])})" if top_memory_ops else ""
        recs.append((mem, f"Memory-bound {unit} work is {_pct(mem)} of step time{ops}: fuse "
                     "elementwise and normalisation ops (torch.compile), use fused/foreach "
                     "optimizers, and keep activations in bf16 to halve bytes moved."))
    if b.step_time > 0 and b.memcpy_exposed / b.step_time >= MEMCPY_NOTABLE:
        f = b.memcpy_exposed / b.step_time
        recs.append((f, f"Memory copies not hidden by compute are {_pct(f)} of step time: use "
                     "pinned host memory with non_blocking=True copies and avoid per-step "
                     "host<->device transfers."))
    comp = s[Bottleneck.COMPUTE]
    if comp >= DEVICE_NOTABLE:
        if mfu.value is not None and mfu.value < LOW_MFU:
            tip = (f"MFU is {_pct(mfu.value)}: " + (
                "run matmuls in bf16 (autocast) or enable TF32; " if mfu.dtype_family == "fp32" else ""
            ) + "use fused attention (scaled_dot_product_attention) and tensor-core friendly shapes "
                "(dimensions multiples of 64).")
        elif mfu.value is not None:
            tip = (f"MFU is {_pct(mfu.value)}, already near what the math allows: gains now come "
                   "from doing fewer FLOPs (smaller model, activation checkpointing trade-offs) "
                   "or more devices.")
        else:
            tip = ("record shapes (record_shapes=True) or pass --flops-per-step to measure MFU; "
                   "use bf16 autocast and fused kernels.")
        recs.append((comp, f"Compute-bound {unit} work is {_pct(comp)} of step time: {tip}"))
    if stragglers is not None and stragglers.ranks:
        worst = max(stragglers.ranks, key=lambda r: stragglers.per_rank_step_us.get(str(r), 0))
        slow = stragglers.per_rank_step_us.get(str(worst), 0) / stragglers.median_step_us - 1
        recs.append((1.0, f"Rank {worst} is {_pct(slow)} slower per step than the median rank; "
                     "every other rank waits for it at each collective: check that node's GPU "
                     "clocks/thermals, its input shard, and CPU contention."))
    recs.sort(key=lambda r: -r[0])
    return [text for _, text in recs]
