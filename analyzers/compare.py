"""Before/after: what changed between two diagnoses of (supposedly) the same job.

Why it is careful: two runs of the same unchanged job never take exactly the same time, and
profiled steps are slowed by the profiler by an amount that itself varies from run to run (the
same GPT job on an H100 read "50.4 -> 38.6 ms, 23% faster" from its traced steps while its own
step timer said 28.8 vs 28.5 ms). So when both sides are run directories, the step time is
compared from the runs' step timers (untraced steps, profiler off), with a bootstrap interval
on the ratio of the medians and a run-to-run noise floor (``step_change``); breakdowns, labels
and MFU come from the unprofiled estimates. With a trace on either side there is no step timer,
and the comparison says it cannot tell noise from change.

Kernels and operators are compared by mean time *per step*, so runs that traced a different
number of steps or ranks still compare like for like.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpudiag.analyzers.stats import iqr_over_median, mann_whitney_p
from gpudiag.diagnosis import (
    DIFF_SCHEMA_VERSION,
    Bottleneck,
    Diagnosis,
    DiagnosisDiff,
    ItemDelta,
    StepChange,
    TimeBreakdown,
    TopItem,
)
from gpudiag.units import pct

MAX_ITEMS = 15

# The interval: a percentile bootstrap of the ratio of the two medians (Efron & Tibshirani, "An
# Introduction to the Bootstrap", 1993, ch. 13). Medians, not means: step times have a long right
# tail (a checkpoint, a DataLoader hiccup) that moves a mean by more than the change sought.
CONFIDENCE = 0.95
RESAMPLES = 2000  # the 2.5% / 97.5% quantiles of 2000 resamples move by well under 0.1%
BOOTSTRAP_SEED = 0  # fixed: the same two runs always get the same answer
_CHUNK = 250  # resamples drawn at a time, so a 100k-step run needs no gigabytes
# Fewer untraced steps than this on either side give no interval worth printing.
MIN_STEPS = 5
# The interval only knows the step-to-step jitter inside each run; runs also differ as a whole
# (GPU clocks and temperature, other tenants, where the allocator landed), and the interval of
# a few hundred steps is narrower than that. So a change must also exceed the run-to-run noise:
# - at least RUN_TO_RUN_FLOOR: two runs of the same unchanged job differed by 1.0% in median step
#   time on an H100 (GPT: 28.8 vs 28.5 ms), and gpudiag's dilation model treats under 2% as noise
#   (analyzers/unprofiled.NOISE_FLOOR);
# - and at least half the interquartile range (over the median) of the noisier run: a median that
#   moves by less than the run's own step-to-step spread is what a change of conditions (a noisy
#   neighbour in one run) does. Seen here: the same CPU job twice on a shared machine, +3.0% with
#   a bootstrap interval of +2.4..+3.8%, while the second run's half-IQR was 8.5%.
RUN_TO_RUN_FLOOR = 0.02
# A CPU job's runs differ more as a whole: the same unchanged ~11 ms CPU job run twice on a 2-core
# CI runner read +2.6% (bootstrap interval +2.4..+3.0%, both half-IQRs under 2%), and +3.0% on
# this team's shared 2-core VM. The cores' clocks, the page cache and every other process share
# the device itself, where a GPU job shares only its host. So a CPU job's change must pass 5%.
CPU_RUN_TO_RUN_FLOOR = 0.05

# The percentile interval of a median is a little too narrow on small samples (medians of few
# steps take few distinct values): with 10 steps a side it excluded "no change" for 5.5% of
# pairs drawn from one distribution. A rank test (Mann-Whitney U, two-sided, normal
# approximation with tie and continuity corrections: Mann & Whitney 1947; Lehmann,
# "Nonparametrics", 1975, ch. 1) holds its level there; a change must pass both.
ALPHA = 1 - CONFIDENCE

NO_CHANGE = "no significant change"
METHOD = (f"{CONFIDENCE:.0%} percentile bootstrap interval ({RESAMPLES} resamples, fixed seed) of the "
          "ratio of median untraced step times; significant when the interval excludes no change, a "
          f"Mann-Whitney U test agrees (p < {ALPHA:.2g}) and the change exceeds run-to-run noise (at least "
          f"{RUN_TO_RUN_FLOOR:.0%} on a GPU, {CPU_RUN_TO_RUN_FLOOR:.0%} on a CPU, and at least half the "
          "interquartile range of either run's steps)")


def step_change(before_s: Sequence[float], after_s: Sequence[float], *, confidence: float = CONFIDENCE,
                resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                floor: float = RUN_TO_RUN_FLOOR) -> StepChange | None:
    """Whether the median step time changed by more than noise, from two samples of step times
    (seconds, untraced steps of each run). None when either side has fewer than MIN_STEPS."""
    b = np.asarray([x for x in before_s if x > 0 and np.isfinite(x)], dtype=float)
    a = np.asarray([x for x in after_s if x > 0 and np.isfinite(x)], dtype=float)
    if len(b) < MIN_STEPS or len(a) < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    ratios = []
    for start in range(0, resamples, _CHUNK):
        n = min(_CHUNK, resamples - start)
        mb = np.median(b[rng.integers(0, len(b), size=(n, len(b)))], axis=1)
        ma = np.median(a[rng.integers(0, len(a), size=(n, len(a)))], axis=1)
        ratios.append(ma / mb)
    tail = (1 - confidence) / 2
    lo, hi = np.quantile(np.concatenate(ratios), [tail, 1 - tail]) - 1.0
    med_b, med_a = float(np.median(b)), float(np.median(a))
    change = med_a / med_b - 1.0
    noise = max(floor, iqr_over_median(b) / 2, iqr_over_median(a) / 2)
    significant = bool((lo > 0 or hi < 0) and abs(change) >= noise
                       and mann_whitney_p(b, a) < 1 - confidence)
    direction = NO_CHANGE if not significant else "slower" if change > 0 else "faster"
    return StepChange(before_median_us=med_b * 1e6, after_median_us=med_a * 1e6, change=change,
                      ci_low=float(lo), ci_high=float(hi), confidence=confidence,
                      before_steps=len(b), after_steps=len(a), noise_floor=noise,
                      significant=significant, direction=direction,
                      method=METHOD if (confidence, resamples, floor) == (CONFIDENCE, RESAMPLES,
                                                                          RUN_TO_RUN_FLOOR) else
                      f"{confidence:.0%} percentile bootstrap interval ({resamples} resamples) of the ratio "
                      f"of median step times; noise floor {floor:.1%}")


def describe(sc: StepChange) -> str:
    """'-0.3% (95% interval -1.5% to +0.9%; noise ±1.2%; 412 and 398 untraced steps): no significant
    change'."""
    what = NO_CHANGE if not sc.significant else f"significantly {sc.direction}"
    lo, hi = pct(sc.ci_low, signed=True), pct(sc.ci_high, signed=True)
    return (f"{pct(sc.change, signed=True)} ({sc.confidence:.0%} interval {lo} to {hi}; noise "
            f"\u00b1{pct(sc.noise_floor)}; {sc.before_steps} and {sc.after_steps} untraced steps): {what}")


