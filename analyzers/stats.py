"""Statistics that more than one analysis uses: spread, a rank test, a quantile per class.

``iqr_over_median`` is how unsteady a run's steps are (the report's "noise \u00b1" and ``gpudiag
diff``'s noise floor are half of it); ``mann_whitney_p`` tells whether one set of steps is
systematically slower than another (``gpudiag diff``, and the reference around a traced window:
did the job's pace change across it?); ``class_quantile`` is each operator's class's typical or
fast call (stalls cut to the median, the profiler's slow-down beyond the fastest tenth).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np


def iqr_over_median(xs: Sequence[float] | np.ndarray) -> float:
    """Interquartile range over the median: how unsteady a run's steps are. Quartiles as
    ``statistics.quantiles`` takes them (Weibull's p(n+1) positions). The report's "noise ±"
    and ``gpudiag diff``'s noise floor are both half of it."""
    if len(xs) < 4:
        return 0.0
    q = statistics.quantiles(xs, n=4)
    med = statistics.median(xs)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def class_quantile(key: np.ndarray, values: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """For each element: the ``q`` quantile of ``values`` over the elements with the same ``key``
    (the value at position ``int(count * q)`` of the class sorted ascending), and that count."""
    _, cls, counts = np.unique(key, return_inverse=True, return_counts=True)
    order = np.lexsort((values, cls))  # by class, smallest first
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return values[order[first + (counts * q).astype(np.int64)]][cls], counts[cls]


def mann_whitney_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie- and
    continuity-corrected): are values of one sample systematically larger than the other's?"""
    n1, n2 = len(x), len(y)
    both = np.concatenate([x, y])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    sorted_vals = both[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - float((counts ** 3 - counts).sum()) / (n * (n - 1)))
    if var <= 0:
        return 1.0  # every value tied: nothing tells the samples apart
    z = (abs(u - n1 * n2 / 2.0) - 0.5) / math.sqrt(var)
    return math.erfc(max(z, 0.0) / math.sqrt(2.0))
