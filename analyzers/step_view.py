"""Which view of the step the verdict describes, and everything that is read from that view.

Two views exist: the traced steps as the profiler recorded them, and (for a run directory
whose step timer gives a trustworthy reference) the job as it runs unprofiled. One step time
per view: the breakdown, the MFU, the collectives table, the recommendations and their
predictions all read the step of the view the verdict describes, never a median of one and a
mean of the other. Every caveat on the way is a ``Deduction`` from the confidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpudiag.analyzers.classify import HOST_CAUSE, classify, extreme_dilation, machine_penalty, shares
from gpudiag.analyzers.own_pace import (
    OTHERS_MOSTLY,
    own_events,
    reference_input_us,
    reference_machine_us,
    stalls_owner,
    with_machine,
    without_machine,
)
from gpudiag.analyzers.stats import iqr_over_median
from gpudiag.analyzers.unprofiled import (
    NOISE_FLOOR,
    CpuEvents,
    estimate_unprofiled,
    measure_dilation,
    noise_deduction,
)
from gpudiag.diagnosis import (
    Bottleneck,
    Deduction,
    Dilation,
    Mfu,
    RankResult,
    Roofline,
    TimeBreakdown,
    Verdict,
)
from gpudiag.steps import WindowSteps
from gpudiag.units import ms, pct_whole

PROFILED = "profiled-steps"
UNPROFILED = "unprofiled-estimate"
# From this share of a step, the machine's part (``host_stalled``) is named in the dilation's
# caveats: the steps it compares are the job's own, not what the clock read.
MACHINE_NOTED = 0.01


def busier_window(traced: TimeBreakdown, machine_us: float, untraced_own_us: float) -> list[Deduction]:
    """A deduction where other processes took more of the traced steps than of the untraced ones
    around them: what the machine's share of the window costs (``classify.machine_penalty``)
    less what its share of the untraced steps already costs the estimate's label (classify reads
    the estimate's step, whose ``host_stalled`` is theirs). The split of the step comes from the
    traced window alone; taken at the job's own pace it still holds what a crowded window does to
    the job's own work (its operators' threads waiting for a core, caches shared), which the
    quiet steps it is scaled to did not have. Seen beside a CI clone's test suite: a job of
    ~7,600 small ops whose quiet runs read compute 0.48-0.57 read host-bound 0.65 at confidence
    0.78 ("high") from a window where the machine took 52% of each step, scaled to untraced steps
    where it took 2%; and, charged only from 10 points above the reference, compute-bound at
    "medium" in one run and another label at "medium" in the next, beside one busy loop."""
    if traced.step_time <= 0:
        return []
    window = traced.host_stalled / traced.step_time
    wall = untraced_own_us + machine_us
    reference = machine_us / wall if wall > 0 else 0.0
    extra = machine_penalty(window) - machine_penalty(reference)
    if extra <= 0:
        return []
    return [Deduction(f"other processes took {pct_whole(window)} of the traced steps and "
                      f"{pct_whole(reference)} of the untraced ones around them: the split was "
                      "measured in a busier stretch than the steps it describes, and a crowded "
                      "step moves each share by up to the machine's part", round(extra, 3))]


@dataclass
class StepView:
    basis: str  # PROFILED or UNPROFILED
    breakdown: TimeBreakdown  # the view's mean step
    noise: float | None  # step-time noise of the view (half the IQR over the median)
    dilation: Dilation | None = None
    unprofiled: TimeBreakdown | None = None
    deductions: list[Deduction] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def mfu_basis(self) -> str:
        return "untraced steps" if self.basis == UNPROFILED else "traced steps"


def traced_noise(results: list[RankResult], windows: list[WindowSteps] | None) -> float | None:
    """Noise of the traced steps: from the step timer where there is one, else the trace."""
    timer = [x for w in windows or [] for x in w.traced]
    steps = timer if len(timer) >= 4 else [s.breakdown.step_time for r in results for s in r.steps]
    return iqr_over_median(steps) / 2 if len(steps) >= 4 else None


def choose_view(traced: TimeBreakdown, results: list[RankResult], windows: list[WindowSteps] | None,
                device_kind: str, events: CpuEvents | None = None,
                traced_machine_us: float | None = None) -> StepView:
    """The unprofiled estimate where the reference around the traced window can be trusted;
    otherwise the traced steps, saying why. ``events``: what a CPU trace's steps hold that tells
    the profiler's cost from the job's (``unprofiled.CpuEvents``, ``unprofiled._cpu_per_event``).
    ``traced_machine_us``: the step timer's part of other processes in a traced step
    (``HostWait.traced_machine_us``; None where not split), which names whose work the trace's
    stalls were.

    At the job's own pace: ``windows`` are its step rows less the part other processes took
    (``gpudiag.pace.at_own_pace``), and the traced steps are taken without theirs
    (``host_stalled``), so the profiler's dilation and the estimate are the job's, whatever the
    machine did around the window; the estimate then gets the reference steps' own machine
    part back as ``host_stalled``, so its step is the wall clock with that part a row apart."""
    noise = traced_noise(results, windows)
    traced_cost = noise_deduction(noise, "the traced steps")
    if windows is None:
        return StepView(PROFILED, traced, noise, deductions=traced_cost)
    own = without_machine(traced)
    measured = measure_dilation(own.step_time, windows, device_kind)
    if measured is None:
        n = sum(len(w.before) + len(w.after) for w in windows)
        return StepView(PROFILED, traced, noise, deductions=traced_cost, warnings=[
            f"the step timer holds {n} untraced steps around the traced window: too few to measure "
            "the profiler's slowdown; the breakdown, verdict and MFU describe the profiled steps "
            "(run more steps before and after the window)"])
    dil, deductions = measured
    dil.untraced_input_us = reference_input_us(windows, dil.reference_steps)
    machine = reference_machine_us(windows, dil.reference_steps)
    if (traced.host_stalled >= MACHINE_NOTED * traced.step_time
            or machine >= MACHINE_NOTED * dil.untraced_step_us):
        split = traced_machine_us
        took = (f"the OS ran other work for {ms(traced.host_stalled)} of each traced step "
                f"({stalls_owner(traced.host_stalled, split)}; {ms(traced.step_time)} by wall clock)"
                if split is not None and split < OTHERS_MOSTLY * traced.host_stalled else
                f"other processes took {ms(traced.host_stalled)} of each traced step "
                f"({ms(traced.step_time)} by wall clock)")
        # one subject where the traced part is other processes' too (blind check 34: "other
        # processes took 31.3 ms of each traced step (...) and other processes 31 ms of each")
        untraced = (f"{ms(machine)} of each untraced one ({ms(dil.untraced_step_us + machine)})"
                    if took.startswith("other processes") else
                    f"other processes {ms(machine)} of each untraced one "
                    f"({ms(dil.untraced_step_us + machine)})")
        dil.caveats.append(
            f"traced and untraced steps compared at the job's own pace: {took} and {untraced}, shown "
            "apart as the OS running other work")
    if not dil.trusted:
        return StepView(PROFILED, traced, noise, dilation=dil, deductions=deductions + traced_cost)
    # the traced view's own classify names its machine share; the estimate's split needs this
    deductions = deductions + busier_window(traced, machine, dil.untraced_step_us)
    unprofiled, repairs = estimate_unprofiled(own, dil, device_kind, own_events(events, traced))
    unprofiled = with_machine(unprofiled, machine, device_kind)
    noise = dil.untraced_spread / 2
    deductions += (repairs + extreme_dilation(dil.factor)
                   + noise_deduction(noise, "the untraced steps around the window"))
    return StepView(UNPROFILED, unprofiled, noise, dilation=dil, unprofiled=unprofiled,
                    deductions=deductions)


def traced_step_floor(view: StepView) -> float | None:
    """The shortest own step the traced view's MFU may divide by: the faster side of the
    untraced steps around the window (at the job's own pace, us), where the view is the traced
    one for want of a trusted reference. The profiler only adds time to a step, so a traced
    step shorter than the job ran unobserved on both sides of the window is not the job's
    pace: its own pace took out more than the machine's part. Seen on this project's 2-core
    EPYC VM, an fp32 MLP beside eight busy loops: the training thread waited for a core while
    its intra-op thread finished its share of each parallel region, so the step read the
    training thread's run alone (3.63 ms traced against 4.39 and 6.52 ms unobserved around the
    window, 4.1-4.4 ms quiet) and MFU 1.5x its quiet run's. None where there is no such side."""
    dil = view.dilation
    if view.basis == UNPROFILED or dil is None:
        return None
    sides = [x for x in (dil.before_step_us, dil.after_step_us) if x]
    return min(sides) if sides else None


