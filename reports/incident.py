"""A stall incident rendered: terminal lines and a self-contained HTML page. Nothing computed.

The page (same shell as the run report: inline CSS, no script but the JSON data block, nothing
fetched) shows the verdict, a timeline of the last steps per rank up to the stall, the wavefront
table (where each rank is in each process group), each rank's collectives, and the stacks of
every thread of every process (DataLoader workers included), with what the kernel said each
thread waits on.
"""

from __future__ import annotations

import time

from markupsafe import Markup

from gpudiag import __version__
from gpudiag.incident import STRAGGLER, Evidence, Incident, Verdict
from gpudiag.reports import svg_base as sb
from gpudiag.reports.page import embed_json, env

STACK_FRAMES = 12   # frames shown per thread on the page (all are in the JSON)
WAVE_ROWS = 16      # wavefront rows printed on the terminal


def _clock(t: float | None) -> str:
    return "n/a" if t is None else time.strftime("%H:%M:%S", time.localtime(t))


def headline(v: Verdict) -> str:
    kind, _, rest = v.headline.partition(": ")
    return f"{kind.upper()}: {rest}" if rest else v.headline


def render_text(inc: Incident, where: str | None = None) -> str:
    """What ``gpudiag profile`` prints (on stderr) when it opens an incident, and ``hang-report``."""
    ev, v = inc.evidence, inc.verdict
    lines = []
    if v.kind == STRAGGLER:
        lines.append(f"gpudiag: {headline(v)}")
    else:
        stalled = max((r.stalled_s or 0.0 for r in ev.ranks), default=0.0)
        what = {"stall": f"STALL at {_clock(ev.detected_at)}: no step for {stalled:.0f} s"
                         + (f" (limit: {ev.rule})" if ev.rule else ""),
                "exit": "the job ended badly; what its ranks left behind says",
                "dumps": f"Flight Recorder dumps of {len(ev.ranks)} rank(s)"}.get(ev.source, ev.source)
        lines.append(f"gpudiag: incident {ev.id}: {what}")
        lines.append(f"  {headline(v)}")
    lines += [f"    {d}" for d in v.details]
    for w in v.wavefront[:WAVE_ROWS]:
        lines.append(f"    {w.pg if w.pg not in ('0',) else 'default'} rank {w.rank}: entered #{w.entered}, "
                     f"completed #{w.completed} {w.op}{' [' + w.shape + ']' if w.shape else ''} {w.state}"
                     + (f" {w.for_s:.0f} s" if w.for_s is not None else ""))
    if len(v.wavefront) > WAVE_ROWS:
        lines.append(f"    ... {len(v.wavefront) - WAVE_ROWS} more rows on the page")
    lines += [f"    note: {n}" for n in ev.notes]
    if inc.resolution:
        lines.append(f"  {inc.resolution}")
    if where:
        lines.append(f"  incident page: {where}")
    return "\n".join(lines)


def timeline_chart(ev: Evidence, width: float = 960) -> str:
    """The last steps of each rank (a bar per step, its collective wait darker) up to the stall,
    and the stretch since each rank's last step (no step: red)."""
    rows = sorted(ev.timeline.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0)
    if not rows:
        return ""
    now = ev.detected_at
    starts = [r[1] - r[2] for _, rs in rows for r in rs] + [r.last_step_t for r in ev.ranks if r.last_step_t]
    lo = min(starts, default=now - 60) - now
    ticks = sb.nice_ticks(lo, 0.0)
    label_w, right_w, row_h = 70.0, 20.0, 22.0
    plot_w = width - label_w - right_w

    def sx(v: float) -> float:
        return label_w + (v - ticks[0]) / (ticks[-1] - ticks[0]) * plot_w

    leg, leg_h = sb.legend_marks([("step", sb.BLUE), ("waiting in collectives", sb.SKY_BLUE),
                             ("no step since", sb.VERMILLION)], label_w, sb.TITLE_H, plot_w)
    top = sb.TITLE_H + leg_h + 6
    body = list(leg)
    y_axis = top + row_h * len(rows) + 4
    body += sb.x_axis_marks(ticks, sx, y_axis, top, "seconds before the stall was noticed",
                            label_w + plot_w / 2)
    last = {str(r.rank): r.last_step_t for r in ev.ranks}
    for i, (rank, steps) in enumerate(rows):
        y = top + i * row_h
        body.append(f'<text x="{sb.pt(label_w - 8)}" y="{sb.pt(y + 15)}" text-anchor="end" fill="#222">'
                    f"rank {sb.esc(rank)}</text>")
        for step, end, dt, waited in steps:
            x0, x1 = sx(end - dt - now), sx(end - now)
            if x1 < label_w:
                continue
            x0 = max(x0, label_w)
            tip = f"<title>step {int(step)}: {dt * 1e3:.1f} ms, {waited * 1e3:.1f} ms in collectives</title>"
            body.append(f'<rect x="{sb.pt(x0)}" y="{sb.pt(y + 3)}" width="{sb.pt(max(x1 - x0, 0.5))}" '
                        f'height="16" fill="{sb.BLUE}" stroke="#fff" stroke-width="0.5">{tip}</rect>')
            if waited > 0 and dt > 0:
                w = (x1 - x0) * min(1.0, waited / dt)
                body.append(f'<rect x="{sb.pt(x1 - w)}" y="{sb.pt(y + 3)}" width="{sb.pt(max(w, 0.3))}" '
                            f'height="16" fill="{sb.SKY_BLUE}">{tip}</rect>')
        t = last.get(rank)
        if t is not None and t < now:
            x0 = max(sx(t - now), label_w)
            body.append(f'<rect x="{sb.pt(x0)}" y="{sb.pt(y + 8)}" width="{sb.pt(sx(0) - x0)}" height="6" '
                        f'fill="{sb.VERMILLION}"><title>no step for {now - t:.0f} s</title></rect>')
    return sb.frame_svg("The last steps of each rank, up to the stall", width, y_axis + 42, body,
                     "One row per rank: each step as a bar (its wait in collectives lighter), and the "
                     "time since its last step in red.")


def render_html(inc: Incident) -> str:
    ev, v = inc.evidence, inc.verdict
    ctx = {"title": f"gpudiag incident {ev.id}: {v.kind}", "generated_by": f"gpudiag {__version__}",
           "inc": inc, "ev": ev, "v": v, "headline": headline(v), "clock": _clock,
           "chart": Markup(timeline_chart(ev)), "frames": STACK_FRAMES,
           "data": embed_json(inc.to_dict()), "data_note": ""}
    return env().get_template("incident.html.j2").render(ctx)
