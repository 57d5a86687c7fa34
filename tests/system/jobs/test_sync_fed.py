"""Operators computed only for values a loop reads back into Python are the host's work: a
job whose metrics logger runs ``histc`` and ``norm`` for its ``.tolist()`` and ``.item()``
calls is host-bound, not compute-bound, and removing the logging is predicted as measured
(issue 37: the third blind zoo's metrics_log read compute-bound 0.37-0.79, "arithmetic
intensity above the ridge point", where removing the logging removed 62-75% of its step).

``tests/jobs/metrics_job.py`` under ``gpudiag profile``; the label and the first fix in
``make test``; the fix applied (``--log-every 0``) against the job as it is, alone, in a
palindrome, in ``make test-timing`` (a ratio of wall-clock runs is the machine's noise on a
busy one: a CI clone beside other work measured the fix at 0.78x, 0.16-0.18x quiet). On the
2-core AMD EPYC VM at load 2-3: the label host-bound (0.89), 8.66 ms of the 13.2 ms step
sync-fed operators; the job's own timer: 9.5 ms of logging in a 13.2 ms step; the fix
predicted 0.24-0.28x, measured 0.16-0.18x.
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

JOB = TESTS / "jobs" / "metrics_job.py"


def alone(tmp: Path, name: str, *opts: str) -> float:
    """The job's median step (its own timer, after its first five steps), run without gpudiag."""
    report = tmp / f"{name}.json"
    subprocess.run([sys.executable, str(JOB), "--steps", "30", "--report", str(report), *opts],
                   check=True, timeout=300)
    return statistics.median(json.loads(report.read_text())["step_seconds"][5:])


def profiled_job(tmp: Path) -> Diagnosis:
    """The job under ``gpudiag profile``, its diagnosis."""
    return profiled(tmp / "run", [str(JOB), "--steps", "40", "--report", str(tmp / "own.json")])


def test_a_loop_whose_logging_feeds_reads_back_is_host_bound_and_dropping_the_logging_comes_first(tmp_path):
    d = profiled_job(tmp_path)
    v = d.verdict
    assert v.label is Bottleneck.HOST, (v.summary, v.evidence)
    assert "computed only for values read back" in v.summary, v.summary
    first = v.recommendations[0]
    assert first.action == "remove-host-syncs", [r.action for r in v.recommendations]
    assert first.predicted_step_s < first.step_s, first.why
    s = d.syncs
    # the logging is most of this step (9.5 ms of 13.2 by the job's own timer): what the
    # reads and the operators feeding them are credited with is a large share of the step at
    # its own pace, on a busy machine too (6.4 ms of 11.0 ms own, a 69 ms wall-clock step,
    # under a CI pass and a scheduler replay beside it)
    assert s is not None and s.own_step_us is not None, s
    assert 0.25 * s.own_step_us <= s.saving_us < s.step_us, s


@pytest.mark.timing   # make test-timing: a wall-clock ratio of real runs, on a quiet machine
def test_dropping_the_logging_is_predicted_as_the_job_measures_it_applied(tmp_path):
    d = profiled_job(tmp_path)
    first = d.verdict.recommendations[0]
    assert first.action == "remove-host-syncs", [r.action for r in d.verdict.recommendations]
    a1, b1 = alone(tmp_path, "a1"), alone(tmp_path, "b1", "--log-every", "0")
    b2, a2 = alone(tmp_path, "b2", "--log-every", "0"), alone(tmp_path, "a2")
    measured = (b1 + b2) / (a1 + a2)
    predicted = first.predicted_step_s / first.step_s
    # the prediction under-states the gain, and says what it counts: the reads, the operators
    # that fed only them and the Python right after them (the logger's JSON and write). What it
    # cannot see is the logging slowing the rest of the step: by the job's own timer, 9.5 ms of
    # logging in a 13.3 ms step leaves 3.8 ms, and the step without logging runs 2.1 ms. At load
    # ~2: predicted 0.24-0.28x, measured 0.16-0.18x (1.35-1.75x the measured step; 2.0x before
    # the Python after the reads was counted)
    # on a busy machine the prediction is a range: the other processes' part of the step keeps
    # its share of the shorter step (the point), or its time (the other end). The fix is held to
    # the range's far end: it gains at least that (measured at load ~2: 0.16-0.18x against
    # 0.24-0.28x predicted; CI clones beside the suite 0.35x in 0.17-0.57x, 0.10x in 0.27-0.63x,
    # 0.18x where the wall-clock end alone read 0.75x). How close the point comes is within the
    # machine's noise here: the numbers are in docs/diagnosis.md.
    s = d.syncs
    assert s is not None
    other_end = (s.step_us - s.saving_us) / s.step_us
    assert predicted < 0.5 and measured < max(predicted, other_end) * 1.25, (
        predicted, other_end, measured, first.why)
