"""Durations as people type and read them: ``10m``, ``2h``, ``1d``, ``0``; ``3m05s`` as an age.

Why here, below every command: ``gpudiag profile``, ``submit``, ``scheduler serve``, ``sim`` and
``top`` take durations, the scheduler's daemon words its limits in them ("--grace must be
between 0s and 1h") and ``gpudiag top`` reads ages as ``gpudiag queue`` does. One parser and one
formatter that all of them import, so an option's ``--help``, its error and the daemon's
refusal agree; a command importing another command for them would tie commands together and
let the layers below (``reports``, ``scheduler``) call up into the CLI.
"""

from __future__ import annotations

import re

import click

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str, option: str) -> float:
    """'10m', '600s', '1.5h', '2d', '0' -> seconds (0 turns the feature off)."""
    m = _DURATION.match(text)
    if not m:
        raise click.BadParameter(f"{text!r}: use e.g. 10m, 600s, 2h, 1d or 0", param_hint=option)
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def format_duration(seconds: float) -> str:
    """Seconds as ``parse_duration`` reads them, in the largest whole unit: 600 -> '10m'."""
    for unit in ("d", "h", "m"):
        n = seconds / _DURATION_UNIT[unit]
        if n >= 1 and n == int(n):
            return f"{int(n)}{unit}"
    return f"{seconds:g}s"


def short_age(seconds: float) -> str:
    """An age in at most 7 characters, for a table column: '4m05s', '3h07m'."""
    s = max(0, int(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
