"""The job as it runs unobserved, estimated from its traced steps and its own step timer.

The torch profiler costs host time on every operator it records (more with recorded shapes).
On the GPU that cost does not slow the kernels; it delays their launches, so it shows up in
the trace as GPU idle gaps, which a breakdown of traced steps reads as host overhead. The
step timer runs on every step, traced or not, so the traced step against the untraced steps
*around* the window is the profiler's extra wall time per step, measured, not modelled.

Around, not all: a busy machine is the normal machine. Another job that slowed the first
steps and then left, or a job that changes pace (a DataLoader warming up), makes a
reference taken from the whole run compare the traced steps with another time of the run
(seen: "slowed 13x" from load during the window, "0.22x" from load before it). So the
reference is the untraced steps just before and just after the window (``steps.window_steps``,
same phase), and it is not trusted when the two sides disagree (the load changed across the
window), when it is itself unsteady, or when it is not faster than the traced steps: the
verdict then falls back to the traced view (profiled steps, whose host time reads high) and
says why, instead of scaling by a factor that cannot be trusted.

One step time per view: the traced view's step is the mean of the traced steps (the
breakdown's), and the dilation is that over the reference's median, which is the unprofiled
view's step; breakdown, MFU and text use the step of the view they describe.

The model (stated in every Diagnosis that uses it): device work is kept as traced; the extra
wall time is removed from the host gaps first (where the profiler's cost lands), then from the
input wait (a host slowed by the profiler gives DataLoader workers more time, so the traced
input wait is, if anything, too small: taking extra time from it is the last resort). Every
caveat is a ``Deduction`` from the verdict's confidence, of a stated amount:
- the device work alone is longer than the untraced step: the profiler slowed the device work
  itself (CUPTI on many tiny kernels, or CPU operators whose own time grew), so the work is
  scaled down to fit and the compute/memory split keeps its proportions;
- the device is the CPU: operator time itself carries part of the profiler's cost, so there
  the extra time is taken per recorded event from operator time and the gaps between operators,
  long operators' time beyond their own fastest calls from operator time first (the profiler's
  records crowd their data out of the caches), and the input wait keeps its length.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gpudiag.analyzers.page_faults import allocator_moved
from gpudiag.analyzers.stats import iqr_over_median, mann_whitney_p
from gpudiag.diagnosis import Deduction, Dilation, TimeBreakdown
from gpudiag.steps import REFERENCE_STEPS, WindowSteps
from gpudiag.units import pct_whole

# Fewer reference steps than this give no reference worth correcting by (a median of 2 is
# one outlier away from anything); fewer than MIN_SIDE_STEPS on a side, and that side's median
# is not compared with the other's.
MIN_UNTRACED_STEPS = 3
MIN_SIDE_STEPS = 3
# A dilation below 1 + this is within the step-to-step noise of most jobs: no correction.
NOISE_FLOOR = 0.02
# Interquartile range over median of the reference above this (noise beyond +-12.5%): the
# reference is unsteady. It is still used where the correction it makes dwarfs its noise (a
# tiny-op job whose traced steps the profiler slowed 11x is far better described by a reference
# +-15% noisy than by its traced steps); it is not where its noise, or a change of pace across
# the window, is more than TRUST_SHARE of the correction (factor - 1): then the factor cannot
# be told from noise or load, and the traced view is used.
UNSTEADY_SPREAD = 0.25
TRUST_SHARE = 0.5
# The medians before and after the window differ by more than this, and a rank test says the
# two sides differ (p < LOAD_CHANGE_ALPHA): the job's pace (or the machine's load) changed
# across the window, so neither side is known to be the traced steps' pace; the traced view is
# used. 15%: more than the 1-10% run-to-run variation of steady jobs seen here and on the H100
# runs (../shared/runs), less than what a competing process does; the test keeps a noisy job's
# medians, which differ by chance, from passing for a change (Mann-Whitney U, as gpudiag diff).
LOAD_CHANGE_MAX = 0.15
LOAD_CHANGE_ALPHA = 0.05
# The steps after the window slower by that much on a GPU job whose CUPTI stayed attached are
# the observer's (``observer_after_effect``) unless the machine outside the job kept more than
# this many more cores busy after the window than before it: then the load is the cause.
OUTSIDE_LOAD_RISE = 0.5
# a repair's caveat: its text, and the confidence it costs
Caveat = Callable[[str, float], None]

# Confidence deductions (points of confidence, 0..1) for the caveats of this module. Each is
# our own calibration, stated so a reader can weigh it: noise costs in proportion (one point
# per point of step-time noise), as does a change of pace across the window; a fallback to the
# traced view costs a fixed 0.1 for the host time the profiler adds to it; a repair of the
# estimate (work scaled, input wait cut) 0.1; the CPU's proportional model 0.05.
PENALTY_PER_NOISE = 1.0
# ...each of these two at most this much: a reference noisy by +-300% (a 1 ms step among
# preemptions) says little, and the floor of the confidence says the rest
PENALTY_PROPORTIONAL_MAX = 0.5
PENALTY_PER_LOAD_CHANGE = 1.0
PENALTY_TRACED_VIEW = 0.1
PENALTY_PER_SLOWER = 1.0  # per point by which the reference was slower than the traced steps
PENALTY_ESTIMATE_REPAIR = 0.1
PENALTY_CPU_MODEL = 0.05
# ...and the CPU's per-event model decides how much of the profiler's extra time was operator
# time and how much the gaps': what it charges to operator time (long operators' slow-down and
# the per-event cost inside them) is that much of the unobserved step moved from compute to
# host, and an error of CPU_CHARGE_ERROR in that charge moves the margin between the two by
# twice that error. The charge per event of the small-ops job (1,221 events a step, the same
# events each run) ranged 1.52-2.71 us over 12 quiet runs on this project's 2-core AMD VM
# (2026-11-30): +-30% around its median; over them its model charged 0.28-0.51 of the step to
# operator time and read host 0.44-0.52 against compute 0.36-0.44, and in a CI clone two runs
# of it read compute 0.54 / host 0.32 and host 0.56 / compute 0.33, both at "medium". So 2 x
# 0.3 points per point of the step charged, at least PENALTY_CPU_MODEL, at most
# PENALTY_PROPORTIONAL_MAX.
CPU_CHARGE_ERROR = 0.3
PENALTY_ONE_SIDE = 0.05  # a reference from one side of the window (the other slowed by the observer)

# The job's own host time per operator it calls from the gaps (Python, the dispatcher: a few
# microseconds a call, observed or not) is at least this many times the profiler's cost per
# recorded event. Where charging the profiler per event would leave the gaps less than that,
# the charge is not the profiler's: the machine ran the traced window slower than the steps
# around it (another tenant, a busy host under a VM), which step times cannot show, and that
# slow-down is the job's own time at another pace. Our calibration, on this project's 2-core VM
# (per operator dispatched from the gaps over the per-event charge, windows at the reference's
# pace): 2.5-6.2 for a chain of small operators between GEMMs (eight runs), 4.5-9.9 for a
# many-small-operator job, 4.8-5.0 for a host-bound one, 9.3 and more for the rest; 0 in six
# runs of the chain slowed over the window alone by a process cutting its CPU into 0.3 ms slices
# (``tests/jobs/_compete.py``: the gaps left empty, torch.compile's gain under-promised by 22-36%),
# 0.7 in one slowed by a process sharing its CPU (docs/diagnosis.md has every number).
DISPATCH_PER_EVENT_MIN = 2.0

# Every part of a TimeBreakdown but the step: what scaling an estimate to its step scales.
_PARTS = tuple(f for f in TimeBreakdown.__dataclass_fields__ if f != "step_time")

MODEL = ("step = the median of the untraced steps just before and after the traced window "
         f"(up to {REFERENCE_STEPS} a side, the job's own step timer, each at the job's own pace: less "
         "the wait for a core other processes caused, gpudiag.pace); device work as traced; the "
         "profiler's extra wall time (traced mean minus that step) removed from the host gaps first, "
         "then from the input wait (a loader in the training process: from its wait by the share of "
         "recorded events inside it)")


@dataclass(frozen=True)
class CpuEvents:
    """What a CPU job's traced steps hold beyond their breakdown that tells the profiler's cost
    from the job's own time (per traced step, the mean over ranks; ``rank_facts``)."""

    recorded: float  # events the profiler recorded
    in_compute: float  # ...of them starting inside the breakdown's compute blocks
    slowed_us: float = 0.0  # long operators' time beyond their class's fast calls (``rank_facts``)
    # operators the job called from the gaps (top level, outside operator blocks, DataLoader
    # waits and collectives): each cost it host time unobserved too (DISPATCH_PER_EVENT_MIN)
    dispatched: float = 0.0
    # ...of them inside the DataLoader waits: a loader in the training process (num_workers=0)
    # records its own operators there, and the profiler's cost per event with them
    in_waits: float = 0.0

    @staticmethod
    def mean(ranks: list[CpuEvents]) -> CpuEvents:
        """Over ranks: in a synchronous job every rank's traced step is the job's step."""
        n = len(ranks)
        return CpuEvents(*(sum(getattr(r, f) for r in ranks) / n for f in CpuEvents.__dataclass_fields__))


