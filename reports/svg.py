"""Inline SVG charts drawn by our own code: no plotting library, no JavaScript, no network.

Why hand-written: a report must be one file that opens anywhere, offline, years later, and
stays small (an 8-rank run with a full counter timeline in well under 2 MB). Each function
takes numbers already computed by the analyzers, scales them to pixels and returns an SVG
string. The building blocks (palette, text widths, escaping, axes) are in ``svg_base`` and
re-exported here, so a report needs only ``svg``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gpudiag.reports.svg_base import (
    BLACK,
    BLUE,
    FONT,
    GREEN,
    GREY,
    HALO,
    LINE_COLOURS,
    LINE_DASHES,
    MIN_SPAN_PX,
    ORANGE,
    PURPLE,
    SKY_BLUE,
    TITLE_H,
    VERMILLION,
    YELLOW,
    esc,
    fit,
    frame_svg,
    legend_marks,
    line_style,
    nice_ticks,
    pt,
    text_width,
    tick_label,
    x_axis_marks,
    y_axis_marks,
)
from gpudiag.units import si

__all__ = ["BLACK", "BLUE", "FONT", "GREEN", "GREY", "HALO", "LINE_COLOURS", "LINE_DASHES", "MIN_SPAN_PX",
           "ORANGE", "PURPLE", "SKY_BLUE", "TITLE_H", "VERMILLION", "YELLOW", "Bar", "Ceilings", "HBar",
           "Line", "Point", "Segment", "bar_chart", "fit", "line_chart", "line_style", "loglog_scatter",
           "nice_ticks", "si", "stacked_bars", "text_width", "tick_label"]


# --- stacked horizontal bars -----------------------------------------------------------------

@dataclass
class Segment:
    value: float  # in axis units
    colour: str
    tip: str


@dataclass
class Bar:
    label: str
    segments: list[Segment]
    note: str = ""  # printed right of the bar (e.g. the step time)
    marked: bool = False  # drawn with a warning marker (stragglers)
    tip: str = ""


def stacked_bars(title: str, bars: list[Bar], legend: list[tuple[str, str]], x_label: str,
                 width: float = 960, label_w: float = 150, desc: str = "") -> str:
    """One row per bar, segments left to right; for step-time breakdowns."""
    right_w = 90
    plot_w = width - label_w - right_w
    leg, leg_h = legend_marks(legend, label_w, TITLE_H, plot_w + right_w)
    top = TITLE_H + leg_h + 6
    row_h = 22
    x_max = max((sum(max(s.value, 0.0) for s in b.segments) for b in bars), default=0.0)
    ticks = nice_ticks(0.0, x_max if x_max > 0 else 1.0)
    scale = plot_w / ticks[-1]
    body = leg
    y_axis = top + row_h * len(bars) + 4
    body += x_axis_marks(ticks, lambda v: label_w + v * scale, y_axis, top, x_label, label_w + plot_w / 2)
    for i, b in enumerate(bars):
        y = top + i * row_h
        text = fit(b.label, label_w - 12, middle=False)
        weight = ' font-weight="700"' if b.marked else ""
        tip = f"<title>{esc(b.tip or b.label)}</title>"
        body.append(f'<text x="{pt(label_w - 8)}" y="{pt(y + 15)}" text-anchor="end" fill="#222"'
                    f"{weight}>{tip}{esc(text)}</text>")
        if b.marked:
            body.append(f'<path d="M{pt(2)} {pt(y + 16)} l6 -11 l6 11 z" fill="{VERMILLION}">'
                        f"{tip}</path>")
        x = label_w
        for s in b.segments:
            w = max(s.value, 0.0) * scale
            if w <= 0:
                continue
            body.append(f'<rect x="{pt(x)}" y="{pt(y + 3)}" width="{pt(max(w, 0.5))}" height="16" '
                        f'fill="{s.colour}" stroke="#fff" stroke-width="0.5">'
                        f"<title>{esc(s.tip)}</title></rect>")
            x += w
        if b.note:
            body.append(f'<text x="{pt(x + 5)}" y="{pt(y + 15)}" fill="#222">{esc(b.note)}</text>')
    return frame_svg(title, width, y_axis + 42, body, desc)


# --- plain horizontal bars (may be negative), with optional reference marks ------------------

@dataclass
class HBar:
    label: str
    value: float
    colour: str
    text: str  # the formatted value, printed beside the bar's end
    tip: str = ""
    ref: float | None = None  # e.g. the link peak this bandwidth is measured against
    ref_tip: str = ""


def _value_label(text: str, x0: float, x1: float, negative: bool, lo: float, hi: float,
                 y: float) -> str:
    """The value beside the bar's end (``x1`` for positive bars, ``x0`` for negative ones),
    kept inside [lo, hi]: inside the bar, in white, when there is no room beside it."""
    tw = text_width(text)
    if not negative:
        if x1 + 5 + tw <= hi:
            x, anchor, fill = x1 + 5, "start", "#222"
        elif x1 - x0 >= tw + 10:
            x, anchor, fill = x1 - 5, "end", "#fff"
        else:
            x, anchor, fill = max(lo, hi - tw), "start", "#222"
    else:
        if x0 - 5 - tw >= lo:
            x, anchor, fill = x0 - 5, "end", "#222"
        elif x1 - x0 >= tw + 10:
            x, anchor, fill = x0 + 5, "start", "#fff"
        else:
            x, anchor, fill = min(hi, lo + tw), "end", "#222"
    halo = HALO if fill == "#222" else ""
    return (f'<text x="{pt(x)}" y="{pt(y)}" text-anchor="{anchor}" fill="{fill}" {halo} '
            f'pointer-events="none">{esc(text)}</text>')


def bar_chart(title: str, bars: list[HBar], x_label: str, width: float = 960, label_w: float = 300,
              legend: list[tuple[str, str]] | None = None, desc: str = "", ref_label: str = "") -> str:
    """One bar per row from a zero line; each value is printed beside its bar's end, inside the
    plot. ``HBar.ref`` draws a black tick on the bar's row (a peak to compare with); when every
    bar has the same ref, ``ref_label`` names that line above the plot."""
    right_w = 24
    plot_w = width - label_w - right_w
    leg, leg_h = legend_marks(legend or [], label_w, TITLE_H, plot_w)
    refs = {b.ref for b in bars if b.ref is not None}
    common_ref = refs.pop() if len(refs) == 1 and all(b.ref is not None for b in bars) else None
    ref_h = 16 if ref_label and common_ref is not None else 0
    top = TITLE_H + leg_h + 6 + ref_h
    row_h = 20
    vals = [b.value for b in bars] + [b.ref for b in bars if b.ref is not None]
    lo, hi = min([0.0, *vals]), max([0.0, *vals])
    if lo < 0 < hi:
        ticks = nice_ticks(lo, hi, 6)
    elif lo < 0:
        ticks = [-t for t in reversed(nice_ticks(0.0, -lo))]
    else:
        ticks = nice_ticks(0.0, hi if hi > 0 else 1.0)
    scale = plot_w / (ticks[-1] - ticks[0])

    def sx(v: float) -> float:
        return label_w + (v - ticks[0]) * scale

    y_axis = top + row_h * len(bars) + 4
    body = leg + x_axis_marks(ticks, sx, y_axis, top, x_label, label_w + plot_w / 2)
    zero = sx(0.0)
    body.append(f'<line x1="{pt(zero)}" y1="{pt(top)}" x2="{pt(zero)}" y2="{pt(y_axis)}" stroke="#555"/>')
    if ref_h and common_ref is not None:
        rx = sx(common_ref)
        tw = text_width(ref_label)
        anchor, tx = ("end", rx + 1) if rx + tw / 2 > width - 2 else ("middle", rx)
        body.append(f'<line x1="{pt(rx)}" y1="{pt(top - 4)}" x2="{pt(rx)}" y2="{pt(y_axis)}" '
                    f'stroke="{BLACK}" stroke-width="1" stroke-dasharray="3 3">'
                    f"<title>{esc(ref_label)}</title></line>")
        body.append(f'<text x="{pt(tx)}" y="{pt(top - 6)}" text-anchor="{anchor}" fill="#222">'
                    f"{esc(ref_label)}</text>")
    texts = []
    for i, b in enumerate(bars):
        y = top + i * row_h
        tip = f"<title>{esc(b.tip or b.label)}</title>"
        body.append(f'<text x="{pt(label_w - 8)}" y="{pt(y + 14)}" text-anchor="end" fill="#222">'
                    f"{tip}{esc(fit(b.label, label_w - 12))}</text>")
        x0, x1 = sorted((zero, sx(b.value)))
        body.append(f'<rect x="{pt(x0)}" y="{pt(y + 3)}" width="{pt(max(x1 - x0, 0.5))}" height="14" '
                    f'fill="{b.colour}">{tip}</rect>')
        if b.ref is not None:
            rx = sx(b.ref)
            body.append(f'<line x1="{pt(rx)}" y1="{pt(y + 1)}" x2="{pt(rx)}" y2="{pt(y + 19)}" '
                        f'stroke="{BLACK}" stroke-width="2"><title>{esc(b.ref_tip)}</title></line>')
        if b.text:
            texts.append(_value_label(b.text, x0, x1, b.value < 0, label_w + 2, width - 2, y + 14))
    body += texts  # above the ref ticks, so a tick never strikes through a value
    return frame_svg(title, width, y_axis + 42, body, desc)


# --- line chart with shaded spans -------------------------------------------------------------

@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float]
    colour: str = BLUE
    dash: str = ""


def line_chart(title: str, lines: list[Line], x_label: str, y_label: str,
               spans: list[tuple[float, float]] | None = None, span_label: str = "",
               x_max: float | None = None, y_max: float | None = None,
               width: float = 560, height: float = 230, desc: str = "") -> str:
    """Lines over time; spans (e.g. the traced steps) are shaded behind them."""
    left, right, bottom = 58, 14, 44
    leg, leg_h = legend_marks([(ln.label, ln.colour) for ln in lines], left, TITLE_H, width - left - right,
                         shape="line")
    top = TITLE_H + leg_h + 4
    plot_h = height - top - bottom
    xs_all = [x for ln in lines for x in ln.xs]
    ys_all = [y for ln in lines for y in ln.ys if math.isfinite(y)]
    x_end = x_max if x_max else max(xs_all, default=1.0) or 1.0
    # the time axis ends where the run ended, not at the next round tick
    xt = [t for t in nice_ticks(0.0, x_end) if t <= x_end * (1 + 1e-9)]
    yt = nice_ticks(0.0, y_max if y_max else max(ys_all, default=1.0) or 1.0, 4)
    sxk = (width - left - right) / x_end
    syk = plot_h / yt[-1]

    def sx(v: float) -> float:
        return left + v * sxk

    def sy(v: float) -> float:
        return top + plot_h - v * syk

    body = list(leg)
    for s0, s1 in spans or []:
        x0, x1 = sx(s0), sx(s1)
        body.append(f'<rect x="{pt(x0)}" y="{pt(top)}" width="{pt(max(x1 - x0, MIN_SPAN_PX))}" '
                    f'height="{pt(plot_h)}" fill="#000" fill-opacity="0.12">'
                    f"<title>{esc(span_label)}: {s0:g} s to {s1:g} s</title></rect>")
    body += x_axis_marks(xt, sx, top + plot_h, top, x_label, left + (width - left - right) / 2, end=x_end)
    body += y_axis_marks(yt, sy, left, width - right, y_label, top + plot_h / 2)
    for ln in lines:
        pts = [(x, y) for x, y in zip(ln.xs, ln.ys, strict=False) if math.isfinite(y)]
        dash = f' stroke-dasharray="{ln.dash}"' if ln.dash else ""
        tip = f"<title>{esc(ln.label)}</title>"
        if len(pts) == 1:
            body.append(f'<circle cx="{pt(sx(pts[0][0]))}" cy="{pt(sy(pts[0][1]))}" r="3" '
                        f'fill="{ln.colour}">{tip}</circle>')
        elif pts:
            coords = " ".join(f"{pt(sx(x))},{pt(sy(y))}" for x, y in pts)
            body.append(f'<polyline points="{coords}" fill="none" stroke="{ln.colour}" '
                        f'stroke-width="1.5" stroke-linejoin="round"{dash}>{tip}</polyline>')
    for s0, _ in (spans or [])[:1]:
        body.append(f'<text x="{pt(sx(s0) + 3)}" y="{pt(top + 12)}" fill="#222" stroke="#fff" '
                    f'stroke-width="3" paint-order="stroke">{esc(span_label)}</text>')
    return frame_svg(title, width, height, body, desc)


# --- log-log scatter with a compute and a bandwidth ceiling (roofline) -----------------------

@dataclass
class Point:
    x: float
    y: float
    weight: float  # circle area grows with it (e.g. time spent)
    colour: str
    tip: str


@dataclass
class Ceilings:
    peak: float | None  # horizontal ceiling, y units
    bandwidth: float | None  # slope of the diagonal ceiling, y units per x unit
    ridge: float | None  # x where they meet
    peak_label: str = ""
    bandwidth_label: str = ""
    ridge_label: str = ""
    extra: list[str] = field(default_factory=list)


def _decades(lo: float, hi: float) -> tuple[int, int]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return a, max(b, a + 1)


def loglog_scatter(title: str, points: list[Point], ceil: Ceilings, x_label: str, y_label: str,
                   legend: list[tuple[str, str]], width: float = 960, height: float = 440,
                   desc: str = "") -> str:
    """Circles on log-log axes under the roofline. Callers draw this only with points: an empty
    roofline is a sentence, not a chart. The ceiling labels are drawn last, over the circles,
    with a white halo, so a cluster of points never hides them."""
    left, right, bottom = 72, 20, 46
    leg, leg_h = legend_marks(legend, left, TITLE_H, width - left - right)
    top = TITLE_H + leg_h + 6
    plot_w, plot_h = width - left - right, height - top - bottom
    pts = [p for p in points if p.x > 0 and p.y > 0 and math.isfinite(p.x) and math.isfinite(p.y)]
    x0, x1, y0, y1 = _log_decades(pts, ceil)

    def sx(v: float) -> float:
        return left + (math.log10(v) - x0) / (x1 - x0) * plot_w

    def sy(v: float) -> float:
        return top + plot_h - (math.log10(v) - y0) / (y1 - y0) * plot_h

    def fmt(v: float) -> str:
        return si(v)

    xt = [10.0 ** k for k in range(x0, x1 + 1)]
    yt = [10.0 ** k for k in range(y0, y1 + 1)]
    body = list(leg)
    body += x_axis_marks(xt, sx, top + plot_h, top, x_label, left + plot_w / 2, fmt, corner=True)
    body += y_axis_marks(yt, sy, left, left + plot_w, y_label, top + plot_h / 2, fmt, corner=True)
    plot = _LogPlot(sx, sy, left, top, plot_w, plot_h, 10.0 ** x0, 10.0 ** x1, 10.0 ** y0)
    roof, labels = _roof_marks(ceil, plot)  # the labels drawn after the circles
    body += roof
    wmax = max((p.weight for p in pts), default=0.0)
    for p in sorted(pts, key=lambda p: -p.weight):
        r = 3 + 11 * math.sqrt(p.weight / wmax) if wmax > 0 else 4
        body.append(f'<circle cx="{pt(sx(p.x))}" cy="{pt(sy(p.y))}" r="{pt(r)}" fill="{p.colour}" '
                    'fill-opacity="0.75" stroke="#222" stroke-width="0.6">'
                    f"<title>{esc(p.tip)}</title></circle>")
    body += labels
    return frame_svg(title, width, height, body, desc)


@dataclass
class _LogPlot:
    """A log-log plot's scales and frame: where a value lands, and the decades it spans."""

    sx: Callable[[float], float]
    sy: Callable[[float], float]
    left: float
    top: float
    plot_w: float
    plot_h: float
    xlo: float
    xhi: float
    ylo: float


