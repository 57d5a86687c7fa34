"""What a fix is predicted to be worth, against the fix applied, on real CPU jobs.

Each case runs a held-out job (tests/jobs) under ``gpudiag profile``, alternating in one
process phases as it is and with the fix applied (so the load of a shared machine hits both
alike); gpudiag traces the job as it is and predicts the step time if the fix worked fully; the
job's own timer gives the fixed steps' time. They must agree within 15%. The numbers for the
docs come from ``benchmarks/predicted_vs_applied.py``, which runs the same cases.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 0.15  # relative, as the issue asks


def _bench():
    name = "gpudiag_bench_predicted_vs_applied"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "predicted_vs_applied.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def check(case_name: str, tmp_path: Path):
    bench = _bench()
    r = bench.run_case(bench.CASES[case_name], tmp_path)
    detail = (f"{bench.machine()}; view {r.basis}, step {r.view_step_s * 1e3:.1f} ms, own timer "
              f"before {r.before_s * 1e3:.1f} ms; {r.why}")
    assert abs(r.ratio - 1) <= TOLERANCE, (
        f"{case_name}: predicted {r.predicted_s * 1e3:.1f} ms, measured {r.measured_s * 1e3:.1f} ms "
        f"(ratio {r.ratio:.2f}); {detail}")
    # the fix is worth predicting: it moves the step by more than the tolerance
    assert r.measured_s < (1 - TOLERANCE) * r.before_s, detail
    return r


def test_dataloader_workers_0_to_4_on_an_input_bound_job(tmp_path):
    check("workers", tmp_path)


def test_torch_compile_on_a_job_of_many_small_ops(tmp_path):
    r = check("compile", tmp_path)
    assert not r.diagnosis.traits.compiled  # the window was traced in an eager phase


@pytest.mark.skipif(not __import__("torch").distributed.is_gloo_available(), reason="no gloo")
def test_ddp_buckets_that_let_communication_overlap(tmp_path):
    r = check("ddp-buckets", tmp_path)
    assert r.diagnosis.traits.ddp
