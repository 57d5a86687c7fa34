"""Long steps the median leaves out: one step in N that holds work the others do not.

The verdict's view starts from the median untraced step, which is the right pace for a loop
whose steps are alike, and hides a stretch of work that lands in one step in N: a file written
and fsynced every few optimizer steps, an eval, a log flush. Blind set 9 (2026-11-29): a job
whose own step was 5 optimizer steps and a 4 MB write + fsync + read read 0.472 ms a step
against 9.8 ms by its own timer, "CPU idle 100%", and nothing said the intervals were uneven.
Periodic ``torch.save`` has its own fix (``checkpoint``); what remains is said here, with where
the long steps' extra time went (on a core, in the kernel, or off a core).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps

# The mean step this much above the median: the tail is the job's, not the timer's noise
# (1-4%) nor a machine that got busy for a moment (which moves the median too).
TAIL_RATIO = 1.25
# A step is long when it runs this many times the median.
LONG = 2.0
MIN_ROWS = 8


@dataclass(frozen=True)
class Tail:
    median_us: float
    mean_us: float
    long_steps: int
    steps: int
    extra_us: float  # the long steps' mean time beyond the median
    cpu_extra_us: float | None  # ...of it on a core (all threads); None: not recorded
    sys_extra_us: float | None  # ...of that in the kernel
    # whether the long steps come at a fixed period (every gap between them within one step of
    # the median gap, on each side of the window): the shape of a job's own step that holds
    # several optimizer steps, as against a loader's hiccups now and then
    periodic: bool = False

    @property
    def every(self) -> float:
        return self.steps / self.long_steps


def tail(windows: list[WindowSteps] | None, saved_us_per_step: float = 0.0) -> Tail | None:
    """The lowest rank's long steps, where they lift the mean step ``TAIL_RATIO`` above the
    median beyond what its timed saves explain (``saved_us_per_step``); else None."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    rows = [*w.before_rows, *w.after_rows, *w.later_rows]
    if len(rows) < MIN_ROWS:
        return None
    dts = [r.dt + r.machine_s for r in rows]
    med, mean = statistics.median(dts), statistics.fmean(dts)
    if med <= 0 or (mean * 1e6 - saved_us_per_step) < TAIL_RATIO * med * 1e6:
        return None
    long = [r for r, d in zip(rows, dts, strict=True) if d >= LONG * med]
    if not long:
        return None
    short = [r for r, d in zip(rows, dts, strict=True) if d < LONG * med]
    at = {r.step for r in long}
    return Tail(median_us=med * 1e6, mean_us=mean * 1e6, long_steps=len(long), steps=len(rows),
                extra_us=(statistics.fmean(r.dt + r.machine_s for r in long) - med) * 1e6,
                cpu_extra_us=_extra(long, short, "cpu_s"), sys_extra_us=_extra(long, short, "sys_s"),
                periodic=_periodic([[r.step for r in side if r.step in at]
                                    for side in (w.before_rows, [*w.after_rows, *w.later_rows])]))


def _periodic(sides: list[list[int]]) -> bool:
    """Whether the long steps' numbers, side by side (no gap spans the window), come at one
    period: at least two gaps, each within one step of their median."""
    gaps = [b - a for side in sides for a, b in zip(side, side[1:], strict=False)]
    if len(gaps) < 2:
        return False
    mid = statistics.median(gaps)
    return mid > 1 and all(abs(g - mid) <= 1 for g in gaps)


def _extra(long: list[StepRow], short: list[StepRow], field: str) -> float | None:
    a = [getattr(r, field) for r in long]
    b = [getattr(r, field) for r in short]
    if not b or any(x is None for x in a + b):
        return None
    return max(0.0, statistics.fmean(a) - statistics.fmean(b)) * 1e6


def text(t: Tail, workers: list[int] | None = None) -> str:
    """The warning; ``workers``: the job's DataLoader worker counts, whose turns make a period
    of their own (blind check 40: 2 workers asleep on storage gave steps of ~70 and ~5 ms in
    turn, and were told to call gpudiag.step() as if the loop's own step held two)."""
    where = ""
    if t.cpu_extra_us is not None and t.sys_extra_us is not None:
        off = max(0.0, t.extra_us - t.cpu_extra_us)
        where = (f" ({t.cpu_extra_us / 1e3:.3g} ms of it on a core, {t.sys_extra_us / 1e3:.3g} ms of that in "
                 f"the kernel; {off / 1e3:.3g} ms off a core: storage, a sleep or a lock)")
    said = (f"one untraced step in about {t.every:.2g} ran {t.extra_us / 1e3:.3g} ms longer than the median "
            f"step{where}: the mean step is {t.mean_us / 1e3:.3g} ms against the median's "
            f"{t.median_us / 1e3:.3g} ms (all the untraced steps'), which leaves that work out")
    if not t.periodic:
        return said + " (now and then, at no fixed period)"
    turns = [n for n in (workers or []) if n > 1 and abs(t.every - n) <= 0.5]
    if turns:
        n = turns[0]
        return (said + f". They come every {n} steps, as the DataLoader's {n} workers take turns: each "
                f"makes a batch in {n} steps, and the step that waits for the next one holds the "
                "wait; the mean step is the loader's pace")
    return (said + ". They come at a fixed period: where the job's own step is several optimizer steps "
            "(a loop that writes, logs or evaluates every few), call gpudiag.step() once per step of yours")
