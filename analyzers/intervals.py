"""Interval arithmetic on numpy arrays: the primitive every time breakdown is made of.

A set of intervals is a pair of sorted, disjoint arrays (starts, ends). All operations are
vectorised so a million kernels cost milliseconds, not a Python loop.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]

EMPTY: Intervals = (np.empty(0), np.empty(0))


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals as sorted disjoint intervals."""
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s = starts[order]
    e = ends[order]
    run_end = np.maximum.accumulate(e)
    # a new group starts where the interval begins after everything before it has ended
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    group_end = np.maximum.reduceat(e, idx)
    return s[idx], group_end


def contains(iv: Intervals, x: np.ndarray) -> np.ndarray:
    """Which of the points ``x`` lie inside ``iv`` (sorted, disjoint [start, end))."""
    lo, hi = iv
    if lo.size == 0:
        return np.zeros(x.size, dtype=bool)
    j = np.searchsorted(lo, x, side="right") - 1
    return (j >= 0) & (x < hi[np.clip(j, 0, None)])


def total(iv: Intervals) -> float:
    return float((iv[1] - iv[0]).sum())


def _covered_upto(iv: Intervals, x: np.ndarray) -> np.ndarray:
    """Length of the union lying before each point x (F(x), monotone)."""
    s, e = iv
    if s.size == 0:
        return np.zeros_like(x, dtype=np.float64)
    cum = np.concatenate(([0.0], np.cumsum(e - s)))
    i = np.searchsorted(s, x, side="right")  # intervals starting at or before x
    before = cum[np.maximum(i - 1, 0)]
    last_s = s[np.maximum(i - 1, 0)]
    last_e = e[np.maximum(i - 1, 0)]
    partial = np.clip(x - last_s, 0.0, last_e - last_s)
    return np.where(i > 0, before + partial, 0.0)


def measure_in(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the union inside each window [lo_k, hi_k]."""
    lo = np.asarray(lo, dtype=np.float64)
    hi = np.asarray(hi, dtype=np.float64)
    out: np.ndarray = _covered_upto(iv, hi) - _covered_upto(iv, lo)
    return out


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted interval sets."""
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    # boundaries sweep: +1 at starts, -1 at ends, for both sets; keep where depth == 2
    pts = np.concatenate((a[0], a[1], b[0], b[1]))
    delta = np.concatenate((np.ones(a[0].size), -np.ones(a[1].size),
                            np.ones(b[0].size), -np.ones(b[1].size)))
    order = np.lexsort((delta, pts))  # ends before starts at equal points
    pts = pts[order]
    depth = np.cumsum(delta[order])
    start_mask = depth == 2
    if not start_mask.any():
        return EMPTY
    starts = pts[start_mask]
    ends = pts[np.flatnonzero(start_mask) + 1]
    keep = ends > starts
    return starts[keep], ends[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Parts of a not covered by b."""
    if a[0].size == 0 or b[0].size == 0:
        return a
    lo = min(a[0][0], b[0][0]) - 1.0
    hi = max(a[1][-1], b[1][-1]) + 1.0
    # complement of b within [lo, hi]
    comp_s = np.concatenate(([lo], b[1]))
    comp_e = np.concatenate((b[0], [hi]))
    keep = comp_e > comp_s
    return intersect(a, (comp_s[keep], comp_e[keep]))


def union(*sets: Intervals) -> Intervals:
    parts = [s for s in sets if s[0].size]
    if not parts:
        return EMPTY
    return merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
