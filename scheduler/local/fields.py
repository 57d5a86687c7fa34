"""A submit's fields in the words of the options that set them: what each may be, and the one
line that refuses it.

The daemon validates every request (another client may send anything over the socket), but the
person reading its refusal typed ``gpudiag submit --grace 2h``, not ``grace_s``: "grace_s must be
a number in [0, 3600]" names neither the option nor its units. So each field's check lives here
once, worded as the option with its range in the option's units ("--grace must be between 0s
and 1h"), and both sides run it: ``gpudiag submit`` before it sends (no round trip, and the same
words), the daemon's ``protocol.parse_submit`` on what arrives.
"""

from __future__ import annotations

import math

from gpudiag.durations import format_duration
from gpudiag.scheduler.local.config import MAX_GRACE_S, MAX_NAME, MAX_TIME_LIMIT_S

OPTION = {"gpus": "--gpus", "tier": "--tier", "team": "--team", "name": "--name", "grace_s": "--grace",
          "time_limit_s": "--time-limit"}
# field -> (lowest, highest, what 0 means when 0 is the option's "none" rather than a value)
DURATIONS = {"grace_s": (0.0, MAX_GRACE_S, ""), "time_limit_s": (1.0, MAX_TIME_LIMIT_S, " (0 = none)")}
_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def duration_error(key: str, value: object) -> str | None:
    """None if ``value`` (seconds) is a valid ``key``; else "--time-limit must be between 1s and
    365d (0 = none)"."""
    lo, hi, zero = DURATIONS[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        return f"{OPTION[key]} must be between {format_duration(lo)} and {format_duration(hi)}{zero}"
    return None


def label_error(key: str, value: object) -> str | None:
    """``--team``/``--name``: they become database keys and metric label values."""
    if not isinstance(value, str) or len(value) > MAX_NAME or not set(value) <= _NAME_OK:
        return f"{OPTION[key]} must be at most {MAX_NAME} characters of letters, digits, '_', '.', '-'"
    return None


def gpus_error(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"{OPTION['gpus']} must be a positive whole number"
    return None


def tier_error(value: object, tiers: list[str]) -> str | None:
    if value not in tiers:
        return f"unknown tier {str(value)[:40]!r}: {OPTION['tier']} is one of {', '.join(tiers)}"
    return None
