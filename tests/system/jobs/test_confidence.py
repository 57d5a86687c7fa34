"""Confidence that carries every caveat, ties within noise, a reference the machine cannot fool,
and peaks that load cannot lower: the rules, on the values they are defined on.

The end-to-end behaviour on real jobs is in test_diagnosis_fit.py and test_unprofiled.py; these
check each rule's arithmetic where a real run cannot pick the case (a tie of exactly known
shares, a load change of a known size), on the same dataclasses a run produces.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpudiag.analyzers.classify import CONFIDENCE_BASE, CONFIDENCE_MIN, classify, with_deductions
from gpudiag.analyzers.unprofiled import (
    LOAD_CHANGE_MAX,
    PENALTY_ONE_SIDE,
    PENALTY_PROPORTIONAL_MAX,
    PENALTY_TRACED_VIEW,
    TRUST_SHARE,
    measure_dilation,
)
from gpudiag.diagnosis import Bottleneck, Deduction, Mfu, Roofline, TimeBreakdown
from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps

ROOFLINE = Roofline("shapes", 1e12, 1e11, 10.0, "fp32", 0.0, 0.0, 0.0)
MFU = Mfu(None, "n/a", None, "none", None, None, None)


def step(compute_bound: float, memory_bound: float, host: float) -> TimeBreakdown:
    c = compute_bound + memory_bound
    return TimeBreakdown(step_time=c + host, gpu_busy=c, compute=c, compute_bound=compute_bound,
                         memory_bound=memory_bound, idle=host, host_overhead=host)


def verdict(b: TimeBreakdown, noise: float | None = None, deductions: list[Deduction] | None = None):
    return classify(b, device_kind="gpu", roofline=ROOFLINE, mfu=MFU, n_steps=5, noise=noise,
                    deductions=deductions)


def test_a_margin_within_the_step_time_noise_is_a_tie_of_the_two_labels():
    b = step(compute_bound=10, memory_bound=46, host=44)  # memory 46% vs host 44%
    tie = verdict(b, noise=0.05)
    assert tie.label is Bottleneck.MEMORY and tie.tie_with is Bottleneck.HOST
    assert "a tie between memory-bound (46%) and host-bound (44%)" in tie.summary
    clear = verdict(b, noise=0.01)
    assert clear.tie_with is None and "tie" not in clear.summary


def test_each_caveat_lowers_the_confidence_by_its_stated_amount():
    b = step(compute_bound=10, memory_bound=60, host=30)  # margin 0.30
    plain = verdict(b)
    assert plain.confidence == pytest.approx(CONFIDENCE_BASE + 0.30)
    costs = [Deduction("noise", 0.07), Deduction("fallback", PENALTY_TRACED_VIEW)]
    lowered = verdict(b, deductions=costs)
    assert lowered.confidence == pytest.approx(plain.confidence - 0.07 - PENALTY_TRACED_VIEW)
    assert [d.reason for d in lowered.deductions] == ["noise", "fallback"]
    more = with_deductions(lowered, [Deduction("lost events", 0.05)])
    assert more.confidence == pytest.approx(lowered.confidence - 0.05) and len(more.deductions) == 3
    assert with_deductions(plain, [Deduction("a lot", 5.0)]).confidence == CONFIDENCE_MIN


def windows(before: list[float], traced: list[float], after: list[float]) -> list[WindowSteps]:
    rows = [StepRow(step=i, t=0.0, dt=x) for i, x in enumerate(before + traced + after)]
    nb, nt = len(before), len(traced)
    return [WindowSteps(0, rows[nb:nb + nt], rows[:nb], rows[nb + nt:])]


def test_a_reference_around_the_window_that_agrees_is_trusted():
    dil, cost = measure_dilation(20_000.0, windows([0.010] * 10, [0.020] * 5, [0.0101] * 10))
    assert dil.trusted and dil.factor == pytest.approx(20_000 / 10_050, rel=0.01)
    assert dil.before_step_us == pytest.approx(10_000) and dil.after_step_us == pytest.approx(10_100)
    assert cost == []


def test_load_that_changed_across_the_window_falls_back_to_the_traced_view():
    """Before the window the job ran 2x slower (another process), after it at its own pace:
    neither side is known to be the traced steps' pace."""
    dil, cost = measure_dilation(25_000.0, windows([0.020, 0.021] * 5, [0.025] * 5, [0.010, 0.0102] * 5))
    assert not dil.trusted and dil.load_change > LOAD_CHANGE_MAX
    reasons = " | ".join(d.reason for d in cost)
    assert "pace changed across the traced window" in reasons and "used as is" in reasons
    change = next(d for d in cost if "pace changed" in d.reason)
    # in proportion, up to its cap
    assert change.amount == pytest.approx(min(PENALTY_PROPORTIONAL_MAX, dil.load_change), abs=0.001)


