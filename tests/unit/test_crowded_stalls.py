"""A CPU trace whose operators were stalled in most of its steps keeps the label of the same job
traced alone: a kind's own time is its fastest call, not its median, which a crowded window
makes a stall itself (CI, 2026-12-03: the input-bound workload read host-bound beside eight test
workers). The fixtures' READMEs say how each was recorded."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpudiag.analyzers.diagnose import diagnose
from gpudiag.diagnosis import Bottleneck
from tests.paths import TESTS

CROWDED = TESTS / "fixtures" / "cpu-input-bound-crowded"
QUIET = TESTS / "fixtures" / "cpu-input-bound-quiet"


def _diagnose(src: Path, tmp_path: Path):
    copy = tmp_path / src.name
    shutil.copytree(src, copy)
    return diagnose(copy, jobs=1)


def test_an_input_bound_job_whose_tiny_operators_were_stalled_in_most_steps_stays_input_bound(
        tmp_path: Path) -> None:
    quiet = _diagnose(QUIET, tmp_path)
    crowded = _diagnose(CROWDED, tmp_path)
    assert quiet.verdict.label is Bottleneck.INPUT and crowded.verdict.label is Bottleneck.INPUT
    alone, busy = (d.verdict.evidence["input-bound share"] for d in (quiet, crowded))
    assert busy > 0.8 and abs(busy - alone) < 0.1, (alone, busy)
    # the stretched operators are the machine's, out of the host share the label weighs
    b = crowded.breakdown
    assert b.host_stalled > 0.5 * (b.host_overhead), (b.host_stalled, b.host_overhead)
    assert crowded.verdict.evidence["host-bound share"] < 0.2, crowded.verdict.evidence
