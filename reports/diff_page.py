"""The before/after page of ``gpudiag diff`` (``render_diff``): a DiagnosisDiff as one HTML file.

Same rules as the report page (one file, no script, nothing fetched; numbers rendered, never
computed): the comparison itself, including whether a step-time change is larger than run-to-run
noise, is ``analyzers/compare.py``'s; this page lays it out.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from gpudiag.diagnosis import Diagnosis, DiagnosisDiff, ItemDelta, TimeBreakdown
from gpudiag.reports import svg
from gpudiag.reports.fmt import ms, pct, signed_ms
from gpudiag.reports.names import display_names
from gpudiag.reports.page import (
    FASTER,
    PARTS,
    SLOWER,
    embed_json,
    env,
    legend_parts,
    part_segments,
    verdict_ctx,
)

NAME_LABEL_W = 360  # px for kernel/operator names left of the bars (as on the report page)


def _delta_rows(items: list[ItemDelta], slower: bool) -> list[dict[str, Any]]:
    shorts = display_names([x.name for x in items])  # over both tables: one name, one label
    return [{"name": x.name, "short": short, "before": ms(x.before_us), "after": ms(x.after_us),
             "delta": signed_ms(x.delta_us),
             "ratio": (f"{x.ratio:.2f}\u00d7" if x.ratio is not None
                       else "new" if x.before_us == 0 else "gone")}
            for x, short in zip(items, shorts, strict=True) if (x.delta_us > 0) == slower and x.delta_us != 0]


def _delta_chart(title: str, items: list[ItemDelta]) -> Markup | None:
    if not items:
        return None
    labels = display_names([x.name for x in items], NAME_LABEL_W - 12)
    bars = [svg.HBar(label, x.delta_us / 1e3, SLOWER if x.delta_us > 0 else FASTER, signed_ms(x.delta_us),
                     tip=f"{x.name}: {ms(x.before_us)} before, {ms(x.after_us)} after per step")
            for x, label in zip(items, labels, strict=True)]
    return Markup(svg.bar_chart(title, bars, "change in mean time per step (ms)", label_w=NAME_LABEL_W,
                                legend=[("slower", SLOWER), ("faster", FASTER)]))


def render_diff(diff: DiagnosisDiff, before: Diagnosis, after: Diagnosis) -> str:
    """Before/after page for ``gpudiag diff``; ``before``/``after`` supply context (verdicts)."""
    unprofiled = diff.basis == "unprofiled-estimate"
    view = "unprofiled estimates" if unprofiled else "as traced"
    bars = []
    for name, b in (("before", diff.before), ("after", diff.after)):
        if b.step_time > 0:
            bars.append(svg.Bar(name, part_segments(b, b.step_time / 1e3, True), note=ms(b.step_time)))
    charts = []
    if bars:
        charts.append(Markup(svg.stacked_bars(f"Mean step time, before and after ({view})", bars,
                                              legend_parts(diff.before, diff.after),
                                              "mean step time (ms)")))
    rows = []
    # after - before per part; older DiagnosisDiffs (and their JSON) do not carry it
    delta: TimeBreakdown | None = getattr(diff, "breakdown_delta", None)
    for key, label in [(k, lab) for k, lab, _ in PARTS[:2]] + [("compute", "compute (total)")] + \
            [(k, lab) for k, lab, _ in PARTS[2:]] + [("step_time", "step time")]:
        change = getattr(delta, key, None) if delta is not None else None
        rows.append({"label": label, "before": ms(getattr(diff.before, key)),
                     "before_share": pct(diff.before.fraction(key)), "after": ms(getattr(diff.after, key)),
                     "after_share": pct(diff.after.fraction(key)), "change": signed_ms(change),
                     "dir": "" if not change else "delta-up" if change > 0 else "delta-down"})
    label_changed = diff.label_before != diff.label_after
    sc = diff.own_pace_change or diff.step_change  # the verdict's: the job's own pace where recorded
    steps = ((ms(sc.before_median_us), ms(sc.after_median_us)) if sc is not None
             else (ms(diff.before.step_time), ms(diff.after.step_time)))
    ctx = {
        "title": f"gpudiag diff: {diff.label_before.value} \u2192 {diff.label_after.value}",
        "diff": diff, "label_changed": label_changed, "view": view, "unprofiled": unprofiled,
        "step_source": ("median untraced step at the job's own pace (each job's own step timer, profiler "
                        "off, less the wait for a core other processes caused)"
                        if diff.own_pace_change is not None else
                        "median untraced step (each job's own step timer, profiler off)" if sc is not None
                        else "mean traced step (under the profiler)"),
        "step_verdict": diff.step_time_verdict or pct(diff.step_time_change, signed=True),
        "step_class": ("" if sc is None or not sc.significant
                       else "delta-down" if sc.change < 0 else "delta-up"),
        "method": sc.method if sc is not None else "",
        "mfu_before": pct(diff.mfu_before) if diff.mfu_before is not None else "not available",
        "mfu_after": pct(diff.mfu_after) if diff.mfu_after is not None else "not available",
        "sides": [{"name": "before", "d": before, "sources": diff.before_sources,
                   "device": diff.device_before, "verdict": verdict_ctx(before),
                   "step": steps[0], "basis": before.basis},
                  {"name": "after", "d": after, "sources": diff.after_sources,
                   "device": diff.device_after, "verdict": verdict_ctx(after),
                   "step": steps[1], "basis": after.basis}],
        "charts": charts, "rows": rows, "has_delta": delta is not None,
        "kernel_chart": _delta_chart("Kernels: change in mean time per step", diff.kernels),
        "op_chart": _delta_chart("Operators: change in mean time per step", diff.ops),
        "kernels": {"slower": _delta_rows(diff.kernels, True), "faster": _delta_rows(diff.kernels, False)},
        "ops": {"slower": _delta_rows(diff.ops, True), "faster": _delta_rows(diff.ops, False)},
        "notes": diff.notes,
        "data": embed_json({"before": before.to_dict(), "after": after.to_dict(), "diff": diff.to_dict()}),
        "generated_by": f"gpudiag {after.gpudiag_version}",
    }
    return env().get_template("diff.html.j2").render(ctx)