def test_an_unsteady_reference_still_stands_where_the_profiler_dwarfed_its_noise():
    """A tiny-op job slowed 11x: a reference +-20% noisy is far closer than the traced steps."""
    ref = [0.0010, 0.0013, 0.0009, 0.0015, 0.0011] * 2
    dil, _ = measure_dilation(12_000.0, windows(ref, [0.012] * 5, ref))
    assert dil.untraced_spread > 0.25 and dil.trusted
    small, _ = measure_dilation(1_300.0, windows(ref, [0.0013] * 5, ref))  # a 1.1x correction
    assert not small.trusted and small.untraced_spread / 2 > TRUST_SHARE * abs(small.factor - 1)


def test_a_reference_slower_than_the_traced_steps_is_not_scaled_by():
    dil, cost = measure_dilation(10_000.0, windows([0.015] * 10, [0.010] * 5, [0.015] * 10))
    assert not dil.trusted and any("slower than the traced ones" in d.reason for d in cost)


def test_the_cpu_peak_cache_is_keyed_by_library_versions_and_is_a_floor(tmp_path):
    """A cache written under other library versions is measured again; a job's faster rate
    raises the cached peak, a slower one never lowers it (real measurement, ~2 s)."""
    env = {**os.environ, "GPUDIAG_CACHE_DIR": str(tmp_path)}
    code = ("from gpudiag.collectors.cpu_peak import cpu_peak, raise_floor, cache_path\n"
            "import json, sys\n"
            "d = cpu_peak()\n"
            "raise_floor({k: float(v) for k, v in json.loads(sys.argv[1]).items()})\n"
            "print(json.dumps({'first': d.flops, 'cache': json.loads(cache_path().read_text())}))")
    stale = {"version": 3, "model": "x", "cores": os.cpu_count(), "libraries": {"torch": "0.0"},
             "flops": {"fp32": 1.0}, "bandwidth": 1.0}
    (tmp_path / "cpu_peak.json").write_text(json.dumps(stale))
    out = json.loads(subprocess.run([sys.executable, "-c", code, json.dumps({"fp32": 1e18, "bf16": 1.0})],
                                    env=env, capture_output=True, text=True, check=True, timeout=120).stdout)
    first, cache = out["first"], out["cache"]
    assert first["fp32"] > 1e9 and cache["libraries"]["torch"] != "0.0"  # measured again, here
    assert {"fp32", "bf16", "fp16"} <= set(first)
    assert cache["flops"]["fp32"] == 1e18  # raised (raise_floor has no plausibility bound itself)
    assert cache["flops"]["bf16"] == first["bf16"]  # never lowered


def test_jobs_started_together_on_a_fresh_machine_measure_the_cpu_peak_once(tmp_path):
    """Two processes needing the peak at once, with no cache: one measures, the other waits for
    the cache's lock and reads the same figures (each measuring cost ~21 s of CPU on 2 cores,
    three at once under the local scheduler). Measured figures are best-of-runs floats: two
    measurements never agree to the last bit."""
    env = {**os.environ, "GPUDIAG_CACHE_DIR": str(tmp_path)}
    code = ("import json\n"
            "from gpudiag.collectors.cpu_peak import cpu_peak\n"
            "d = cpu_peak()\n"
            "print(json.dumps([d.flops, d.bandwidth]))")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] and outs[0][0]["fp32"] > 1e9, outs


