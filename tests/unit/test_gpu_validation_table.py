"""benchmarks/gpu_validation.py judges its table by issue 29's criteria: in every mode (defaults,
``--skip 20``, ``--monitor``) a job reads its expected label or a stated tie with it, the modes
agree, and MFU is within 10% of analytic. Held against the results recorded on a GPU
(tests/fixtures/h200) and against the H200 table the issue reports."""

from __future__ import annotations

import copy
import json

from tests.conftest import benchmark_module
from tests.paths import TESTS

RECORDED = TESTS / "fixtures" / "h200" / "realistic_validation_results.json"


def _row(job: str, mode: str, label: str, mfu_vs: float | None, tie: str | None = None) -> dict:
    return {"job": job, "mode": mode, "expected": "memory-bound", "exit": 0, "measured": label,
            "tie_with": tie, "mfu_vs_analytic": mfu_vs}


# issue 29, as measured on an NVIDIA H200 with the wheel of main: the LM's MFU 16%, 17% and 26%
# below analytic; the ResNet-50 memory-bound under defaults, host-bound under the other two, its
# MFU 7%, 41% and 41% below analytic
ISSUE_TABLE = [
    _row("lm", "defaults", "memory-bound", -0.16), _row("lm", "skip20", "memory-bound", -0.17),
    _row("lm", "monitor", "memory-bound", -0.26),
    _row("cnn", "defaults", "memory-bound", -0.07), _row("cnn", "skip20", "host-bound", -0.41),
    _row("cnn", "monitor", "host-bound", -0.41),
]


def test_the_recorded_gpu_results_pass_the_table() -> None:
    lines, passed = benchmark_module("gpu_validation").judge(json.loads(RECORDED.read_text())["rows"])
    assert passed, lines
    assert {line.split(":")[0] for line in lines} == {"lm", "cnn", "gemm", "elementwise", "input", "host"}


def test_the_h200_table_of_the_issue_fails_for_mfu_and_for_two_labels_of_one_job() -> None:
    lines, passed = benchmark_module("gpu_validation").judge(ISSUE_TABLE)
    assert not passed
    lm, cnn = lines
    assert lm.startswith("lm: FAIL") and "MFU -26.0% of analytic" in lm and "disagree" not in lm
    assert "skip20: host-bound, not memory-bound" in cnn and "the modes disagree" in cnn


def test_a_stated_tie_with_the_expected_label_is_one_label() -> None:
    rows = [_row("cnn", "defaults", "memory-bound", -0.05),
            _row("cnn", "skip20", "host-bound", 0.04, tie="memory-bound"),
            _row("cnn", "monitor", "memory-bound", 0.02, tie="host-bound")]
    lines, passed = benchmark_module("gpu_validation").judge(rows)
    assert passed, lines
    apart = copy.deepcopy(rows)
    apart[1]["tie_with"] = "compute-bound"   # host / compute: neither is memory-bound
    assert not benchmark_module("gpu_validation").judge(apart)[1]


def test_a_mode_that_ran_no_diagnosis_fails_the_job() -> None:
    rows = [_row("lm", "defaults", "memory-bound", 0.01),
            {"job": "lm", "mode": "monitor", "expected": "memory-bound", "exit": 1}]
    lines, passed = benchmark_module("gpu_validation").judge(rows)
    assert not passed and "monitor: no diagnosis (exit 1)" in lines[0]