def measure_dilation(traced_step_us: float, windows: list[WindowSteps], device_kind: str = "gpu"
                     ) -> tuple[Dilation, list[Deduction]] | None:
    """The traced view's step (the trace's mean) against the untraced steps around the
    window, pooled over ranks (in a synchronous job every rank runs at the job's pace).
    None when the reference has too few steps. ``trusted`` is False, with the reasons as
    deductions, where the traced view must be used instead. The steps after the window are
    left out where the observer slowed them (``observer_after_effect``), those before it where
    the job was still warming up (``warming_before``)."""
    before = [x for w in windows for x in w.before]
    after = [x for w in windows for x in w.after]
    traced = [x for w in windows for x in w.traced]
    if len(before) + len(after) < MIN_UNTRACED_STEPS or traced_step_us <= 0:
        return None
    mb = statistics.median(before) * 1e6 if len(before) >= MIN_SIDE_STEPS else None
    ma = statistics.median(after) * 1e6 if len(after) >= MIN_SIDE_STEPS else None
    change = max(mb, ma) / min(mb, ma) - 1 if mb and ma else 0.0
    changed = (change > LOAD_CHANGE_MAX
               and mann_whitney_p(np.array(before), np.array(after)) < LOAD_CHANGE_ALPHA)
    left_out = (observer_after_effect(windows, device_kind, mb, ma)
                if changed and len(before) >= MIN_UNTRACED_STEPS else None)
    warming = (warming_before(windows, mb, ma)
               if changed and left_out is None and len(after) >= MIN_UNTRACED_STEPS else None)
    used = [] if warming else [r for w in windows for r in w.before_rows]
    if left_out is None:
        used += [r for w in windows for r in w.after_rows]
    left_out = left_out or warming
    ref = [r.dt for r in used]
    u = statistics.median(ref) * 1e6
    if u <= 0:
        return None
    spread = iqr_over_median(ref)
    steps = sorted({r.step for r in used})
    where = (f"untraced steps just before ({len(before)}) and after ({len(after)}) the traced window"
             if left_out is None else
             f"the {len(after)} untraced steps just after the traced window only" if warming else
             f"the {len(before)} untraced steps just before the traced window only")
    dil = Dilation(traced_step_us=traced_step_us, untraced_step_us=u, factor=traced_step_us / u,
                   traced_steps=len(traced), untraced_steps=len(ref), untraced_spread=spread,
                   model=MODEL, reference=f"{where} (steps {_ranges(steps)})",
                   before_step_us=mb, after_step_us=ma, load_change=change,
                   reference_steps=steps, left_out=left_out,
                   left_out_side=None if left_out is None else "before" if warming else "after",
                   untraced_mean_us=statistics.fmean(ref) * 1e6)
    if left_out is not None:
        dil.caveats.append(left_out)
        return dil, [Deduction(left_out, PENALTY_ONE_SIDE), *_trust(dil, 0.0, False)]
    return dil, _trust(dil, change, changed)


