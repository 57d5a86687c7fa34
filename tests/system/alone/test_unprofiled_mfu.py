"""The small-ops job's MFU and label however it is profiled, held to its own timer.

Alone (the solo pass), not in the suite's parallel pass: there the load on the 2-core VM moves
from one step to the next, and the 10% bound is inside that noise. A CI run read 1.11x: of the
reference's ten steps, five ran beside other tests (the job's own pace 5.0-7.6 ms a step) and
five quiet (4.5-4.7 ms); the truth leaves out the step whose own timing holds the profiler's
start, and its median of nine fell on a loaded step (5.33 ms) where gpudiag's of ten fell
between the groups (4.82 ms).
"""

from __future__ import annotations

from tests.conftest import labels_of, view_mfu, view_steps
from tests.system.jobs.test_unprofiled import MFU_TOLERANCE, profile

# The job's own timings a traced view's MFU is held to: the traced steps less the last, whose own
# timing holds the trace export. --monitor traces 2 steps, so one timing is left: beside a CPU
# hog (CI, 2026-11-28) the two traced steps took 14.7 and 10.6 ms, the view's step was their
# mean (12.5 ms), and the one own timing left (14.5 ms) read its MFU as 1.16x: a single step of a
# loaded machine is no truth. The view's basis and its deduction are still checked.
MIN_TRUTH_STEPS = 3


def test_many_small_ops_job_gets_one_label_and_mfu_however_it_is_profiled(tmp_path):
    """Defaults, another --skip and --monitor: the profiler dilates the traced steps of this
    job most (hundreds of tiny ops per step). Where the steps around the window give a reference
    to trust, the runs agree on the label and MFU is within 10% of the job's analytic MFU; where
    the machine's load changed across the window, the run falls back to its traced view and says
    so, and its MFU still matches the job's own timer over those (traced) steps."""
    runs = {name: profile(tmp_path, name, *opts) for name, opts in
            (("defaults", ()), ("skip25", ("--skip", "25")), ("monitor", ("--monitor",)))}
    ratios = {}
    for name, (d, own, run) in runs.items():
        assert d.dilation is not None, name
        if d.basis == "unprofiled-estimate":
            assert d.mfu.step_time_basis == "untraced steps" and d.dilation.trusted
            assert d.dilation.factor > 1.1, (name, d.dilation)  # dilation is real here
        else:
            why = " | ".join(x.reason for x in d.verdict.deductions)
            assert not d.dilation.trusted and "used as is" in why, (name, why)
            assert d.mfu.step_time_basis == "traced steps"
            if len(view_steps(d, run)) - 1 < MIN_TRUTH_STEPS:
                continue   # --monitor's 2 traced steps: one of the job's own timings to hold it to
        ratios[name] = d.mfu.value / view_mfu(d, own, run)
    # each run is held to its own truth: on a shared machine the job's real speed (and the CPU
    # peak measured per session) moves with the load; the tool must follow it
    assert all(abs(r - 1) <= MFU_TOLERANCE for r in ratios.values()), ratios
    # one label, where a run's margin was within its noise read as the tie it reports (this job
    # sits near the line: compute 0.48-0.57 of the step, host 0.37-0.45 in 27 runs on this VM)
    # A verdict of low confidence says itself that it may be either: beside three busy loops on
    # 2 cores (the machine took 45-51% of each step) the three runs read compute 0.50 / host 0.37,
    # host 0.56 / compute 0.35 and compute 0.44 / host 0.40, at confidence 0.05-0.14 (a CI clone
    # beside the suite: the same); what must agree are the verdicts that claim to be sure (a
    # window busier than the steps around it lowers its verdict's confidence: in a CI clone the
    # --skip 25 run read host-bound at 0.78 from a window where the machine took 52% of each
    # step and 2% of the untraced ones, now 0.28 with that reason)
    trusted = [d.verdict for d, _, _ in runs.values()
               if d.basis == "unprofiled-estimate" and d.verdict.confidence_level != "low"]
    assert not trusted or set.intersection(*map(labels_of, trusted)), [
        (v.label, v.tie_with, v.noise, v.evidence) for v in trusted]
