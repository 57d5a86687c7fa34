"""Time the OS ran other work inside a CPU job's operators is named by whose work it was: the
trace sees operators 20x past their kind's median, but not who held the cores; gpudiag's step
timer splits the same steps into the job's own part and other processes' (issue 37, blind check
20: an idle machine read "a busy machine", with other processes said to take 18.4 ms a step
where the step timer put them at 2.7 ms)."""

from __future__ import annotations

import shutil

import pytest

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.analyzers.own_pace import stalls_owner
from tests.paths import TESTS

FIXTURE = TESTS / "fixtures" / "cpu-fft-worker-own-stalls"


def test_stalls_are_other_processes_work_only_where_the_step_timer_puts_most_of_them_on_them():
    assert stalls_owner(18.4e3, 2.7e3).startswith("mostly the job's own workers and threads")
    said = "other processes' work: the step timer puts their part at 15 ms"
    assert stalls_owner(18.4e3, 15e3).startswith(said)
    assert "did not split" in stalls_owner(18.4e3, None)


def test_a_job_whose_own_worker_held_the_cores_is_not_told_other_processes_took_its_time(
        tmp_path: pytest.TempPathFactory) -> None:
    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    d = diagnose(copy, jobs=1)
    assert d.host_wait is not None and d.host_wait.traced_machine_us is not None
    assert d.breakdown.host_stalled > 4 * d.host_wait.traced_machine_us  # the recorded case
    [w] = [w for w in d.warnings if "the OS ran other work while an operator" in w]
    assert "mostly the job's own workers and threads" in w and "a busy machine" not in w, w
    assert "other processes took" not in d.mfu.reason, d.mfu.reason
    assert "a busy machine" not in " ".join(x.reason for x in d.verdict.deductions)
    assert not any("other processes took 18" in c for c in d.dilation.caveats), d.dilation.caveats