NOT_SPLIT = ("recorded no split of its steps (a run directory written before gpudiag's step timer read "
             "/proc schedstat, or not Linux): the step time is compared by wall clock, which counts "
             "other processes' hold on the cores as the job's")


@dataclass
class OwnPace:
    """The step-time comparison at the job's own pace, and what the machine took of each run."""

    change: StepChange | None  # None: a side recorded no split (``warnings`` says which)
    machine: str = ""  # one line: other processes' part of each run's typical step
    warnings: list[str] = field(default_factory=list)
    # where the own pace changed significantly and the training thread's time on a core moved
    # with it: by how much, and that a busier machine can move it too (``cpu_note``); else empty
    cpu: str = ""
    busier: str = ""  # "BEFORE" or "AFTER": the run other processes took the larger share of

    def verdict(self, wall: StepChange) -> str:
        """The verdict sentence: by the job's own pace where recorded, the wall clock's beside
        it, with the machine's part where the two disagree or their changes differ by more than
        the noise (a blind check: "+13%, significantly slower" at its own pace and "+117%" by
        wall clock read "By wall clock the same", and the machine's part was left out); else
        the wall clock's. Where they agree it is the verdict that is the same, and says so:
        blind check 37 read "By wall clock the same: +72.1%" beside an own pace of -14.8%, both
        within the noise, as one change."""
        if self.change is None:
            return describe(wall) + ". Compared by wall clock only: " + "; ".join(self.warnings)
        own = "At the job's own pace: " + describe(self.change)
        if self.cpu:   # set only where the own pace changed significantly (``own_pace``)
            own += "; " + self.cpu
        apart = abs(wall.change - self.change.change) >= max(wall.noise_floor, self.change.noise_floor)
        if self.change.direction == wall.direction and not apart:
            return own + ". By wall clock, the same verdict: " + describe(wall)
        # the machine's part explains a wall-clock change that points the way of the busier run
        # (slower where AFTER was busier, faster where BEFORE was); one that points the other
        # way is the job's own, and reads so (blind check 34: "+25.6% significantly slower: the
        # machine was busier in BEFORE" read as a cause that contradicts itself)
        explains = wall.direction == NO_CHANGE or (wall.direction == "slower") == (self.busier == "AFTER")
        why = "; " if not self.busier else ": " if explains else "; other processes do not explain it, "
        return own + ". By wall clock: " + describe(wall) + why + self.machine