def _trust(dil: Dilation, change: float, changed: bool) -> list[Deduction]:
    """Whether the reference can correct the traced steps: not where the job's pace changed
    across the window (``changed``), its noise is as large as the correction, or it is slower
    than the traced steps. Sets ``dil.trusted``; returns the deductions."""
    mb, ma, spread = dil.before_step_us, dil.after_step_us, dil.untraced_spread
    out: list[Deduction] = []
    why = []
    correction = abs(dil.factor - 1)  # what scaling by the reference would change
    if changed:
        assert mb is not None and ma is not None  # a change is measured between the two sides
        text = (f"the job's pace changed across the traced window (untraced steps before it "
                f"{mb / 1e3:.3g} ms, after it {ma / 1e3:.3g} ms: {100 * change:.0f}% apart, load on the "
                "machine or a change of phase)")
        if change > TRUST_SHARE * correction:
            why.append(text)
        else:
            text += (f", by far less than the profiler's slowdown ({dil.factor:.2g}x): the reference "
                     "still stands")
            dil.caveats.append(text)
        out.append(Deduction(text, round(min(PENALTY_PROPORTIONAL_MAX, PENALTY_PER_LOAD_CHANGE * change), 3)))
    if spread > UNSTEADY_SPREAD and spread / 2 > TRUST_SHARE * correction:
        why.append(f"the untraced steps around the window vary a lot (interquartile range "
                   f"{100 * spread:.0f}% of their median), " + (
                       f"and are skewed (median {dil.untraced_step_us / 1e3:.3g} ms, mean "
                       f"{(dil.untraced_mean_us or 0.0) / 1e3:.3g} ms: a few long steps hold much of the "
                       f"time): the traced window's {dil.traced_steps} "
                       "steps are too few to compare with them" if dil.skewed else
                       f"as much as the profiler's slowdown ({dil.factor:.2g}x) they would correct"))
    if dil.factor < 1 - max(NOISE_FLOOR, spread / 2):  # slower by more than the noise
        why.append(f"the untraced steps around the window were slower than the traced ones "
                   f"({dil.factor:.2f}x): the job changed phase or its steps differ")
        out.append(Deduction(why[-1], round(PENALTY_PER_SLOWER * (1 - dil.factor), 3)))
    if why:
        dil.trusted = False
        fallback = ("the traced breakdown is used as is: the verdict and MFU describe the profiled "
                    "steps, whose host time reads high by the profiler's cost")
        out.append(Deduction(fallback, PENALTY_TRACED_VIEW))
        dil.caveats.extend([*why, fallback])
    return out


