"""The verdict: which single thing limits this job, how sure we are, and what to do.

Decide from the time breakdown first, because a stall (waiting for input, exposed
communication, host gaps) caps speed no matter how fast the kernels are; then split the
device-busy time by roofline into compute- and memory-bound. The label is the largest share
of step time, with one override from XProf: input wait at or above ``INPUT_HIGH`` of step
time is "highly input-bound" whatever else is going on, because nothing else can be
improved until the GPU is fed. Not on a CPU: there the device does not idle while the batch is
made, the loading is the same cores' work as the model's (in the training thread, or in workers
beside it), and the label is the largest share like any other (blind check 42: an MLP whose
in-process loader took 34-35% of the step read input-bound where its model took 65%, and no
count of workers made it faster).
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.diagnosis import (
    Bottleneck,
    Deduction,
    Mfu,
    Roofline,
    TimeBreakdown,
    Verdict,
)
from gpudiag.units import pct_whole

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
# Every caveat is a ``Deduction`` of a stated amount from this (the caveats of the unprofiled
# estimate are in ``unprofiled``, of the trace here). Penalties for what the label rests on.
# Kernel-name classes (no shapes) misjudge kernels whose
# name does not say what they do; with no roofline at all compute vs memory is a default, not a
# measurement; a single traced step cannot show step-to-step variation.
PENALTY_KERNEL_NAMES = 0.2
PENALTY_NO_ROOFLINE = 0.3
PENALTY_ONE_STEP = 0.1
# The OS running other work for part of the view's step (``host_stalled``): the label rests on
# the rest of it, and what the machine's load did to that rest no trace shows: the job's own
# work crowded (its operators' threads waiting for a core, caches and a core's sibling shared)
# can move each share by up to the machine's part, so the margin between two labels by twice
# it. Measured on this project's 2-core AMD VM, a job of ~7,600 small ops beside one busy loop:
# where the machine took 46% of the traced window, compute minus host moved from +0.03..+0.20
# (quiet) to -0.63, 1.6 points of margin per point of the machine's share. So MACHINE_MOVES_SPLIT
# points per point of the step, at most PENALTY_STALLED_MAX.
MACHINE_MOVES_SPLIT = 2.0
PENALTY_STALLED_MAX = 0.5
# ...and from this share of the step on, the summary says its step is the job's own.
STALLED_NOTED = 0.01
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


def extreme_dilation(factor: float | None) -> list[Deduction]:
    """The deduction for traced steps the profiler dwarfed (none below ``EXTREME_DILATION``)."""
    if factor is None or factor < EXTREME_DILATION:
        return []
    return [Deduction(f"the profiler slowed the traced steps {factor:.0f}x, so the split of the real "
                      "step is estimated, not measured (trace a larger batch or fewer, larger ops)",
                      PENALTY_EXTREME_DILATION)]


def lost_events(lost: int, total: int) -> list[Deduction]:
    """The deduction for timed events the trace lost (none below ``LOST_NOTABLE``)."""
    share = lost / total if total > 0 else 0.0
    if share < LOST_NOTABLE:
        return []
    return [Deduction(f"{pct_whole(share)} of the trace's timed events were unusable",
                      round(LOST_PENALTY_PER_SHARE * share, 3))]


def refuse_for_lost_gpu_events(v: Verdict, gpu_lost: int, gpu_total: int) -> Verdict:
    """No verdict when most of the GPU's own events are unusable."""
    if gpu_total > 0 and gpu_lost / gpu_total >= LOST_REFUSE:
        return replace(v, label=Bottleneck.UNKNOWN, confidence=0.0, confidence_level="none",
                       secondary=None, recommendations=[], not_advised=[], tie_with=None,
                       summary=(f"no verdict: {gpu_lost} of {gpu_total} GPU events (kernels, copies) were "
                                "unusable (negative, missing or implausible durations), so the GPU's time "
                                "is mostly unknown; re-record the trace"))
    return v


def with_deductions(v: Verdict, extra: list[Deduction]) -> Verdict:
    """The verdict with more deductions taken from its confidence (floored at CONFIDENCE_MIN)."""
    extra = [d for d in extra if d.amount > 0]
    if not extra or v.label is Bottleneck.UNKNOWN:
        return v
    conf = max(CONFIDENCE_MIN, v.confidence - sum(d.amount for d in extra))
    return replace(v, confidence=round(conf, 2), confidence_level=_level(conf),
                   deductions=[*v.deductions, *extra])


# What a host-bound summary says the host share is, where nothing more is known of it.
HOST_CAUSE = "launch, Python and synchronisation overhead"


def host_cause_of(named: list[str], rest: bool) -> str:
    """A host-bound summary's cause: the parts of the host share measured apart (``named``, in
    order), then the rest (``rest``: say "the rest" where a named part is the thread asleep, not
    overhead) as launch, Python and synchronisation overhead."""
    return ", ".join([*named, ("the rest " if rest else "") + HOST_CAUSE])


