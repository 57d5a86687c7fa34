"""A Diagnosis as text for a terminal: the verdict first, the evidence after."""

from __future__ import annotations

import textwrap
from typing import Any

from gpudiag.diagnosis import Diagnosis, DiagnosisDiff, SyncReport
from gpudiag.reports import views
from gpudiag.units import ms, pct, pct_fine, si

_BAR = 30


def _bar(frac: float) -> str:
    n = int(round(max(0.0, min(1.0, frac)) * _BAR))
    return "#" * n + "." * (_BAR - n)


def _pct(x: float | None) -> str:
    return pct(x).rjust(6)


def _breakdown(d: Diagnosis, unit: str) -> list[str]:
    """The mean step: one view (traced), or both side by side with the bar for the verdict's."""
    b = d.breakdown
    if not views.has_both_views(d):
        out = [f"Step time {ms(b.step_time)} (mean per step over ranks), {unit} view:"]
        for key, name in views.rows_of(b)[:-1]:
            frac = b.fraction(key)
            out.append(f"  {name:<26}{_pct(frac)}  {_bar(frac)}  {ms(getattr(b, key))}")
        return out
    out = [f"Step time, {unit} view (mean per step over ranks), as traced and unprofiled (estimated):",
           f"  {'':<26}{'as traced':>16}   {'unprofiled (est.)':>17}"]
    for r in views.view_rows(d):
        bar = "" if r.label == "step time" else "  " + _bar(r.unprofiled_share or 0.0)
        out.append(f"  {r.label:<26}{ms(r.traced_us):>9} {_pct(r.traced_share)}   "
                   f"{ms(r.unprofiled_us):>10} {_pct(r.unprofiled_share)}{bar}")
    return out


# Jobs with more ranks than this get the per-rank distribution (and the extreme ranks)
# instead of anything listed rank by rank.
MAX_RANK_ROWS = 8
# Straggler ranks listed by number before "and N more".
MAX_LISTED_RANKS = 10


def _rank_list(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:MAX_LISTED_RANKS]))
    more = len(ranks) - MAX_LISTED_RANKS
    return shown + (f" and {more} more" if more > 0 else "")


def _spread(d: Diagnosis) -> list[str]:
    """Per-rank numbers over many ranks: distribution and the ranks at the top."""
    out = [f"  {'per step, over ' + str(d.rank_spread[0].ranks) + ' ranks':<32}{'min':>9}{'p10':>9}"
           f"{'median':>9}{'p90':>9}{'max':>9}   highest"]
    for sp in d.rank_spread:
        top = ", ".join(f"{v.rank} ({ms(v.value)})" for v in sp.highest[:3])
        out.append(f"  {sp.label:<32}" + "".join(f"{ms(x):>9}" for x in
                   (sp.minimum, sp.p10, sp.median, sp.p90, sp.maximum)) + f"   {top}")
    return out


def _syncs(d: Diagnosis, r: SyncReport, width: int) -> list[str]:
    """Host syncs (``r``, the diagnosis' own): the count, the predicted saving, the busiest call
    sites, how it was counted."""
    wrap: dict[str, Any] = {"width": width, "initial_indent": "  ", "subsequent_indent": "    "}
    out = ["", *textwrap.wrap("Host syncs: " + views.sync_headline(r), width, subsequent_indent="  ")]
    advised = [*d.verdict.recommendations, *d.verdict.not_advised]
    if not r.notes and not any(x.action == "remove-host-syncs" for x in advised):
        # too few to be worth advice: the headline says so; the HTML and JSON keep the details
        return out
    rows = views.sync_rows(r)
    if rows:
        w = min(48, max(len(site) for site, *_ in rows))
        out.append(f"  {'call site':<{w}}  {'kind':<24}{'per step':>9}{'inside':>11}  function")
        for site, func, kind, n, t in rows:
            site = site if len(site) <= w else "..." + site[-(w - 3):]
            out.append(f"  {site:<{w}}  {kind[:24]:<24}{n:>9}{t:>11}  {func}")
    feed = views.feeding_line(r)
    if feed:
        out.extend(textwrap.wrap(feed[0].upper() + feed[1:] + ".", **wrap))
    out.extend(textwrap.wrap(views.sync_source(r), **wrap))
    for n in r.notes:
        out.extend(textwrap.wrap("Note: " + n, **wrap))
    return out


