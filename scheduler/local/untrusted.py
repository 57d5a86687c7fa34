"""Bytes a user or a job wrote, read by the root daemon: bounded in size, depth and value, typed,
and every failure one ``Untrusted`` error naming what was read.

Python's JSON parser recurses, accepts ``NaN`` and turns 4,000 digits into an int: a job's
``run.json`` of 200,000 ``[`` once ended the daemon's loop. So the size is bounded before the
parse, numbers as they are parsed, depth after. docs/scheduler-daemon.md, "Fuzzed".
"""

from __future__ import annotations

import json
import math

MAX_DEPTH = 32           # a run.json is 3 levels deep; a request 2
MAX_INT_DIGITS = 20      # 2**63 has 19 digits: a larger number is no count, id or time of ours


class Untrusted(ValueError):
    """What a user or job wrote cannot be used; the message says what and why, in one line."""


def depth_of(value: object, limit: int) -> int | None:
    """How deeply ``value`` nests (a scalar 0, ``[]`` 1) if at most ``limit``, else None; a walk
    with its own stack, stopped at ``limit``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            d += 1
            if d > limit:
                return None
            deepest = max(deepest, d)
            stack.extend((x, d) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise Untrusted(f"a number of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise Untrusted(f"the number {text[:30]} (beyond a float)")
    return v


def _constant(name: str) -> float:
    raise Untrusted(f"{name}, which is not a JSON number")


def json_value(raw: bytes, what: str, max_bytes: int, max_depth: int = MAX_DEPTH) -> object:
    """``raw`` as JSON, or ``Untrusted("<what> ...: why")``: larger than ``max_bytes``, nested
    deeper than ``max_depth``, not UTF-8 JSON, or holding NaN, Infinity, or a number too large."""
    deep = f"{what} is nested deeper than {max_depth} levels"
    if len(raw) > max_bytes:
        raise Untrusted(f"{what} is larger than {max_bytes} bytes")
    try:
        value = json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except Untrusted as e:
        raise Untrusted(f"{what} holds {e}") from None
    except RecursionError:   # the parser recurses per level: it stops at the interpreter's limit
        raise Untrusted(deep) from None
    except (ValueError, TypeError, MemoryError) as e:   # UnicodeDecodeError is a ValueError
        raise Untrusted(f"{what} is not JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if depth_of(value, max_depth) is None:
        raise Untrusted(deep)
    return value