def machine_penalty(share: float) -> float:
    """What the machine taking ``share`` of the steps a split was read in costs its label: nothing
    under ``STALLED_NOTED``."""
    if share < STALLED_NOTED:
        return 0.0
    return round(min(PENALTY_STALLED_MAX, MACHINE_MOVES_SPLIT * share), 3)


def _level(conf: float) -> str:
    return "high" if conf >= CONFIDENCE_HIGH else "medium" if conf >= CONFIDENCE_MEDIUM else "low"


def shares(b: TimeBreakdown) -> dict[Bottleneck, float]:
    """Fraction of the step at the job's own pace each bottleneck accounts for: of the step less
    the time the OS ran other work (``host_stalled``: the machine's load is no bottleneck of the
    job's, ``gpudiag.pace``), so they sum to 1 however busy the machine was.

    Communication's share is its cost over the step its fix is predicted on (``comm_cost.cost``
    over the view's step, ``whatif.accumulated``): its parts (exposed wait, copies, compute
    slowed beside it) are timed by wall clock, other processes' time inside them included, and
    over the own-pace step they read as much as half again larger than the step the fix removes
    (a DDP job at load 2-6 read 73% of its own-pace step where accumulating over 4 micro-batches
    ran 0.64x, as predicted from 48% of the wall step); its exposed wait, which the own pace took
    other processes' part out of (``TimeBreakdown.comm_stalled``), with that part back. The
    other shares keep their proportions in the rest of the own-pace step."""
    if b.own_step <= 0:
        return {k: 0.0 for k in _NOTABLE}
    known = b.compute_bound + b.memory_bound
    # communication's cost inside the compute (``comm_cost``): the training thread's work for
    # the collectives, and compute slowed by their threads; the rest is split by the roofline
    for_comm = min(b.compute, b.comm_work + b.comm_contention)
    rest = b.compute - for_comm
    if known > 0:
        cb = rest * b.compute_bound / known
        mb = rest * b.memory_bound / known
    else:
        cb, mb = rest, 0.0  # unknown split: counted as compute, confidence lowered
    st = b.own_step
    comm = b.comm_exposed_wall + for_comm   # ``comm_cost.cost``: by the wall clock
    others = st - (b.comm_exposed + for_comm)
    k = (1 - comm / b.step_time) / others if others > 0 else 1 / st
    return {
        Bottleneck.COMPUTE: cb * k,
        Bottleneck.MEMORY: (mb + b.memcpy_exposed) * k,
        Bottleneck.COMMUNICATION: comm / b.step_time if others > 0 else comm / st,
        Bottleneck.INPUT: b.input_wait * k,
        Bottleneck.HOST: (b.host_overhead - b.host_stalled) * k,
    }


# A tie is called within the step-time noise up to this much: beyond it the steps are not one
# population (a loader's 2 workers taking turns gave steps of ~70 and ~5 ms, noise +-490%), and
# their spread says nothing of the margin between two shares (blind check 40: "a tie between
# input-bound (86%) and memory-bound (8%)").
TIE_NOISE_MAX = 0.25