def at_faster_side(view: StepView, traced: TimeBreakdown, device_kind: str,
                   events: CpuEvents | None = None) -> TimeBreakdown | None:
    """The traced steps brought to the faster side of the untraced steps around the window,
    where the traced view is used because those sides disagree (or the reference is otherwise
    not trusted): the job ran that fast unobserved, in the same phase, so its real step lies
    between that and the traced one, and a label is only known where both ends give it. None
    where there is no such side, or it is not faster than the traced steps. (On an H200, a
    GPT-style LM whose steps after the window ran 36% slower than before it fell back to its
    traced view and read host-bound 0.27; three other runs, and the truth, memory-bound.)"""
    dil = view.dilation
    if view.basis == UNPROFILED or dil is None:
        return None
    events = own_events(events, traced)
    traced = without_machine(traced)  # the sides are at the job's own pace
    fastest = traced_step_floor(view) or dil.untraced_step_us
    if fastest <= 0 or fastest >= traced.step_time * (1 - NOISE_FLOOR):
        return None
    at = replace(dil, untraced_step_us=fastest, factor=traced.step_time / fastest, caveats=[])
    return estimate_unprofiled(traced, at, device_kind, events)[0]


def verdicts(view: StepView, traced: TimeBreakdown, *, device_kind: str, roofline: Roofline,
             mfu: Mfu, traced_mfu: Mfu, n_steps: int, traced_noise_: float | None,
             events: CpuEvents | None = None, host_cause: str = HOST_CAUSE,
             input_cause: str = "") -> tuple[Verdict, Verdict | None]:
    """The verdict of the view, and (for the unprofiled view) what the traced steps alone say.
    In the traced view, a label that the steps at the faster side of the reference would not
    give is a stated tie with the label they give (``at_faster_side``)."""
    v = classify(view.breakdown, device_kind=device_kind, roofline=roofline, mfu=mfu,
                 n_steps=n_steps, deductions=view.deductions, noise=view.noise, host_cause=host_cause,
                 input_cause=input_cause)
    if view.basis != UNPROFILED:
        fast = at_faster_side(view, traced, device_kind, events)
        if fast is None or v.tie_with is not None:
            return v, None
        fv = classify(fast, device_kind=device_kind, roofline=roofline, mfu=mfu, n_steps=n_steps)
        if fv.label in (v.label, Bottleneck.UNKNOWN):
            return v, None
        s, fs = shares(view.breakdown), shares(fast)
        return replace(v, tie_with=fv.label, summary=(
            f"a tie between {v.label.value} ({pct_whole(s[v.label])}) and {fv.label.value}: the traced "
            f"steps read {v.label.value}, but the job ran {fast.step_time / 1e3:.3g} ms per step "
            f"unobserved on one side of the window (against {traced.step_time / 1e3:.3g} ms traced), "
            f"and at that step, the rest of the traced step taken as the profiler's, it reads "
            f"{fv.label.value} ({pct_whole(fs[fv.label])}). " + v.summary[0].upper() + v.summary[1:])), None
    tv = classify(traced, device_kind=device_kind, roofline=roofline, mfu=traced_mfu,
                  n_steps=n_steps, noise=traced_noise_)
    return v, replace(tv, recommendations=[])
