"""The two views of a step: as traced, and as the job runs unprofiled. One phrasing for every report.

Why this exists: the profiler slows what it records (it adds host time to every op), so a
breakdown of traced steps over-states idle and host time. When the job's own step timer shows
by how much (``Diagnosis.dilation``), the analyzers estimate the unprofiled step
(``Diagnosis.unprofiled``) and base the verdict and MFU on it; the traced breakdown is still
shown, because it is what was measured. A reader must see both, the factor between them, and
where the estimate is unsafe; a trace-only diagnosis must say plainly that it describes
profiled steps. The terminal and HTML reports take their sentences from here so the two never
disagree. Text only: no number is computed here that the Diagnosis does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudiag.diagnosis import (
    Diagnosis,
    Dilation,
    Recommendation,
    SyncReport,
    TimeBreakdown,
    Verdict,
)
from gpudiag.units import ms, pct

UNPROFILED = "unprofiled-estimate"
PROFILED = "profiled-steps"

STALLED = "host_stalled"
WAITING = "host_waiting"
# parts of compute that are communication's cost on a CPU (TimeBreakdown.comm_work, comm_contention)
COMM_WORK = "comm_work"
COMM_CORES = "comm_contention"
# Traced steps this much faster than the untraced ones (or less) read "as fast as" them where the
# untraced steps' noise holds the difference; further off, only that the two cannot be told apart
AS_FAST = 0.05
# (TimeBreakdown field, row label) of the side-by-side table, in reading order.
VIEW_ROWS = [
    ("compute", "compute"),
    ("compute_bound", "  compute-bound"),
    ("memory_bound", "  memory-bound"),
    (COMM_WORK, "  collectives' copies"),
    (COMM_CORES, "  collectives' cores"),
    ("comm_exposed", "exposed communication"),
    ("memcpy_exposed", "exposed memcpy/memset"),
    ("input_wait", "input wait (DataLoader)"),
    ("host_overhead", "host overhead"),
    (WAITING, "  waiting for a core"),
    (STALLED, "  OS ran other work"),
    ("step_time", "step time"),
]


def rows_of(*shown: TimeBreakdown | None) -> list[tuple[str, str]]:
    """VIEW_ROWS for these breakdowns: the OS's share of the host overhead only where there
    is one (a busy machine), and the training thread's wait for a core only where part of it
    was the job's own threads' and workers' (a GPU job's step timer), so a quiet run's table is
    not padded with zeros, and a CPU job's (whose stalls are all its waiting) not with a copy."""
    stalled = any(b is not None and b.host_stalled > 0 for b in shown)
    waiting = any(b is not None and b.host_waiting > b.host_stalled for b in shown)
    some = {k for k in (COMM_WORK, COMM_CORES) if any(b is not None and getattr(b, k) > 0 for b in shown)}
    return [(k, label) for k, label in VIEW_ROWS
            if (k != STALLED or stalled) and (k != WAITING or waiting)
            and (k not in (COMM_WORK, COMM_CORES) or k in some)]


def has_both_views(d: Diagnosis) -> bool:
    return d.basis == UNPROFILED and d.unprofiled is not None and d.unprofiled.step_time > 0


def basis_line(d: Diagnosis) -> str:
    """One sentence: what the breakdown and the verdict describe."""
    if has_both_views(d):
        return ("Verdict and MFU describe the job as it runs unprofiled, estimated from its own step "
                "timer; the breakdown as traced is shown beside it.")
    if d.dilation is not None and not d.dilation.trusted:
        return ("Verdict and MFU describe the profiled steps as they ran under the profiler: the job's "
                "own step timer around the traced window could not be trusted to remove the profiler's "
                "cost (the caveats say why), so idle and host overhead read high by it.")
    return ("This breakdown is of the profiled steps as they ran under the profiler, which adds host "
            "time to every op (idle and host overhead read high); a trace alone cannot say how the job "
            "runs unobserved. Run it under gpudiag profile to get the unprofiled estimate.")


def noise(dil: Dilation) -> str:
    """Half the interquartile range of the untraced steps, relative to their median: '±1.2%'."""
    return "\u00b1" + pct(dil.untraced_spread / 2)