def warming_before(windows: list[WindowSteps], before_us: float | None, after_us: float | None) -> str | None:
    """Why the untraced steps before the window are not the job's pace, or None: the job was
    still warming up there. They ran slower than the steps after the window, fell across the
    side (its first half slower than its second by more than LOAD_CHANGE_MAX), and the steps
    beyond the after side agree with it (within LOAD_CHANGE_MAX): the pace the window sits in is
    the one after it. Blind check 16 (2026-11-30): a 2.6 ms job whose first steps took 20-100 ms
    read 5.2 ms before the default window (after 10 steps) and 2.7 ms after it, was told its pace
    changed "(load on the machine or a change of phase)" and fell back to its traced steps, 9.9-
    11.5 ms a step, every prediction stated from those; with --skip 30 it read its own pace."""
    if before_us is None or after_us is None or before_us <= after_us:
        return None
    rows = [r for w in windows for r in w.before_rows]
    half = len(rows) // 2
    later = [r.dt for w in windows for r in w.later_rows]
    if half < 2 or len(later) < MIN_SIDE_STEPS:
        return None
    first, second = (statistics.median(r.dt for r in part) for part in (rows[:half], rows[half:]))
    later_us = statistics.median(later) * 1e6
    if first <= second * (1 + LOAD_CHANGE_MAX) or abs(later_us / after_us - 1) > LOAD_CHANGE_MAX:
        return None
    steps = sorted(r.step for r in rows)
    return (f"the {len(rows)} untraced steps before the window (steps {_ranges(steps)}) left out of the "
            f"reference: they ran {before_us / 1e3:.3g} ms against {after_us / 1e3:.3g} ms after it, "
            f"falling from {first * 1e3:.3g} to {second * 1e3:.3g} ms across them, and the "
            f"{len(later)} steps beyond the after side agree on {later_us / 1e3:.3g} ms: the job was "
            "still warming up before the window (a larger --skip starts the window after it)")


def observer_after_effect(windows: list[WindowSteps], device_kind: str, before_us: float | None,
                          after_us: float | None) -> str | None:
    """Why the untraced steps after the window are not the job's pace, or None. Two cases.

    A slow-down that passed, on any device: the steps beyond the after side came back to the
    pace before the window (within LOAD_CHANGE_MAX). The after side alone is off, and the steps
    on either side of it agree on the job's pace. Seen on the 2-core AMD EPYC: the trace export
    runs in the job's own thread (1.2-1.4 s while another process shared its core); the next
    0-14 steps ran up to 1.9x slower, with no wait for a core, then came back (unobserved, the
    same job's steps after such a load ran at its pace at once: tests/jobs/chain_job.py).
    Whether the export or a load that passed caused it, the steps before the window are the
    pace the window sits in.

    CUPTI's lasting cost, on a GPU: torch's profiler leaves CUPTI attached after a window unless
    told to tear it down (``collectors.torch_cupti``): every step after the window then pays for
    CUPTI's callbacks, 10-20% in torch's own reports, 23-36% on an H200
    (../shared/runs/h200-2026-11-27/gpt: 28.4 ms before, 34.9 ms after; the job alone 29.4 ms).
    The after side is the observer's when the pace changed that way (slower after: a machine that
    got busy could do that too) on a GPU job whose CUPTI was not known to be torn down, and the
    machine outside the job was not busier after the window than before it (host samples;
    unknown counts as not busier).

    The allocator moved, either way: the process faulted pages in at twice the rate or more on
    one side than the other (``page_faults.allocator_moved``). The profiler's buffers, freed at
    the export, move glibc's malloc thresholds as one large free does (the job then faults its
    MB-sized temporaries in every step, or never): tests/jobs/alloc_job.py ran 12-24 ms (mean
    15.7-17.7) alone and 21.7 ms with 4,480 faults every step after the window on the 2-core
    AMD EPYC VM; held-out set 8's jobs ran 3-8% faster after it.

    Neither: steps beyond the after side faster than both (../shared/runs/h100-resnet18-dl8's
    DataLoader warming up: 21.5 ms before, 25.3 ms after, 13.5 ms from step 28 on, 13.4 ms
    alone): the job's pace itself moved, and no side is known to be the window's."""
    if before_us is None or after_us is None:
        return None
    moved = allocator_moved(windows)
    if moved is not None:
        steps = sorted(r.step for w in windows for r in w.after_rows)
        return (f"the {len(steps)} untraced steps after the window (steps {_ranges(steps)}) left out "
                f"of the reference: they ran {after_us / 1e3:.3g} ms against {before_us / 1e3:.3g} ms "
                f"before it, faulting {moved[1]:,.0f} pages a step against {moved[0]:,.0f}: the "
                "profiler's buffers, freed, moved glibc's malloc thresholds, and the job's allocations "
                "with them")
    if after_us <= before_us:
        return None
    n_after = sum(len(w.after_rows) for w in windows)
    after_steps = sorted(r.step for w in windows for r in w.after_rows)
    said = (f"the {n_after} untraced steps after the window (steps {_ranges(after_steps)}) left out "
            f"of the reference: they ran {after_us / 1e3:.3g} ms against {before_us / 1e3:.3g} ms "
            f"before it ({100 * (after_us / before_us - 1):.0f}% slower)")
    later = [r for w in windows for r in w.later_rows]
    if len(later) >= MIN_SIDE_STEPS:
        later_us = statistics.median(r.dt for r in later) * 1e6
        if abs(later_us / before_us - 1) <= LOAD_CHANGE_MAX:
            return (f"{said}, and the {len(later)} steps after them (steps "
                    f"{_ranges(sorted(r.step for r in later))}) came back to {later_us / 1e3:.3g} ms: a "
                    "slow-down that passed right after the trace was written (the export's aftermath, "
                    "or a load that left), while the steps on either side of it agree on the job's pace")
        if later_us < before_us:
            return None  # the job's own pace moved (a loader warming up): no side is the window's
    if device_kind == "cpu":
        return None
    attached = [w.cupti_attached for w in windows]
    if attached and all(a is False for a in attached):
        return None  # torn down (or no CUDA): the observer left nothing behind
    ob = [w.outside_before for w in windows if w.outside_before is not None]
    oa = [w.outside_after for w in windows if w.outside_after is not None]
    if ob and oa and statistics.fmean(oa) - statistics.fmean(ob) > OUTSIDE_LOAD_RISE:
        return None  # the machine got busier: its pace, not the observer's after-effect
    how = ("torch left CUPTI attached after the window" if any(attached)
           else "CUPTI teardown was not recorded (likely left attached)")
    return (f"{said} on a GPU job whose {how}, with no more load outside the job: the observer's "
            "after-effect, not the job's pace")


