"""The job's own GEMM shapes, and what bf16 autocast measured on them (``collectors.gemm_probe``).

``lower-precision`` on a CPU took the compute-bound fp32 work at the bf16 peak's ratio (the
best of 512x512x512 GEMMs), "assuming the same efficiency in both dtypes". Blind set 12 (2-core
AMD EPYC, bf16 peak 2.2x fp32): two 256x1024x1024 layers measured 0.715x with autocast where
0.50x was promised, and a host-bound MLP of 64x128x256 layers ran 1.08x, slower, promised
0.84x; its conv nets matched the peak's ratio (0.625x against 0.645x). A GEMM's bf16 rate
depends on its shape, and autocast casts each weight at every call. So the fp32 GEMMs that take
the most time are timed at their own shapes, with autocast's casts, on this machine, and their
measured ratio replaces the peak's for their share of the work. Pure functions: the timing is
the collector's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The GEMMs timed: the fp32 mm/addmm groups with the most time, up to this many shapes
# (forward and the two backward GEMMs of a layer are three shapes).
TOP_SHAPES = 6
# ...each at least this share of the compute-bound time: a conv net's classifier head (0.05 ms of
# 25, blind set 13) is no figure for the step, and its 4.6x in bf16 read as if bf16 were a loss.
MIN_SHARE = 0.05
_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2)}
Shape = tuple[int, int, int]


@dataclass(frozen=True)
class AutocastGemms:
    """The measured ratio over the timed GEMMs' time, and their share of the compute-bound
    fp32 work (as traced)."""

    ratio: float  # bf16 with casts over fp32, time-weighted over the timed shapes
    share: float  # the timed shapes' time over the compute-bound time
    shapes: int


def gemm_shapes(groups: dict[tuple[str, str, str], list[float]]) -> list[tuple[Shape, float]]:
    """(rows, inner, out) and time in us of the fp32 GEMM groups with the most time (the
    roofline's groups: (op, shape text, dtype) -> [calls, flops, bytes, time])."""
    out: dict[Shape, float] = {}
    for (op, shape, dtype), (_calls, _flops, _bytes, time_us) in groups.items():
        if op not in _GEMMS or dtype != "float":
            continue
        s = _parse(shape, *_GEMMS[op])
        if s is not None:
            out[s] = out.get(s, 0.0) + float(time_us)
    return sorted(out.items(), key=lambda kv: -kv[1])[:TOP_SHAPES]


def sizeable(shapes: list[tuple[Shape, float]], compute_bound_us: float) -> list[tuple[Shape, float]]:
    """The shapes with at least ``MIN_SHARE`` of the compute-bound time: the ones worth timing,
    and the only ones a ratio is taken over."""
    return [(s, t) for s, t in shapes if t >= MIN_SHARE * compute_bound_us]


def summarise(shapes: list[tuple[Shape, float]], ratios: dict[Shape, float],
              compute_bound_us: float) -> AutocastGemms | None:
    """The time-weighted ratio over the shapes measured (None: none was, or no time)."""
    timed = [(t, ratios[s]) for s, t in sizeable(shapes, compute_bound_us)
             if s in ratios and ratios[s] > 0]
    total = sum(t for t, _ in timed)
    if total <= 0 or compute_bound_us <= 0:
        return None
    ratio = sum(t * r for t, r in timed) / total
    return AutocastGemms(ratio=ratio, share=min(1.0, total / compute_bound_us), shapes=len(timed))


def _parse(shape: str, a: int, b: int) -> Shape | None:
    try:
        dims = json.loads(shape)
        (m, k), (k2, n) = dims[a], dims[b]
    except (ValueError, TypeError, IndexError):
        return None
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (m, k, k2, n))
    return (m, k, n) if ok and k == k2 else None
