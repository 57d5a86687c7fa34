"""A reference of skewed untraced steps does not read as the profiler's slowdown: a loader whose
batch is ready or not (blind check 20's FFT loader with one worker: steps of 1-170 ms, median 4.77
ms, mean ~40) told "the profiler slowed traced steps 6.1x" from 5 traced steps of 29 ms against
the median; their mean is the job's pace, and 5 steps cannot be compared with either."""

from __future__ import annotations

import dataclasses

from gpudiag.analyzers.unprofiled import measure_dilation
from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps
from reports.views import dilation_line


def rows(first: int, seconds: list[float]) -> list[StepRow]:
    return [StepRow(step=first + i, t=float(first + i), dt=s) for i, s in enumerate(seconds)]


def window(side: list[float]) -> WindowSteps:
    return WindowSteps(rank=0, traced_rows=rows(12, [0.029] * 5), before_rows=rows(2, side),
                       after_rows=rows(17, side))


def test_skewed_untraced_steps_say_the_slowdown_is_not_measured_not_a_factor():
    # 6 fast steps and 3 long ones a side: median 4.8 ms, mean ~60 ms
    measured = measure_dilation(29e3, [window([0.004, 0.0048, 0.005, 0.0045, 0.17, 0.0042, 0.16,
                                               0.0047, 0.17])], "cpu")
    assert measured is not None
    dil, _ = measured
    assert not dil.trusted and dil.skewed, dil
    line = dilation_line(dil)
    assert line.startswith("profiler's slowdown not measured") and "mean untraced" in line, line
    assert "slowed traced steps" not in line
    assert any("skewed" in c for c in dil.caveats), dil.caveats


def test_steady_untraced_steps_still_give_the_profilers_factor():
    measured = measure_dilation(29e3, [window([0.0101, 0.0099, 0.0100, 0.0102, 0.0098, 0.0100,
                                               0.0101, 0.0099, 0.0100])], "cpu")
    assert measured is not None
    dil, _ = measured
    assert dil.trusted and not dil.skewed
    assert dilation_line(dil).startswith("profiler slowed traced steps 2.9")


def test_traced_steps_faster_than_their_reference_are_not_read_as_a_slowdown_below_one():
    """A blind check's 2-thread conv net beside busy loops: traced steps of ~180 ms against a
    reference of ~700 ms read "the profiler appears to have slowed traced steps 0.26x"."""
    measured = measure_dilation(0.18e6, [WindowSteps(
        rank=0, traced_rows=rows(12, [0.18] * 5), before_rows=rows(2, [0.70, 0.69, 0.71, 0.70] * 2),
        after_rows=rows(17, [0.70, 0.71, 0.69, 0.70] * 2))], "cpu")
    assert measured is not None
    dil, _ = measured
    assert dil.factor < 1
    line = dilation_line(dil)
    assert line.startswith("traced steps ran faster than the untraced ones (0.26"), line
    assert "slowed" not in line


def test_traced_steps_a_hair_faster_than_their_reference_read_as_within_its_noise():
    """9.95 ms traced steps against a 10 ms reference whose half-IQR is 1%: no slowdown, and no
    claim that the job ran slower outside the window either."""
    measured = measure_dilation(9.95e3, [window([0.0101, 0.0099, 0.0100, 0.0102, 0.0098, 0.0100,
                                                 0.0101, 0.0099, 0.0100])], "cpu")
    assert measured is not None
    dil, _ = measured
    assert dil.factor < 1
    line = dilation_line(dil)
    assert line.startswith("traced steps ran as fast as the untraced ones"), line
    assert "within the noise" in line and "slower outside" not in line, line


def test_traced_steps_far_faster_than_a_noisy_reference_are_not_read_as_fast_as_it():
    """Blind check 39: "The traced steps ran as fast as the untraced ones (0.56x: 6.64 ms vs 11.8
    ms ...; noise +-58.5%)". Within a noise that wide the two cannot be told apart; "as fast as"
    is kept for a difference within a few percent."""
    measured = measure_dilation(9.95e3, [window([0.0101, 0.0099, 0.0100, 0.0102, 0.0098, 0.0100,
                                                 0.0101, 0.0099, 0.0100])], "cpu")
    assert measured is not None
    noisy = dataclasses.replace(measured[0], factor=0.56, untraced_spread=1.17)
    line = dilation_line(noisy)
    assert line.startswith("traced steps' pace could not be told from the untraced ones' (0.56"), line
    assert "as fast as" not in line and "vary more than the two differ" in line, line