def _ranges(steps: list[int]) -> str:
    """[4, 5, 6, 9, 10] -> '4-6, 9-10'."""
    out: list[str] = []
    for s in steps:
        if out and s == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def noise_deduction(noise: float | None, of: str) -> list[Deduction]:
    """Step-time noise costs confidence in proportion (``PENALTY_PER_NOISE`` per point)."""
    if not noise:
        return []
    return [Deduction(f"step-time noise \u00b1{100 * noise:.1f}% (half the interquartile range of "
                      f"{of})", round(min(PENALTY_PROPORTIONAL_MAX, PENALTY_PER_NOISE * noise), 3))]


def estimate_unprofiled(traced: TimeBreakdown, dilation: Dilation, device_kind: str,
                        events: CpuEvents | None = None
                        ) -> tuple[TimeBreakdown, list[Deduction]]:
    """The mean step as it runs unobserved (for a trusted dilation), and the deductions its
    repairs cost; each is also appended to ``dilation.caveats``."""
    out: list[Deduction] = []

    def caveat(text: str, amount: float) -> None:
        dilation.caveats.append(text)
        out.append(Deduction(text, amount))

    if dilation.factor < 1 + NOISE_FLOOR or dilation.untraced_step_us >= traced.step_time:
        return replace(traced), out
    # The unobserved step is the reference's median itself (not the traced mean shrunk by the
    # factor): one slow traced step (a sync, an allocation) must not leak into it.
    step = dilation.untraced_step_us
    if device_kind == "cpu":
        if events is not None and events.recorded > 0:
            est, dilation.profiler_us_per_event, dilation.profiler_step_us = _cpu_per_event(
                traced, step, events, caveat, dilation.untraced_input_us)
            return est, out
        return _cpu_estimate(traced, step, caveat), out
    work = traced.compute + traced.comm_exposed + traced.memcpy_exposed
    if work > step:
        caveat(f"device work alone ({work / 1e3:.3g} ms) exceeds the untraced step "
               f"({step / 1e3:.3g} ms): the profiler slowed the device work itself; it is "
               "scaled down to fit, keeping its proportions", PENALTY_ESTIMATE_REPAIR)
        k = step / work
        return TimeBreakdown(
            step_time=step, gpu_busy=traced.gpu_busy * k, compute=traced.compute * k,
            compute_bound=traced.compute_bound * k, memory_bound=traced.memory_bound * k,
            comm_total=traced.comm_total * k, comm_exposed=traced.comm_exposed * k,
            memcpy_exposed=traced.memcpy_exposed * k, idle=0.0, input_wait=0.0,
            host_overhead=0.0, comm_work=traced.comm_work * k,
            comm_contention=traced.comm_contention * k), out
    extra = traced.step_time - step
    from_wait = _loader_share(traced, extra, events)
    if events is not None and from_wait > 0:
        dilation.caveats.append(
            f"the DataLoader ran in the training process: {events.in_waits:.0f} of the "
            f"{events.recorded:.0f} events the profiler recorded per step were its operators, inside "
            f"the input wait, so that share of the profiler's extra time ({from_wait / 1e3:.3g} ms) "
            "was taken from the input wait, the rest from the host gaps")
    host = traced.host_overhead - (extra - from_wait)
    input_wait = traced.input_wait - from_wait
    if host < 0:
        input_wait = max(0.0, input_wait + host)
        host = 0.0
        caveat("the profiler's extra time exceeded the traced host gaps: the rest was taken "
               "from the input wait", PENALTY_ESTIMATE_REPAIR)
    idle = step - work
    # keep the parts additive whatever rounding did: idle == input_wait + host_overhead
    host = max(0.0, idle - input_wait)
    input_wait = idle - host
    return replace(traced, step_time=step, idle=idle, input_wait=input_wait, host_overhead=host), out


def _loader_share(traced: TimeBreakdown, extra: float, events: CpuEvents | None) -> float:
    """The profiler's extra time a GPU job's input wait carries: its cost is paid per recorded
    event, and a loader that runs in the training process (num_workers=0) records its operators
    inside the wait (a ResNet-50's augmentation on an H200: 18,255 of 21,889 events per step).
    Workers' operators are not recorded there: that wait keeps its length, as before."""
    if events is None or events.recorded <= 0 or events.in_waits <= 0:
        return 0.0
    return min(traced.input_wait, extra * events.in_waits / events.recorded)


