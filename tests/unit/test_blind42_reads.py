"""What blind check 42 found gpudiag misreading, each on the smallest input that shows it.

- An MLP fed by a DataLoader in the training process (num_workers=0) whose samples each run
  ~100 small torch operators: the profiler's cost for those events sits inside the traced input
  wait (27 ms against 16.0 ms in the untraced steps, by the step timer and by the job's own), and
  kept whole it read input-bound (58%) where input was 34-35% of the step.
- That same job, at its real 34%: XProf's "20% of the step waiting for input is input-bound"
  named it input-bound over a model taking 65% of the step, which no count of workers sped up.
- Adam over 162 tensors of at most 64x64: a few optimizer calls of 20-80 us (against medians of
  2-7 us) counted as the loop's work on larger tensors, which compiling keeps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpudiag.analyzers.classify import classify
from gpudiag.analyzers.compile_facts import operator_work
from gpudiag.analyzers.trace_loader import load_rank
from gpudiag.analyzers.unprofiled import CpuEvents, estimate_unprofiled
from gpudiag.diagnosis import Bottleneck, Dilation, Mfu, Roofline, TimeBreakdown


def _dilation(traced_us: float, untraced_us: float, untraced_input_us: float | None) -> Dilation:
    return Dilation(traced_step_us=traced_us, untraced_step_us=untraced_us,
                    factor=traced_us / untraced_us, traced_steps=5, untraced_steps=18,
                    untraced_spread=0.06, model="test", untraced_input_us=untraced_input_us)


def _loader_job() -> TimeBreakdown:
    """Blind check 42's job2 as traced: 61.7 ms, of it 27 ms in next(loader), 32.7 ms of
    operators (its GEMMs 29 ms), 2 ms of gaps."""
    return TimeBreakdown(step_time=61.7e3, gpu_busy=32.7e3, compute=32.7e3, compute_bound=29.1e3,
                         memory_bound=3.6e3, idle=29e3, input_wait=27e3, host_overhead=2e3)


def test_an_in_process_loaders_events_leave_the_input_wait_at_its_untraced_length():
    traced = _loader_job()
    events = CpuEvents(recorded=8681, in_compute=100, slowed_us=3.9e3, dispatched=50, in_waits=8520)
    dil = _dilation(61.7e3, 46.9e3, 16.0e3)
    est, _ = estimate_unprofiled(traced, dil, "cpu", events)
    assert abs(est.input_wait - 16.0e3) < 1.0, est
    assert est.compute > 25e3 and abs(est.step_time - 46.9e3) < 1.0, est
    assert "the DataLoader's own 8520 events" in dil.caveats[0]
    assert dil.caveats[0].endswith("the compute/host split moves with it")
    assert "the input wait is the untraced steps' own" in dil.caveats[0]
    # without the step timer's measure, or without the loader's events in the wait, as before
    for untraced, in_waits in ((None, 8520.0), (16.0e3, 0.0)):
        d = _dilation(61.7e3, 46.9e3, untraced)
        e = CpuEvents(recorded=8681, in_compute=100, slowed_us=3.9e3, dispatched=50, in_waits=in_waits)
        est, _ = estimate_unprofiled(traced, d, "cpu", e)
        assert est.input_wait == traced.input_wait, est
        assert any("keeps its length" in c for c in d.caveats), d.caveats


def test_on_a_cpu_the_label_is_the_largest_share_however_long_the_input_wait():
    """XProf's rule (input at or above 20% of the step is input-bound) holds where the device
    idles while the batch is made; on a CPU the loading is the same cores' work as the model's."""
    b = TimeBreakdown(step_time=46.9e3, gpu_busy=28.8e3, compute=28.8e3, compute_bound=25.7e3,
                      memory_bound=3.1e3, idle=18.1e3, input_wait=16.0e3, host_overhead=2.1e3)
    roof = Roofline("shapes", 192e9, 17.8e9, 10.8, "fp32", 0, 0, 0)
    mfu = Mfu(0.24, "t", None, "shapes", "fp32", None, None)
    cpu = classify(b, device_kind="cpu", roofline=roof, mfu=mfu, n_steps=5, noise=0.03)
    gpu = classify(b, device_kind="gpu", roofline=roof, mfu=mfu, n_steps=5, noise=0.03)
    assert cpu.label is Bottleneck.COMPUTE and cpu.secondary is Bottleneck.INPUT, cpu
    assert gpu.label is Bottleneck.INPUT, gpu


def test_an_optimizer_call_slow_in_one_step_is_not_work_its_tensor_does_each_step(tmp_path: Path):
    """Four calls a step on four tensors, three steps; the third tensor's call is longer every
    step (work: 8 us a step over the fastest), the second's once (60 us: a preemption)."""
    events, t, starts = [], 0.0, []
    for step in range(3):
        starts.append(t)
        for dur in (2.0, 60.0 if step == 1 else 2.0, 10.0, 2.0):
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::div", "pid": 1, "tid": 1,
                           "ts": t, "dur": dur, "args": {}})
            t += dur + 5
        t += 100
    path = tmp_path / "rank-0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    rt = load_rank(path)
    calls = np.flatnonzero(rt.cpu_is_op)
    assert calls.size == 12
    assert operator_work(rt, calls, np.array(starts)) == 3 * 8.0


def test_workers_get_no_step_from_cores_measured_in_another_regime_than_the_window():
    """Blind check 42's busy profile: the run's untraced steps averaged 1,365 ms (two intra-op
    threads spinning while another session loaded the machine), the steps around the window
    43 ms; a step predicted from the run's cores said -26% and a worker ran 1.06-1.09x."""
    from dataclasses import replace

    from gpudiag.analyzers.advice import recommend
    from gpudiag.analyzers.advice_text import REGIME_X
    from tests.unit.test_advice_rules import FED, _fed, inputs

    def workers(reference_mean_us: float | None):
        out = recommend(replace(inputs(FED, traits=_fed(1.2), label=Bottleneck.INPUT),
                                reference_mean_us=reference_mean_us))
        return next(r for r in out.advised + out.not_advised if r.action == "dataloader-workers")

    # the host samples' steps: 30 ms (_fed's cpu_step_s)
    assert workers(None).predicted_step_s is not None
    assert workers(31e3).predicted_step_s is not None
    for other in (30e3 / (REGIME_X + 0.5), 30e3 * (REGIME_X + 0.5)):
        rec = workers(other)
        assert rec.predicted_step_s is None and "another regime" in rec.why, rec
