"""End to end on real torch CPU runs: each benchmark workload gets the label it was built for.

Each test runs a workload from ``benchmarks/workloads`` under the PyTorch profiler into a
temporary folder, then ``gpudiag analyze DIR --json`` on the traces, and checks the verdict
and the numbers behind it. Failures print the verdict's evidence shares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import NO_GLOO, torchrun
from tests.paths import REPO

ROOT = REPO
WORKLOADS = ROOT / "benchmarks" / "workloads"
TIMEOUT_S = 180


@pytest.fixture(scope="module", autouse=True)
def gpudiag_cache() -> Path:
    """The session's CPU-peak cache (tests/conftest.py), away from the user's home directory:
    measured once for the run, not once more for this module."""
    return Path(os.environ["GPUDIAG_CACHE_DIR"])


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
        f"stderr:\n{proc.stderr[-3000:]}")
    return proc


def _profile(workload: str, out: Path) -> str:
    """Run a single-process workload with --profile-out; its stdout."""
    proc = _run([sys.executable, str(WORKLOADS / workload), "--profile-out", str(out)])
    assert (out / "rank-0.json.gz").is_file(), f"{workload} wrote no trace: {list(out.iterdir())}"
    return proc.stdout


def _analyze(target: Path) -> dict:
    proc = _run([sys.executable, "-m", "gpudiag", "analyze", str(target), "--json"])
    return json.loads(proc.stdout)


def _why(d: dict) -> str:
    v = d["verdict"]
    return f"verdict {v['label']} ({v['confidence']}), evidence {v['evidence']}: {v['summary']}"


def test_slow_dataset_with_num_workers_0_is_input_bound(tmp_path: Path) -> None:
    stdout = _profile("input_bound.py", tmp_path)
    assert "final loss" in stdout
    d = _analyze(tmp_path)
    assert d["verdict"]["label"] == "input-bound", _why(d)
    b = d["breakdown"]
    assert b["input_wait"] / b["step_time"] >= 0.2, _why(d)
    assert any("num_workers" in r["text"] for r in d["verdict"]["recommendations"]), d["verdict"]


def test_wide_fp32_mlp_is_compute_bound_with_measured_mfu(tmp_path: Path) -> None:
    _profile("compute_bound.py", tmp_path)
    d = _analyze(tmp_path)
    assert d["verdict"]["label"] == "compute-bound", _why(d)
    assert d["mfu"]["value"] is not None and d["mfu"]["value"] > 0, d["mfu"]
    assert d["mfu"]["flops_source"] == "shapes"
    # the op group holding the most time is a GEMM above the ridge point
    top = d["roofline"]["points"][0]
    assert top["op"] in ("aten::mm", "aten::addmm") and top["bound"] == "compute", top


def test_elementwise_ops_on_big_tensors_are_memory_bound(tmp_path: Path) -> None:
    _profile("memory_bound.py", tmp_path)
    d = _analyze(tmp_path)
    assert d["verdict"]["label"] == "memory-bound", _why(d)
    # no op above the ridge point, and no matmul FLOPs to base an MFU on
    assert d["verdict"]["evidence"]["compute-bound share"] < 0.05, _why(d)
    assert d["mfu"]["value"] is None, d["mfu"]
    assert all(p["bound"] == "memory" for p in d["roofline"]["points"]), d["roofline"]["points"]


def test_many_tiny_ops_at_batch_1_are_host_bound(tmp_path: Path) -> None:
    _profile("host_bound.py", tmp_path)
    d = _analyze(tmp_path)
    # host-bound, or a stated tie with it: on a machine busy enough that the job's own pace
    # takes the OS's part out of its host gaps, the rest can sit within the step's noise of
    # its elementwise work (seen once, nice 19 beside a full suite: memory 0.525, host 0.475)
    assert "host-bound" in (d["verdict"]["label"], d["verdict"].get("tie_with")), _why(d)
    b = d["breakdown"]
    assert b["host_overhead"] / b["step_time"] >= 0.5, _why(d)
    assert b["input_wait"] == 0.0
    # the host advice: compile for the tiny ops, or, where the trace shows the loss's loop over
    # elements (16 of them, outside the model: compile does not reach it), writing it over the
    # batch; here compile's calls at batch 1 are mostly GEMMs it still calls (predicted +3%)
    assert any("tiny ops" in r["text"] or r["action"] == "vectorise-sample-loop"
               for r in d["verdict"]["recommendations"]), d["verdict"]


_NEEDS_GLOO = pytest.mark.skipif(NO_GLOO, reason="torch built without gloo")


@pytest.fixture(scope="module")
def comm_diagnosis(tmp_path_factory: pytest.TempPathFactory, gpudiag_cache: Path) -> dict:
    """The 2-rank gloo job, run once for the tests that read its diagnosis."""
    out = tmp_path_factory.mktemp("comm_bound")
    cmd = [*torchrun(2), str(WORKLOADS / "comm_bound.py"), "--profile-out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "final loss" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]
    return _analyze(out)


@_NEEDS_GLOO
def test_two_rank_gloo_gradient_all_reduce_is_communication_bound(comm_diagnosis: dict) -> None:
    d = comm_diagnosis
    assert d["verdict"]["label"] == "communication-bound", _why(d)
    assert len(d["ranks"]) == 2 and d["world_size"] == 2
    b = d["breakdown"]
    assert b["comm_exposed"] / b["step_time"] >= 0.3, _why(d)
    # the fix that pays here is all-reducing less often (it leads); overlapping is weighed, and
    # is a thing to do only where backward is long enough to hide the all-reduce: this job's
    # backward is 0.3 ms beside 15 ms of all-reduce, so it is predicted +1.5% on a quiet machine
    # and under 1% on a loaded one (a CI clone, 2026-11-29), where it is listed as not helping
    v = d["verdict"]
    assert v["recommendations"][0]["action"] == "all-reduce-less-often", v["recommendations"]
    weighed = v["recommendations"] + v.get("not_advised", [])
    assert any("Communication not overlapped" in r["text"] for r in weighed), weighed


@_NEEDS_GLOO
def test_gloo_all_reduce_is_listed_in_the_communication_table(comm_diagnosis: dict) -> None:
    # gloo in torch 2.x records only "gloo:all_reduce" annotations (dims, dtype, no
    # "Collective name"): the loader must still list them, with their bytes
    comm = {c["collective"]: c for c in comm_diagnosis["communication"]}
    assert "all_reduce" in comm and comm["all_reduce"]["count"] > 0, comm_diagnosis["communication"]
    assert comm["all_reduce"]["bytes"] and comm["all_reduce"]["busbw_gbps"] > 0


def test_the_demo_job_is_input_bound_and_the_fix_is_dataloader_workers(tmp_path: Path) -> None:
    """`make demo` profiles this job: its bottleneck must be the one it was built with."""
    proc = _run([sys.executable, str(WORKLOADS / "demo_train.py"), "--profile-out", str(tmp_path),
                 "--steps", "8"])
    assert "final loss" in proc.stdout
    d = _analyze(tmp_path)
    assert d["verdict"]["label"] == "input-bound", _why(d)
    # recommendations as text or as objects (the Diagnosis schema may carry either)
    assert "num_workers" in json.dumps(d["verdict"]["recommendations"]), d["verdict"]["recommendations"]
