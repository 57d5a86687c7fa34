"""``_gather.c``'s ``gather`` in Python: the fold's fallback where the C extension was not built.

Why it exists: the C reader is what makes folding as cheap as decoding (trace_fold.py says
why), but building it needs a C compiler and Python's headers, which a user's machine may lack.
Without them pip still installs gpudiag (the extension is optional in pyproject.toml) and the
fold uses this: the same columns and the same errors for the same input (tests/unit/test_gather.py
runs every check on both). A rank loads about 2.5x slower with it (0.9 s against 0.35 s for
a 3 MB V100 rank, on a 2-core AMD EPYC VM).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

_SIZE = {"d": 8, "q": 8, "l": 8, "i": 4, "b": 1, "n": 1, "e": 1}
_RANGE = {"i": (-(1 << 31), (1 << 31) - 1, "id out of int32 range"),
          "b": (-128, 127, "code out of int8 range"),
          "q": (-(1 << 63), (1 << 63) - 1, "Python int too large to convert to C long long")}


def _value(kind: str, v: Any, arg: Any) -> Any:
    if kind == "d":
        if isinstance(v, float):
            return v
        if isinstance(v, (str, bytes, bytearray)):  # float() would parse them; C refuses them
            raise TypeError(f"must be real number, not {type(v).__name__}")
        return float(v)
    if kind == "q":
        if not isinstance(v, int):
            raise TypeError(f"expected an int, got {type(v).__name__}")
        x = v
    elif kind in "ib":
        x = operator.index(arg[v])
    elif kind == "n":
        return v is not None
    elif kind == "e":
        return v is arg or bool(v == arg)
    else:  # "l"
        return len(v)
    lo, hi, why = _RANGE[kind]
    if not lo <= x <= hi:
        raise OverflowError(why)
    return x


def gather(out: Any, seq: Sequence[Any], idx: Any, attrs: tuple[str, ...], kind: str,
           arg: Any = None) -> None:
    """gather(out, seq, idx, attrs, kind, arg=None): one field of seq[idx] into out."""
    size = _SIZE.get(kind)
    if size is None:
        raise ValueError(f"unknown kind {kind}")
    if kind in "ib" and not hasattr(type(arg), "__getitem__"):
        raise TypeError(f"kind {kind} needs a mapping")
    if not isinstance(attrs, tuple):
        raise TypeError("attrs must be a tuple")
    if not 1 <= len(attrs) <= 2:
        raise ValueError("one or two attribute names")
    if not all(isinstance(a, str) for a in attrs):
        raise TypeError("attribute names are str")
    items = seq if isinstance(seq, (list, tuple)) else list(seq)
    pos: Sequence[int]
    if idx is not None:
        arr = np.asarray(idx)
        if arr.dtype.itemsize != 8 or arr.dtype.kind != "i":
            raise TypeError("idx must be an int64 array")
        pos = arr.tolist()
    else:
        pos = range(len(items))
    col = np.asarray(out)
    if col.dtype.itemsize != size or col.size != len(pos):
        raise ValueError(f"out must hold {len(pos)} items of {size} bytes")
    if not col.flags.writeable or not col.flags.c_contiguous:
        raise ValueError("out must be a writable C-contiguous buffer")
    first, *rest = attrs
    vals = []
    for j in pos:
        if not 0 <= j < len(items):
            raise IndexError("idx out of range")
        v = getattr(items[j], first)
        if rest:
            v = getattr(v, rest[0])
        vals.append(_value(kind, v, arg))
    if vals:
        col[:] = vals
