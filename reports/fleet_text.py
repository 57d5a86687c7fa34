"""``gpudiag fleet`` as text: numbers for people, the terminal's first screen and the CSV of
the per-job table. A FleetSummary rendered, nothing computed.

Numbers read as a person writes them: "1,234", "12.3", "0.042", "< 0.001" GPU-hours (never
``8.12e-06``), shares as "12.3%" or "< 0.1%", step times in s or ms. The CSV keeps full
precision in fixed notation for a spreadsheet.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

from gpudiag.live.fleet_model import LOSS_CAUSES, Fix, FleetSummary, JobRow
from gpudiag.units import seconds

CAUSE_WORDS = {"stalled": "stalled", "idle": "idle", "below_peers": "below peers", "fixable": "fixable"}


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def utc_s(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def gpu_h(x: float | None) -> str:
    """GPU-hours (or any count of a unit a person sums): 3 significant digits, no exponent."""
    if x is None or x != x:
        return "n/a"
    a = abs(x)
    if a == 0:
        return "0"
    if a < 0.001:
        return "< 0.001" if x > 0 else "> -0.001"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.2g}" if a >= 0.01 else f"{x:.3f}"


def axis(v: float) -> str:
    """A chart's tick: as ``gpu_h``, but exact for the small ticks of a short range."""
    if v == 0 or abs(v) >= 0.001:
        return gpu_h(v)
    return f"{v:.7f}".rstrip("0")


def share(frac: float | None) -> str:
    if frac is None or frac != frac:
        return "n/a"
    if frac == 0:
        return "0%"
    if 0 < frac < 0.001:
        return "< 0.1%"
    return f"{100 * frac:.1f}%"


def change(now: float, before: float | None) -> str:
    """This period against the previous one: "+12%", "-5%", "new", "same"."""
    if before is None:
        return "n/a"
    if before <= 0:
        return "new" if now > 0 else "same"
    d = now / before - 1
    return "same" if abs(d) < 0.0005 else f"{100 * d:+.1f}%"


def mfu_text(r: JobRow) -> str:
    if r.mfu is not None:
        return share(r.mfu)
    return "no MFU" if r.signalled else "no signal"


def cause_text(cause: str | None, r: JobRow) -> str:
    """A job's main loss in words: "stalled (idle)" names the stall's own cause."""
    words = CAUSE_WORDS.get(cause or "", cause or "")
    return f"{words} ({r.stall_cause})" if cause == "stalled" and r.stall_cause else words


def fix_line(i: int, f: Fix) -> str:
    return (f"{i}. {f.job_id} ({f.team}, {f.user}): {f.action}, step {seconds(f.step_s)} -> "
            f"{seconds(f.predicted_step_s)}: {gpu_h(f.win_gpu_hours_per_week)} GPU-h/week")


def terminal(s: FleetSummary, page: str | None = None, csv_path: str | None = None) -> str:
    """The first screen at 80 columns: the fixes that win most, totals, the no-signal share,
    this period against the previous one, the jobs that lost most."""
    t = s.totals
    out = [f"gpudiag fleet  {utc(s.start)} .. {utc(s.end)}" + ("  (cut at now)" if s.clipped_to_now else ""),
           f"  GPU-hours held by jobs {gpu_h(t.gpu_hours):>9}   useful (x MFU) {gpu_h(t.useful_gpu_hours):>9}"
           f" = {share(t.useful_share)}",
           f"  no signal              {gpu_h(t.no_signal_gpu_hours):>9}   = {share(t.no_signal_share)}: "
           "jobs not run under gpudiag",
           f"  under gpudiag, no MFU  {gpu_h(t.no_mfu_gpu_hours):>9}   "
           f"held while idle {gpu_h(t.idle_gpu_hours):>9}",
           f"  stalled (no step)      {gpu_h(t.stalled_gpu_hours):>9}   at MFU 0, all lost",
           f"  jobs {t.jobs} ({t.signalled_jobs} under gpudiag), teams {t.teams}, users {t.users}, "
           f"at most {t.gpus_max} GPUs; held by no job {gpu_h(t.unallocated_gpu_hours)}",
           f"  Prometheus held GPU samples for {share(s.coverage.share)} of the range"]
    if s.previous is not None:
        p = s.previous.totals
        out.append(f"  previous period: held {gpu_h(p.gpu_hours)} ({change(t.gpu_hours, p.gpu_hours)} now), "
                   f"useful {gpu_h(p.useful_gpu_hours)} "
                   f"({change(t.useful_gpu_hours, p.useful_gpu_hours)} now)")
    out.append("")
    if s.fixes:
        out.append("  Fix first (GPU-hours a week at this range's rate):")
        out += [f"   {fix_line(i, f)}" for i, f in enumerate(s.fixes, 1)]
    else:
        out.append("  No job reported a recommendation with a predicted step time.")
    out.append("")
    rows = {r.job_id: r for r in s.jobs}
    if s.most_lost:
        out.append(f"  {'most GPU-hours lost':<22} {'lost h':>8} {'cause':<12} {'MFU':>9}  label")
        for m in s.most_lost[:8]:
            r = rows[m["job_id"]]
            out.append(f"  {r.job_id[:22]:<22} {gpu_h(m['lost_gpu_hours']):>8} "
                       f"{cause_text(m['cause'], r)[:12]:<12} {mfu_text(r):>9}  "
                       f"{(r.label or '-')[:16]}")
    if page:
        out.append(f"  page: {page}" + (f"  jobs as CSV: {csv_path}" if csv_path else ""))
    return "\n".join(line if line.startswith("  page: ") else line[:80] for line in out) + "\n"


CSV_FIELDS = ["job_id", "user", "user_source", "team", "team_source", "nodes", "gpus", "signalled",
              "gpu_hours", "useful_gpu_hours", "mfu_gpu_hours", "no_mfu_gpu_hours", "no_signal_gpu_hours",
              "idle_gpu_hours", "mfu", "label", "confidence", "step_s", "action", "predicted_step_s",
              "fix_gpu_hours", "lost_gpu_hours", "lost_cause", "first_seen_utc", "last_seen_utc"]


def _cell(v: object) -> str:
    """Fixed notation for numbers; text that a spreadsheet would run as a formula is quoted."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6f}".rstrip("0").rstrip(".") if v else "0"
    text = str(v)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def jobs_csv(s: FleetSummary) -> str:
    """Every job (not only those the page lists), one row each, in the page's order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in s.jobs:
        row = {**{k: getattr(r, k) for k in CSV_FIELDS if hasattr(r, k)}, "nodes": " ".join(r.nodes),
               "first_seen_utc": utc_s(r.first_seen - s.step_s), "last_seen_utc": utc_s(r.last_seen)}
        w.writerow([_cell(row[k]) for k in CSV_FIELDS])
    return buf.getvalue()


__all__ = ["CSV_FIELDS", "LOSS_CAUSES", "change", "gpu_h", "jobs_csv", "share", "terminal", "utc"]