def classify(b: TimeBreakdown, *, device_kind: str, roofline: Roofline, mfu: Mfu, n_steps: int,
             deductions: list[Deduction] | None = None, noise: float | None = None,
             host_cause: str = HOST_CAUSE, input_cause: str = "") -> Verdict:
    """The label, its confidence (the margin over the runner-up, less every deduction) and
    evidence. ``noise`` is the step-time noise of the view (half the interquartile range over
    the median): a label whose margin is within it is a tie with the runner-up.
    Recommendations are added by ``advice.recommend``. ``host_cause``: what a host-bound
    summary says the host share is (``host_cause_of``: the syncs' operators, a blocking call,
    named where the trace and the step timer measured them)."""
    s = shares(b)
    ranked = sorted(s.items(), key=lambda kv: -kv[1])
    label, top = ranked[0]
    if s[Bottleneck.INPUT] >= INPUT_HIGH and device_kind == "gpu":
        label, top = Bottleneck.INPUT, s[Bottleneck.INPUT]
    others = [(k, v) for k, v in ranked if k != label]
    runner_up, second_share = others[0] if others else (None, 0.0)
    secondary = next((k for k, v in others if v >= _NOTABLE[k]), None)

    margin = top - second_share
    confidence = min(CONFIDENCE_MAX, max(CONFIDENCE_MARGIN_FLOOR, CONFIDENCE_BASE + margin))
    mine: list[Deduction] = []
    if label in (Bottleneck.COMPUTE, Bottleneck.MEMORY):
        if roofline.method == "kernel-names":
            mine.append(Deduction("compute/memory split from kernel names, not shapes",
                                  PENALTY_KERNEL_NAMES))
        elif roofline.method == "none" or b.compute_bound + b.memory_bound <= 0:
            mine.append(Deduction("no roofline information", PENALTY_NO_ROOFLINE))
    if n_steps <= 1:
        mine.append(Deduction("fewer than two profiler steps", PENALTY_ONE_STEP))
    stalled = b.fraction("host_stalled")
    if stalled >= STALLED_NOTED:
        mine.append(Deduction(f"the OS ran other work for {pct_whole(stalled)} of the step while the "
                              "job's threads waited for a core (whose work, the warnings say): the "
                              "label rests on the rest, and a crowded step moves each share by up to "
                              "that much", machine_penalty(stalled)))
    tie = runner_up if (noise is not None and runner_up is not None and second_share > 0
                        and 0 <= margin < min(noise, TIE_NOISE_MAX)) else None

    evidence = {f"{k.value} share": round(v, 4) for k, v in s.items()}
    evidence["step time ms"] = round(b.step_time / 1e3, 3)
    if b.host_stalled > 0:
        evidence["own step ms"] = round(b.own_step / 1e3, 3)
    if mfu.value is not None:
        evidence["mfu"] = round(mfu.value, 4)
    if noise is not None:
        evidence["step-time noise"] = round(noise, 4)
    unit = "GPU" if device_kind == "gpu" else "CPU"
    summary = _summary(label, s, b, unit, mfu, host_cause, input_cause)
    if tie is not None and noise is not None:   # a tie is only called within the noise
        summary = (f"a tie between {label.value} ({pct_whole(s[label])}) and {tie.value} "
                   f"({pct_whole(s[tie])}): their margin is within the step-time noise "
                   f"(\u00b1{pct_whole(noise)}). " + summary[0].upper() + summary[1:])
    v = Verdict(label=label, confidence=round(confidence, 2), confidence_level=_level(confidence),
                summary=summary, evidence=evidence, secondary=secondary, recommendations=[],
                tie_with=tie, noise=noise)
    return with_deductions(v, [*mine, *(deductions or [])])


def _summary(label: Bottleneck, s: dict[Bottleneck, float], b: TimeBreakdown, unit: str,
             mfu: Mfu, host_cause: str, input_cause: str = "") -> str:
    ms = b.own_step / 1e3  # the job's own step (``shares``)
    own = " at the job's own pace" if b.fraction("host_stalled") >= STALLED_NOTED else ""
    if label is Bottleneck.INPUT:
        # on a CPU the batch may be made on the cores the model uses (num_workers=0, decoding):
        # what is idle is the model, not the CPU (a blind job's augmenting main thread read "idle")
        idle = f"while the {unit} is idle" if unit == "GPU" else "with no model operator running"
        return (f"{pct_whole(s[label])} of each {ms:.3g} ms step{own} is spent waiting for the DataLoader "
                f"{idle}{input_cause}")
    if label is Bottleneck.COMMUNICATION:
        # of the step its fix is predicted on (``shares``): by wall clock where others took part
        wall = b.step_time / 1e3
        at = " (by wall clock, the step its fix is predicted on)" if own else ""
        inner = min(b.compute, b.comm_work + b.comm_contention)
        if inner <= 0:
            return (f"{pct_whole(s[label])} of each {wall:.3g} ms step{at} is communication not overlapped "
                    f"with compute")
        return (f"{pct_whole(s[label])} of each {wall:.3g} ms step{at} is communication's cost: "
                f"{pct_whole(b.comm_exposed_wall / b.step_time)} not overlapped with compute, "
                f"{pct_whole(inner / b.step_time)} inside the compute (the collectives' copies on the "
                f"training thread, and the compute slowed beside them: their threads on the ranks' cores)")
    if label is Bottleneck.HOST:
        if unit == "GPU":
            return (f"the GPU is idle for {pct_whole(s[label])} of each {ms:.3g} ms step{own} without "
                    f"waiting for input: {host_cause}")
        # where the CPU is the device it is busy in the gaps too, with the job's own Python and
        # dispatch (blind check 18: "the CPU is idle for 100%" of a tiny-ops job's step)
        return (f"{pct_whole(s[label])} of each {ms:.3g} ms step{own} is spent between model operators, "
                f"not waiting for input: {host_cause}")
    mfu_txt = f", MFU {pct_whole(mfu.value)}" if mfu.value is not None else ""
    if label is Bottleneck.COMPUTE:
        return (f"{pct_whole(s[label])} of each {ms:.3g} ms step{own} is compute-bound {unit} work "
                f"(arithmetic intensity above the ridge point){mfu_txt}")
    return (f"{pct_whole(s[label])} of each {ms:.3g} ms step{own} is memory-bound {unit} work "
            f"(arithmetic intensity below the ridge point){mfu_txt}")
