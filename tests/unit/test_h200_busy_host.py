"""An H200 LM quiet and beside two busy loops per host core (issue 38 on a GPU), 2026-11-30.

``tests/fixtures/h200-2026-11-30`` holds two ``gpudiag profile`` run directories of the same job
(``benchmarks/gpu_session.py --plan pace1``: ``gpu_realistic.py --kind lm``, 120 steps, gpudiag's
defaults), one on the quiet machine and one beside 32 busy loops on its 16 cores, each with the
job's own report, and the job's own reports of the same two conditions without gpudiag. The
busy loops made the job 2.5x slower by its own timer (27.1 -> 67.7 ms a step alone, 25.6 ->
72.0 ms profiled): its host thread waits for a core between launches. The truth a busy reading
is held to is the quiet run's: the job did the same work on the same GPU.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudiag.analyzers.diagnose import device_busy_s, diagnose
from gpudiag.cli import main
from gpudiag.commands.profile_signals import signal_fields
from gpudiag.diagnosis import Bottleneck, Diagnosis
from gpudiag.pace import at_own_pace
from gpudiag.rundir import read_bootstrap, read_host_cpu, read_steps
from tests.paths import REPO, TESTS

FIXTURES = TESTS / "fixtures" / "h200-2026-11-30"
BF16_PEAK = 989.4e12  # the H200's dense bf16 peak in gpudiag's device table


def own_timer_s(report: Path, first: int = 20) -> float:
    """The median of the job's own CUDA-synchronised steps from step ``first`` on."""
    return statistics.median(json.loads(report.read_text())["step_seconds"][first:])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Diagnosis]]:
    """Both runs copied (the fixtures stay read-only) and diagnosed from their traces."""
    out = {}
    for name in ("quiet", "busy"):
        copy = tmp_path_factory.mktemp(name) / name
        shutil.copytree(FIXTURES / name, copy)
        out[name] = (copy, diagnose(copy, jobs=1))
    return out


def test_the_busy_loops_made_the_h200_job_slower_by_its_own_timer() -> None:
    """The premise: by the job's own timer, alone and profiled, the loops slowed it 2x or more."""
    for busy, quiet in (("busy_alone_report.json", "quiet_alone_report.json"),
                        ("busy/job_report.json", "quiet/job_report.json")):
        assert own_timer_s(FIXTURES / busy) > 2 * own_timer_s(FIXTURES / quiet)


def test_an_h200_lm_beside_busy_loops_reads_the_quiet_runs_label_and_mfu(runs) -> None:
    """One job, one label and one MFU: beside the loops the diagnosis reads the quiet run's label
    and its MFU within 10%, and within 10% of the analytic MFU at the quiet run's own timer; the
    wall-clock MFU is shown beside it, with the machine's part, where they differ."""
    (_, quiet), (busy_dir, busy) = runs["quiet"], runs["busy"]
    assert busy.verdict.label == quiet.verdict.label == Bottleneck.MEMORY
    assert busy.mfu.value == pytest.approx(quiet.mfu.value, rel=0.10)
    flops = json.loads((busy_dir / "job_report.json").read_text())["analytic_flops_per_step"]
    analytic = flops / own_timer_s(FIXTURES / "quiet" / "job_report.json") / BF16_PEAK
    assert busy.mfu.value == pytest.approx(analytic, rel=0.10)
    assert busy.mfu.wall_value is not None and busy.mfu.wall_value < 0.6 * busy.mfu.value
    assert "other processes" in busy.mfu.pace


def test_diff_of_the_h200_lm_quiet_and_busy_reads_no_change_at_its_own_pace(runs) -> None:
    """``gpudiag diff``: by wall clock significantly slower, at the job's own pace not, and the
    machine's part named in one line."""
    quiet_dir, busy_dir = runs["quiet"][0], runs["busy"][0]
    res = CliRunner().invoke(main, ["diff", str(quiet_dir), str(busy_dir), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["step_change"]["significant"] and d["step_change"]["direction"] == "slower"
    assert not d["own_pace_change"]["significant"]
    assert d["machine_note"].startswith("the machine was busier in AFTER: other processes took")


def test_a_gpu_steps_own_pace_never_reads_below_its_device_busy_time(runs) -> None:
    """The host's wait for a core overlaps the kernels it queued: before the traced window the
    busy run's steps read 14-20 ms at their own pace without the device's floor, under the
    21.6 ms a step the GPU was busy (the job alone: 25-27 ms). With it, none does, and the
    diagnosis' reference before the window reads at least the device's time."""
    busy_dir, busy = runs["busy"]
    boot = read_bootstrap(busy_dir)
    steps, samples = read_steps(busy_dir, boot), read_host_cpu(busy_dir)
    device = device_busy_s(busy.ranks)
    assert 0.020 < device[0] < 0.023
    before = [r.dt for r in at_own_pace(steps, samples, boot)[0][2:10]]
    assert max(before) < device[0]  # what the floor mends
    floored = at_own_pace(steps, samples, boot, device)[0]
    walls = {r.step: r.dt for r in steps[0]}
    assert all(r.dt >= min(walls[r.step], device[0]) - 1e-9 for r in floored)
    assert busy.dilation is not None and busy.dilation.before_step_us >= 1e6 * device[0] - 1


def test_the_live_signal_of_a_crowded_gpu_job_is_held_to_its_device_busy_time(runs) -> None:
    """The agent's MFU divides by the recent untraced steps at the job's own pace; like the
    diagnosis', never by less than the device's busy time per step: a live own step of 15 ms
    (what the unfloored pace read before the window) exports the MFU at the device's 21.6 ms."""
    busy = runs["busy"][1]
    device = device_busy_s(busy.ranks)[0]
    fields = signal_fields(busy, 0.015, None)
    assert fields["mfu_ratio"] == pytest.approx(busy.mfu.flops_per_step / device / busy.mfu.peak_flops)
    slower = signal_fields(busy, 0.030, None)  # a step longer than the device's: as it is
    assert slower["mfu_ratio"] == pytest.approx(busy.mfu.flops_per_step / 0.030 / busy.mfu.peak_flops)


def test_the_busy_runs_mfu_is_trusted_as_the_quiet_runs_though_its_label_is_not(runs) -> None:
    """The label's confidence falls beside the loops (each share moves by the machine's part);
    the MFU's, of the step it divides by, does not: the scheduler weighs the busy job's MFU,
    right as above, by it (``Signal.mfu_confidence``), and the signal carries it."""
    (_, quiet), (_, busy) = runs["quiet"], runs["busy"]
    assert busy.verdict.confidence < 0.5 <= quiet.verdict.confidence
    assert quiet.mfu.confidence is not None and busy.mfu.confidence is not None
    assert busy.mfu.confidence >= 0.5 and busy.mfu.confidence == pytest.approx(quiet.mfu.confidence, abs=0.1)
    assert signal_fields(busy, 0.030, None)["mfu_confidence"] == busy.mfu.confidence


def test_the_sessions_tables_print_each_run_and_the_diff() -> None:
    """``benchmarks/gpu_session.py --tables`` on this session: one row a run, and the diff's
    line with both changes (what the closing note quotes)."""
    spec = importlib.util.spec_from_file_location("gpu_session", REPO / "benchmarks" / "gpu_session.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "benchmarks"))  # it imports gpu_validation beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    out = module.tables([FIXTURES / "session.json"])
    assert out.startswith("The job's own pace on a busy host")
    assert "| defaults-busy | 1 | 32 | 72.01 | memory-bound (0.05) | 23.1% | 10.5% |" in out
    assert "own pace +11.0% (no significant change), wall clock +177.3% (slower)" in out