def test_a_cached_cpu_peak_is_looked_up_without_importing_torch(tmp_path):
    """gpudiag profile looks the peak up at exit, in a process that has no other use for torch:
    the cache key reads torch's version from its installed metadata (importing torch to read it
    cost 1.5 s of CPU on the 2-core AMD EPYC), and it is the version the import reports."""
    env = {**os.environ, "GPUDIAG_CACHE_DIR": str(tmp_path)}
    code = ("import sys\n"
            "from gpudiag.collectors.cpu_peak import cache_key\n"
            "key = cache_key()\n"
            "print('torch' in sys.modules, key['libraries']['torch'])\n"
            "import torch\n"
            "print(torch.__version__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=120).stdout.split()
    assert out[0] == "False" and out[1] == out[2], out


def _gpu_windows(before, after, later=(), attached=True, outside=(None, None)):
    (w,) = windows(before, [0.060] * 5, after)
    step = len(before) + 5 + len(after)
    w.later_rows = [StepRow(step + i + 1, 1000.0 + i, dt) for i, dt in enumerate(later)]
    w.cupti_attached, (w.outside_before, w.outside_after) = attached, outside
    return [w]


def test_steps_after_the_window_slowed_by_cupti_are_left_out_only_when_the_observer_explains_it():
    before, after = [0.028, 0.0285] * 4, [0.035, 0.0355] * 5
    dil, _ = measure_dilation(60_000.0, _gpu_windows(before, after, later=[0.036] * 5), "gpu")
    assert dil.left_out and dil.untraced_steps == 8 and dil.untraced_step_us == pytest.approx(28_250)
    # CUPTI torn down, a CPU job, a machine that got busier, a job whose own pace moved on (the
    # steps beyond faster than both sides, as a DataLoader warming up): both sides
    for kw, kind in (({"attached": False}, "gpu"), ({}, "cpu"), ({"outside": (0.1, 3.0)}, "gpu"),
                     ({"later": [0.020] * 5}, "gpu")):
        dil, _ = measure_dilation(60_000.0, _gpu_windows(before, after, **kw), kind)
        assert dil.left_out is None and dil.untraced_steps == 18, (kw, kind)


def test_steps_after_the_window_slowed_for_a_while_are_left_out_where_both_sides_of_them_agree():
    """The after side slower, the steps beyond it back at the pace before the window: on a CPU
    job (the trace export's aftermath on a shared core, tests/system/alone/test_diagnosis_fit.py) and on a
    GPU job whose CUPTI was torn down alike, the before side is the reference; it says why."""
    before, after = [0.028, 0.0285] * 4, [0.035, 0.0355] * 5
    for kw, kind in (({"attached": False}, "gpu"), ({}, "cpu"), ({"outside": (0.1, 3.0)}, "cpu")):
        dil, _ = measure_dilation(60_000.0, _gpu_windows(before, after, later=[0.029] * 5, **kw), kind)
        assert dil.left_out and "came back to 29 ms" in dil.left_out, (kw, kind)
        assert dil.untraced_steps == 8 and dil.untraced_step_us == pytest.approx(28_250), (kw, kind)
    # too few steps beyond to tell, or still slow there on a CPU job: both sides, as before
    for later in ([0.029] * 2, [0.035] * 5):
        dil, _ = measure_dilation(60_000.0, _gpu_windows(before, after, later=later), "cpu")
        assert dil.left_out is None and dil.untraced_steps == 18, later


def test_steps_before_the_window_still_warming_up_are_left_out_where_the_steps_after_agree():
    """Blind check 16's 2.6 ms job, its first steps 20-100 ms: the default window after 10 steps
    had 5.2 ms steps before it and 2.7 ms after, and fell back to its traced steps (9.9-11.5 ms).
    Steps before the window that fell across their side, with the steps beyond the after side at
    the after side's pace, are the job warming up: the reference is the after side, and says so.
    A before side slow throughout (a load that left), or steps beyond that do not agree: both
    sides, as before."""
    warm = [0.008, 0.007, 0.006, 0.005, 0.003, 0.0029, 0.0028, 0.0027]
    after = [0.0027, 0.0028] * 5
    dil, cost = measure_dilation(9_000.0, _gpu_windows(warm, after, later=[0.0027] * 5), "cpu")
    assert dil.left_out_side == "before" and "still warming up" in dil.left_out, dil.left_out
    assert "falling from 6.5 to 2.85 ms" in dil.left_out, dil.left_out
    assert dil.untraced_steps == 10 and dil.untraced_step_us == pytest.approx(2_750), dil
    assert dil.reference.startswith("the 10 untraced steps just after the traced window only")
    assert dil.trusted and [d.amount for d in cost] == [PENALTY_ONE_SIDE]
    for before, later in (([0.005] * 8, [0.0027] * 5), (warm, [0.005] * 5), (warm, [0.0027] * 2)):
        dil, _ = measure_dilation(9_000.0, _gpu_windows(before, after, later=later), "cpu")
        assert dil.left_out is None and dil.untraced_steps == 18, (before, later)


def _cpu_step(compute: float, host: float, stalled: float) -> TimeBreakdown:
    """A traced CPU step (us): operators, and host gaps of which ``stalled`` other processes took."""
    return TimeBreakdown(step_time=compute + host, gpu_busy=compute, compute=compute, compute_bound=compute,
                         idle=host, host_overhead=host, host_stalled=stalled)


def test_an_estimate_scaled_from_a_window_busier_than_its_reference_says_so_and_loses_confidence():
    """The split of the estimate comes from the traced window: where other processes took half
    of each traced step and almost nothing of the untraced ones (a CI clone beside the suite: a
    small-ops job read host-bound at confidence 0.78 so, where its quiet runs read compute-bound),
    the view carries a deduction of twice the window's share less what the untraced steps' share
    already costs; a window a tenth busy beside a quiet reference pays 0.2 less that (it was
    charged nothing from under 10 points above the reference, and one busy loop then gave the
    small-ops job two labels at "medium"); a window as quiet as its reference, none."""
    from gpudiag.analyzers.step_view import UNPROFILED, choose_view

    def view(stalled_us: float):
        # own-pace rows: 5 ms steps around the window, 0.1 ms of each taken by the machine
        rows = [StepRow(step=i, t=0.0, dt=0.005, machine_s=0.0001) for i in range(20)]
        w = [WindowSteps(0, [StepRow(step=100 + i, t=0.0, dt=0.008) for i in range(5)], rows[:10], rows[10:])]
        return choose_view(_cpu_step(3_000.0, 5_000.0 + stalled_us, stalled_us), [], w, "cpu")

    busy, tenth, quiet = view(8_000.0), view(8_000.0 / 9), view(0.0)
    assert busy.basis == tenth.basis == quiet.basis == UNPROFILED
    reference = 2 * 0.1 / 5.1   # what classify charges the estimate's step, twice its 2%
    (d,) = [x for x in busy.deductions if "busier stretch" in x.reason]
    assert "took 50% of the traced steps and 2% of the untraced" in d.reason, d.reason
    assert d.amount == pytest.approx(0.5 - reference, abs=0.002)   # at most 0.5 in all
    (d,) = [x for x in tenth.deductions if "busier stretch" in x.reason]
    assert "took 10% of the traced steps" in d.reason, d.reason
    assert d.amount == pytest.approx(0.2 - reference, abs=0.002)
    assert not [x for x in quiet.deductions if "busier stretch" in x.reason]
