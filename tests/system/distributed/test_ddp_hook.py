"""gpudiag's timing of DDP's gradient all-reduce on gloo: DDP's own math, each bucket counted once.

The bootstrap replaces DDP's built-in all-reduce with a communication hook that times each
bucket; the hook must reduce exactly as DDP does (the trained weights are the same as unobserved)
and count each bucket once, also when the job registered a hook of its own that calls
``torch.distributed.all_reduce`` (which the bootstrap also times: not twice)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.rundir import read_steps
from tests.harness import torchrun, torchrun_ran
from tests.paths import TESTS

JOB = TESTS / "jobs" / "ddp_hook_job.py"


def _torchrun(report: Path, *extra: str) -> list[str]:
    return [*torchrun(2), str(JOB),
            "--report", str(report), *extra]


def ran(p: subprocess.CompletedProcess[str], report: Path) -> bool:
    return torchrun_ran(p, wrote=report)


@pytest.fixture(scope="module")
def unobserved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp") / "alone.json"
    p = subprocess.run(_torchrun(out), capture_output=True, text=True, timeout=300)
    assert ran(p, out), p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("own_hook", [False, True], ids=["ddp-default", "jobs-own-hook"])
def test_each_bucket_is_timed_once_and_the_weights_train_as_unobserved(tmp_path, unobserved, own_hook):
    report = tmp_path / "own.json"
    job_cmd = _torchrun(report, *(["--own-hook"] if own_hook else []))
    p = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--skip", "100000", "--out",
                        str(tmp_path / "run"), "--", *job_cmd], capture_output=True, text=True, timeout=300)
    assert ran(p, report), p.stderr
    job = json.loads(report.read_text())
    assert job["checksum"] == pytest.approx(unobserved["checksum"], rel=1e-9)
    for rank, rows in read_steps(tmp_path / "run").items():
        # from step 2 on, DDP runs its rebuilt buckets: one timed all-reduce each
        counts = [r.collectives["all_reduce"]["count"] for r in rows[1:]]
        assert counts == [job["buckets"]] * len(counts), (rank, counts)
