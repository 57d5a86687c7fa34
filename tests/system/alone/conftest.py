"""Runs of tests/system/alone that more than one of its modules reads.

Each such run is made once for the solo pass (session scope) and only read by the tests, so no
test's outcome depends on which ran first: the pass runs one job at a time, and a job started
for one module that another module's test started again, alike, was that pass's time twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpudiag.diagnosis import Diagnosis
from tests.paths import REPO

JOBS = REPO / "tests" / "jobs"
# The single-thread GEMM job of ``gemm_beside_two_loops``: 1.07 GFLOP a step, ~15 ms alone on
# this project's 2-core EPYC VM, ~45 ms beside the two loops. 60 steps: the host sampler's 1 s
# samples must fall inside its untraced steps for the split of its wait (``host_wait.other_share``):
# 30 steps are ~1.4 s, 60 about 3 s.
GEMM_STEPS = 60
GEMM_JOB = [str(JOBS / "gemm_job.py"), "--steps", str(GEMM_STEPS), "--width", "512"]


@pytest.fixture(scope="session")
def gemm_beside_two_loops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    """``GEMM_JOB`` (pinned to the lowest CPU by itself) under ``gpudiag profile`` beside two busy
    loops outside the job, pinned to that CPU, from its first step to its end: (diagnosis, the
    job's own report, run directory). Read by test_host_wait (whose wait for a core it is) and
    test_own_pace_bounds (its own pace against its time on a core and its pace alone), which
    each profiled such a job beside two such loops (40 steps of width 1024, and 30 of 512)."""
    from tests.system.alone.test_own_pace import profile

    root = tmp_path_factory.mktemp("gemm-beside-loops")
    report = root / "busy.json"
    d = profile(root / "busy", [*GEMM_JOB, "--report", str(report)], loops=2,
                loop_cpus={min(os.sched_getaffinity(0))})
    return d, json.loads(report.read_text()), root / "busy"