def _cpu_per_event(traced: TimeBreakdown, step: float, events: CpuEvents,
                   caveat: Caveat, untraced_input: float | None = None
                   ) -> tuple[TimeBreakdown, float, float]:
    """The CPU as the device: the profiler pays a roughly fixed cost per event it records
    (``benchmarks/profile_dilation.py``), inside the operators' spans and in the gaps between
    them. So the extra wall time per step (less the time the OS did not run the job at all, and
    less what long operators took beyond their own fastest calls), over the events recorded per
    step, is that cost; operator blocks lose it once per event that starts inside them, the gaps
    the rest, and the input wait (blocked on the DataLoader) keeps its length. A big GEMM with
    one event keeps its time; a tiny op whose time was mostly the profiler's loses most of it.
    Returns the estimate, that cost per event (us), which a part of the step with a known
    number of events loses the same way (``whatif.compiled_update``), and the profiler's whole
    cost per step so charged (the events', and the in-process DataLoader's below).

    Why the long operators first: the profiler's records also slow the operators themselves
    where those stream data from the caches (a chain of GEMMs over 16 MB of weights, traced:
    26.3 ms per step against 21.7 ms unobserved, with 8,448 events per step). Charged per
    event, that slowdown was taken from the gaps between the small operators, leaving too little
    host time for ``torch.compile`` to remove (predicted steps 1.3x the compiled step's); a long
    operator's slower calls beyond its class's fast ones (``rank_facts.slowed_beyond_floor``)
    are its own time. Variation the job has unobserved too is taken with it: bounded by the
    profiler's extra time, and stated in the caveat.

    A DataLoader in the training process (num_workers=0) records its own operators inside the
    input wait, and pays the profiler's cost for each there: where the step timer measured the
    wait in the untraced steps (``untraced_input``, us), the traced wait's excess over it is
    that cost, taken out first with those events (``_loader_events``). Blind check 42's MLP fed
    by a loader of 100 small operators a sample: traced wait 27 ms, 16.0 ms untraced by the step
    timer (and the job's own); kept whole, it read input-bound (58%) where input was 34-35%."""
    traced, events, loader = _loader_events(traced, step, events, untraced_input)
    n_all, n_compute = events.recorded, events.in_compute
    # time the OS did not run the job (``host_stalled``) is already host time, and it is the
    # machine's load, not the profiler's cost: it leaves the step first, then the profiler's;
    # what the step cannot lose of it (the reference was as busy) stays, still apart
    stalled = min(traced.host_stalled, max(0.0, traced.step_time - step))
    extra = traced.step_time - stalled - step
    # long operators that ran slower than their own fast calls were slowed themselves (their
    # data crowded out of the caches by the profiler's records): operator time, taken first
    slowed = min(events.slowed_us, max(0.0, extra), traced.compute)
    per_event = (extra - slowed) / n_all if n_all > 0 else 0.0
    from_compute = min(traced.compute, slowed + per_event * n_compute)
    rest = extra - from_compute
    host = traced.host_overhead - stalled - rest
    compute = traced.compute - from_compute
    floor = DISPATCH_PER_EVENT_MIN * per_event * events.dispatched
    pace = _window_pace(traced, step, stalled, slowed, events) if host < floor else None
    if pace is not None:
        compute, host, per_event = _at_window_pace(traced, events, stalled, slowed, per_event, host,
                                                   pace, caveat)
    if host < 0:
        compute = max(0.0, compute + host)  # the gaps could not absorb their share
        host = 0.0
        caveat("the profiler's extra time per step exceeded what its recorded events account for "
               "in the gaps: the rest was taken from operator time", PENALTY_ESTIMATE_REPAIR)
    charged = min(traced.compute, slowed + max(0.0, per_event) * n_compute)
    caveat(_cpu_split_text(traced.step_time, step, stalled, slowed, per_event, events, loader)
           + f". Of it, this model charged {charged / 1e3:.3g} ms a step to operator time "
           f"({pct_whole(charged / step)} of the untraced step), and its charge per event varies by "
           f"+-{pct_whole(CPU_CHARGE_ERROR)} between runs of one job: the compute/host split moves with it",
           cpu_model_penalty(charged / step))
    per_event = max(0.0, per_event)
    return (_cpu_unobserved(traced, step, compute, host, stalled), per_event,
            per_event * n_all + (loader.us if loader is not None else 0.0))


def cpu_model_penalty(charged_share: float) -> float:
    """What the CPU's per-event model costs a label: its charge to operator time (a share of
    the untraced step) times CPU_CHARGE_ERROR, twice (both shares move), between
    PENALTY_CPU_MODEL and PENALTY_PROPORTIONAL_MAX."""
    moved = 2 * CPU_CHARGE_ERROR * max(0.0, charged_share)
    return round(min(PENALTY_PROPORTIONAL_MAX, max(PENALTY_CPU_MODEL, moved)), 3)