def dilation_line(dil: Dilation) -> str:
    """'profiler slowed traced steps 1.8× (50.4 ms vs 28.8 ms untraced, 20 untraced steps around
    the window: 28.6 ms before, 29.0 ms after; noise ±1.2%)'."""
    sides = ""
    if dil.before_step_us is not None and dil.after_step_us is not None:
        sides = f": {ms(dil.before_step_us)} before, {ms(dil.after_step_us)} after"
    verb = "slowed" if dil.trusted else "appears to have slowed"
    where = "around the window"
    if dil.left_out:  # one side left out: slowed by the observer, or the job still warming up
        steps = dil.reference_steps
        span = f" (steps {steps[0]}-{steps[-1]})" if steps else ""
        where = (f"after the window{span}; those before it left out, the job still warming up"
                 if dil.left_out_side == "before" else
                 f"before the window{span}; those after it left out, slowed by the observer")
    if not dil.trusted and dil.skewed:
        return (f"profiler's slowdown not measured: traced steps {ms(dil.traced_step_us)} (mean of "
                f"{dil.traced_steps}) against {ms(dil.untraced_step_us)} median and "
                f"{ms(dil.untraced_mean_us or 0.0)} mean untraced ({dil.untraced_steps} untraced steps "
                f"{where}{sides}): those are skewed, and {dil.traced_steps} traced steps too few to "
                "compare with them")
    ref = (f"{dil.untraced_steps} untraced step{'s' if dil.untraced_steps != 1 else ''} {where}{sides}; "
           f"noise {noise(dil)}")
    if dil.factor < 1:
        # a profiler adds work, never removes it: traced steps faster than the reference say the
        # reference ran slower than the job's pace in the window (a blind check, 2-thread conv net
        # beside busy loops: "the profiler appears to have slowed traced steps 0.26x")
        # "as fast as" only where the two are close as well as within the noise: blind check 39
        # read "ran as fast as the untraced ones (0.56x ...; noise +-58%)" as a contradiction
        within = dil.factor >= 1 - dil.untraced_spread / 2
        close = dil.factor >= 1 - AS_FAST
        said = ("traced steps ran as fast as the untraced ones" if within and close else
                "traced steps' pace could not be told from the untraced ones'" if within else
                "traced steps ran faster than the untraced ones")
        return (f"{said} ({dil.factor:.2g}\u00d7: {ms(dil.traced_step_us)} vs "
                f"{ms(dil.untraced_step_us)}, {ref})"
                + ((": within the noise" if close else ": the untraced steps vary more than the two "
                    "differ") if within else
                   ": the profiler adds time, so the job ran slower outside the window than in it"))
    return (f"profiler {verb} traced steps {dil.factor:.2g}\u00d7 ({ms(dil.traced_step_us)} vs "
            f"{ms(dil.untraced_step_us)} untraced, {ref} "
            "(half the interquartile range))")


def confidence_lines(v: Verdict) -> list[str]:
    """'−0.10: <reason>' for each deduction that lowered the confidence by a shown amount: one
    that rounds to 0.00 (the demo's "−0.00: step-time noise ±0.4%") lowered nothing a reader can
    see, and stays in the JSON."""
    return [f"\u2212{d.amount:.2f}: {d.reason}" for d in v.deductions if round(d.amount, 2) > 0]


def prediction_line(r: Recommendation) -> str:
    """'median untraced step 41 ms → ≈ 12 ms (−71%): input wait hidden …', or 'no prediction:
    why'. The step it starts from is named: fixes start from different ones (the mean where a
    save's cost lives, the median elsewhere)."""
    if r.predicted_step_s is None or r.step_s is None:
        return f"no prediction: {r.why}" if r.why else "no prediction"
    return (f"{r.step_from or 'step'} {ms(r.step_s * 1e6)} \u2192 \u2248 {ms(r.predicted_step_s * 1e6)} "
            f"({pct(-(r.gain or 0.0), signed=True, digits=0)}{_faster_end(r)}) if it worked fully: {r.why}")


def _faster_end(r: Recommendation) -> str:
    """'; ≈ 4.66 ms (−53%) at its other end' where the prediction states a faster end."""
    if (r.best_step_s is None or r.step_s is None or r.predicted_step_s is None
            or r.best_step_s >= r.predicted_step_s):
        return ""
    return (f"; \u2248 {ms(r.best_step_s * 1e6)} ({pct(r.best_step_s / r.step_s - 1, signed=True, digits=0)})"
            " at its other end")


