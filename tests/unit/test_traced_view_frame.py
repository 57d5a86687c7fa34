"""Where the verdict's view is the traced steps (the reference around the window not trusted),
each fix's step and prediction are shown at the untraced steps' wall step, the one the job's
own timer reads, with the ratio the traced steps gave (``advice._unobserved_frame``).

Why: blind check 22 found a job crowded in its traced window told "1,467 ms -> ..." where its
own timer read 112 ms a step, so a prediction checked by applying the fix was off by 13x before
the fix was run. The recorded case here (``tests/fixtures/cpu-fft-worker-own-stalls``, blind
check 20's job 3: its README holds the job's own timer, 36.2 ms median under the profiler)
falls back to its traced view, whose steps ran 59.4 ms by wall clock.
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.pace import at_own_pace, wall
from gpudiag.rundir import read_bootstrap, read_host_cpu, read_steps
from gpudiag.steps import window_steps
from tests.paths import TESTS

FIXTURE = TESTS / "fixtures" / "cpu-fft-worker-own-stalls"
OWN_TIMER_S = 36.2e-3  # the job's own median step under the profiler (the fixture's README)


def untraced_wall_s(run: Path) -> float:
    """The untraced steps around the window, by wall clock, read from the step rows here."""
    boot = read_bootstrap(run)
    own = at_own_pace(read_steps(run, boot), read_host_cpu(run), boot)
    rows = [r for w in window_steps(run, boot=boot, steps=own) for r in (*w.before_rows, *w.after_rows)]
    return statistics.median(wall(rows))


def test_a_traced_views_fixes_are_shown_at_the_step_the_jobs_own_timer_reads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    d = diagnose(run, jobs=1)
    assert d.unprofiled is None and d.dilation is not None and not d.dilation.trusted  # the traced view
    traced_s = d.breakdown.step_time * 1e-6
    assert traced_s > 1.25 * OWN_TIMER_S  # the frame that misled: 59.4 ms against 36.2
    entries = [r for r in d.verdict.recommendations if r.predicted_step_s is not None]
    assert entries, d.verdict.recommendations
    expected = untraced_wall_s(run)
    for r in entries:
        assert r.step_s == pytest.approx(expected, rel=1e-6), r
        assert OWN_TIMER_S / 1.25 <= r.step_s <= 1.25 * OWN_TIMER_S, r
        assert "shown at the untraced steps'" in r.why, r.why
        assert r.gain == pytest.approx(1 - r.predicted_step_s / r.step_s, abs=1e-9)