def render_terminal(d: Diagnosis, width: int = 100) -> str:
    """The report in the order a reader decides: what the run was, the verdict and how sure,
    what it rests on, where the time went, what it costs, what to do."""
    wrap: dict[str, Any] = {"width": width, "initial_indent": "  ", "subsequent_indent": "    "}
    out = [*_header(d), "", *_verdict(d, width), "", *_basis(d, wrap)]
    if d.breakdown.step_time > 0:
        out += ["", *_breakdown(d, "GPU" if d.device.kind == "gpu" else "CPU")]
    if d.host_wait is not None and d.host_wait.recorded:
        out += textwrap.wrap("Host time: " + d.host_wait.note + ".", **wrap)
    out += ["", *_efficiency(d, wrap), *_collectives(d)]
    if d.syncs is not None:
        out += _syncs(d, d.syncs, width)
    out += [*_ranks(d), *_top(d), *_advice(d, width)]
    if d.warnings:
        out += ["", "Warnings:"]
        for w in d.warnings:
            out += textwrap.wrap(w, width, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(out)


def _header(d: Diagnosis) -> list[str]:
    """Version, ranks (of how many) and the device with where its peak came from."""
    dev, ranks = d.device, len(d.ranks)
    world = f" of {d.world_size}" if d.world_size and d.world_size != ranks else ""
    src = f"{dev.name}" + (f" [{dev.source}]" if dev.source else "")
    return [f"gpudiag {d.gpudiag_version} | {ranks} rank{'s' if ranks != 1 else ''}{world} | "
            f"device: {src}"]


def _verdict(d: Diagnosis, width: int) -> list[str]:
    """The label (and a tie), confidence, the summary, and what lowered the confidence."""
    v = d.verdict
    second = f" | secondary: {v.secondary.value}" if v.secondary else ""
    label = v.label.value.upper() + (f" / {v.tie_with.value.upper()} (a tie within noise)"
                                      if v.tie_with else "")
    out = [f"VERDICT: {label}  (confidence {v.confidence:.2f}, {v.confidence_level}){second}",
           *textwrap.wrap(v.summary, width, initial_indent="  ", subsequent_indent="  ")]
    lowered = views.confidence_lines(v)
    if lowered:
        out.append("  Confidence lowered by:")
        for line in lowered:
            out += textwrap.wrap(line, width, initial_indent="    ", subsequent_indent="      ")
    return out


def _basis(d: Diagnosis, wrap: dict[str, Any]) -> list[str]:
    """Which steps the verdict rests on, the profiler's dilation, the traced verdict where it
    differs, and the dilation's caveats not already counted against the confidence."""
    out = textwrap.wrap(("Basis: unprofiled estimate. " if views.has_both_views(d) else
                         "Basis: profiled steps. ") + views.basis_line(d), **wrap)
    if d.dilation is not None:
        out += textwrap.wrap("The " + views.dilation_line(d.dilation) + ".", **wrap)
    traced = views.traced_verdict_line(d)
    if traced:
        out += textwrap.wrap("The " + traced, **wrap)
    counted = {x.reason for x in d.verdict.deductions}  # shown above with what they cost
    for c in d.dilation.caveats if d.dilation is not None else []:
        if c not in counted:
            out += textwrap.wrap("Caveat: " + c, **wrap)
    return out


def _efficiency(d: Diagnosis, wrap: dict[str, Any]) -> list[str]:
    """MFU (or why none), by wall clock beside it, and the roofline's ridge."""
    m = d.mfu
    out = [f"MFU: {pct_fine(m.value)}  ({m.reason})" if m.value is not None else f"MFU: {m.reason}"]
    if m.pace:  # the wall clock's beside it, or that no split was recorded
        beside = (f"MFU by wall clock: {pct_fine(m.wall_value)} ({m.pace})" if m.wall_value is not None
                  else m.pace)
        out += textwrap.wrap(beside, **wrap)
    r = d.roofline
    if r.method != "none" and r.peak_flops > 0:
        out.append(f"Roofline ({r.method}): ridge {r.ridge_intensity:.3g} FLOP/byte at "
                   f"{si(r.peak_flops, 'FLOP/s')} {r.dtype_family}, {si(r.peak_bandwidth, 'B/s')}")
    return out


def _collectives(d: Diagnosis) -> list[str]:
    """One row per collective type: time and exposed time in all, and per step."""
    if not d.communication:
        return []
    out = ["", "Collectives:",
           f"  {'type':<16}{'count':>7}{'time':>12}{'exposed':>12}{'per step':>12}"
           f"{'exposed':>12}{'busbw GB/s':>12}"]
    for c in d.communication:
        bw = f"{c.busbw_gbps:.3g}" if c.busbw_gbps is not None else "n/a"
        out.append(f"  {c.collective:<16}{c.count:>7}{ms(c.total_time_us):>12}"
                   f"{ms(c.exposed_time_us):>12}{ms(c.time_per_step_us):>12}"
                   f"{ms(c.exposed_per_step_us):>12}{bw:>12}")
    out.append(f"  (time and exposed: all traced steps and ranks; per step: the verdict's view, "
               f"{'unprofiled' if views.has_both_views(d) else 'as traced'}, as in the breakdown)")
    return out


def _ranks(d: Diagnosis) -> list[str]:
    """Stragglers, and the per-rank distribution where there are too many ranks to list."""
    out = []
    if d.stragglers is not None:
        s = d.stragglers
        slow = _rank_list(s.ranks) or "none"
        out.append(f"Ranks: median step {ms(s.median_step_us)}, imbalance "
                   f"{100 * s.imbalance:.1f}%, stragglers: {slow}")
    if len(d.ranks) > MAX_RANK_ROWS and d.rank_spread:
        out += _spread(d)
    return out


def _top(d: Diagnosis) -> list[str]:
    """The five kernels (on a GPU) or operators that take the most time."""
    top = d.top_kernels if d.device.kind == "gpu" and d.top_kernels else d.top_ops
    if not top:
        return []
    out = ["", "Top kernels:" if top is d.top_kernels else "Top operators:"]
    for t in top[:5]:
        name = t.name if len(t.name) <= 70 else t.name[:67] + "..."
        out.append(f"  {_pct(t.share)}  {ms(t.time_us):>10}  x{t.calls:<6} {name}")
    return out


def _advice(d: Diagnosis, width: int) -> list[str]:
    """What to do, each with its predicted gain, then what would not help and why."""
    v, out = d.verdict, []
    if v.recommendations:
        out += ["", "What to do:"]
        for i, rec in enumerate(v.recommendations, 1):
            out += textwrap.wrap(f"{rec.text} [{rec.action}]", width, initial_indent=f"  {i}. ",
                                 subsequent_indent="     ")
            out += textwrap.wrap(views.prediction_line(rec), width, initial_indent="     ",
                                 subsequent_indent="       ")
    if v.not_advised:
        out += ["", "Would not help here:"]
        for rec in v.not_advised:
            out += textwrap.wrap(f"[{rec.action}] {views.not_helping_line(rec)}", width,
                                 initial_indent="  - ", subsequent_indent="    ")
    return out


def _diff_medians(diff: DiagnosisDiff) -> str:
    """The medians the verdict's percentages compare, in ms, and what steps they are: blind
    check 37 read a diff's own pace beside each run's diagnosis (23.6 against 25.4 ms) and
    nothing said which steps either was of."""
    sc, own = diff.step_change, diff.own_pace_change
    if sc is None:
        return ""
    wall = f"{ms(sc.before_median_us)} -> {ms(sc.after_median_us)}"
    both = (f"{ms(own.before_median_us)} -> {ms(own.after_median_us)} at the job's own pace, {wall} by "
            "wall clock" if own is not None else f"{wall} by wall clock")
    return (f"Median step: {both} (the untraced steps the verdict compares; a run's diagnosis "
            "reads the steps around its traced window)")


def render_diff_terminal(diff: DiagnosisDiff, width: int = 100, items: int = 3) -> str:
    """``gpudiag diff`` on a terminal: the verdict on step time, label and MFU, and the items
    that changed most (the HTML page has the rest)."""
    out = textwrap.wrap("Step time: " + diff.step_time_verdict, width, subsequent_indent="  ")
    medians = _diff_medians(diff)
    if medians:
        out.extend(textwrap.wrap(medians, width, subsequent_indent="  "))
    for w in diff.warnings:
        out.extend(textwrap.wrap(w, width, initial_indent="Warning: ", subsequent_indent="  "))
    view = "unprofiled estimate" if diff.basis == views.UNPROFILED else "profiled steps"
    before = diff.label_before.value + (f" (a tie with {diff.tie_before.value})" if diff.tie_before else "")
    after = diff.label_after.value + (f" (a tie with {diff.tie_after.value})" if diff.tie_after else "")
    label = f"{before} -> {after}" if before != after else f"unchanged, {after}"
    out.append(f"Label ({view}): {label}")
    out.append(f"MFU ({view}): {pct_fine(diff.mfu_before)} -> {pct_fine(diff.mfu_after)}")
    for title, rows in (("Kernels", diff.kernels), ("Operators", diff.ops)):
        if rows:
            out.append(f"{title} that changed most (per traced step):")
            for r in rows[:items]:
                name = r.name if len(r.name) <= 60 else r.name[:57] + "..."
                out.append(f"  {r.delta_us / 1e3:+.3g} ms  {ms(r.before_us)} -> {ms(r.after_us)}  {name}")
    for n in diff.notes:
        out.extend(textwrap.wrap(n, width, initial_indent="Note: ", subsequent_indent="  "))
    return "\n".join(out)
