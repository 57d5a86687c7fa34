"""Stacked columns over time: one column per bucket (a day of a week), its parts stacked.

Why columns and not lines: the parts are shares of one whole (GPU-hours held by label), so a
stack reads as "how much, and of what", where overlapping lines hid each other. Same frame,
axes, legend and escaping as ``svg`` (``svg_base``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpudiag.reports.svg_base import (
    esc,
    fit,
    frame_svg,
    legend_marks,
    nice_ticks,
    pt,
    text_width,
    tick_label,
    y_axis_marks,
)


@dataclass
class Stack:
    label: str           # under the column (a date)
    parts: list[float]   # one per series, in legend order
    tip: str = ""        # the column's total, in words


def stacked_columns(title: str, stacks: list[Stack], series: list[tuple[str, str]], y_label: str,
                    value: Callable[[float], str] = str, width: float = 960, height: float = 300,
                    desc: str = "", tick: Callable[[float], str] = tick_label) -> str:
    """``series``: (name, colour) per part, bottom first; ``value`` formats a number for the
    tooltips, ``tick`` for the axis. Labels under the columns are thinned to fit."""
    left, right = 64.0, 12.0
    plot_w = width - left - right
    leg, leg_h = legend_marks(series, left, 26, plot_w)
    top = 26 + leg_h + 8
    bottom = height - 44
    totals = [sum(max(p, 0.0) for p in s.parts) for s in stacks]
    ticks = nice_ticks(0.0, max(totals, default=0.0) or 1.0)
    scale = (bottom - top) / ticks[-1]

    def sy(v: float) -> float:
        return bottom - v * scale

    body = leg + y_axis_marks(ticks, sy, left, left + plot_w, y_label, (top + bottom) / 2, fmt=tick)
    n = max(len(stacks), 1)
    slot = plot_w / n
    bar_w = max(2.0, slot * 0.72)
    widest = max((text_width(s.label) for s in stacks), default=0.0)
    every = max(1, int((widest + 10) // slot) + 1)
    for i, s in enumerate(stacks):
        x = left + i * slot + (slot - bar_w) / 2
        y = bottom
        for (name, colour), v in zip(series, s.parts, strict=False):
            h = max(v, 0.0) * scale
            if h <= 0:
                continue
            y -= h
            body.append(f'<rect x="{pt(x)}" y="{pt(y)}" width="{pt(bar_w)}" height="{pt(max(h, 0.5))}" '
                        f'fill="{colour}" stroke="#fff" stroke-width="0.5">'
                        f"<title>{esc(f'{s.label}: {name} {value(v)}')}</title></rect>")
        if i % every == 0:
            body.append(f'<text x="{pt(left + i * slot + slot / 2)}" y="{pt(bottom + 15)}" '
                        f'text-anchor="middle" fill="#444">{esc(fit(s.label, slot * every - 4))}</text>')
    body.append(f'<line x1="{pt(left)}" y1="{pt(bottom)}" x2="{pt(left + plot_w)}" y2="{pt(bottom)}" '
                'stroke="#555"/>')
    return frame_svg(title, width, height, body, desc)
