"""Durations as people type and read them: ``10m``, ``2h``, ``1d``, ``0``; ``3m05s`` as an age.

Why here, below every command: ``gpudiag profile``, ``submit``, ``scheduler serve``, ``sim`` and
``top`` take durations, the scheduler's daemon words its limits in them ("--grace must be
between 0s and 1h") and ``gpudiag top`` reads ages as ``gpudiag queue`` does. One parser and one
formatter that all of them import, so an option's ``--help``, its error and the daemon's
refusal agree; a command importing another command for them would tie commands together and
let the layers below (``reports``, ``scheduler``) call up into the CLI.

Slurm's own spelling, ``[D-]HH:MM:SS``, is read here too (``slurm_duration``): squeue's time
limits and sacct's elapsed times in traces are one format, parsed by one function. So is
Prometheus' (``prom_duration``: ``1m30s``, as its targets API reports a scrape interval).
"""

from __future__ import annotations

import re

import click

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_DURATION_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, None: 1.0}
# Slurm's time format as squeue (%l) and sacct (Elapsed, Timelimit) print it: [D-][HH:]MM:SS,
# sacct adding a fraction of a second to some fields (dropped: Slurm counts whole seconds)
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
# Prometheus' duration, as its API prints one: whole numbers each with a unit, largest first
# ("1m30s", "500ms"); its year is 365 days
_PROM_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_PROM_UNIT = {**{k: v for k, v in _DURATION_UNIT.items() if k}, "y": 365 * 86400.0}


def parse_duration(text: str, option: str, examples: str = "10m, 600s, 2h, 1d or 0") -> float:
    """'10m', '600s', '1.5h', '2d', '2w', '0' -> seconds (0 turns the feature off)."""
    m = _DURATION.match(text)
    if not m:
        raise click.BadParameter(f"{text!r}: use e.g. {examples}", param_hint=option)
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def parse_interval(text: str, option: str, low: float, high: float) -> float:
    """A sampling period within [low, high] seconds: '100ms' -> 0.1, '1' -> 1.0. ``0`` is refused
    like any value below ``low`` (a period cannot turn a feature off)."""
    value = parse_duration(text, option, examples="100ms, 0.5s or 1")
    if not low <= value <= high:
        raise click.BadParameter(f"must be between {_short(low)} and {_short(high)}", param_hint=option)
    return value


def _short(seconds: float) -> str:
    """A bound for an error message: under a second in ms (10ms), else in s (3600s)."""
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def slurm_duration(text: str) -> float:
    """Slurm's ``[D-]HH:MM:SS`` or ``MM:SS`` in seconds: '1-02:03:04' -> 93784.0. ValueError on
    anything else (``UNLIMITED`` and friends are the caller's to decide)."""
    m = _SLURM_TIME.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a Slurm time ([D-]HH:MM:SS)")
    d, h, mi, se = (int(x) if x else 0 for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + se)


def prom_duration(text: str) -> float | None:
    """Prometheus' duration in seconds: '15s' -> 15.0, '1m30s' -> 90.0, '500ms' -> 0.5; None
    where ``text`` is not one (empty, a unit missing, a fraction, anything else around it)."""
    parts = _PROM_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(int(n) * _PROM_UNIT[u] for n, u in parts)


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