def not_helping_line(r: Recommendation) -> str:
    """'step 397 ms → ≈ 618 ms (+55%); would not help: …' for a fix listed as one that would
    not speed the job up (``Verdict.not_advised``): its reason, and the prediction if any."""
    if r.predicted_step_s is None or r.step_s is None:
        return r.why
    return (f"{r.step_from or 'step'} {ms(r.step_s * 1e6)} \u2192 \u2248 {ms(r.predicted_step_s * 1e6)} "
            f"({pct(-(r.gain or 0.0), signed=True, digits=0)}); {r.why}")


def label_share(v: Verdict) -> float | None:
    """The share of step time behind a verdict's label, from its evidence ('host-bound share')."""
    return v.evidence.get(f"{v.label.value} share")


def traced_verdict_line(d: Diagnosis) -> str | None:
    """'traced steps alone would read host-bound (47%)', only where that differs from the verdict."""
    tv = d.traced_verdict
    if tv is None or tv.label == d.verdict.label:
        return None
    share = label_share(tv)
    return (f"traced steps alone would read {tv.label.value}"
            + (f" ({pct(share, digits=0)})" if share is not None else "")
            + f"; with the profiler's extra time removed it reads {d.verdict.label.value}.")


@dataclass
class ViewRow:
    label: str
    traced_us: float
    traced_share: float | None
    unprofiled_us: float | None
    unprofiled_share: float | None


def view_rows(d: Diagnosis) -> list[ViewRow]:
    """The mean step, part by part, as traced and (where estimated) unprofiled."""
    b: TimeBreakdown = d.breakdown
    u = d.unprofiled if has_both_views(d) else None
    return [ViewRow(label.strip() if key == "step_time" else label, getattr(b, key),
                    b.fraction(key) if b.step_time > 0 else None,
                    getattr(u, key) if u is not None else None,
                    u.fraction(key) if u is not None else None)
            for key, label in rows_of(b, u)]


def sync_headline(r: SyncReport) -> str:
    """'49 per step (.item() x25, .cpu() x24); removing them is predicted to save 1.06 ms per step
    (3.1%)'."""
    kinds = ", ".join(f"{k} x{v:.3g}" for k, v in sorted(r.by_kind.items(), key=lambda kv: -kv[1]))
    own = r.own_step_us if r.own_step_us and r.own_step_us < 0.99 * r.step_us else None
    of = f"the {ms(own)} step at the job's own pace" if own else ms(r.step_us)
    cost = f"removing them is predicted to save {ms(r.saving_us)} per step ({pct(r.share)} of {of})"
    feed = (f"; {r.feeding_ops:.3g} operators per step were computed only to feed them "
            f"({ms(r.feeding_us)})" if r.feeding_ops else "")
    return f"{r.per_step:.3g} per step" + (f" ({kinds})" if kinds else "") + f"; {cost}{feed}"


def sync_source(r: SyncReport) -> str:
    """Where the counts come from and how the cost was predicted, in one paragraph."""
    return f"Counted by {r.source}. Cost: {r.assumption}."


def sync_rows(r: SyncReport) -> list[tuple[str, str, str, str, str]]:
    """(site, function, kind, calls per step, time inside per step) per call site."""
    return [(s.site, s.function, s.kind, f"{s.per_step:.3g}", ms(s.host_us)) for s in r.sites]


def feeding_line(r: SyncReport) -> str:
    """'computed only for them: mean x24 (0.52 ms), abs x24 (0.21 ms), ...' or ''."""
    if not r.feeding_top:
        return ""
    return "computed only to feed them: " + ", ".join(
        f"{t.name} x{t.calls} ({ms(t.time_us)})" for t in r.feeding_top[:5])


def syncs_ctx(r: SyncReport | None) -> dict[str, Any] | None:
    """The host-sync section of the HTML report (None: nothing counted)."""
    if r is None:
        return None
    return {"headline": sync_headline(r), "source": sync_source(r), "rows": sync_rows(r),
            "feeding": feeding_line(r), "notes": r.notes}
