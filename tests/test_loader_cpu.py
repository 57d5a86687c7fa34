"""A DataLoader wait on storage against one on decoding: what the host samples say, and what
that does to the workers advised and to the step predicted once the wait is hidden."""

from __future__ import annotations

import math

import pytest

from gpudiag.analyzers import whatif
from gpudiag.analyzers.host_cpu import host_cpu, untraced_spans
from gpudiag.diagnosis import TimeBreakdown
from gpudiag.rundir import PROFILER_TRACED, BootstrapMeta, HostSample, StepRow


def rows(n: int, dt: float, t0: float, traced: range = range(0)) -> list[StepRow]:
    return [StepRow(i, t0 + i * dt, dt, PROFILER_TRACED if i in traced else None) for i in range(1, n + 1)]


def test_untraced_spans_leave_out_start_up_and_the_traced_window() -> None:
    spans = untraced_spans(rows(12, 1.0, 100.0, traced=range(6, 8)))
    # steps 1-2 are start-up, 6-7 traced: steps 3-5 (t 102..105) and 8-12 (t 107..112)
    assert spans == [(102.0, 105.0), (107.0, 112.0)]


def test_host_samples_count_only_where_their_interval_lies_inside_untraced_steps() -> None:
    steps = {0: rows(12, 1.0, 100.0, traced=range(6, 8))}
    s = [HostSample(101.5, 0.0, 0.0, None),   # start-up: only a start for the next interval
         HostSample(102.5, 9.0, 0.0, 9.0),    # interval 101.5-102.5 half in start-up: out
         HostSample(103.5, 1.0, 0.5, 2.0),    # in
         HostSample(104.5, 0.5, 0.0, 2.0),    # in
         HostSample(105.5, 5.0, 0.0, 5.0),    # half in the traced window: out
         HostSample(107.5, 5.0, 0.0, 5.0),    # out
         HostSample(109.5, 0.3, 0.1, 1.3),    # in (2 s interval)
         HostSample(112.05, 0.2, 0.0, 1.2)]   # in: 50 ms past the last step is still the job's
    h = host_cpu(s, steps, {0: BootstrapMeta(rank=0, cpus=4, intra_op_threads=2)})
    assert h is not None and h.samples == 4
    total = 1 + 1 + 2 + 2.55
    assert h.cores_used == pytest.approx((1.0 + 0.5 + 2 * 0.3 + 2.55 * 0.2) / total, abs=1e-3)
    assert h.runq_cores == pytest.approx((0.5 + 2 * 0.1) / total, abs=1e-3)
    assert h.other_cores == pytest.approx((1.0 + 1.5 + 2 * 1.0 + 2.55 * 1.0) / total, abs=1e-3)
    assert (h.cpus, h.intra_op_threads) == (4, 2)
    assert h.step_s == pytest.approx(1.0)  # the steps those samples cover, not the traced ones
    assert host_cpu(s[:3], steps, {}) is None  # one usable sample is no estimate


# a step of 100 ms: 80 ms waiting for the next batch, 20 ms of model work on one thread
STEP = TimeBreakdown(step_time=100e3, compute=20e3, idle=80e3, input_wait=80e3)


def test_a_wait_on_storage_is_hidden_by_as_many_workers_as_it_takes() -> None:
    cpu = whatif.JobCpu(cores_used=0.2, cpus=2, threads=1)   # the model's 20 ms, nothing more
    assert whatif.loading_cores(STEP, cpu) == 0.0
    p = whatif.input_hidden(STEP, cpu)
    assert p.step_us == pytest.approx(20e3)
    assert whatif.workers_needed(STEP, cpu) == 4            # a batch every 80 ms / 20 ms
    assert "cannot do in less" not in p.why
    # the machine's other work does not bound it: workers waiting on storage sleep
    busy = whatif.JobCpu(cores_used=0.2, cpus=2, threads=1, other_cores=1.8)
    assert whatif.input_hidden(STEP, busy).step_us == pytest.approx(20e3)


def test_decoding_in_the_wait_bounds_the_hidden_step_by_the_cores_left_to_the_job() -> None:
    # a core busy all step: 20 ms of model and 80 ms of decoding, another core's worth of other work
    cpu = whatif.JobCpu(cores_used=1.0, cpus=2, threads=1, other_cores=1.0)
    assert whatif.loading_cores(STEP, cpu) == pytest.approx(1.0)
    p = whatif.input_hidden(STEP, cpu)
    assert p.step_us == pytest.approx(100e3)   # 100 ms of CPU on the one core left: no gain
    assert "cannot do in less than 100 ms" in p.why
    idle_machine = whatif.JobCpu(cores_used=1.0, cpus=2, threads=1)
    assert whatif.input_hidden(STEP, idle_machine).step_us == pytest.approx(50e3)
    assert whatif.workers_needed(STEP, idle_machine) == math.ceil(80 / 50)


def test_the_cpu_a_step_costs_is_the_untraced_steps_not_the_traced_views() -> None:
    """In the traced view the step is the profiler's (here 150 ms where the job's own steps took
    100): a core busy all of an untraced step is 100 ms of CPU per step, not 150. Taken as 150,
    a decoding job's predicted steps with workers, in the traced view, read 1.13, 1.01 and 1.60
    times what the fix gave (benchmarks/predicted_vs_applied.py, 2026-11-27)."""
    traced = TimeBreakdown(step_time=150e3, compute=30e3, idle=120e3, input_wait=120e3)
    cpu = whatif.JobCpu(cores_used=1.0, cpus=2, threads=1, step_us=100e3)
    assert whatif.input_hidden_step(traced, cpu) == pytest.approx(50e3)
    assert "(100 ms of CPU per step)" in whatif.input_hidden(traced, cpu).why
    # without the untraced step, the view's is all there is
    assert whatif.input_hidden_step(traced, whatif.JobCpu(1.0, 2, 1)) == pytest.approx(75e3)


def test_waiting_runnable_for_a_core_counts_as_decoding_on_a_busy_machine() -> None:
    # half a core of CPU and half a core of waiting for one: the loading wanted a whole core
    busy = whatif.JobCpu(cores_used=0.5, cpus=2, threads=1, other_cores=1.5, runq_cores=0.5)
    assert whatif.loading_cores(STEP, busy) == pytest.approx(1.0)
    # without the waiting, the same CPU would read as a wait that is mostly not CPU work
    assert whatif.loading_cores(STEP, whatif.JobCpu(0.5, 2, 1, 1.5)) < whatif.CPU_LOADING