def _at_window_pace(traced: TimeBreakdown, events: CpuEvents, stalled: float, slowed: float,
                    per_event: float, host: float, pace: tuple[float, float], caveat: Caveat
                    ) -> tuple[float, float, float]:
    """Operator time and gaps of a window that ran slower than the reference beyond the
    profiler (``_window_pace``), brought to the reference's pace in proportion: (compute, host,
    the profiler's cost per event)."""
    n_all, n_compute = events.recorded, events.in_compute
    charged = per_event
    s, per_event = pace
    caveat(f"the traced window ran {s:.2f}x slower than the steps around it, beyond the "
           f"profiler (the machine was busier then): charged to the profiler alone "
           f"({charged:.3g} us per event), the gaps would keep "
           f"{max(0.0, host) / events.dispatched:.2g} us per operator the job calls from them, "
           f"less than the {DISPATCH_PER_EVENT_MIN:g}x that charge such a call costs the job "
           "unobserved; the window's operator time and gaps were brought to the reference's "
           "pace in proportion",
           round(min(PENALTY_PROPORTIONAL_MAX, PENALTY_PER_LOAD_CHANGE * (s - 1)), 3))
    compute = (traced.compute - slowed - per_event * n_compute) / s
    host = (traced.host_overhead - stalled - per_event * (n_all - n_compute)) / s
    return compute, host, per_event


def _cpu_unobserved(traced: TimeBreakdown, step: float, compute: float, host: float,
                    stalled: float) -> TimeBreakdown:
    """The unobserved CPU step from its operator time and gaps: the compute's parts in
    proportion, communication and the input wait as traced, everything scaled to the step
    where the parts exceed it."""
    k = compute / traced.compute if traced.compute > 0 else 1.0
    out = TimeBreakdown(
        step_time=step, gpu_busy=compute + traced.comm_exposed, compute=compute,
        compute_bound=traced.compute_bound * k, memory_bound=traced.memory_bound * k,
        comm_total=traced.comm_total, comm_exposed=traced.comm_exposed,
        memcpy_exposed=traced.memcpy_exposed, input_wait=traced.input_wait, host_overhead=host,
        host_stalled=min(host, traced.host_stalled - stalled), comm_work=traced.comm_work * k,
        comm_contention=traced.comm_contention * k)
    out.idle = out.input_wait + out.host_overhead
    total = out.compute + out.comm_exposed + out.memcpy_exposed + out.idle
    if total > step > 0:  # nothing left to take from: scale everything to the step
        f = step / total
        for name in _PARTS:
            setattr(out, name, getattr(out, name) * f)
    return out


def _cpu_split_text(traced_step: float, step: float, stalled: float, slowed: float, per_event: float,
                    events: CpuEvents, loader: LoaderEvents | None = None) -> str:
    """Where the traced steps' extra time went, in parts that add up to it: a dilation of 11x
    beside "0 us per event" reads as a contradiction unless the rest of the 11x is named.
    ``traced_step`` and ``events`` are the step's less the in-process DataLoader's own events
    (``loader``), which are named first."""
    first = ([f"{loader.us / 1e3:.3g} ms per step the DataLoader's own {loader.events:.0f} events "
              f"recorded in the training process, inside its wait ({loader.traced_wait / 1e3:.3g} ms "
              f"traced against {(loader.traced_wait - loader.us) / 1e3:.3g} ms in the untraced "
              "steps, by the step timer: taken from the input wait)"] if loader is not None else [])
    traced_step += loader.us if loader is not None else 0.0
    total = traced_step - step
    n_all, n_compute = events.recorded, events.in_compute
    per = per_event * n_all
    parts = first
    if stalled > 0:
        parts.append(f"{stalled / 1e3:.3g} ms per step the OS ran other work (kept apart, host time)")
    if slowed > 0:
        parts.append(f"{slowed / 1e3:.3g} ms per step long operators ran beyond their own fastest "
                     "calls (taken from operator time first)")
    if per >= 0.01 * total:
        parts.append(f"{per / 1e3:.3g} ms per step the profiler's cost per recorded event "
                     f"({n_all:.0f} per step, {per_event:.3g} us each: from operator time for "
                     f"{n_compute:.0f} events inside operators, from the gaps for the rest)")
    else:
        parts.append(f"nothing was left to charge per recorded event ({n_all:.0f} per step, "
                     f"{per_event:.3g} us each)")
    rest = total - stalled - slowed - per - (loader.us if loader is not None else 0.0)
    if rest >= 0.01 * total:
        parts.append(f"{rest / 1e3:.3g} ms per step the window's slower pace (above)")
    return (f"the device is the CPU: the traced steps took {total / 1e3:.3g} ms per step more than "
            f"the untraced ones ({traced_step / step:.2g}x): " + "; ".join(parts) +
            ("; the input wait is the untraced steps' own" if loader is not None
             else "; the input wait keeps its length"))


@dataclass(frozen=True)
class LoaderEvents:
    """The profiler's cost a DataLoader in the training process paid inside its wait."""

    us: float  # per step, taken from the traced input wait
    events: float  # its events per step
    traced_wait: float  # the traced input wait it was taken from (us)