def _machine(wall_s: Sequence[float], own_s: Sequence[float]) -> tuple[float, float]:
    """(other processes' part of the median step, the median wall step), seconds."""
    w = float(np.median(wall_s))
    return max(0.0, w - float(np.median(own_s))), w


def cpu_note(before_own: Sequence[float], before_run: Sequence[float] | None,
             after_run: Sequence[float] | None, floor: float,
             own_after: Sequence[float] | None = None) -> str:
    """Where the training thread's median time on a core per step moved by at least half the
    noise floor of the step: by how much. The own pace takes out the waits other processes
    caused, not a change in how fast the CPU ran the job's work, and a busier machine can make
    that move too (on this project's 2-core VM, two busy loops on a job's CPU cut its time on a
    core from 2.2 to 1.5 ms a step: the core kept awake between its 10 ms sleeps). Empty where
    either side has no such times or they did not move. ``own_after``: the AFTER steps at the
    job's own pace; where the time on a core moved against them, the note says so."""
    if not before_run or not after_run or not before_own:
        return ""
    rb, ra, ob = float(np.median(before_run)), float(np.median(after_run)), float(np.median(before_own))
    if abs(ra - rb) < floor / 2 * ob:
        return ""
    went = f"the training thread's time on a core went from {rb * 1e3:.3g} to {ra * 1e3:.3g} ms a step"
    if own_after is not None and (ra > rb) != (float(np.median(own_after)) > ob):
        # the step moved one way and the work the other: what moved the step is the time the
        # thread spent off a core, not its work (a blind check: a loader's sleep made 12 -> 18 ms
        # read "the job's own work changed" while its time on a core fell 4.94 -> 4.23 ms)
        return (went + ", against the step: what moved the step is the time the thread spent off a "
                "core (asleep, in I/O, waiting on its other threads or workers), not its work on one")
    return (went + ": the job's own work changed, or the CPU ran it at another speed (clocks, caches), "
            "which a busier machine can change too")


# Other processes' parts of the two runs' median steps closer than this (a share of the step)
# name no busier run.
SAME_MACHINE = 0.01


def own_pace(before_s: Sequence[float], after_s: Sequence[float], before_own: Sequence[float] | None,
             after_own: Sequence[float] | None, floor: float, before_run: Sequence[float] | None = None,
             after_run: Sequence[float] | None = None) -> OwnPace:
    """``step_change`` of the steps at the job's own pace (each less the wait other processes
    caused: ``gpudiag.pace``), and the machine's part of each run in one line; with the training
    thread's time on a core in the same steps, how far that moved (``cpu_note``)."""
    missing = [side for side, own in (("BEFORE", before_own), ("AFTER", after_own)) if not own]
    if missing:
        return OwnPace(None, warnings=[f"{side} {NOT_SPLIT}" for side in missing])
    assert before_own is not None and after_own is not None
    change = step_change(before_own, after_own, floor=floor)
    if change is None:
        return OwnPace(None, warnings=[f"fewer than {MIN_STEPS} untraced steps at the job's own pace"])
    (mb, wb), (ma, wa) = _machine(before_s, before_own), _machine(after_s, after_own)
    # only where the own pace moved: the note explains a change, and the JSON carries what the
    # verdict says (a blind check found it filled beside "no significant change", -0.6%)
    cpu = cpu_note(before_own, before_run, after_run, floor, after_own) if change.significant else ""
    if abs(ma / wa - mb / wb) < SAME_MACHINE:
        # a run against itself, or two runs the machine treated alike: no side was busier (a
        # blind check's self-diff read "busier in BEFORE ... (7.55 of 23.6 ms in AFTER)")
        return OwnPace(change, f"the machine took about the same part of both: {mb * 1e3:.3g} ms of each "
                       f"{wb * 1e3:.3g} ms step in BEFORE, {ma * 1e3:.3g} of {wa * 1e3:.3g} ms in AFTER",
                       cpu=cpu)
    busier = "AFTER" if ma / wa > mb / wb else "BEFORE"
    (m1, w1), (m0, w0) = ((ma, wa), (mb, wb)) if busier == "AFTER" else ((mb, wb), (ma, wa))
    machine = (f"the machine was busier in {busier}: other processes took {m1 * 1e3:.3g} ms of each "
               f"{w1 * 1e3:.3g} ms step ({m0 * 1e3:.3g} of {w0 * 1e3:.3g} ms in "
               f"{'BEFORE' if busier == 'AFTER' else 'AFTER'})")
    return OwnPace(change, machine, cpu=cpu, busier=busier)


