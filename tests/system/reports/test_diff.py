"""gpudiag diff does not cry wolf: a step-time change is called only when it is larger than noise.

The statistics (analyzers/compare.step_change) are checked on synthetic samples whose truth is
known (same distribution, a known shift), and end to end on real CPU runs of one small job
under ``gpudiag profile``: the same job twice reads "no significant change", the same job with
an injected per-step sleep reads "significantly slower". Trace-only inputs must say that they
cannot tell noise from change.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpudiag.analyzers.compare import MIN_STEPS, NO_CHANGE, compare, mann_whitney_p, step_change
from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck, Diagnosis, Dilation, TimeBreakdown, Verdict
from tests.conftest import SHARED
from tests.paths import REPO

FIXTURES = REPO / "tests" / "fixtures" / "h200"
LOOP_JOB = REPO / "tests" / "jobs" / "loop_job.py"


def steps(rng: np.random.Generator, n: int, median_s: float, sigma: float) -> list[float]:
    """Step times with a long right tail, as real steps have: lognormal around ``median_s``."""
    return list(median_s * rng.lognormal(0.0, sigma, n))


# --- the statistics on samples of known truth -------------------------------------------------

@pytest.mark.parametrize("sigma", [0.01, 0.05, 0.3])
@pytest.mark.parametrize("n", [MIN_STEPS, 12, 60])
def test_same_distribution_reads_no_significant_change_in_95_percent_of_seeds(sigma, n):
    calls = [step_change(steps(np.random.default_rng(2 * s), n, 0.03, sigma),
                         steps(np.random.default_rng(2 * s + 1), n, 0.03, sigma)) for s in range(200)]
    assert all(c is not None for c in calls)
    false_alarms = sum(c.significant for c in calls if c is not None)
    assert false_alarms <= 10, f"{false_alarms} of 200 pairs from one distribution called significant"
    assert all(c.direction == NO_CHANGE for c in calls if c is not None and not c.significant)


@pytest.mark.parametrize("shift, direction", [(0.05, "slower"), (-0.05, "faster")])
def test_five_percent_shift_with_low_noise_is_significant_and_its_interval_holds_it(shift, direction):
    covered = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        sc = step_change(steps(rng, 40, 0.03, 0.01), steps(rng, 40, 0.03 * (1 + shift), 0.01))
        assert sc is not None and sc.significant and sc.direction == direction, (seed, sc)
        assert abs(sc.change - shift) < 0.01
        covered += sc.ci_low <= shift <= sc.ci_high
    assert covered >= 0.9 * 60, f"the 95% interval held the true shift in only {covered} of 60 runs"


def test_a_shift_below_the_run_to_run_floor_is_not_called_however_tight_the_interval():
    rng = np.random.default_rng(7)
    sc = step_change(steps(rng, 2000, 0.03, 0.001), steps(rng, 2000, 0.0303, 0.001))  # +1%
    assert sc is not None and sc.ci_low > 0  # the interval alone would call it
    assert not sc.significant and sc.direction == NO_CHANGE


def test_a_shift_within_a_noisy_runs_own_spread_is_not_called():
    rng = np.random.default_rng(3)
    quiet = steps(rng, 300, 0.03, 0.005)
    noisy = steps(rng, 300, 0.0315, 0.15)  # +5%, but the run's steps spread by ~±10%
    sc = step_change(quiet, noisy)
    assert sc is not None and sc.noise_floor > 0.05 and not sc.significant


def test_too_few_steps_give_no_judgement():
    assert step_change([0.03] * (MIN_STEPS - 1), [0.03] * 50) is None


def test_mann_whitney_matches_the_hand_computed_value():
    # U = 0 for [1,2,3] vs [4,5,6]; mean 4.5, variance 3*3*7/12 = 5.25; continuity-corrected
    # z = (4.5 - 0.5) / sqrt(5.25); two-sided p = erfc(z / sqrt(2))
    expected = math.erfc((4.5 - 0.5) / math.sqrt(5.25) / math.sqrt(2))
    assert mann_whitney_p(np.array([1.0, 2, 3]), np.array([4.0, 5, 6])) == pytest.approx(expected)
    assert mann_whitney_p(np.array([1.0, 1, 1]), np.array([1.0, 1, 1])) == 1.0  # all tied


# --- compare() on diagnoses ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemm():
    return diagnose(FIXTURES / "gemm_bf16", jobs=1)


def with_estimate(d, label: Bottleneck, traced_label: Bottleneck, untraced_ms: float):
    """A real diagnosis given the unprofiled view the analysis adds for run directories."""
    d = copy.deepcopy(d)
    b = d.breakdown
    d.basis = "unprofiled-estimate"
    d.unprofiled = TimeBreakdown(**{**b.__dict__, "step_time": untraced_ms * 1e3,
                                    "host_overhead": 0.0, "idle": 0.0})
    d.dilation = Dilation(b.step_time, untraced_ms * 1e3, b.step_time / (untraced_ms * 1e3), 5, 100, 0.02,
                          "test model")
    d.traced_verdict = copy.deepcopy(d.verdict)
    d.traced_verdict.label = traced_label
    d.verdict = Verdict(label, 0.8, "high", "s", {}, None, [])
    return d


def test_run_dirs_compare_unprofiled_estimates_and_trace_only_cannot_tell(gemm):
    before = with_estimate(gemm, Bottleneck.MEMORY, Bottleneck.HOST, 10.0)
    after = with_estimate(gemm, Bottleneck.COMPUTE, Bottleneck.HOST, 10.1)
    rng = np.random.default_rng(0)
    diff = compare(before, after, steps(rng, 50, 0.010, 0.02), steps(rng, 50, 0.0101, 0.02))
    assert diff.basis == "unprofiled-estimate"
    assert (diff.label_before, diff.label_after) == (Bottleneck.MEMORY, Bottleneck.COMPUTE)
    assert diff.before.step_time == before.unprofiled.step_time
    assert diff.step_change is not None and not diff.step_change.significant
    assert NO_CHANGE in diff.step_time_verdict
    # a trace on one side: like for like as traced, and no judgement on noise
    mixed = compare(before, gemm)
    assert mixed.basis == "profiled-steps" and mixed.step_change is None
    assert mixed.label_before == Bottleneck.HOST  # before's traced label, not its estimate's
    assert "cannot tell noise from change" in mixed.step_time_verdict
    assert json.loads(mixed.to_json())["step_change"] is None


def test_a_run_whose_traced_steps_the_os_interrupted_is_named(gemm):
    """The operator table compares traced times; a busy machine's slices slow every operator
    (a chain job beside a spinning process: its matmuls +49.6 ms per step), so the run whose
    traced steps lost time to the OS is named in the notes."""
    busy = copy.deepcopy(gemm)
    busy.breakdown.host_stalled = 0.1 * busy.breakdown.step_time
    notes = compare(gemm, busy).notes
    assert any(n.startswith("the after run's traced steps lost 10.0% to the OS") for n in notes), notes
    assert not any("OS" in n for n in compare(gemm, gemm).notes)


# --- end to end: real runs of one CPU job ---------------------------------------------------------

def profile(out: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "gpudiag", "profile", "--out", str(out), "--skip", "2",
                             "--steps", "3", "--", sys.executable, str(LOOP_JOB), "--steps", "60",
                             "--sleep", str(sleep)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)


def gpudiag_diff(before: Path, after: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "diff", str(before), str(after), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same job twice and once with 10 ms more sleep per step, run at the same time so that
    whatever else loads this machine loads all three alike. The base step sleeps 10 ms, so the
    job's compute (about 1 ms on a CPU) and its jitter are a small part of each step."""
    root = tmp_path_factory.mktemp("diff-runs")
    plan = {"base": 0.010, "again": 0.010, "slower": 0.020}
    procs = {name: profile(root / name, sleep) for name, sleep in plan.items()}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
    return {name: root / name for name in plan}


