"""A Diagnosis as one self-contained HTML file (``render_report``).

Why this shape: a report gets mailed, attached to tickets and opened offline long after the
run, so it is a single file with inline CSS and inline SVG, no JavaScript and nothing fetched
over the network. The full Diagnosis rides along as a JSON data block so the file is also
machine-readable. Reports render numbers, they never compute them: everything here is
formatting (units, rounding), scaling to pixels and layout; the numbers come from the
Diagnosis as the analyzers left it.

The pieces: ``fmt`` (how a number reads), ``names`` (kernel names for display), ``page`` (what
the report and the diff page share), ``diff_page`` (``render_diff``, re-exported here), this
module (the sections of the report page).
"""

from __future__ import annotations

import os
import shlex
from collections import Counter
from typing import Any

from markupsafe import Markup

from gpudiag.diagnosis import Diagnosis, RankResult, Series, TimeBreakdown, TopItem
from gpudiag.reports import svg, views
from gpudiag.reports.diff_page import render_diff
from gpudiag.reports.fmt import gbps, ms, num, pct, run_status, si, si_text, when
from gpudiag.reports.names import display_names
from gpudiag.reports.page import (
    BOUND_COLOURS,
    PARTS,
    SHORT_LABELS,
    embed_json,
    env,
    legend_parts,
    part_segments,
    verdict_ctx,
    views_ctx,
)

__all__ = ["embed_json", "render_diff", "render_report"]

TOP_ROWS = 25  # rows of kernel/operator/roofline tables; the JSON block holds what the diagnosis kept
TOP_BARS = 10  # bars in the "where device time went" chart
MAX_STEP_ROWS = 48  # rows of the per-step chart (8 ranks x 6 steps)
# Ranks drawn and listed one by one. A job with more shows the ranks the analysis named (the
# slowest and fastest, the most exposed communication, the stragglers) and the distribution
# over all ranks, so 128 ranks read as a few rows and the page stays small.
MAX_RANK_ROWS = 16
# Past this many bytes of embedded JSON, the per-step data of ranks not shown is left out of it
# (diagnosis.json keeps everything): a report must stay small enough to mail (< 2 MB).
MAX_EMBED_BYTES = 1_000_000
NAME_LABEL_W = 360  # px for kernel/operator names left of the bars


def _header(d: Diagnosis) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    r = d.run
    if r is not None:
        rows.append(("Command", shlex.join(r.command) if r.command else "n/a"))
        rows.append(("Host", r.host or "n/a"))
        rows.append(("Status", run_status(r)))
        rows.append(("Time", f"{when(r.start)} to {when(r.end)}" if r.end else f"from {when(r.start)}"))
        if r.gpus:
            kinds = Counter((g.get("name", "?"), g.get("driver", "?")) for g in r.gpus)
            rows.append(("GPUs", "; ".join(f"{n} \u00d7 {name} (driver {drv})"
                                           for (name, drv), n in kinds.items())))
        else:
            rows.append(("GPUs", "none recorded"))
        rows.append(("GPU counters", r.gpu_counters or "n/a"))
    dev = d.device
    trace_dev = f"; trace says {dev.trace_device_name}" if dev.trace_device_name else ""
    rows.append(("Device", f"{dev.name} ({dev.kind}; peaks from {dev.source}{trace_dev})"))
    world = f" of {d.world_size}" if d.world_size and d.world_size != len(d.ranks) else ""
    rows.append(("Ranks", f"{len(d.ranks)}{world}"))
    versions = dict(r.versions) if r is not None else {}
    recorded = versions.pop("gpudiag", None)
    parts = [f"gpudiag {d.gpudiag_version} (analysis)"]
    if recorded and recorded != d.gpudiag_version:
        parts.append(f"gpudiag {recorded} (profile)")
    if r is not None and "torch" not in versions:
        parts.append("torch not recorded")
    parts += [f"{k} {v}" for k, v in sorted(versions.items())]
    rows.append(("Versions", ", ".join(parts)))
    return rows


