"""What every inline SVG chart is built from: palette, text layout, ticks, frame, legend, axes.

Why separate from the charts (``svg.py``): these are the parts whose correctness is about
markup and measurement, not about a chart's shape: every piece of text that reaches the
markup goes through ``esc`` (kernel and operator names come from traces and may contain
anything), and ``text_width`` lays text out for the widest common sans-serif font so labels
never overrun. The charts import them; callers use them through ``svg``.

Colours are the Okabe-Ito palette (safe for the common colour-vision deficiencies).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

# Okabe & Ito, "Color Universal Design" (2008)
BLACK = "#000000"
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
PURPLE = "#CC79A7"
GREY = "#999999"
# Lines on white: yellow last, it is the hardest to see; dashes once the colours run out.
LINE_COLOURS = [BLUE, VERMILLION, GREEN, PURPLE, ORANGE, SKY_BLUE, BLACK, YELLOW]
LINE_DASHES = ["", "6 3", "2 2", "8 3 2 3"]

FONT = 12
TITLE_H = 26
MIN_SPAN_PX = 3.0  # a traced window of a few steps in an hour-long run must stay visible
HALO = 'stroke="#fff" stroke-width="3" stroke-linejoin="round" paint-order="stroke"'  # text over marks

# Advance widths (em) of DejaVu Sans, the widest of the usual sans-serif fonts a browser picks
# for "system-ui, sans-serif" (and the one Linux uses); laying text out for it leaves room in
# every narrower font. Measured in Chromium; characters not listed count as _W_OTHER.
_W_TABLE = {
    " ": .318, "!": .401, '"': .46, "#": .838, "$": .636, "%": .95, "&": .78, "'": .275, "(": .39,
    ")": .39, "*": .5, "+": .838, ",": .318, "-": .361, ".": .318, "/": .337, ":": .337, ";": .337,
    "<": .838, "=": .838, ">": .838, "?": .531, "@": 1.0, "[": .39, "\\": .337, "]": .39, "^": .838,
    "_": .5, "`": .5, "{": .636, "|": .337, "}": .636, "~": .838, "\u2026": 1.0, "\u00d7": .838,
    "\u2192": .838, "\u2212": .838,
    "A": .684, "B": .686, "C": .698, "D": .77, "E": .632, "F": .575, "G": .775, "H": .752, "I": .295,
    "J": .295, "K": .656, "L": .557, "M": .863, "N": .748, "O": .787, "P": .603, "Q": .787, "R": .695,
    "S": .635, "T": .611, "U": .732, "V": .684, "W": .989, "X": .685, "Y": .611, "Z": .685,
    "a": .613, "b": .635, "c": .55, "d": .635, "e": .615, "f": .352, "g": .635, "h": .634, "i": .278,
    "j": .278, "k": .579, "l": .278, "m": .974, "n": .634, "o": .612, "p": .635, "q": .635, "r": .411,
    "s": .521, "t": .392, "u": .634, "v": .592, "w": .818, "x": .592, "y": .592, "z": .525,
    **{d: .636 for d in "0123456789"},
}
_W_OTHER = 1.0  # wide enough for CJK and symbols
_W_SLACK = 1.06  # a little more than measured: font hinting and other fonts' wider glyphs


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def pt(v: float) -> str:
    """Pixel coordinate: one decimal is finer than any screen and keeps the file small."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def text_width(text: str, size: float = FONT) -> float:
    """Generous width of ``text`` in px at ``size`` px, for laying out labels and legends."""
    return sum(_W_TABLE.get(ch, _W_OTHER) for ch in text) * size * _W_SLACK


def fit(text: str, px: float, size: float = FONT, middle: bool = True, head: float = 0.42) -> str:
    """``text`` shortened to at most ``px`` wide; with ``middle`` the cut is in the middle
    (``head…tail``, the head ``head`` of the room: names differ more at their ends), else at
    the end. Callers put the full text in a <title>."""
    if text_width(text, size) <= px:
        return text
    budget = px - text_width("\u2026", size)
    if budget <= 0:
        return "\u2026"
    if not middle:
        out = ""
        for ch in text:
            if text_width(out + ch, size) > budget:
                break
            out += ch
        return out + "\u2026"
    head_px = head * budget
    first = tail = ""
    for ch in text:
        if text_width(first + ch, size) > head_px:
            break
        first += ch
    for ch in reversed(text[len(first):]):
        if text_width(first + ch + tail, size) > budget:
            break
        tail = ch + tail
    return first.rstrip() + "\u2026" + tail.lstrip()