def spread(run: Path) -> str:
    """The untraced steps' 5/25/50/75/95th percentiles (ms), for a failure message."""
    from gpudiag.steps import step_times

    st = step_times(run)
    return f"{run.name}: {np.percentile(np.array(st.untraced) * 1e3, [5, 25, 50, 75, 95]).round(2)} ms"


def test_same_job_twice_reads_no_significant_change(runs):
    d = gpudiag_diff(runs["base"], runs["again"])
    # breakdowns and labels are the unprofiled estimates' where both runs could trust theirs
    # (a reference around the window that the machine's load did not move), else the traced ones
    trusted = all(Diagnosis.from_json((runs[n] / "diagnosis.json").read_text()).basis
                  == "unprofiled-estimate" for n in ("base", "again"))
    assert d["basis"] == ("unprofiled-estimate" if trusted else "profiled-steps")
    # judged at each run's own pace (issue 38): the other lanes of `make test` and whatever else
    # runs on the machine load the two runs differently, which the wall clock would count
    sc = d["own_pace_change"]
    assert sc is not None and sc["before_steps"] >= 40 and sc["after_steps"] >= 40, d["step_time_verdict"]
    assert sc["significant"] is False and sc["direction"] == NO_CHANGE, \
        f"{d['step_time_verdict']}; {spread(runs['base'])}; {spread(runs['again'])}"
    assert d["step_time_verdict"].startswith("At the job's own pace: ")
    assert NO_CHANGE in d["step_time_verdict"].split(". By wall clock")[0]
    assert d["step_change"] is not None and not d["warnings"]  # the wall clock's, beside it