def _log_decades(pts: list[Point], ceil: Ceilings) -> tuple[int, int, int, int]:
    """The decades the axes span: the points', the ridge's, and room above the peak's ceiling
    for its label."""
    xs = [p.x for p in pts]
    ys = [p.y for p in pts]
    if ceil.ridge and ceil.ridge > 0:
        xs += [ceil.ridge / 20, ceil.ridge * 20]
    if ceil.peak and ceil.peak > 0:
        ys += [ceil.peak * 4, ceil.peak / 1e3]  # room above the ceiling for its label
    if not xs:
        xs = [0.1, 100.0]
    if not ys:
        ys = [1.0, 1e3]
    x0, x1 = _decades(min(xs), max(xs))
    y0, y1 = _decades(min(ys), max(ys))
    return x0, x1, y0, y1


def _roof_marks(ceil: Ceilings, plot: _LogPlot) -> tuple[list[str], list[str]]:
    """The roofline's marks (its bandwidth slope and compute ceiling as one line, the ridge's
    dashed line) and their labels, which the caller draws last."""
    sx, sy = plot.sx, plot.sy
    xlo, xhi, ylo = plot.xlo, plot.xhi, plot.ylo
    body: list[str] = []
    labels: list[str] = []
    roof: list[tuple[float, float]] = []
    if ceil.bandwidth and ceil.bandwidth > 0:
        end = ceil.ridge if ceil.ridge and ceil.peak else xhi
        start = max(xlo, ylo / ceil.bandwidth)
        if start < end:
            roof += [(start, ceil.bandwidth * start), (end, ceil.bandwidth * end)]
            bx, by = sx(start) + 6, sy(ceil.bandwidth * start) - 6
            labels.append(f'<text x="{pt(bx)}" y="{pt(by)}" fill="#222" {HALO} pointer-events="none" '
                          f'transform="rotate({pt(_slope_deg(sx, sy, start, end, ceil.bandwidth))} '
                          f'{pt(bx)} {pt(by)})">{esc(ceil.bandwidth_label)}</text>')
    if ceil.peak and ceil.peak > 0:
        start = max(ceil.ridge if ceil.ridge and ceil.bandwidth else xlo, xlo)
        roof += [(start, ceil.peak), (xhi, ceil.peak)]
        # above the line, at its left end (right of the ridge); flush right if it would not fit
        px, py = sx(start) + 6, sy(ceil.peak) - 7
        anchor = "start"
        if px + text_width(ceil.peak_label) > plot.left + plot.plot_w - 4:
            px, anchor = plot.left + plot.plot_w - 4, "end"
        labels.append(f'<text x="{pt(px)}" y="{pt(py)}" text-anchor="{anchor}" fill="#222" {HALO} '
                      f'pointer-events="none">{esc(ceil.peak_label)}</text>')
    if roof:
        coords = " ".join(f"{pt(sx(x))},{pt(sy(y))}" for x, y in roof)
        body.append(f'<polyline points="{coords}" fill="none" stroke="{BLACK}" stroke-width="2.5">'
                    f"<title>{esc(ceil.peak_label)}; {esc(ceil.bandwidth_label)}</title></polyline>")
    if ceil.ridge and ceil.peak and xlo <= ceil.ridge <= xhi:
        rx = sx(ceil.ridge)
        bottom = plot.top + plot.plot_h
        body.append(f'<line x1="{pt(rx)}" y1="{pt(sy(ceil.peak))}" x2="{pt(rx)}" y2="{pt(bottom)}" '
                    f'stroke="#555" stroke-dasharray="4 3"><title>{esc(ceil.ridge_label)}</title></line>')
        labels.append(f'<text x="{pt(rx + 4)}" y="{pt(bottom - 6)}" fill="#444" {HALO} '
                      f'pointer-events="none">{esc(ceil.ridge_label)}</text>')
    return body, labels


def _slope_deg(sx: Callable[[float], float], sy: Callable[[float], float], a: float, b: float,
               bw: float) -> float:
    dx, dy = sx(b) - sx(a), sy(bw * b) - sy(bw * a)
    return math.degrees(math.atan2(dy, dx)) if dx else 0.0