def line_style(i: int) -> tuple[str, str]:
    """Colour and dash pattern of the i-th line of a chart."""
    return LINE_COLOURS[i % len(LINE_COLOURS)], LINE_DASHES[(i // len(LINE_COLOURS)) % len(LINE_DASHES)]


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.6g}"


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]; the last tick is the axis end."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = mag
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if (hi - lo) / step <= n:
            break
    t = math.floor(lo / step + 1e-9) * step
    ticks: list[float] = []
    while not ticks or ticks[-1] < hi - step * 1e-6 or len(ticks) < 2:
        ticks.append(round(t, 12))
        t += step
    return ticks


def frame_svg(title: str, width: float, height: float, body: list[str], desc: str = "") -> str:
    d = f"<desc>{esc(desc)}</desc>" if desc else ""
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" role="img" '
            f'viewBox="0 0 {pt(width)} {pt(height)}" width="{pt(width)}" height="{pt(height)}" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif" font-size="{FONT}">'
            f"<title>{esc(title)}</title>{d}"
            f'<text x="0" y="16" font-size="14" font-weight="600" fill="#222">{esc(title)}</text>'
            + "".join(body) + "</svg>")


def legend_marks(items: list[tuple[str, str]], x0: float, y0: float, width: float,
            shape: str = "rect") -> tuple[list[str], float]:
    """Legend swatches wrapped to the width; returns the markup and the height used."""
    out: list[str] = []
    x, y = x0, y0
    for label, colour in items:
        w = 18 + text_width(label) + 16  # swatch, gap, label, gap to the next swatch
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + 18
        if shape == "line":
            out.append(f'<line x1="{pt(x)}" y1="{pt(y + 6)}" x2="{pt(x + 14)}" y2="{pt(y + 6)}" '
                       f'stroke="{colour}" stroke-width="2.5"/>')
        else:
            out.append(f'<rect x="{pt(x)}" y="{pt(y)}" width="12" height="12" fill="{colour}" '
                       'stroke="#333" stroke-width="0.5"/>')
        out.append(f'<text x="{pt(x + 18)}" y="{pt(y + 10)}" fill="#222">{esc(label)}</text>')
        x += w
    return out, (y - y0 + 18) if items else 0.0


def x_axis_marks(ticks: list[float], sx: Callable[[float], float], y: float, top: float, label: str,
            mid: float, fmt: Callable[[float], str] = tick_label, end: float | None = None,
            corner: bool = False) -> list[str]:
    """``corner``: a y axis has tick labels at this axis's start, so the first x label starts
    at its tick instead of centring on it (the two would touch)."""
    x_end = sx(ticks[-1] if end is None else max(end, ticks[-1]))
    out = [f'<line x1="{pt(sx(ticks[0]))}" y1="{pt(y)}" x2="{pt(x_end)}" y2="{pt(y)}" stroke="#555"/>']
    for i, t in enumerate(ticks):
        x = sx(t)
        anchor, tx = ("start", x + 2) if corner and i == 0 else ("middle", x)
        out.append(f'<line x1="{pt(x)}" y1="{pt(top)}" x2="{pt(x)}" y2="{pt(y)}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{pt(tx)}" y="{pt(y + 15)}" text-anchor="{anchor}" fill="#444">'
                   f"{esc(fmt(t))}</text>")
    out.append(f'<text x="{pt(mid)}" y="{pt(y + 32)}" text-anchor="middle" fill="#222">{esc(label)}</text>')
    return out


def y_axis_marks(ticks: list[float], sy: Callable[[float], float], x: float, right: float, label: str,
            mid: float, fmt: Callable[[float], str] = tick_label, corner: bool = False) -> list[str]:
    """``corner``: the first label sits above its tick, clear of the x axis's first label."""
    out = [f'<line x1="{pt(x)}" y1="{pt(sy(ticks[0]))}" x2="{pt(x)}" y2="{pt(sy(ticks[-1]))}" '
           'stroke="#555"/>']
    for i, t in enumerate(ticks):
        y = sy(t)
        ty = y - 2 if corner and i == 0 else y + 4
        out.append(f'<line x1="{pt(x)}" y1="{pt(y)}" x2="{pt(right)}" y2="{pt(y)}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{pt(x - 6)}" y="{pt(ty)}" text-anchor="end" fill="#444">'
                   f"{esc(fmt(t))}</text>")
    out.append(f'<text transform="translate(14 {pt(mid)}) rotate(-90)" text-anchor="middle" '
               f'fill="#222">{esc(label)}</text>')
    return out