def test_job_with_injected_sleep_reads_significantly_slower(runs):
    d = gpudiag_diff(runs["base"], runs["slower"])
    sc = d["own_pace_change"]
    assert sc["significant"] is True and sc["direction"] == "slower", d["step_time_verdict"]
    assert sc["ci_low"] > 0.3  # 10 ms on top of an ~11 ms step
    # by wall clock too, unless the machine's load hid it (seen at load 20: +14.5%, noise ±40%)
    assert d["step_change"]["direction"] != "faster", d["step_time_verdict"]
    assert "significantly slower" in d["step_time_verdict"]


def test_trace_only_diff_says_it_cannot_tell_noise_from_change(runs):
    d = gpudiag_diff(runs["base"] / "traces", runs["again"] / "traces")
    assert d["basis"] == "profiled-steps" and d["step_change"] is None
    assert "cannot tell noise from change" in d["step_time_verdict"]


def test_real_h100_run_dirs_diff_from_their_step_timers():
    gpt, resnet = SHARED / "runs" / "h100-gpt-small", SHARED / "runs" / "h100-resnet18-dl8"
    if not gpt.is_dir():
        pytest.fail(f"test data missing: {gpt} (CI lays ../shared beside the repository)")
    d = gpudiag_diff(gpt, gpt)
    assert d["basis"] == "unprofiled-estimate" and d["step_change"]["change"] == 0.0
    # recorded before the step timer read schedstat: by wall clock, and the diff says so
    assert d["own_pace_change"] is None and len(d["warnings"]) == 2
    assert all("recorded no split of its steps" in w for w in d["warnings"])
    assert "Compared by wall clock only" in d["step_time_verdict"]
    assert d["step_change"]["significant"] is False and d["label_before"] == d["label_after"]
    # the untraced median of each job, not its dilated traced step (README: 28.8 ms alone)
    assert d["step_change"]["before_median_us"] == pytest.approx(28_800, rel=0.01)
    # the diff's "noise ±": half the IQR over the median of the run's untraced steps (the whole
    # run's, rank 0: the report's is of the steps around the traced window only)
    from gpudiag.analyzers.stats import iqr_over_median
    from gpudiag.steps import step_times

    spread = iqr_over_median(step_times(gpt).untraced)
    assert d["step_change"]["noise_floor"] == pytest.approx(max(0.02, spread / 2))
    other = gpudiag_diff(gpt, resnet)
    assert other["step_change"]["after_median_us"] < other["step_change"]["before_median_us"]


def test_a_label_its_run_called_a_tie_is_printed_with_the_tie():
    """Blind check 34: `diff` printed "unchanged, compute-bound" where the AFTER run's own report
    said "a tie with communication-bound"; the tie is now carried (``tie_after``) and printed."""
    from gpudiag.reports.terminal import render_diff_terminal

    gpt = SHARED / "runs" / "h100-gpt-small"
    if not gpt.is_dir():
        pytest.fail(f"test data missing: {gpt} (CI lays ../shared beside the repository)")
    before = diagnose(gpt)
    other = next(b for b in Bottleneck if b is not before.verdict.label)
    after = copy.deepcopy(before)
    after.verdict.tie_with = other
    d = compare(before, after)
    assert d.tie_before is None and d.tie_after is other
    text = render_diff_terminal(d)
    assert f"-> {before.verdict.label.value} (a tie with {other.value})" in text, text
    assert "Median step" not in text  # traces alone: no step timer, no medians
    assert "Label" in text and "unchanged" not in text.split("Label")[1].splitlines()[0]


def test_the_diff_prints_the_medians_its_percentages_compare_and_which_steps_they_are():
    """Blind check 37 read a diff's own pace beside each run's diagnosis (23.6 against 25.4 ms)
    and nothing said which steps either was of: the terminal gives both medians, at the job's
    own pace and by wall clock, and says a diagnosis reads the steps around its window."""
    from gpudiag.reports.terminal import render_diff_terminal

    gpt = SHARED / "runs" / "h100-gpt-small"
    if not gpt.is_dir():
        pytest.fail(f"test data missing: {gpt} (CI lays ../shared beside the repository)")
    d = compare(diagnose(gpt), diagnose(gpt))
    before = [0.0189 * (1 + 0.01 * (i % 3)) for i in range(60)]
    d = dataclasses.replace(d, step_change=step_change(before, [x * 1.546 for x in before], floor=0.05),
                            own_pace_change=step_change(before, [x * 1.096 for x in before], floor=0.05))
    text = render_diff_terminal(d).replace("\n  ", " ")
    assert ("Median step: 19.1 ms -> 20.9 ms at the job's own pace, 19.1 ms -> 29.5 ms by wall clock "
            "(the untraced steps the verdict compares; a run's diagnosis reads the steps around its "
            "traced window)") in text, text
