"""The diagnosis in MLflow: a real ``mlflow server`` (SQLite store, local artifact root) on a free
port; ``gpudiag profile --mlflow`` on a real CPU job and ``gpudiag log`` into an existing run;
MLflow's REST API must return the metrics, params and both artifacts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gpudiag.steps import step_times
from tests.harness import free_port, needs_torch, wait_http
from tests.paths import REPO

needs_torch()
ROOT = REPO
LOOP_JOB = ROOT / "tests" / "jobs" / "loop_job.py"
MLFLOW_START_S = 240.0   # its database migrations take a minute on a busy 2-core machine


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    exe = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    assert exe, "mlflow is not installed (the test extra installs it)"
    d = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(d / "server.log", "wb")  # closed below
    proc = subprocess.Popen([exe, "server", "--backend-store-uri", f"sqlite:///{d / 'mlflow.db'}",
                             "--artifacts-destination", str(d / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"],
                            stdout=log, stderr=log, start_new_session=True,
                            # MLflow 3's server also starts a job runner and its queue consumers
                            # (six more Python processes importing mlflow: half a minute of CPU on
                            # a 2-core VM); gpudiag logs runs, metrics and artifacts, never jobs
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/health", timeout=MLFLOW_START_S)
        yield base
    finally:   # the server and the workers it forked: its own process group, by its pid
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def api(base: str, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", method="POST" if data else "GET", data=data,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:  # loopback only
        return json.loads(r.read())


def artifact(base: str, run_id: str, path: str) -> bytes:
    q = urllib.parse.urlencode({"path": path, "run_uuid": run_id})
    with urllib.request.urlopen(f"{base}/get-artifact?{q}", timeout=30) as r:
        return r.read()


def run_data(base: str, run_id: str) -> tuple[dict, dict, dict, str]:
    run = api(base, f"runs/get?run_id={run_id}")["run"]
    data = run["data"]
    return ({m["key"]: m["value"] for m in data.get("metrics", [])},
            {p["key"]: p["value"] for p in data.get("params", [])},
            {t["key"]: t["value"] for t in data.get("tags", [])}, run["info"]["status"])


def gpudiag(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def profiled(mlflow_server, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One real CPU training job under ``gpudiag profile --mlflow``, shared by the tests below."""
    run_dir = tmp_path_factory.mktemp("profiled") / "run"
    p = gpudiag("profile", "--mlflow", mlflow_server, "--out", str(run_dir), "--skip", "3", "--steps", "3",
                "--", sys.executable, str(LOOP_JOB), "--steps", "40", "--sleep", "0.01")
    assert p.returncode == 0, p.stderr
    return run_dir, p


def test_profile_logs_the_diagnosis_of_a_real_job_to_a_real_mlflow_server(mlflow_server, profiled):
    run_dir, p = profiled
    line = next(x for x in p.stderr.splitlines() if "logged to MLflow run" in x)
    run_id = line.split("logged to MLflow run ")[1].split(":")[0]
    assert "View run" not in p.stdout   # MLflow's own banner stays off the job's stdout

    d = json.loads((run_dir / "diagnosis.json").read_text())
    metrics, params, tags, status = run_data(mlflow_server, run_id)
    assert status == "FINISHED"
    assert params["gpudiag/verdict"] == d["verdict"]["label"] == tags["gpudiag/verdict"]
    assert metrics["gpudiag/confidence"] == pytest.approx(d["verdict"]["confidence"])
    assert metrics["gpudiag/mfu"] == pytest.approx(d["mfu"]["value"])
    assert metrics["gpudiag/dilation"] == pytest.approx(d["dilation"]["factor"])
    # the breakdown the verdict describes: the unprofiled estimate, or the traced steps where the
    # reference around the window could not be trusted (a busy machine)
    b = d["unprofiled"] if d["basis"] == "unprofiled-estimate" else d["breakdown"]
    for part in ("compute", "input_wait", "host_overhead", "comm_exposed"):
        assert metrics[f"gpudiag/share/{part}"] == pytest.approx(b[part] / b["step_time"])
    untraced = step_times(run_dir).untraced
    assert len(untraced) >= 10
    assert metrics["gpudiag/step_seconds/p50"] == pytest.approx(statistics.median(untraced))
    assert metrics["gpudiag/step_seconds/p10"] <= metrics["gpudiag/step_seconds/p50"] \
        <= metrics["gpudiag/step_seconds/p90"]

    listed = api(mlflow_server, f"artifacts/list?run_id={run_id}&path=gpudiag")
    assert sorted(f["path"] for f in listed["files"]) == ["gpudiag/diagnosis.json", "gpudiag/report.html"]
    for name in ("diagnosis.json", "report.html"):
        assert artifact(mlflow_server, run_id, f"gpudiag/{name}") == (run_dir / name).read_bytes()


def test_log_writes_into_the_run_named_by_mlflow_run_id_and_leaves_it_running(mlflow_server, profiled):
    run_dir, _ = profiled
    exp = api(mlflow_server, "experiments/create", {"name": f"training-{os.getpid()}"})["experiment_id"]
    made = api(mlflow_server, "runs/create", {"experiment_id": exp, "run_name": "the training's own run",
                                              "start_time": int(time.time() * 1000)})
    theirs = made["run"]["info"]["run_id"]
    api(mlflow_server, "runs/log-parameter", {"run_id": theirs, "key": "lr", "value": "3e-4"})
    p = gpudiag("log", str(run_dir), "--mlflow",
                env={"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_RUN_ID": theirs})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == theirs
    metrics, params, _, status = run_data(mlflow_server, theirs)
    d = json.loads((run_dir / "diagnosis.json").read_text())
    assert status == "RUNNING"                       # the training still owns its run
    assert params["lr"] == "3e-4" and params["gpudiag/verdict"] == d["verdict"]["label"]
    assert metrics["gpudiag/mfu"] == pytest.approx(d["mfu"]["value"])


def test_without_mlflow_installed_one_line_says_how_to_install_it_and_nothing_runs(tmp_path):
    # sys.modules[name] = None is how Python marks a module as absent: `import mlflow` raises
    marker = tmp_path / "ran"
    code = ("import sys; sys.modules['mlflow'] = None; from gpudiag.cli import run; "
            "sys.argv = ['gpudiag', *sys.argv[1:]]; run()")
    for args in (["profile", "--mlflow", "--", "touch", str(marker)], ["log", str(tmp_path), "--mlflow"]):
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip() == "gpudiag: error: --mlflow needs MLflow: pip install 'gpudiag[mlflow]'"
    assert not marker.exists()
