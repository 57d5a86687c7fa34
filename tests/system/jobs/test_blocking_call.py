"""A training thread asleep in a blocking call is named as such, and moving the call beside
the step is advised with what it saves (issue 37: the third blind zoo's rpc_wait slept in
``recv`` 53-80% of its step, read "launch, Python and synchronisation overhead" with no
advice, and compile, listed as not helping, was predicted +120% from that sleep charged to 19
operator calls).

The job asks a server process for a reply each step (``tests/jobs/rpc_job.py``, 15 ms), its
verdict and first fix in ``make test``; then, in ``make test-timing`` (a ratio of wall-clock
runs, which a busy machine's noise decides: a CI clone under the suite's load read 0.65 against
its 2/3 bound), the fix applied (``--ahead``: a background thread asks one step ahead), each
alone, in a palindrome. On the 2-core AMD EPYC VM at load 5-7 (a test suite beside it):
predicted 33 -> 17.9 ms (0.54x), measured 40.5 -> 22.2 ms by the job's timer (0.55x).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.diagnosis import Bottleneck, Diagnosis
from tests.harness import profiled
from tests.paths import TESTS

JOB = TESTS / "jobs" / "rpc_job.py"
DELAY_MS = 15.0


def alone(tmp: Path, name: str, *opts: str) -> float:
    """The job's median step (its own timer, after its first five steps), run without gpudiag."""
    report = tmp / f"{name}.json"
    subprocess.run([sys.executable, str(JOB), "--steps", "40", "--report", str(report), *opts],
                   check=True, timeout=300)
    return statistics.median(json.loads(report.read_text())["step_seconds"][5:])


def profiled_job(tmp: Path) -> Diagnosis:
    """The job under ``gpudiag profile``, its diagnosis (the job's own report in ``own.json``)."""
    return profiled(tmp / "run", [str(JOB), "--steps", "60", "--delay-ms", str(DELAY_MS),
                                  "--report", str(tmp / "own.json")])


def test_a_thread_asleep_in_a_blocking_call_is_named_and_moving_the_call_comes_first(tmp_path):
    d = profiled_job(tmp_path)
    v = d.verdict
    assert Bottleneck.HOST in (v.label, v.tie_with), v.summary
    assert "asleep in a blocking call" in v.summary, v.summary
    # the sleep the step timer read is the reply's wait the job timed itself, within a third
    waited = statistics.median(json.loads((tmp_path / "own.json").read_text())["waited_seconds"][5:]) * 1e6
    assert d.host_wait is not None and d.host_wait.untraced_blocked_us is not None
    assert abs(d.host_wait.untraced_blocked_us / waited - 1) < 1 / 3, (d.host_wait, waited)
    first = v.recommendations[0]
    assert first.action == "unblock-training-thread", [r.action for r in v.recommendations]
    assert first.predicted_step_s < first.step_s, first.why
    # compile does not remove a sleep: what it is credited with is the calls' Python alone
    compiled = [r for r in v.recommendations + v.not_advised if r.action == "compile-small-ops"]
    assert all(r.gain is None or r.gain < 0.2 for r in compiled), compiled


def test_an_mlps_intra_op_threads_waiting_for_each_other_are_not_a_blocking_call(tmp_path):
    """The MLP's two intra-op threads under OpenMP's passive wait policy: the training thread
    sleeps at the end of each parallel region until its peer is done, inside torch's operators,
    many short sleeps a step (2-core AMD EPYC VM, quiet: 1.02 ms of a 5.24 ms step over 24
    wake-ups). It has no blocking call to move beside the step (the step measured 2.98 ms
    passive, 1.35 ms spinning, 2.08 ms on one thread, on the 2-core Intel Xeon VM), so it is
    not told to: its clocks cannot tell those sleeps from a call's (a blind check's 16-block
    model with no call read 9.1 ms of 31 asleep, its 1.9 ms fsync 10.3 ms), so the advice is
    listed as not helping, with how to tell. The bootstrap read the policy the job set."""
    d = profiled(tmp_path / "run", [str(TESTS / "jobs" / "mlp_job.py"), "--steps", "200",
                                    "--report", str(tmp_path / "own.json")])
    actions = [r.action for r in d.verdict.recommendations]
    assert "unblock-training-thread" not in actions, (actions, d.host_wait)
    assert "blocking call" not in d.verdict.summary, d.verdict.summary
    assert d.host_wait is not None and d.host_wait.passive_threads == 2, d.host_wait
    # the policy's own cost is named instead (analyzers.omp_wait: this MLP gave back 3.0 of its
    # 5.0 ms unset, quiet): advised where each thread has a core, else listed as not helping
    assert d.host_wait.untraced_slices and d.host_wait.untraced_slices >= 10, d.host_wait
    listed = {r.action: r for r in d.verdict.recommendations + d.verdict.not_advised}
    omp = listed.get("omp-wait-policy")
    assert omp is not None, (list(listed), d.host_wait)
    assert "OMP_WAIT_POLICY=PASSIVE" in omp.text and (
        omp in d.verdict.recommendations or "spinning threads hold their cores" in omp.why), omp


@pytest.mark.timing   # make test-timing: a wall-clock ratio of real runs, on a quiet machine
def test_moving_the_blocking_call_beside_the_step_is_predicted_as_the_job_measures_it_applied(tmp_path):
    first = profiled_job(tmp_path).verdict.recommendations[0]
    assert first.action == "unblock-training-thread", first
    # the fix applied, against the job as it is, in a palindrome (the machine's load cancels)
    a1, b1 = alone(tmp_path, "a1"), alone(tmp_path, "b1", "--ahead")
    b2, a2 = alone(tmp_path, "b2", "--ahead"), alone(tmp_path, "a2")
    measured = (b1 + b2) / (a1 + a2)
    predicted = first.predicted_step_s / first.step_s
    # loose: the sleep is most of the step, so the ratio holds on a busy machine (0.54x against
    # 0.55x at load 5-7); what it proves is a prediction of the applied fix, not of no change
    assert 2 / 3 < predicted / measured < 1.5, (predicted, measured, first.why)
