"""A job left in float64 is judged against the CPU's float64 peak and told to run in fp32 where
the CPU does fp32 faster (issue 37: the third blind zoo's fp64_mlp read compute-bound at MFU 39%
of the fp32 peak, its own 79% of the fp64 one, and was told only to do fewer FLOPs, where fp32
ran 0.37-0.49x the step).

The GEMM job in double under ``gpudiag profile``, then the fix applied: the same job in fp32,
alone, each step's CPU time on its own thread's clock (no other process's time is counted in
it), the fastest steps compared (``own_cpu_step``). On the
2-core AMD EPYC VM at load 1.6: fp64 peak 64 GFLOP/s against fp32 188; the fix predicted 123 →
46.3 ms (0.37x), measured 118-120 → 56-57 ms by the job's timer (0.47x: ratio 0.80, within the
issue's 25%). Which branch holds depends on this machine's measured peaks, and the test says
which it took.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpudiag.analyzers.advice_fp32 import SLOWER_MIN_RATIO
from gpudiag.diagnosis import Diagnosis
from tests.paths import TESTS

JOBS = TESTS / "jobs"
STEPS, SKIP = 24, 10


def own_cpu_step(report: Path) -> float:
    """The fastest of the job's steps after its first four, on its thread's CPU clock: what the
    work costs where nothing shared the core's caches and pipeline with it. A thread's CPU time
    is not free of the machine's load: work on the other CPU of this VM (a core's sibling, the
    memory bus) stretched the fp32 job's median 0.053 s a step to 0.091 s in a run beside the
    suite's lanes and other work (0.83 of the fp64 job's, where 0.8 was asked); its fastest
    steps are those that ran alone."""
    return min(json.loads(report.read_text())["thread_cpu_seconds"][4:])


def test_a_float64_job_is_judged_at_the_fp64_peak_and_told_to_run_in_fp32(tmp_path):
    run, own = tmp_path / "run", tmp_path / "fp64.json"
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", str(SKIP),
                           "--", sys.executable, str(JOBS / "gemm_job.py"), "--steps", str(STEPS),
                           "--dtype", "fp64", "--report", str(own)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    d = Diagnosis.from_json((run / "diagnosis.json").read_text())
    peaks = d.device.peak_flops
    assert d.device.kind == "cpu" and {"fp32", "fp64"} <= set(peaks), d.device
    assert d.mfu.dtype_family == "fp64" and d.mfu.peak_flops == peaks["fp64"], d.mfu
    advised = {r.action: r for r in d.verdict.recommendations}
    if peaks["fp32"] < SLOWER_MIN_RATIO * peaks["fp64"]:   # a CPU doing fp64 nearly as fast
        assert "fp32-instead" not in advised, advised
        return
    fix = advised["fp32-instead"]
    assert "float32" in fix.text and fix.predicted_step_s is not None, fix
    assert fix.predicted_step_s < fix.step_s
    # the fix applied: the same job in fp32 takes less of its thread's time a step
    fp32 = tmp_path / "fp32.json"
    subprocess.run([sys.executable, str(JOBS / "gemm_job.py"), "--steps", str(STEPS), "--dtype", "fp32",
                    "--report", str(fp32)], check=True, capture_output=True, timeout=600)
    assert own_cpu_step(fp32) < 0.8 * own_cpu_step(own), (own_cpu_step(fp32), own_cpu_step(own))
