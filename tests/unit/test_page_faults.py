"""Pages the allocator faults in again every step, as rules of ``analyzers.page_faults`` (held-out
set 8: two jobs 22.4 and 14.4 ms by default, 13.7 and 7.7 ms with glibc's thresholds set high,
and gpudiag named neither). The same on a real job: ``tests/system/jobs/test_allocator.py``."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import page_faults as pf
from gpudiag.analyzers import step_tail
from gpudiag.analyzers.unprofiled import observer_after_effect
from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps


def rows(steps: range, dt: float, faults: int, sys_s: float, cpu_s: float | None = None) -> list[StepRow]:
    return [StepRow(step=s, t=float(s), dt=dt, minflt=faults, sys_s=sys_s,
                    cpu_s=dt if cpu_s is None else cpu_s) for s in steps]


def window(before: list[StepRow], after: list[StepRow], fault_us: object = 3.5,
           later: list[StepRow] | None = None) -> WindowSteps:
    return WindowSteps(rank=0, traced_rows=[], before_rows=before, after_rows=after,
                       later_rows=later or [], fault_us=fault_us)


def test_faults_cost_the_lower_of_the_probe_and_the_runs_kernel_time_per_fault_on_the_mean_step():
    """4,000 faults a step and 8 ms of kernel time a step (2 us a fault) against a probe that read
    3.5 us: the run's own figure is the cost, and the prediction removes 8 ms of a 20 ms step."""
    w = window(rows(range(5, 11), 0.020, 4000, 0.008), rows(range(16, 26), 0.020, 4000, 0.008))
    f = pf.faults([w])
    assert f is not None and f.steps == 15   # the first step after the window left out
    assert f.fault_us == pytest.approx(2.0) and f.cost_us(f.faults) == pytest.approx(8000)
    assert pf.notable(f) and f.share == pytest.approx(0.4)
    before, after, why = pf.predicted_step_us(f)
    assert (before, after) == (pytest.approx(20e3), pytest.approx(12e3))
    assert "4,000 faults a step at 2 us" in why and "probe's 3.5 us" in why
    assert "MALLOC_MMAP_THRESHOLD_=268435456" in pf.text(f)


def test_the_kernel_time_is_read_over_the_whole_run_because_one_steps_split_is_by_clock_ticks():
    """The kernel splits a thread's time into user and system by 4 ms ticks: the same 4,480
    faults read 0, 4.3 or 7.7 ms of kernel time step by step (tests/jobs/alloc_job.py). A side
    whose few steps all read 0 still gets the run's cost per fault."""
    before = rows(range(5, 11), 0.020, 4000, 0.0)
    after = [*rows(range(16, 21), 0.020, 4000, 0.0), *rows(range(21, 26), 0.020, 4000, 0.016)]
    f = pf.faults([window(before, after)])
    assert f is not None and f.run_us == pytest.approx(0.016 * 5 / (4000 * 15) * 1e6)
    assert f.cost_us(f.faults) == pytest.approx(4000 * f.run_us)


def test_faults_on_intra_op_threads_overlap_so_the_saving_is_over_the_cores_the_step_used():
    f = pf.faults([window(rows(range(5, 11), 0.020, 4000, 0.008, cpu_s=0.040), [])])
    assert f is not None and f.parallel == pytest.approx(2.0)
    assert f.saving_us == pytest.approx(4000)


def test_a_job_that_faults_little_or_whose_cost_was_not_measured_is_not_told_about_its_allocator():
    few = pf.faults([window(rows(range(5, 11), 0.020, 40, 0.0), [])])
    assert few is not None and not pf.notable(few)
    many = rows(range(5, 11), 0.020, 4000, 0.008)
    for hostile in (None, "3.5", True, -1.0, float("nan"), 1e9):
        assert pf.faults([window(many, [], fault_us=hostile)]) is None, hostile
    unrecorded = [StepRow(step=s, t=float(s), dt=0.02) for s in range(5, 11)]
    assert pf.faults([window(unrecorded, [])]) is None


def test_steps_after_the_window_that_fault_at_another_rate_are_left_out_of_the_pace_either_way():
    """The profiler's buffers, freed at the export, move glibc's thresholds: alloc_job ran 21.7 ms
    with 4,480 faults every step after the window against 12-24 ms alone; held-out set 8's jobs ran
    faster after it. Either way the after side is not the job's pace."""
    quiet = rows(range(5, 11), 0.014, 950, 0.0015)
    busy = rows(range(16, 26), 0.022, 4480, 0.008)
    for before, after in ((quiet, busy), (busy, quiet)):
        w = window(before, after)
        assert pf.allocator_moved([w]) is not None
        b = 1e6 * before[0].dt
        a = 1e6 * after[0].dt
        said = observer_after_effect([w], "cpu", b, a)
        assert said is not None and "moved glibc's malloc thresholds" in said, said
    # the same rate on both sides: no move; a few hundred faults either way: noise
    assert pf.allocator_moved([window(busy, rows(range(16, 26), 0.022, 4000, 0.008))]) is None
    assert pf.allocator_moved([window(rows(range(5, 11), 0.01, 10, 0.0),
                                      rows(range(16, 26), 0.01, 200, 0.0))]) is None


