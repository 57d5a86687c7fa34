"""What blind check 39 (and the demo) could not read: which step each prediction starts from
(three "today's steps" in one diagnosis), what to set prefetch_factor to, and why a loader whose
workers are busy making batches on full cores was told nothing to do, and a confidence "lowered
by -0.00"."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.analyzers import whatif
from gpudiag.analyzers.advice import recommend
from gpudiag.diagnosis import Bottleneck, JobTraits, Recommendation
from reports.views import not_helping_line, prediction_line
from tests.unit.test_advice_rules import FED, _fed, breakdown, inputs


def test_each_prediction_names_the_step_it_starts_from_and_the_report_line_says_it():
    """The workers' prediction is held by the cores, read over the untraced steps' mean (the
    host samples'); the view's own step is the unprofiled median or the traced mean. Each entry
    carries which, and the terminal and report line opens with it."""
    # the host samples read a 36 ms mean step where the view's median is 30 ms
    a = inputs(FED, traits=replace(_fed(1.2), cpu_step_s=0.036), label=Bottleneck.INPUT)
    out = recommend(replace(a, view_step=whatif.MEDIAN_UNTRACED))
    workers = next(r for r in out.advised if r.action == "dataloader-workers")
    assert workers.step_from == whatif.MEAN_UNTRACED, workers
    assert prediction_line(workers).startswith("mean untraced step 36 ms \u2192"), prediction_line(workers)
    for r in out.advised + out.not_advised:
        assert r.step_from == (whatif.MEAN_UNTRACED if r is workers else whatif.MEDIAN_UNTRACED), r
    traced = recommend(replace(inputs(breakdown(30e3, compute_bound=10e3)), view_step=whatif.MEAN_TRACED))
    for r in traced.advised + traced.not_advised:
        if r.predicted_step_s is not None:
            assert r.step_from == whatif.MEAN_TRACED, r
    told = Recommendation("x", "t", 0.008, "why", step_s=0.010, gain=0.2, step_from=whatif.MEDIAN_UNTRACED)
    assert not_helping_line(told).startswith("median untraced step 10 ms \u2192 \u2248 8 ms")
    # a file written before step_from reads as "step"
    assert prediction_line(replace(told, step_from="")).startswith("step 10 ms")


def test_more_workers_name_a_prefetch_factor_value():
    out = recommend(inputs(FED, traits=_fed(1.2), label=Bottleneck.INPUT))
    rec = next(r for r in out.advised if r.action == "dataloader-workers")
    assert "prefetch_factor at 2" in rec.text and "and prefetch_factor." not in rec.text, rec.text
    bare = recommend(inputs(FED, traits=JobTraits(training=True, optimizer=True, single_process_loader=True),
                            label=Bottleneck.INPUT))
    rec = next(r for r in bare.advised if r.action == "dataloader-workers")
    assert "prefetch_factor at 2" in rec.text, rec.text


def _workers(busy_s: float, n: int = 2) -> JobTraits:
    return JobTraits(training=True, optimizer=True, dataloader_workers=[n], cores_used=1.97, cpus=2,
                     intra_op_threads=1, other_cores=0.0, runq_cores=1.0, cpu_step_s=0.030,
                     workers_busy_s=busy_s)


def test_a_loader_whose_workers_are_busy_making_batches_is_told_to_make_them_cheaper():
    """Blind check 39's job a: two workers doing FFTs on 2 cores, each on a core or waiting for one
    most of the time. More workers were refused (no core for them) and the job was told nothing.
    Its batches are CPU work in its workers: cheaper batches are the fix, named with what a batch
    costs them. Workers asleep on storage (a tenth of their time busy) are not told that."""
    busy = recommend(inputs(FED, traits=_workers(0.055), label=Bottleneck.INPUT))
    actions = {r.action: r for r in busy.advised}
    assert "cheaper-input" in actions, [r.action for r in busy.advised + busy.not_advised]
    rec = actions["cheaper-input"]
    assert "55 ms a batch of its 2 workers' time" in rec.text, rec.text
    assert rec.predicted_step_s is None and "1/2 ms" in rec.why, rec.why
    asleep = recommend(inputs(FED, traits=_workers(0.006), label=Bottleneck.INPUT))
    assert "cheaper-input" not in {r.action for r in asleep.advised + asleep.not_advised}
    # no pace recorded (a run directory from before the step timer read the workers): not told
    old = recommend(inputs(FED, traits=replace(_workers(0.055), workers_busy_s=None), label=Bottleneck.INPUT))
    assert "cheaper-input" not in {r.action for r in old.advised + old.not_advised}


def test_a_deduction_that_rounds_to_nothing_is_not_printed_as_lowering_the_confidence():
    """The demo printed "Confidence lowered by: -0.00: step-time noise +-0.4%"."""
    from types import SimpleNamespace

    from gpudiag.diagnosis import Deduction
    from reports.views import confidence_lines

    v = SimpleNamespace(deductions=[Deduction("step-time noise", 0.004), Deduction("one step", 0.1)])
    assert confidence_lines(v) == ["\u22120.10: one step"]  # type: ignore[arg-type]


def test_long_steps_at_the_workers_period_are_named_as_the_workers_taking_turns():
    """Blind check 40: 2 workers asleep on storage gave steps of ~70 and ~5 ms in turn, and the
    warning said to call gpudiag.step() as if the loop's own step held two optimizer steps."""
    from gpudiag.analyzers.step_tail import Tail, text

    t = Tail(median_us=7.9e3, mean_us=37.5e3, long_steps=50, steps=100, extra_us=62e3,
             cpu_extra_us=0.4e3, sys_extra_us=0.2e3, periodic=True)
    said = text(t, [2])
    assert "the DataLoader's 2 workers take turns" in said and "gpudiag.step()" not in said, said
    assert "gpudiag.step()" in text(t, [4]) and "gpudiag.step()" in text(t)


def test_a_tie_is_not_called_across_a_margin_wider_than_any_step_noise_can_explain():
    """Blind check 40: "a tie between input-bound (86%) and memory-bound (8%): their margin is
    within the step-time noise (+-490%)": bimodal steps (workers taking turns) are no noise."""
    from gpudiag.analyzers.classify import TIE_NOISE_MAX, classify
    from gpudiag.diagnosis import Mfu, Roofline, TimeBreakdown

    b = TimeBreakdown(step_time=30e3, gpu_busy=3e3, compute=3e3, memory_bound=2.5e3, compute_bound=0.5e3,
                      idle=27e3, input_wait=26e3, host_overhead=1e3)
    roof = Roofline("shapes", 192e9, 17.8e9, 10.8, "fp32", 0, 0, 0)
    mfu = Mfu(0.01, "t", None, "shapes", "fp32", None, None)
    assert classify(b, device_kind="cpu", roofline=roof, mfu=mfu, n_steps=5, noise=4.9).tie_with is None
    close = TimeBreakdown(step_time=30e3, gpu_busy=13e3, compute=13e3, compute_bound=13e3, idle=17e3,
                          input_wait=15e3, host_overhead=2e3)
    v = classify(close, device_kind="cpu", roofline=roof, mfu=mfu, n_steps=5, noise=4.9)
    assert v.tie_with is not None and TIE_NOISE_MAX == 0.25, v


def test_workers_that_keep_up_but_hold_the_models_cores_are_told_to_make_batches_cheaper():
    """Blind check 41: 3 workers augmenting on 2 cores kept up (a 1.5% wait in next(loader))
    while the training thread waited ~20% of its step for the cores they held; the label read
    input-bound and nothing was advised. Caching the batches ran it 0.75x."""
    view = breakdown(99e3, input_wait=1.5e3, compute_bound=70e3)
    held = replace(inputs(view, traits=_workers(0.18, n=3), label=Bottleneck.INPUT), loader_held_us=19e3)
    rec = next((r for r in recommend(held).advised if r.action == "cheaper-input"), None)
    assert rec is not None and "waited 19 ms a step for cores they held" in rec.text, rec
    # the same job without that wait measured: a 1.5% wait is no input advice
    assert "cheaper-input" not in {r.action for r in recommend(replace(held, loader_held_us=0.0)).advised}
