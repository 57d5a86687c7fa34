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


def pct_fine(frac: float | None) -> str:
    """A percentage that may be tiny (an MFU): as ``pct`` from 0.1% up, two significant digits
    below, so that two small values stay apart (blind check 34: a host-bound job's "MFU: 0.0%" by
    its own pace and by the wall clock, which could not be compared): 0.000021 -> '0.0021%'."""
    if frac is None or frac != frac or frac == 0 or abs(frac) >= 0.001:
        return pct(frac)
    return f"{100 * frac:.2g}%"


def pct_whole(frac: float) -> str:
    """A share in a sentence: whole percent, one decimal below 1% (so a small share never
    reads '0%'): 0.234 -> '23%', 0.004 -> '0.4%'."""
    return f"{100 * frac:.0f}%" if frac >= 0.01 else f"{100 * frac:.1f}%"


def num(x: float | None) -> str:
    """A readable number: three significant digits, thousands grouped, an exponent only below
    0.001: 43412.3 -> '43,412', 78.94 -> '78.9', 0.7271 -> '0.727'; None or NaN -> 'n/a'."""
    if x is None or x != x:
        return "n/a"
    a = abs(x)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.001:
        return f"{x:.3g}"
    return f"{x:.2e}"


def ms(us: float | None) -> str:
    """A duration given in microseconds (the traces' unit), in milliseconds to three significant
    digits: 78940.0 -> '78.9 ms', 23000.0 -> '23 ms'; from a second up, whole milliseconds
    grouped: 4.3359e7 -> '43,359 ms' (not '4.34e+04 ms'); None or NaN -> 'n/a'."""
    if us is None or us != us:
        return "n/a"
    v = us / 1e3
    return f"{v:,.0f} ms" if abs(v) >= 1000 else f"{v:.{SIG_DIGITS}g} ms"


def us(v: float | None) -> str:
    """A short duration given in microseconds: under a millisecond in microseconds (12.3 us),
    from there on as ``ms`` (2290.0 -> '2.29 ms', not '2.29e+03 us')."""
    if v is None or v != v:
        return "n/a"
    return f"{v:.{SIG_DIGITS}g} us" if abs(v) < 1000 else ms(v)


def ms_of_seconds(s: float) -> str:
    """A duration given in seconds, in whole milliseconds (one decimal below 10 ms):
    0.2345 -> '234 ms', 0.0042 -> '4.2 ms'."""
    return f"{s * 1e3:.0f} ms" if s >= 0.01 else f"{s * 1e3:.1f} ms"


def seconds(x: float | None) -> str:
    """A duration given in seconds, such as a step time, in the unit that reads it at three
    significant digits: 1.25 -> '1.25 s', 0.127 -> '127 ms', 0.00042 -> '420 µs'; from 100 s
    up, whole seconds grouped: 1234.0 -> '1,234 s'; None or NaN -> 'n/a'."""
    if x is None or x != x:
        return "n/a"
    if x >= 100:
        return f"{x:,.0f} s"
    if x >= 1:
        return f"{x:.{SIG_DIGITS}g} s"
    if x >= 0.001:
        return f"{x * 1000:.{SIG_DIGITS}g} ms"
    return f"{x * 1e6:.{SIG_DIGITS}g} µs"
