"""``gpudiag fleet``'s page: a FleetSummary rendered, nothing computed.

Self-contained like the run report (same shell, ``_page.html.j2``: inline CSS, no script but the
JSON data block, nothing fetched). It answers at a glance: the three fixes that win most, useful
against held per team and user, held GPU-hours by label per date, this period against the
previous one; then the jobs that lost most, the jobs, the nodes. Every job links to its own
series in Prometheus through one URL template (``fleet_query.job_series_url``).

Size: a page lists at most PAGE_JOBS jobs (the largest, and every job a fix or a loss names);
the CSV beside it and ``--json`` hold all. Its embedded JSON is the summary with those jobs, so
10,000 jobs make a page of a few hundred kilobytes, not tens of megabytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpudiag import __version__
from gpudiag.live.fleet_model import (
    LOSS_CAUSES,
    NO_JOB,
    NO_LABEL,
    NO_SIGNAL,
    STALLED,
    UNATTRIBUTED,
    FleetSummary,
    Group,
    JobRow,
)
from gpudiag.live.fleet_query import job_series_url
from gpudiag.reports import svg
from gpudiag.reports.fleet_text import (
    CAUSE_WORDS,
    axis,
    cause_text,
    change,
    gpu_h,
    mfu_text,
    share,
    utc,
    utc_s,
)
from gpudiag.reports.page import embed_json, env

if TYPE_CHECKING:
    from markupsafe import Markup
from gpudiag.reports.svg_columns import Stack, stacked_columns
from gpudiag.units import seconds

PAGE_JOBS = 200
GROUP_ROWS = 15      # teams / users in a table and a chart
NODE_ROWS = 200
LABEL_COLOURS = {"compute-bound": svg.BLUE, "memory-bound": svg.ORANGE, "communication-bound": svg.GREEN,
                 "input-bound": svg.VERMILLION, "host-bound": svg.YELLOW, NO_LABEL: svg.PURPLE,
                 NO_SIGNAL: svg.GREY, STALLED: svg.BLACK}
USE_PARTS = [("useful (x MFU)", svg.BLUE), ("held, not useful", svg.SKY_BLUE), ("stalled", svg.BLACK),
             ("under gpudiag, no MFU", svg.ORANGE), ("no signal", svg.GREY)]
COMPARE = [("held by jobs", "gpu_hours"), ("useful", "useful_gpu_hours"),
           ("no signal", "no_signal_gpu_hours"),
           ("no MFU", "no_mfu_gpu_hours"), ("stalled", "stalled_gpu_hours"),
           ("held while idle", "idle_gpu_hours"),
           ("held by no job", "unallocated_gpu_hours"), ("lost", "lost_gpu_hours")]


def listed_jobs(s: FleetSummary, limit: int = PAGE_JOBS) -> list[JobRow]:
    """The jobs the page lists: the largest, and every one a fix or a loss names."""
    named = {f.job_id for f in s.fixes} | {m["job_id"] for m in s.most_lost}
    top = s.jobs[:limit]
    have = {r.job_id for r in top}
    return top + [r for r in s.jobs if r.job_id in named and r.job_id not in have]


def _use_bars(title: str, groups: list[Group]) -> str:
    bars = []
    for g in groups[:GROUP_ROWS]:
        rest = max(0.0, g.gpu_hours - g.useful_gpu_hours - g.stalled_gpu_hours - g.no_mfu_gpu_hours
                   - g.no_signal_gpu_hours)
        parts = [g.useful_gpu_hours, rest, g.stalled_gpu_hours, g.no_mfu_gpu_hours, g.no_signal_gpu_hours]
        segs = [svg.Segment(v, c, f"{g.name}: {n} {gpu_h(v)} GPU-h")
                for (n, c), v in zip(USE_PARTS, parts, strict=True)]
        useful = g.useful_gpu_hours / g.gpu_hours if g.gpu_hours > 0 else None
        bars.append(svg.Bar(g.name, segs, note=f"{share(useful)} useful",
                            tip=f"{g.name}: {gpu_h(g.gpu_hours)} GPU-h held, "
                                f"{gpu_h(g.useful_gpu_hours)} useful"))
    if not bars:
        return ""
    return svg.stacked_bars(title, bars, USE_PARTS, "GPU-hours held", width=1100, label_w=170,
                            desc="GPU-hours held per group, split into useful (held x MFU), held with an "
                                 "MFU but not useful, held by jobs under gpudiag without an MFU, and held "
                                 "by jobs that sent no signal")


def _bucket_label(t: float, bucket_s: float) -> str:
    from datetime import datetime, timezone

    d = datetime.fromtimestamp(t, timezone.utc)
    if bucket_s >= 86400:
        return d.strftime("%a %m-%d")
    if bucket_s >= 3600:
        return d.strftime("%m-%d %H:%M")
    return d.strftime("%H:%M:%S")


def _mix_chart(s: FleetSummary) -> str:
    mix = s.label_mix
    names = [n for n in mix.labels if n != NO_JOB and any(v > 0 for v in mix.labels[n])]
    if not names:
        return ""
    tail = [STALLED, NO_LABEL, NO_SIGNAL]
    names = sorted((n for n in names if n not in tail), key=lambda n: -sum(mix.labels[n])) + \
        [n for n in tail if n in names]
    series = [(n, LABEL_COLOURS.get(n, svg.BLACK)) for n in names]
    stacks = [Stack(_bucket_label(t, mix.bucket_s), [mix.labels[n][i] for n in names])
              for i, t in enumerate(mix.starts)]
    from gpudiag.durations import format_duration

    names_of = {86400.0: "day", 7 * 86400.0: "week", 3600.0: "hour"}
    unit = names_of.get(mix.bucket_s, format_duration(mix.bucket_s))
    return stacked_columns(f"Held GPU-hours by bottleneck label, per {unit} (UTC)",
                           stacks, series, "GPU-hours", value=gpu_h, tick=axis, width=1100, height=320,
                           desc="GPU-hours held by jobs per bottleneck label in each period of the range; "
                                "'no label': jobs under gpudiag before their first label; 'no signal': "
                                "jobs not run under gpudiag")


def page_data(s: FleetSummary, listed: list[JobRow]) -> dict[str, Any]:
    """The summary as --json prints it, with the listed jobs only (``jobs_omitted`` says how
    many more the CSV and --json hold)."""
    return replace(s, jobs=listed, jobs_omitted=len(s.jobs) - len(listed)).to_json()


def render_page(s: FleetSummary, csv_href: str = "fleet.csv") -> str:
    listed = listed_jobs(s)
    shown = replace(s, jobs_omitted=len(s.jobs) - len(listed))
    intervals = sorted(Counter(n.scrape_interval_s for n in s.nodes).items())
    ctx = {"title": f"gpudiag fleet: {utc(s.start)} to {utc(s.end)}",
           "generated_by": f"gpudiag {__version__}",
           "s": shown, "t": s.totals, "p": s.previous.totals if s.previous else None, "listed": listed,
           "rows": {r.job_id: r for r in s.jobs if r.job_id in {m["job_id"] for m in s.most_lost}},
           "utc": utc, "utc_s": utc_s, "count": lambda n: f"{n:,}", "gpu_h": gpu_h, "share": share,
           "secs": seconds, "change": change,
           "mfu": mfu_text, "link": lambda job: job_series_url(s.prometheus, s.start, s.end, job),
           "team_bars": svg_markup(_use_bars("Useful against held GPU-hours per team", s.teams)),
           "user_bars": svg_markup(_use_bars("Useful against held GPU-hours per user", s.users)),
           "mix_chart": svg_markup(_mix_chart(s)), "compare_rows": COMPARE, "group_rows": GROUP_ROWS,
           "node_rows": NODE_ROWS, "causes": LOSS_CAUSES, "cause_words": CAUSE_WORDS, "cause": cause_text,
           "unattributed": UNATTRIBUTED, "csv_href": csv_href, "intervals": intervals,
           "windows": round((s.end - s.start) / s.step_s) if s.step_s else 0,
           "data": embed_json(page_data(s, listed)),
           "data_note": (f"It lists {len(listed)} of the {len(s.jobs)} jobs; the CSV and --json hold all."
                         if len(listed) < len(s.jobs) else "")}
    return env().get_template("fleet.html.j2").render(ctx)


def svg_markup(text: str) -> Markup:
    from markupsafe import Markup

    return Markup(text)  # trusted: built by reports/svg*.py, which escape every string