def _steps(d: Diagnosis) -> int:
    return max(1, sum(len(r.steps) for r in d.ranks))


def _per_step(items: list[TopItem], steps: int) -> dict[str, float]:
    return {t.name: t.time_us / steps for t in items}


def _deltas(before: dict[str, float], after: dict[str, float]) -> list[ItemDelta]:
    out = []
    for name in set(before) | set(after):
        b, a = before.get(name, 0.0), after.get(name, 0.0)
        out.append(ItemDelta(name=name, before_us=b, after_us=a, delta_us=a - b,
                             ratio=a / b if b > 0 and a > 0 else None))
    out.sort(key=lambda x: -abs(x.delta_us))
    return out[:MAX_ITEMS]


def _has_estimate(d: Diagnosis) -> bool:
    return d.basis == "unprofiled-estimate" and d.unprofiled is not None and d.unprofiled.step_time > 0


def _traced_view(d: Diagnosis) -> tuple[TimeBreakdown, Bottleneck, float | None]:
    """Breakdown, label and MFU of the traced steps, also for a diagnosis whose verdict and MFU
    are of its unprofiled estimate: the like-for-like side of a trace-only comparison."""
    if not _has_estimate(d):
        return d.breakdown, d.verdict.label, d.mfu.value
    label = (d.traced_verdict or d.verdict).label
    m, st = d.mfu, d.breakdown.own_step  # the job's own pace, as its MFU
    mfu = m.flops_per_step / (st * 1e-6) / m.peak_flops if m.flops_per_step and m.peak_flops and st > 0 \
        else None
    return d.breakdown, label, mfu


# The OS running other work for this share of a run's traced steps is worth a note: the
# operator table compares traced times, and a busy machine slows every operator.
STALLED_NOTABLE = 0.01


def compare(before: Diagnosis, after: Diagnosis, before_steps: Sequence[float] | None = None,
            after_steps: Sequence[float] | None = None, *, before_own: Sequence[float] | None = None,
            after_own: Sequence[float] | None = None, before_run: Sequence[float] | None = None,
            after_run: Sequence[float] | None = None) -> DiagnosisDiff:
    """``before_steps`` / ``after_steps``: untraced step times (seconds) from each run's step
    timer, when the input was a run directory; with both, the step time is judged against noise.
    ``before_own`` / ``after_own``: the same steps at the job's own pace (``gpudiag.pace``), None
    where that run recorded no split: with both, the verdict is the job's own (``own_pace``).
    ``before_run`` / ``after_run``: the training thread's time on a core in those steps, where
    recorded: a significant change at the job's own pace says how far that moved."""
    nb, na = _steps(before), _steps(after)
    notes = _side_notes(before, after)
    unprofiled = _has_estimate(before) and _has_estimate(after)
    (bb, ab), labels, mfus = _views(before, after, unprofiled, notes)
    floor = CPU_RUN_TO_RUN_FLOOR if "cpu" in (before.device.kind, after.device.kind) else RUN_TO_RUN_FLOOR
    timed = bool(before_steps and after_steps)
    sc = step_change(before_steps, after_steps, floor=floor) if before_steps and after_steps else None
    pace = (own_pace(before_steps, after_steps, before_own, after_own, floor, before_run, after_run)
            if sc is not None and before_steps and after_steps else None)
    change, verdict = _step_time_verdict(sc, pace, bb, ab, timed)
    return DiagnosisDiff(
        schema_version=DIFF_SCHEMA_VERSION,
        before_sources=before.sources, after_sources=after.sources,
        before=bb, after=ab, step_time_change=change,
        label_before=labels[0], label_after=labels[1], mfu_before=mfus[0], mfu_after=mfus[1],
        kernels=_deltas(_per_step(before.top_kernels, nb), _per_step(after.top_kernels, na)),
        ops=_deltas(_per_step(before.top_ops, nb), _per_step(after.top_ops, na)),
        device_before=before.device.name, device_after=after.device.name, notes=notes,
        breakdown_delta=TimeBreakdown(**{
            f: getattr(ab, f) - getattr(bb, f) for f in TimeBreakdown.__dataclass_fields__}),
        basis="unprofiled-estimate" if unprofiled else "profiled-steps",
        step_change=sc, step_time_verdict=verdict,
        own_pace_change=pace.change if pace is not None else None,
        machine_note=pace.machine if pace is not None else "",
        cpu_note=pace.cpu if pace is not None else "",
        warnings=pace.warnings if pace is not None else [],
        tie_before=_tie(before, labels[0]), tie_after=_tie(after, labels[1]),
    )


