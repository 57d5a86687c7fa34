"""The allocator named as a fix (issue 37, held-out set 8): a real job whose optimizer's 2.4 MB
temporaries glibc unmaps on free and faults in again (tests/jobs/alloc_job.py) is told to keep
them in the heap, with a predicted step; the fix applied as the advice says it (glibc's
thresholds in the job's environment) faults no more, is no longer advised, and runs the job
faster by its own timer. Fault counts are exact, so the advice's presence is no timing
threshold; the one timing check is the fix's direction, by the job's own clock of its
thread's time on a core, which load beside it does not move (by wall clock, on the 2-core AMD
EPYC VM quiet, 104 ms against 37 ms; predicted 101 -> 37.8 ms; the prediction against the fix
applied is benchmarks/predicted_vs_applied.py's, where timing belongs).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gpudiag.analyzers.page_faults import GLIBC_ENV
from gpudiag.diagnosis import Diagnosis
from gpudiag.rundir import read_steps
from tests.paths import TESTS

JOB = TESTS / "jobs" / "alloc_job.py"
STEPS = 24
# 38 MB temporaries, above the 32 MB glibc's threshold can rise to: every step faults them in,
# however the heap stands (the default width's 2.4 MB fault in some steps and not others)
SHAPE = ["--width", "3072", "--layers", "1", "--batch", "8"]
FIX = dict(kv.split("=") for kv in GLIBC_ENV.split())


def _env(fixed: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return {**env, **FIX} if fixed else env


def _profile(tmp: Path, fixed: bool) -> tuple[Diagnosis, Path]:
    run = tmp / ("fixed" if fixed else "default")
    job = [sys.executable, str(JOB), *SHAPE, "--steps", str(STEPS)]
    p = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--", *job],
                       env=_env(fixed), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), run


def _alone(tmp: Path, fixed: bool) -> tuple[float, float]:
    """The job unobserved, by its own clocks: (mean wall step, mean CPU seconds of its training
    thread per step), after start-up."""
    report = tmp / f"alone-{fixed}.json"
    subprocess.run([sys.executable, str(JOB), *SHAPE, "--steps", str(STEPS), "--report", str(report)],
                   env=_env(fixed), check=True, timeout=600)
    own = json.loads(report.read_text())
    return statistics.fmean(own["step_seconds"][5:]), statistics.fmean(own["thread_cpu_seconds"][5:])


def test_faulted_temporaries_are_told_to_stay_in_the_heap_and_the_fix_applied_faults_no_more(tmp_path):
    d, run = _profile(tmp_path, fixed=False)
    advised = {r.action: r for r in d.verdict.recommendations}
    rec = advised.get("allocator-keep-memory")
    assert rec is not None, [r.action for r in d.verdict.recommendations]
    assert rec.predicted_step_s is not None and rec.step_s is not None
    assert rec.predicted_step_s < rec.step_s, rec.why
    assert "MALLOC_MMAP_THRESHOLD_" in rec.text and "faults a step" in rec.why
    faulted = [r.minflt for r in read_steps(run)[0] if r.profiler is None and r.minflt is not None]
    assert statistics.median(faulted) >= 256, faulted

    fixed, frun = _profile(tmp_path, fixed=True)
    names = {r.action for r in fixed.verdict.recommendations} | {r.action for r in fixed.verdict.not_advised}
    assert "allocator-keep-memory" not in names, names
    after = [r.minflt for r in read_steps(frun)[0]
             if r.profiler is None and r.step > 3 and r.minflt is not None]
    assert statistics.median(after) < 64, after

    # the fix applied, unobserved, by the job's own clocks: less of its thread's time on a core a
    # step (the faults' kernel time gone), which another process's load does not change. By wall
    # clock, one run each in the suite's first pass beside a busy loop read the fix slower (0.32
    # against 0.21 s a step): the load moved more than the fix
    (wall_fixed, cpu_fixed), (wall_default, cpu_default) = _alone(tmp_path, True), _alone(tmp_path, False)
    assert cpu_fixed < cpu_default, (cpu_fixed, cpu_default, wall_fixed, wall_default)