def _shown_ranks(d: Diagnosis) -> list[RankResult]:
    """All ranks, or for a large job the ones the analysis named, in rank order."""
    if len(d.ranks) <= MAX_RANK_ROWS:
        return d.ranks
    named = set(d.stragglers.ranks[:MAX_RANK_ROWS // 2]) if d.stragglers else set()
    for sp in d.rank_spread:
        if sp.metric in ("step_time", "comm_exposed"):
            named.update(v.rank for v in sp.highest)
        if sp.metric == "step_time":
            named.update(v.rank for v in sp.lowest)
    return [r for r in d.ranks if r.rank in named]


def _spread_rows(d: Diagnosis) -> list[dict[str, Any]]:
    return [{"label": sp.label, "values": [ms(x) for x in (sp.minimum, sp.p10, sp.median, sp.p90,
                                                          sp.maximum)],
             "highest": ", ".join(f"{v.rank} ({ms(v.value)})" for v in sp.highest),
             "lowest": ", ".join(f"{v.rank} ({ms(v.value)})" for v in sp.lowest)}
            for sp in d.rank_spread]


def _breakdown(d: Diagnosis) -> dict[str, Any]:
    slow = set(d.stragglers.ranks) if d.stragglers else set()
    shown = _shown_ranks(d)
    bars = _rank_bars(d, shown, slow)
    charts = []
    legend = legend_parts(d.breakdown)
    if bars:
        charts.append(svg.stacked_bars("Step time per rank (mean per step)", bars, legend,
                                       "mean step time (ms)",
                                       desc="Each bar is one rank's mean step, split into the parts "
                                            "of the time breakdown; stragglers are marked."))
    step_bars = _step_bars(shown, slow)
    if step_bars:
        charts.append(svg.stacked_bars("Step time per traced step", step_bars, legend, "step time (ms)"))
    rank_rows = [{"rank": r.rank, "trace": r.trace, "steps": len(r.steps), "mean": ms(r.mean_step_time),
                  "parts": [pct(r.total.fraction(key)) for key, _, _ in PARTS],
                  "busy": pct(r.total.fraction("gpu_busy")), "straggler": r.rank in slow}
                 for r in shown]
    strag = None
    if d.stragglers is not None:
        st = d.stragglers
        strag = (f"median step {ms(st.median_step_us)}, imbalance {pct(st.imbalance)} "
                 f"((max - min) / median of per-rank mean step time); stragglers: "
                 + (", ".join(f"rank {x}" for x in st.ranks) or "none"))
    total_steps = sum(len(r.steps) for r in shown)
    note = ""
    if total_steps > len(step_bars) and step_bars:
        note = f"The per-step chart shows the first {len(step_bars)} of {total_steps} steps."
    if len(shown) < len(d.ranks):
        note = (f"{note} " if note else "") + (
            f"{len(shown)} of {len(d.ranks)} ranks are drawn and listed: the slowest and fastest by "
            "mean step time, those with the most exposed communication, and the stragglers; the "
            "distribution below covers every rank, and diagnosis.json has each one.")
    return {"charts": [Markup(c) for c in charts], "mean_rows": _mean_rows(d.breakdown),
            "rank_rows": rank_rows, "part_labels": SHORT_LABELS, "stragglers": strag, "note": note,
            "spread": _spread_rows(d), "device": "GPU" if d.device.kind == "gpu" else "CPU"}


def _rank_bars(d: Diagnosis, shown: list[RankResult], slow: set[int]) -> list[svg.Bar]:
    """The job's mean step, then each shown rank's, split into the breakdown's parts."""
    bars = []
    if d.breakdown.step_time > 0:
        bars.append(svg.Bar("mean, all ranks", part_segments(d.breakdown, d.breakdown.step_time / 1e3, True),
                            note=ms(d.breakdown.step_time), tip="mean step over all ranks"))
    for r in shown:
        if r.total.step_time <= 0:
            continue
        straggler = r.rank in slow
        bars.append(svg.Bar(f"rank {r.rank}" + (" (straggler)" if straggler else ""),
                            part_segments(r.total, r.mean_step_time / 1e3, False),
                            note=ms(r.mean_step_time), marked=straggler,
                            tip=f"rank {r.rank}: mean step {ms(r.mean_step_time)} over {len(r.steps)} "
                                f"step(s){'; straggler' if straggler else ''}"))
    return bars


def _step_bars(shown: list[RankResult], slow: set[int]) -> list[svg.Bar]:
    """Each traced step of the shown ranks, the first ``MAX_STEP_ROWS``."""
    step_bars: list[svg.Bar] = []
    for r in shown:
        for s in r.steps:
            if len(step_bars) >= MAX_STEP_ROWS or s.breakdown.step_time <= 0:
                continue
            name = f"rank {r.rank} step {s.step}" if s.step is not None else f"rank {r.rank} (whole trace)"
            step_bars.append(svg.Bar(name, part_segments(s.breakdown, s.breakdown.step_time / 1e3, True),
                                     note=ms(s.breakdown.step_time), marked=r.rank in slow))
    return step_bars


def _mean_rows(b: TimeBreakdown) -> list[tuple[str, str, str]]:
    """The mean step's table: each part, then what parts of compute and host overhead hold."""
    mean_rows = [(label, ms(getattr(b, key)), pct(b.fraction(key))) for key, label, _ in PARTS]
    mean_rows[2:2] = [("compute (total)", ms(b.compute), pct(b.fraction("compute")))]
    if b.comm_work > 0:
        mean_rows.append(("of the compute, the training thread's copies for the collectives (DDP's "
                          "buckets): communication's cost", ms(b.comm_work), pct(b.fraction("comm_work"))))
    if b.comm_contention > 0:
        mean_rows.append(("of the compute, slowed beside the collectives (their threads on the ranks' "
                          "cores): communication's cost", ms(b.comm_contention),
                          pct(b.fraction("comm_contention"))))
    if b.host_waiting > b.host_stalled:
        mean_rows.append(("of the host overhead, the training thread waiting for a core (the job's "
                          "own workers and threads, or other processes)", ms(b.host_waiting),
                          pct(b.fraction("host_waiting"))))
    if b.host_stalled > 0:
        mean_rows.append(("of the host overhead, the OS running other work", ms(b.host_stalled),
                          pct(b.fraction("host_stalled"))))
    mean_rows += [("device busy", ms(b.gpu_busy), pct(b.fraction("gpu_busy"))),
                  ("communication (total, incl. overlapped)", ms(b.comm_total),
                   pct(b.fraction("comm_total"))),
                  ("step time", ms(b.step_time), pct(1.0 if b.step_time > 0 else None))]
    return mean_rows


def _sources(d: Diagnosis) -> list[str]:
    """The trace files, or for many ranks their folder, how many, and the first and last."""
    if len(d.sources) <= MAX_RANK_ROWS:
        return d.sources
    try:
        folder = os.path.commonpath(d.sources)
    except ValueError:  # absolute and relative paths mixed: no common folder to name
        return d.sources
    names = [os.path.relpath(x, folder) for x in d.sources]
    return [f"{len(names)} files in {folder}: {names[0]}, {names[1]}, …, {names[-1]}"]


def _embedded(d: Diagnosis) -> tuple[Markup, str]:
    """The Diagnosis as the page's JSON data block, and a note when part was left out."""
    data = d.to_dict()
    text = embed_json(data)
    if len(text) <= MAX_EMBED_BYTES:
        return text, ""
    keep = {r.rank for r in _shown_ranks(d)}
    cut = 0
    for r in data["ranks"]:
        if r["rank"] not in keep and r["steps"]:
            r["steps"] = []
            cut += 1
    return embed_json(data), (f"The embedded JSON data leaves out the per-step breakdowns of {cut} "
                              "ranks to keep this page small; diagnosis.json has them.")


def _no_timeline_reason(d: Diagnosis) -> str:
    if d.run is None:
        return ("This report was made from profiler traces alone, not from a gpudiag profile run "
                "directory, so there are no counters over the whole run. Run the job under "
                "gpudiag profile to get SM activity, tensor activity, DRAM bandwidth, power and "
                "step times over time.")
    if d.timeline is None or not d.timeline.series:
        return ("The run directory holds no GPU samples and no per-step records "
                f"(GPU counters: {d.run.gpu_counters or 'n/a'}).")
    return ""


def _timeline(d: Diagnosis) -> dict[str, Any]:
    reason = _no_timeline_reason(d)
    if reason:
        return {"charts": [], "reason": reason, "facts": []}
    tl = d.timeline
    assert tl is not None
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in tl.series:
        groups.setdefault((s.name, s.unit), []).append(s)
    spans = [(a, b) for a, b in tl.traced]
    charts = []
    for (name, unit), series in groups.items():
        lines = []
        for i, s in enumerate(series):
            colour, dash = svg.line_style(i)
            who = f"GPU {s.gpu}" if s.gpu is not None else f"rank {s.rank}" if s.rank is not None else name
            lines.append(svg.Line(who, s.t, s.v, colour, dash))
        charts.append(Markup(svg.line_chart(
            f"{name} ({unit})", lines, "seconds since the run started", unit, spans=spans,
            span_label="traced steps", x_max=tl.duration or None, y_max=100.0 if unit == "%" else None,
            desc=f"{name} per {'GPU' if series[0].gpu is not None else 'rank'} over the whole run; "
                 "the shaded span is the traced window.")))
    facts = [f"t = 0 at {when(tl.start)}, {num(tl.duration)} s of run",
             f"{len(tl.series)} series, downsampled for drawing"]
    if d.run is not None and d.run.gpu_counters.startswith("not sampled"):
        facts.append(f"GPU counters {d.run.gpu_counters}")
    return {"charts": charts, "reason": "", "facts": facts}


def _roofline(d: Diagnosis) -> dict[str, Any]:
    r = d.roofline
    charts = []
    unit = "FLOP/s" if d.device.kind == "gpu" else "FLOP/s (CPU)"
    facts = [("method", r.method), ("dtype family", r.dtype_family or "n/a"),
             ("compute ceiling", si(r.peak_flops, "FLOP/s") if r.peak_flops else "unknown"),
             ("bandwidth ceiling", si(r.peak_bandwidth, "B/s") if r.peak_bandwidth else "unknown"),
             ("ridge point", f"{num(r.ridge_intensity)} FLOP/byte" if r.ridge_intensity else "n/a")]
    empty = ""
    if not r.points:
        # an empty 440 px chart says less than a sentence: no chart without points
        why = {"kernel-names": "each kernel was classed compute- or memory-bound by its name, without "
                               "the operator shapes a point needs (profile with record_shapes=True)",
               "none": "neither operator shapes nor known kernel classes were found"}
        empty = (f"No roofline points (method {r.method!r}): "
                 + why.get(r.method, "no operator had both FLOPs and bytes") + ".")
    else:
        pts = [svg.Point(p.intensity, p.achieved_flops, p.time_us, BOUND_COLOURS.get(p.bound, svg.GREY),
                         f"{p.op} {p.shape} {p.dtype}: {p.calls} calls, {ms(p.time_us)}, "
                         f"{num(p.intensity)} FLOP/byte, {si(p.achieved_flops, 'FLOP/s')} achieved "
                         f"of {si(p.attainable_flops, 'FLOP/s')} attainable ({p.bound}-bound)")
               for p in r.points]
        ceil = svg.Ceilings(
            peak=r.peak_flops or None, bandwidth=r.peak_bandwidth or None, ridge=r.ridge_intensity or None,
            peak_label=f"compute ceiling {si(r.peak_flops, 'FLOP/s')} {r.dtype_family}",
            bandwidth_label=f"bandwidth ceiling {si(r.peak_bandwidth, 'B/s')}",
            ridge_label=f"ridge {num(r.ridge_intensity)} FLOP/byte")
        charts.append(svg.loglog_scatter(
            "Roofline", pts, ceil, "arithmetic intensity (FLOP/byte)", f"achieved {unit}",
            [("compute-bound", svg.BLUE), ("memory-bound", svg.ORANGE), ("circle area: time", "#ffffff")],
            desc="Each circle is an operator and shape; circle area grows with its time."))
    split = [svg.Segment(r.compute_bound_time / 1e3, svg.BLUE, f"compute-bound: {ms(r.compute_bound_time)}"),
             svg.Segment(r.memory_bound_time / 1e3, svg.ORANGE, f"memory-bound: {ms(r.memory_bound_time)}"),
             svg.Segment(r.unattributed_time / 1e3, svg.GREY, f"unattributed: {ms(r.unattributed_time)}")]
    if any(s.value > 0 for s in split):
        charts.append(svg.stacked_bars(
            "Device compute time by roofline class (all ranks, all traced steps)",
            [svg.Bar("compute time", split)],
            [("compute-bound", svg.BLUE), ("memory-bound", svg.ORANGE), ("unattributed", svg.GREY)],
            "ms", label_w=110))
    top = sorted(r.points, key=lambda p: -p.time_us)[:TOP_ROWS]
    # dtype shown without its namespace ('c10::bfloat16' -> 'bfloat16'; the title keeps it)
    rows = [{"op": p.op, "short": short, "shape": p.shape, "dtype": p.dtype,
             "dtype_short": p.dtype.split("::")[-1], "calls": p.calls,
             "time": ms(p.time_us), "flops": si(p.flops, "FLOP"), "bytes": si(p.bytes, "B"),
             "intensity": num(p.intensity), "achieved": si(p.achieved_flops, "FLOP/s"),
             "attainable": si(p.attainable_flops, "FLOP/s"), "bound": p.bound}
            for p, short in zip(top, display_names([p.op for p in top]), strict=True)]
    return {"charts": [Markup(c) for c in charts], "facts": facts, "rows": rows,
            "n_points": len(r.points), "empty": empty}


def _item_rows(items: list[TopItem]) -> list[dict[str, Any]]:
    top = items[:TOP_ROWS]
    return [{"name": t.name, "short": short, "calls": t.calls, "time": ms(t.time_us), "share": pct(t.share)}
            for t, short in zip(top, display_names([t.name for t in top]), strict=True)]


def _tables(d: Diagnosis) -> dict[str, Any]:
    top_chart = comm_chart = ""
    top = d.top_kernels or d.top_ops
    what = "kernels" if d.top_kernels else "operators"
    if top:
        shown = top[:TOP_BARS]
        labels = display_names([t.name for t in shown], NAME_LABEL_W - 12)
        bars = [svg.HBar(label, 100 * t.share, svg.BLUE, pct(t.share),
                         tip=f"{t.name}: {ms(t.time_us)} in {t.calls} calls")
                for t, label in zip(shown, labels, strict=True)]
        top_chart = svg.bar_chart(f"Top {what} by device time", bars, "% of device busy time",
                                  label_w=NAME_LABEL_W)
    comm = [c for c in d.communication if c.busbw_gbps is not None]
    if comm:
        bars = []
        for c in comm:
            bw = c.busbw_gbps or 0.0
            of_peak = f" ({pct(bw / c.link_peak_gbps)} of peak)" if c.link_peak_gbps else ""
            bars.append(svg.HBar(c.collective, bw, svg.GREEN, gbps(bw) + of_peak,
                                 tip=f"{c.collective}: bus bandwidth {gbps(bw)}{of_peak}",
                                 ref=c.link_peak_gbps,
                                 ref_tip=f"link peak {gbps(c.link_peak_gbps)}" if c.link_peak_gbps else ""))
        peaks = {c.link_peak_gbps for c in comm}
        ref_label = f"link peak {gbps(peaks.pop())}" if len(peaks) == 1 and None not in peaks else ""
        comm_chart = svg.bar_chart("Collective bus bandwidth against the link peak", bars, "GB/s",
                                   label_w=160, ref_label=ref_label,
                                   legend=[("bus bandwidth", svg.GREEN),
                                           ("link peak (black tick)", svg.BLACK)])
    coll_rows = [{"name": c.collective, "count": c.count, "time": ms(c.total_time_us),
                  "exposed": ms(c.exposed_time_us), "per_step": ms(c.time_per_step_us),
                  "exposed_per_step": ms(c.exposed_per_step_us),
                  "bytes": si(c.bytes, "B") if c.bytes is not None else "n/a",
                  "algbw": gbps(c.algbw_gbps), "busbw": gbps(c.busbw_gbps),
                  "peak": gbps(c.link_peak_gbps)} for c in d.communication]
    m = d.mfu
    reason = si_text(m.reason.removeprefix("not available: ") if m.value is None else m.reason)
    mfu = {"value": pct(m.value) if m.value is not None else "not available", "reason": reason,
           "wall": pct(m.wall_value) if m.pace and m.wall_value is not None else None,
           "pace": si_text(m.pace) if m.pace else None,
           "rows": [("FLOPs per step per rank",
                     si(m.flops_per_step, "FLOP") if m.flops_per_step else "n/a"),
                    ("FLOPs from", m.flops_source), ("dtype family", m.dtype_family or "n/a"),
                    ("dtype mix", ", ".join(f"{k} {pct(v, digits=0)}" for k, v in m.dtype_mix.items())
                     or "n/a"),
                    ("peak", si(m.peak_flops, "FLOP/s") if m.peak_flops else "n/a"),
                    ("step time", ms(m.step_time_us)), ("step time from", m.step_time_basis)]}
    return {"syncs": views.syncs_ctx(d.syncs), "top_chart": Markup(top_chart),
            "top_chart_kernels": bool(d.top_kernels),
            "comm_chart": Markup(comm_chart), "kernels": _item_rows(d.top_kernels),
            "n_kernels": len(d.top_kernels), "ops": _item_rows(d.top_ops), "n_ops": len(d.top_ops),
            "collectives": coll_rows, "mfu": mfu}


def _missing(d: Diagnosis) -> list[str]:
    return [si_text(m) for m in _missing_raw(d)]


def _missing_raw(d: Diagnosis) -> list[str]:
    items = list(d.warnings)
    if d.run is not None and d.run.gpu_counters.startswith("not sampled"):
        items.append(f"GPU counters {d.run.gpu_counters}")
    reason = _no_timeline_reason(d)
    if reason:
        items.append("No counter timeline: " + reason)
    r = d.roofline
    if r.method == "kernel-names":
        items.append("Roofline from kernel names: no operator shapes could be used, so each kernel was "
                     "judged compute- or memory-bound by its name and there are no roofline points "
                     "(profile with record_shapes=True).")
    elif r.method == "none":
        items.append("No roofline: neither operator shapes nor known kernel classes were found.")
    if r.unattributed_time > 0:
        items.append(f"{ms(r.unattributed_time)} of compute time had neither recorded shapes nor a "
                     "known kernel class: it is in neither roofline class.")
    if d.mfu.value is None:
        items.append(f"MFU {d.mfu.reason}")
    if d.run is not None:
        items += [f"Run note: {n}" for n in d.run.notes]
    return items


def render_report(d: Diagnosis) -> str:
    """The whole report for one Diagnosis as an HTML string."""
    ctx = {
        "title": f"gpudiag: {d.verdict.label.value} \u2014 {d.device.name}",
        "header": _header(d), "sources": _sources(d), "verdict": verdict_ctx(d), "views": views_ctx(d),
        "breakdown": _breakdown(d), "timeline": _timeline(d), "roofline": _roofline(d),
        "tables": _tables(d), "missing": _missing(d), "generated_by": f"gpudiag {d.gpudiag_version}",
    }
    ctx["data"], ctx["data_note"] = _embedded(d)
    return env().get_template("report.html.j2").render(ctx)
