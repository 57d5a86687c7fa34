"""The fixed steps of "predicted vs applied" brought to the run's pace by the unfixed steps beside
them (``benchmarks/predicted_vs_applied.paced_fixed_median``): the measure the timing test holds
its ratios to, checked here on step times whose answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import benchmark_module


@pytest.fixture(scope="module")
def bench():
    return benchmark_module("predicted_vs_applied")


def _own(tmp_path: Path, segments: list[tuple[str, int, float]]) -> Path:
    """A job's own report: ``segments`` of (phase, steps, step seconds)."""
    times = [t for _, n, t in segments for _ in range(n)]
    phases = [p for p, n, _ in segments for _ in range(n)]
    path = tmp_path / "own.json"
    path.write_text(json.dumps({"step_seconds": times, "phases": phases}))
    return path


def test_fixed_phases_run_while_the_machine_was_slow_are_brought_to_the_run_pace(bench, tmp_path):
    # the fix halves the step; the machine ran 1.5x slower around each fixed phase only
    slow = [("b", 8, 0.150), ("a", 15, 0.075), ("b", 8, 0.150)]
    own = _own(tmp_path, [("b", 30, 0.100), *slow, ("b", 30, 0.100), *slow, ("b", 30, 0.100)])
    before = bench.phase_median(own, "b", 0, set())
    assert before == pytest.approx(0.100)
    assert bench.phase_median(own, "a", 3, set()) == pytest.approx(0.075)  # two moments compared
    assert bench.paced_fixed_median(own, 3, set(), before) == pytest.approx(0.050)


def test_only_the_unfixed_steps_next_to_a_phase_set_its_pace(bench, tmp_path):
    n = bench.NEIGHBOURS
    # a slow stretch earlier in the same unfixed phase is another moment
    own = _own(tmp_path, [("b", 40, 0.300), ("b", n, 0.100), ("a", 10, 0.050), ("b", n, 0.100)])
    before = bench.phase_median(own, "b", 0, set())
    assert before == pytest.approx(0.300)
    assert bench.paced_fixed_median(own, 0, set(), before) == pytest.approx(0.150)
    # the steps the profiler touched (1-based) are not the job's pace either
    own = _own(tmp_path, [("b", 20, 0.100), ("b", n, 0.400), ("a", 3, 0.500), ("a", 10, 0.050),
                          ("b", 20, 0.100)])
    touched = set(range(21, 21 + n))
    assert bench.paced_fixed_median(own, 3, touched, 0.100) == pytest.approx(0.050)
    assert bench.paced_fixed_median(own, 3, set(), 0.100) < 0.040  # what counting them would give


def test_a_report_whose_times_and_phases_disagree_is_refused(bench, tmp_path):
    path = tmp_path / "own.json"
    path.write_text(json.dumps({"step_seconds": [0.1, 0.1], "phases": ["b"]}))
    with pytest.raises(ValueError, match="2 step times for 1 phases"):
        bench.phase_median(path, "b", 0, set())
