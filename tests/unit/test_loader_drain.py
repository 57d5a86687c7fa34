"""The steps after a trace window that drain a DataLoader's queue are no reference for the job.

While the traced steps run slow under the profiler, a loader's workers keep making batches until
their queue holds ``num_workers x prefetch_factor``; the steps after the window take those at
once and run faster than the job's pace. The bootstrap records the depth, and the reference
around the window starts after it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.rundir import PROFILER_EXPORT, PROFILER_TRACED, PROFILER_WARMUP, read_bootstrap
from gpudiag.steps import MAX_PREFETCH, REFERENCE_STEPS, prefetch_depth, window_steps


def _run(tmp: Path, prefetch: object) -> Path:
    """20 steps of 40 ms, a warm-up and 5 traced steps, an export, 8 steps of 30 ms (the queue
    drained), then 20 of 40 ms."""
    samples = tmp / "samples"
    samples.mkdir(parents=True)
    dts = ([(0.040, None)] * 20 + [(0.06, PROFILER_WARMUP)] + [(0.08, PROFILER_TRACED)] * 5
           + [(0.1, PROFILER_EXPORT)] + [(0.030, None)] * 8 + [(0.040, None)] * 20)
    t, rows = 1e9, []
    for i, (dt, prof) in enumerate(dts, start=1):
        t += dt
        rows.append({"step": i, "t": t, "dt": dt, **({"profiler": prof} if prof else {})})
    (samples / "steps-rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (samples / "bootstrap-rank-0.json").write_text(json.dumps({
        "rank": 0, "dataloader_workers": [4], "dataloader_prefetch": prefetch,
        "traced_steps": list(range(22, 27))}))
    return tmp


def test_the_steps_that_drain_a_loaders_queue_after_the_window_are_left_out_of_its_reference(tmp_path):
    [w] = window_steps(_run(tmp_path / "eight", 8))
    assert [r.step for r in w.after_rows] == list(range(36, 36 + REFERENCE_STEPS))
    assert {r.dt for r in w.after_rows} == {0.040}
    # a run recorded before the depth was (or a job without workers) keeps the steps next to it
    [w] = window_steps(_run(tmp_path / "none", 0))
    assert w.after_rows[0].step == 28 and w.after_rows[0].dt == 0.030


@pytest.mark.parametrize("claim, depth", [("8", 0), (-3, 0), (True, 0), (2.5, 0), (None, 0),
                                          (10**9, MAX_PREFETCH), (16, 16)])
def test_a_job_written_depth_is_read_as_a_bounded_count_or_as_none(tmp_path, claim, depth):
    """The bootstrap file is the job's to write: a depth that is no count is none, and one
    beyond MAX_PREFETCH leaves no reference otherwise, so it is held there."""
    meta = read_bootstrap(_run(tmp_path, claim))[0]
    assert prefetch_depth(meta) == depth
