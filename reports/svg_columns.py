"""Stacked columns over time: one column per bucket (a day of a week), its parts stacked.

Why columns and not lines: the parts are shares of one whole (GPU-hours held by label), so a
stack reads as "how much, and of what", where overlapping lines hid each other. Same frame,
axes, legend and escaping as ``svg`` (``svg_base``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpudiag.reports.svg_base import (
    _esc,
    _f,
    _frame,
    _legend,
    _y_axis,
    fit,
    nice_ticks,
    text_width,
    tick_label,
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
    leg, leg_h = _legend(series, left, 26, plot_w)
    top = 26 + leg_h + 8
    bottom = height - 44
    totals = [sum(max(p, 0.0) for p in s.parts) for s in stacks]
    ticks = nice_ticks(0.0, max(totals, default=0.0) or 1.0)
    scale = (bottom - top) / ticks[-1]

    def sy(v: float) -> float:
        return bottom - v * scale

    body = leg + _y_axis(ticks, sy, left, left + plot_w, y_label, (top + bottom) / 2, fmt=tick)
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
            body.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(bar_w)}" height="{_f(max(h, 0.5))}" '
                        f'fill="{colour}" stroke="#fff" stroke-width="0.5">'
                        f"<title>{_esc(f'{s.label}: {name} {value(v)}')}</title></rect>")
        if i % every == 0:
            body.append(f'<text x="{_f(left + i * slot + slot / 2)}" y="{_f(bottom + 15)}" '
                        f'text-anchor="middle" fill="#444">{_esc(fit(s.label, slot * every - 4))}</text>')
    body.append(f'<line x1="{_f(left)}" y1="{_f(bottom)}" x2="{_f(left + plot_w)}" y2="{_f(bottom)}" '
                'stroke="#555"/>')
    return _frame(title, width, height, body, desc)
