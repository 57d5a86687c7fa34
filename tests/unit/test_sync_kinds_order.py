"""The ranks' mean sync counts keep their kinds in the ranks' order, so that ``analyze --json``
prints the same bytes whatever Python's hash seed (a set's order once moved "device waits"
before "scalar reads" from one run to the next)."""

from __future__ import annotations

from gpudiag.analyzers.syncs import DATA_SHAPES, DEVICE_WAITS, SCALAR_READS, TraceSyncs, mean_trace_syncs


def test_mean_sync_counts_keep_the_ranks_order_of_kinds():
    a = TraceSyncs(steps=3, counts={SCALAR_READS: 5.0, DEVICE_WAITS: 6.0}, host_us=10.0)
    b = TraceSyncs(steps=4, counts={SCALAR_READS: 1.0, DATA_SHAPES: 2.0, DEVICE_WAITS: 2.0}, host_us=20.0)
    mean = mean_trace_syncs([a, b])
    assert mean is not None
    assert list(mean.counts) == [SCALAR_READS, DEVICE_WAITS, DATA_SHAPES]
    assert mean.counts == {SCALAR_READS: 3.0, DEVICE_WAITS: 4.0, DATA_SHAPES: 1.0}
    assert (mean.steps, mean.host_us) == (3, 15.0)
