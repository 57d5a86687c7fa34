"""The one formatter of quantities for people: SI prefixes and percentages.

Why one module: a FLOP count, a bandwidth or a share printed by the analyzers (in a verdict's
summary, an MFU reason), by the terminal report and by the HTML report must read the same
everywhere, or a reader comparing "67.2 GFLOP/s" with "0.0672 TFLOP/s" suspects two numbers.
It lives in ``gpudiag`` (not ``reports``) because analyzers write prose with numbers in it and
may import only ``gpudiag`` core modules.
"""

from __future__ import annotations

import math

# Prefixes from the largest down; a value takes the first one it reaches.
SI_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
# Three significant digits: enough to tell apart numbers a person compares (19.5 vs 19.8
# TFLOP/s), few enough to read at a glance. Measurement noise is larger than the fourth digit.
SIG_DIGITS = 3


def si(v: float | None, unit: str = "") -> str:
    """1.95e13, "FLOP/s" -> '19.5 TFLOP/s'; 512, "B" -> '512 B'; None or NaN -> 'n/a'."""
    if v is None or v != v:
        return "n/a"
    if v == 0 or not math.isfinite(v):
        return f"{v:g} {unit}".strip()
    for factor, prefix in SI_PREFIXES:
        if abs(v) >= factor:
            return f"{v / factor:.{SIG_DIGITS}g} {prefix}{unit}"
    return f"{v:.{SIG_DIGITS}g} {unit}".strip()


def pct(frac: float | None, signed: bool = False, digits: int = 1) -> str:
    """A fraction as a percentage: 0.1234 -> '12.3%'; ``signed``: '+12.3%'; None/NaN -> 'n/a'."""
    if frac is None or frac != frac:
        return "n/a"
    return f"{100 * frac:+.{digits}f}%" if signed else f"{100 * frac:.{digits}f}%"