def _loader_events(traced: TimeBreakdown, step: float, events: CpuEvents,
                   untraced_input: float | None
                   ) -> tuple[TimeBreakdown, CpuEvents, LoaderEvents | None]:
    """The traced step and its events less the in-process DataLoader's events and the
    profiler's cost they paid (the traced wait's excess over the untraced steps' measured
    wait, at most the profiler's whole extra time), and that cost; the same step, events and
    None where the loader recorded no events in the wait, or the wait was not measured or not
    longer traced."""
    if untraced_input is None or events.in_waits <= 0 or traced.input_wait <= untraced_input:
        return traced, events, None
    stalled = min(traced.host_stalled, max(0.0, traced.step_time - step))
    us = min(traced.input_wait - untraced_input, max(0.0, traced.step_time - stalled - step))
    if us <= 0:
        return traced, events, None
    out = replace(traced, step_time=traced.step_time - us, input_wait=traced.input_wait - us,
                  idle=traced.idle - us)
    less = replace(events, recorded=events.recorded - events.in_waits, in_waits=0.0)
    return out, less, LoaderEvents(us, events.in_waits, traced.input_wait)


def _window_pace(traced: TimeBreakdown, step: float, stalled: float, slowed: float,
                 events: CpuEvents) -> tuple[float, float] | None:
    """The traced window's pace against the reference's (s > 1: slower) and the profiler's cost
    per event, where the gaps keep exactly DISPATCH_PER_EVENT_MIN times that cost per operator
    dispatched from them: the least slow-down that makes the per-event charge plausible.

    The window's operator time and gaps are the reference's at pace s plus the profiler's cost
    per event, c: compute' = s*compute + c*n_compute, gaps' = s*gaps + c*n_gaps; they and the
    kept parts (input wait, exposed communication) add up to the reference step; the gaps are
    DISPATCH_PER_EVENT_MIN * c * dispatched. With P = compute' + gaps' and A = the step less the
    kept parts, c = (P - s*A) / n, and the gaps' equation gives f(s) = (P - s*A)(n_gaps + s*q) -
    gaps' * n = 0, q = DISPATCH_PER_EVENT_MIN * dispatched: a downward parabola, positive at s = 1
    (the per-event charge too large there) and negative at s = P/A, so one root between."""
    n, n_gaps = events.recorded, events.recorded - events.in_compute
    gaps = traced.host_overhead - stalled
    p = traced.compute - slowed + gaps
    a = step - (traced.input_wait + traced.comm_exposed + traced.memcpy_exposed)
    q = DISPATCH_PER_EVENT_MIN * events.dispatched
    if a <= 0 or q <= 0 or gaps <= 0 or p <= a:
        return None
    # f(s) = -a*q*s^2 + b*s + k
    b, k = p * q - a * n_gaps, p * n_gaps - gaps * n
    s = (b + (b * b + 4 * a * q * k) ** 0.5) / (2 * a * q) if b * b + 4 * a * q * k >= 0 else float("nan")
    if not 1 < s < p / a:
        return None
    return s, (p - s * a) / n


def _cpu_estimate(traced: TimeBreakdown, step: float, caveat: Caveat) -> TimeBreakdown:
    """The CPU as the device: the profiler's per-operator cost lands inside the operators' own
    spans as much as in the gaps between them, so both shrink by the same factor; the input
    wait (blocked on the DataLoader: I/O, decoding, a sleep) carries little of it and keeps
    its traced length unless the rest cannot absorb the extra time."""
    extra = traced.step_time - step
    ops_and_gaps = traced.compute + traced.comm_exposed + traced.memcpy_exposed + traced.host_overhead
    input_wait = traced.input_wait
    if ops_and_gaps <= 0:
        return replace(traced)
    keep = (ops_and_gaps - extra) / ops_and_gaps
    if keep < 0:
        input_wait = max(0.0, input_wait + keep * ops_and_gaps)
        keep = 0.0
        caveat("the profiler's extra time exceeded the traced operator and gap time: the rest "
               "was taken from the input wait", PENALTY_ESTIMATE_REPAIR)
    caveat("the device is the CPU: the profiler's cost was taken from operator time and the "
           "gaps between operators in proportion (it is paid per operator, inside and between "
           "them), not from the input wait", PENALTY_CPU_MODEL)
    k = keep
    out = TimeBreakdown(
        step_time=0.0, gpu_busy=traced.gpu_busy * k, compute=traced.compute * k,
        compute_bound=traced.compute_bound * k, memory_bound=traced.memory_bound * k,
        comm_total=traced.comm_total * k, comm_exposed=traced.comm_exposed * k,
        memcpy_exposed=traced.memcpy_exposed * k, input_wait=input_wait,
        host_overhead=traced.host_overhead * k,
        host_stalled=min(traced.host_stalled, traced.host_overhead * k), comm_work=traced.comm_work * k,
        comm_contention=traced.comm_contention * k)
    out.idle = out.input_wait + out.host_overhead
    # the parts add up to the untraced step; rounding and a traced input wait longer than the
    # whole untraced step (noise) are absorbed by scaling all of them to it
    total = out.compute + out.comm_exposed + out.memcpy_exposed + out.idle
    f = step / total if total > 0 else 1.0
    for name in _PARTS:
        setattr(out, name, getattr(out, name) * f)
    out.step_time = step
    return out