def _tie(d: Diagnosis, label: Bottleneck) -> Bottleneck | None:
    """The label ``d``'s verdict called a tie with ``label``, where ``label`` is its verdict's."""
    return d.verdict.tie_with if d.verdict.label == label else None


def _side_notes(before: Diagnosis, after: Diagnosis) -> list[str]:
    """What differs between the two runs besides the change: device, world size, a busy machine."""
    notes = []
    if before.device.name != after.device.name:
        notes.append(f"different devices: {before.device.name} before, {after.device.name} after")
    if (before.world_size or 1) != (after.world_size or 1):
        notes.append(f"different world sizes: {before.world_size} before, {after.world_size} after")
    if before.top_kernels and after.top_kernels:
        notes.append("kernels and operators are compared by mean time per traced step and rank, "
                     "over the top items of each run")
    for side, d in (("before", before), ("after", after)):
        lost = d.breakdown.fraction("host_stalled")
        if lost >= STALLED_NOTABLE:
            notes.append(f"the {side} run's traced steps lost {pct(lost)} to the OS running other work "
                         "(a busy machine): its operators' times hold the machine's load too")
    return notes


def _views(before: Diagnosis, after: Diagnosis, unprofiled: bool, notes: list[str]
           ) -> tuple[tuple[TimeBreakdown, TimeBreakdown], tuple[Bottleneck, Bottleneck],
                      tuple[float | None, float | None]]:
    """The two breakdowns compared, with their labels and MFU: both unprofiled estimates where
    both runs have one, else both as traced (a note says which)."""
    if unprofiled:
        assert before.unprofiled is not None and after.unprofiled is not None
        notes.append("breakdowns, labels and MFU are those of each run's unprofiled estimate (its own "
                     "step timer, profiler off), not of the traced steps")
        return ((before.unprofiled, after.unprofiled), (before.verdict.label, after.verdict.label),
                (before.mfu.value, after.mfu.value))
    (bb, lb, mb), (ab, la, ma) = _traced_view(before), _traced_view(after)
    if _has_estimate(before) or _has_estimate(after):
        notes.append("only one side has an unprofiled estimate (the other is traces only, or its "
                     "steps around the trace window were too few or too unsteady to trust): both "
                     "are compared as traced, so labels and MFU here may differ from that run's "
                     "own report")
    return (bb, ab), (lb, la), (mb, ma)


def _step_time_verdict(sc: StepChange | None, pace: OwnPace | None, bb: TimeBreakdown,
                       ab: TimeBreakdown, timed: bool) -> tuple[float | None, str]:
    """The step time's change and its verdict: at the job's own pace, from the step timers, or
    from the traced steps with why that cannot tell noise from change (``timed``: both sides
    had a step timer, with too few steps on one)."""
    if pace is not None and sc is not None:
        return pace.change.change if pace.change is not None else sc.change, pace.verdict(sc)
    if sc is not None:
        return sc.change, describe(sc)
    bst, ast = bb.step_time, ab.step_time
    change = (ast / bst - 1) if bst > 0 and ast > 0 else None
    why = (f"fewer than {MIN_STEPS} untraced steps on a side" if timed
           else "no step timer on at least one side (traces only)")
    verdict = ((f"{pct(change, signed=True)} in traced step time; " if change is not None else "")
               + f"cannot tell noise from change: {why}. Traced steps are "
               "slowed by the profiler by an amount that varies from run to run; compare two "
               "gpudiag profile run directories for a judgement.")
    return change, verdict