def test_a_job_flipping_between_allocator_modes_gets_the_same_fixed_step_and_the_ratio_each_mode_gives():
    """Blind set 9's AdamW job: steps of 29 ms with no fault and 39 ms with 4,064, in any mix on
    either side of the window; alone it ran 44.6 ms, 29.2 with the fix. Each step less its own
    faults is 29 ms; the ratio spans the most-faulting step's mode to the least-faulting side's."""
    calm = rows(range(5, 11), 0.029, 0, 0.0)
    mixed = [StepRow(step=s, t=float(s), dt=0.039 if s % 2 else 0.029, minflt=4064 if s % 2 else 0,
                     sys_s=0.01 if s % 2 else 0.0, cpu_s=0.039 if s % 2 else 0.029) for s in range(16, 36)]
    f = pf.faults([window(calm, mixed, fault_us=2.4605)])
    assert f is not None and f.fixed_us == pytest.approx(29e3, rel=0.02)
    lo, hi = f.ratio_range()
    assert lo == pytest.approx(29 / 39, rel=0.02) and hi == pytest.approx(1.0)
    assert pf.notable(f)  # the worst side's share, not only the mean's
    _, _, why = pf.predicted_step_us(f)
    assert f"{lo:.2f}x" in why and "either" in why
    assert "0 times a step before the traced window" in pf.text(f)


def test_one_long_step_in_five_is_said_with_where_its_time_went_and_alike_steps_are_not():
    """Blind set 9's job: its own step was 5 optimizer steps and a 4 MB write + fsync + read;
    gpudiag read 0.472 ms a step against 9.8 ms by the job's timer and said nothing of the
    intervals. One step in five, 8 ms longer, mostly off a core, is named; alike steps are not."""
    def row(s: int) -> StepRow:
        long = s % 5 == 0
        return StepRow(step=s, t=float(s), dt=0.0085 if long else 0.0005, minflt=0,
                       sys_s=0.0007 if long else 0.0, cpu_s=0.0022 if long else 0.0005)
    w = window([row(s) for s in range(5, 11)], [row(s) for s in range(16, 36)])
    t = step_tail.tail([w])
    assert t is not None and t.every == pytest.approx(26 / 6)
    assert t.extra_us == pytest.approx(8000) and t.cpu_extra_us == pytest.approx(1700)
    said = step_tail.text(t)
    assert "one untraced step in about 4.3" in said and "6.3 ms off a core" in said, said
    assert t.periodic and "gpudiag.step()" in said
    # a loader's hiccups now and then: said, without the step-marking hint
    odd = [StepRow(step=s, t=float(s), dt=0.0085 if s in (7, 19, 22, 31) else 0.0005) for s in range(5, 36)]
    t2 = step_tail.tail([window(odd[:6], odd[11:])])
    assert t2 is not None and not t2.periodic
    assert "no fixed period" in step_tail.text(t2) and "gpudiag.step()" not in step_tail.text(t2)
    alike = window(rows(range(5, 11), 0.01, 0, 0.0), rows(range(16, 36), 0.011, 0, 0.0))
    assert step_tail.tail([alike]) is None
    # a periodic torch.save explains its own tail: the checkpoint advice names it
    assert step_tail.tail([w], saved_us_per_step=t.mean_us) is None


def test_the_first_step_after_the_window_faulting_the_heap_back_in_is_no_allocator_to_fix():
    """alloc_job with glibc's thresholds already set: no fault a step before the window or
    after, 9,217 in the first step after it (the heap where the profiler's buffers were); its
    4% of the mean step named the fix already applied (a CI clone run)."""
    after = rows(range(18, 28), 0.0375, 0, 0.0)
    after[0] = StepRow(step=18, t=18.0, dt=0.056, minflt=9217, sys_s=0.0197, cpu_s=0.056)
    f = pf.faults([window(rows(range(5, 11), 0.0375, 0, 0.0), after, fault_us=3.7)])
    assert f is not None and f.faults == 0 and not pf.notable(f)
    assert pf.allocator_moved([window(rows(range(5, 11), 0.0375, 0, 0.0), after)]) is None

    # a heap grown once, in any untraced step: the one step that faulted more than twice any other
    before = rows(range(5, 11), 0.0375, 0, 0.0)
    before[1] = StepRow(step=6, t=6.0, dt=0.0587, minflt=9168, sys_s=0.02, cpu_s=0.0587)
    g = pf.faults([window(before, rows(range(18, 28), 0.0375, 0, 0.0), fault_us=3.7)])
    assert g is not None and g.faults == 0 and not pf.notable(g)
