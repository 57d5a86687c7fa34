"""``gpudiag fleet``'s page and terminal summary: a FleetSummary rendered, nothing computed.

The page is self-contained like the run report (same shell, ``_page.html.j2``: inline CSS, no
script but the JSON data block, nothing fetched). Every number is a link to the Prometheus
query it came from, over the same range; the terminal summary fits 80 columns and names them.
"""

from __future__ import annotations

from datetime import datetime, timezone

from gpudiag import __version__
from gpudiag.live.fleet import NO_JOB, NO_SIGNAL, STALLED, FleetSummary, JobRow
from gpudiag.reports import svg
from gpudiag.reports.fmt import num, pct
from gpudiag.reports.page import embed_json, env

LABEL_COLOURS = {"compute-bound": svg.BLUE, "memory-bound": svg.ORANGE, "communication-bound": svg.GREEN,
                 "input-bound": svg.VERMILLION, "host-bound": svg.YELLOW, NO_SIGNAL: svg.GREY,
                 NO_JOB: svg.SKY_BLUE, "unknown": svg.PURPLE, STALLED: svg.BLACK}


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def utc_s(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def hours(h: float | None) -> str:
    return "n/a" if h is None else num(h)


def _mfu(r: JobRow) -> str:
    return NO_SIGNAL if r.mfu is None else pct(r.mfu)


def _chart(s: FleetSummary) -> str:
    if not s.times:
        return ""
    x0 = s.start
    lines = [svg.Line(name, [(t - x0) / 3600 for t in s.times], ys, LABEL_COLOURS.get(name, svg.BLACK))
             for name, ys in s.label_mix.items()]
    return svg.line_chart("GPUs by bottleneck label over time", lines, "hours since the range's start",
                          "GPUs", width=960, height=260,
                          desc="GPUs held by jobs of each bottleneck label, by jobs without a "
                               "signal, and by no job, at each step of the range")


def render_page(s: FleetSummary) -> str:
    ctx = {"title": f"gpudiag fleet: {utc(s.start)} to {utc(s.end)}",
           "generated_by": f"gpudiag {__version__}", "s": s, "utc": utc, "utc_s": utc_s, "hours": hours,
           "pct": pct, "num": num, "mfu": _mfu, "chart": svg_markup(_chart(s)),
           "data": embed_json(s.to_json()), "data_note": ""}
    return env().get_template("fleet.html.j2").render(ctx)


def svg_markup(text: str):  # noqa: ANN201 - Markup
    from markupsafe import Markup

    return Markup(text)  # noqa: S704 - built by reports/svg.py, which escapes every string


def terminal(s: FleetSummary, page: str | None = None) -> str:
    """The first screen at 80 columns: totals, the no-signal share, the top wasters."""
    share = s.no_signal_share
    out = [f"gpudiag fleet  {utc(s.start)} .. {utc(s.end)}  step {num(s.step_s)} s",
           f"  GPU-hours held by jobs {hours(s.gpu_hours):>10}   "
           f"useful (x MFU) {hours(s.useful_gpu_hours):>10}",
           f"  no signal              {hours(s.no_signal_gpu_hours):>10}   "
           f"= {pct(share) if share is not None else 'n/a'} of GPU-hours (no MFU guessed)",
           f"  held while idle        {hours(s.idle_gpu_hours):>10}   "
           f"held by no job {hours(s.unallocated_gpu_hours):>10}",
           f"  stalled (no step)      {hours(s.stalled_gpu_hours):>10}   counted at MFU 0, all lost",
           f"  jobs {len(s.jobs)}, teams {len(s.teams)}, users {len(s.users)}, at most {s.gpus_max} GPUs",
           ""]
    if s.wasters:
        out.append(f"  {'most GPU-hours lost':<22} {'lost h':>8} {'MFU':>6} {'median':>6}  label / action")
        for r in s.wasters[:10]:
            out.append(f"  {r.job_id[:22]:<22} {num(r.lost_gpu_hours):>8} {_mfu(r):>6} "
                       f"{pct(r.class_median_mfu) if r.class_median_mfu is not None else '':>6}  "
                       + (f"STALLED {r.stall_cause} / {(r.action or '-')[:15]}" if r.stalled_gpu_hours
                          else f"{(r.label or NO_SIGNAL)[:14]} / {(r.action or '-')[:15]}"))
    else:
        out.append("  no job lost GPU-hours against its size class's median MFU")
    out.append("")
    out.append("  GPU-hours: sum of `" + s.queries["gpus"] + "` x step")
    if page:
        out.append(f"  page: {page}")
    return "\n".join(line if line.startswith("  page: ") else line[:80] for line in out) + "\n"
