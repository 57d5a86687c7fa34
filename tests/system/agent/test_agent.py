"""``gpudiag agent``: a real Prometheus scrapes it; promtool checks it; faults and churn."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpudiag.agent.gpu_collector import GpuCollector
from gpudiag.agent.job_table import JobTable
from gpudiag.agent.signals import MAX_SIGNAL_BYTES, parse_signal
from gpudiag.collectors.job_signals import own_step
from gpudiag.collectors.nvml import NO_BACKEND_REASON, ReplayBackend
from gpudiag.jobsignal import write_signal
from tests.harness import free_port, prometheus_server, wait_http
from tests.paths import REPO
from tests.replay import GpuFallsOffTheBus

ROOT = REPO
REPLAY = ROOT / "tests" / "fixtures" / "h200" / "profile_gemm_gpu.jsonl"
DASHBOARD = ROOT / "agent" / "deploy" / "grafana-dashboard.json"
JOB = ROOT / "tests" / "jobs" / "loop_job.py"


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # loopback only
        return r.read().decode()


class Agent:
    def __init__(self, state: Path, backend: str = f"replay:{REPLAY}") -> None:
        self.port = free_port()
        self.state = state
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpudiag", "agent", "--listen", f"127.0.0.1:{self.port}",
             "--backend", backend, "--state-dir", str(state)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_http(self.url)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def metrics(self) -> str:
        return http_get(self.url)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=20)
        return err

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop()


@pytest.fixture
def agent(tmp_path):
    a = Agent(tmp_path / "state")
    yield a
    if a.proc.poll() is None:
        a.stop()


def promtool_check(text: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (.ci/run installs Debian's prometheus)"
    return subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)


# a schema-2 signal with every field a job may send
def full_signal(job_id: str, **over: object) -> dict:
    now = time.time()
    return {"job_id": job_id, "ts": now, "mfu_ratio": 0.31, "bottleneck": "memory-bound",
            "confidence": 0.8, "mfu_confidence": 0.87, "traced_at": now - 120.0, "dilation": 1.25,
            "traced_steps": 5,
            "step_seconds": 0.2, "input_wait_ratio": 0.03, "collective_seconds_total": {"all_reduce": 3.0},
            **over}


def sample_value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert m, f"{series} not in the scrape"
    return float(m.group(1))


def test_metrics_pass_promtool_with_gpu_and_job_series(agent):
    write_signal(agent.state / "spool", full_signal("slurm:7"))
    text = agent.metrics()
    assert 'gpudiag_gpu_up{gpu="0",job_id="",model="NVIDIA H200",uuid="replay-0"} 1.0' in text
    assert 'gpudiag_job_mfu_ratio{job_id="slurm:7",owner_uid="0"} 0.31' in text
    assert ('gpudiag_job_collective_seconds_total{collective="all_reduce",job_id="slurm:7",owner_uid="0"} 3.0'
            in text)
    assert 'gpudiag_job_signal_confidence{job_id="slurm:7",owner_uid="0"} 0.8' in text
    assert 'gpudiag_job_mfu_confidence{job_id="slurm:7",owner_uid="0"} 0.87' in text
    assert 'gpudiag_job_profiler_dilation_ratio{job_id="slurm:7",owner_uid="0"} 1.25' in text
    assert 'gpudiag_job_signal_traced_steps{job_id="slurm:7",owner_uid="0"} 5.0' in text
    age = sample_value(text, 'gpudiag_job_signal_age_seconds{job_id="slurm:7",owner_uid="0"}')
    assert 120.0 <= age < 150.0
    assert "gpudiag_agent_signals_applied_total 1.0" in text
    check = promtool_check(text)
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr


def test_without_nvml_the_agent_says_so_once_and_exports_health(tmp_path):
    # --backend none takes the path a failed nvmlInit takes (NvmlUnavailable from
    # open_backend), whether or not this host has NVML
    a = Agent(tmp_path / "state", backend="none")
    try:
        text = a.metrics()
        a.metrics()
    finally:
        err = a.stop()
    assert "gpudiag_nvml_up 0.0" in text and "gpudiag_host_cpus" in text
    assert "gpudiag_gpu_up{" not in text
    assert err.count(NO_BACKEND_REASON) == 1
    assert promtool_check(text).returncode == 0


def test_bad_signals_are_rejected_counted_and_never_crash_the_agent(agent):
    spool = agent.state / "spool"
    (spool / "a.json").write_text("{not json")
    (spool / "b.json").write_bytes(b"{" + b" " * (MAX_SIGNAL_BYTES + 10) + b"}")
    (spool / "c.json").write_text(json.dumps({"schema_version": 1, "job_id": "x", "ts": time.time(),
                                              "bottleneck": "<script>"}))
    (spool / "d.json").write_text(json.dumps({"schema_version": 1, "job_id": "y" * 500, "ts": 1.0}))
    os.symlink("/etc/passwd", spool / "e.json")
    text = agent.metrics()
    assert 'gpudiag_agent_signals_rejected_total{reason="not_json"} 1.0' in text
    assert 'gpudiag_agent_signals_rejected_total{reason="too_large"} 1.0' in text
    assert 'gpudiag_agent_signals_rejected_total{reason="bad_value"} 1.0' in text
    assert 'gpudiag_agent_signals_rejected_total{reason="job_id"} 1.0' in text
    assert 'gpudiag_agent_signals_rejected_total{reason="not_regular_file"} 1.0' in text
    assert "gpudiag_agent_jobs 0.0" in text
    assert list(spool.iterdir()) == []  # consumed, not left to be re-read
    assert agent.proc.poll() is None
    assert oct(spool.stat().st_mode & 0o7777) == "0o1733"


def test_job_signals_survive_a_killed_agent(tmp_path):
    state = tmp_path / "state"
    a = Agent(state)
    write_signal(state / "spool", {"job_id": "torchrun:abc", "ts": time.time(), "mfu_ratio": 0.42})
    assert 'gpudiag_job_mfu_ratio{job_id="torchrun:abc",owner_uid="0"} 0.42' in a.metrics()
    a.stop(signal.SIGKILL)
    b = Agent(state)
    try:
        assert 'gpudiag_job_mfu_ratio{job_id="torchrun:abc",owner_uid="0"} 0.42' in b.metrics()
    finally:
        b.stop()


def test_a_gpu_off_the_bus_is_marked_down_and_the_others_stay_up():
    reg = CollectorRegistry()
    reg.register(GpuCollector(GpuFallsOffTheBus(good_reads=2), lambda pids: ""))
    for _ in range(4):
        text = generate_latest(reg).decode()
    assert re.search(r'gpudiag_gpu_up\{gpu="0",[^}]*\} 1\.0', text)
    assert re.search(r'gpudiag_gpu_up\{gpu="1",[^}]*\} 0\.0', text)
    assert re.search(r'gpudiag_gpu_errors_total\{gpu="1",[^}]*\} 2\.0', text)
    assert re.search(r'gpudiag_gpu_power_watts\{gpu="0",', text)


def test_jobs_churning_six_times_past_its_bound_keep_the_table_bounded(tmp_path):
    """3,000 jobs through a table of 512, 50 alive at a time: the ended ones make room. (10,000
    asked the same and cost 53 s of the suite's first pass in a CI clone, most of it creating
    20,000 signal files.)"""
    table = JobTable(tmp_path / "state", ttl=30.0, max_jobs=512)
    t0 = 1_000_000.0
    peak = 0
    for i in range(3_000):
        now = t0 + i * 0.1  # a job starts every 100 ms
        write_signal(table.spool, {"job_id": f"job-{i}", "ts": now, "step_seconds": 0.5})
        if i >= 50:  # and jobs end, 50 behind
            write_signal(table.spool, {"job_id": f"job-{i - 50}", "ts": now, "ended": True})
        if i % 100 == 0:
            table.ingest(now=now)
            peak = max(peak, len(table.jobs))
    assert peak == 512  # the bound was reached: ended jobs were evicted to make room
    table.ingest(now=t0 + 3_000 * 0.1 + 120)
    assert len(table.jobs) == 0
    assert table.rejected.get("too_many_jobs", 0) == 0
    assert len(json.loads((tmp_path / "state" / "jobs.json").read_text())["jobs"]) == 0


def test_the_job_table_refuses_jobs_beyond_its_bound(tmp_path):
    table = JobTable(tmp_path / "state", max_jobs=10)
    for i in range(15):
        write_signal(table.spool, {"job_id": f"j{i}", "ts": time.time()})
    table.ingest()
    assert len(table.jobs) == 10 and table.rejected["too_many_jobs"] == 5


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_scrapes_grow_rss_by_under_a_kilobyte_each(tmp_path):
    """2,500 scrapes of 100 jobs and a GPU, RSS after against before: a leak of a kilobyte a
    scrape fails it (5,000 scrapes against 5 MB asked the same and cost 22 CPU-s of the suite)."""
    table = JobTable(tmp_path / "state")
    reg = CollectorRegistry()
    reg.register(GpuCollector(ReplayBackend(REPLAY), lambda pids: "job"))
    reg.register(table)
    for i in range(100):
        write_signal(table.spool, {"job_id": f"job-{i}", "ts": time.time(), "mfu_ratio": 0.5,
                                   "bottleneck": "compute-bound",
                                   "collective_seconds_total": {"all_reduce": 1.0}})
    for _ in range(200):  # warm up allocator pools
        generate_latest(reg)
    gc.collect()
    before = _rss()
    for _ in range(2500):
        generate_latest(reg)
    gc.collect()
    assert _rss() - before < 2500 * 2**10


def test_parse_signal_accepts_the_documented_format():
    sig = parse_signal(json.dumps({"schema_version": 1, "job_id": "k8s:pod 1", "ts": 5.0,
                                   "input_wait_ratio": 0.25, "ended": False}).encode())
    assert sig.job_id == "k8s:pod_1" and sig.input_wait_ratio == 0.25


# --- a real Prometheus server --------------------------------------------------------------------

@pytest.fixture
def prometheus(tmp_path, agent):
    with prometheus_server(tmp_path, agent.port) as base:
        yield base


def promql(base: str, expr: str) -> dict:
    data = json.loads(http_get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}"))
    assert data["status"] == "success", (expr, data)
    return data["data"]


def wait_series(base: str, expr: str, timeout: float = 60.0) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = promql(base, expr)["result"]
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"no series for {expr}")


def test_real_prometheus_reads_back_the_mfu_and_label_of_a_profiled_job(tmp_path, agent, prometheus):
    env = {**os.environ, "GPUDIAG_AGENT_DIR": str(agent.state), "GPUDIAG_SIGNAL_INTERVAL": "1",
           "GPUDIAG_JOB": "e2e-job"}
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(tmp_path / "run"),
                           "--skip", "2", "--steps", "3", "--", sys.executable, str(JOB), "--steps", "40",
                           "--sleep", "0.05"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    d = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    # signals sent while the job ran carry running estimates; the last one, sent at the end,
    # carries the diagnosis' FLOPs over the job's own recent pace (the waits other processes
    # caused left out: ``job_signals.own_step``): Prometheus must get there within a few scrapes
    m = d["mfu"]
    final = min(1.0, m["flops_per_step"] / own_step(tmp_path / "run") / m["peak_flops"])
    expr = 'gpudiag_job_mfu_ratio{job_id="e2e-job"}'
    end = time.monotonic() + 30
    seen = None
    while time.monotonic() < end:
        seen = float(wait_series(prometheus, expr)[0]["value"][1])
        if seen == pytest.approx(final, rel=1e-6):
            break
        time.sleep(0.5)
    assert seen == pytest.approx(final, rel=1e-6)
    label = wait_series(prometheus, 'gpudiag_job_bottleneck{job_id="e2e-job"} == 1')
    assert label[0]["metric"]["label"] == d["verdict"]["label"]
    up = wait_series(prometheus, "gpudiag_gpu_up")
    assert up[0]["metric"]["model"] == "NVIDIA H200"


PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside strings, label
    matchers, ranges and by/without/on/ignoring lists that are not functions or keywords."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", s):
        if m.group() in PROMQL_WORDS or s[m.end():].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def test_promql_metric_names_finds_a_misspelled_metric():
    assert promql_metric_names(
        'sum by (gpu) (rate(gpudiag_gpu_erors_total{instance=~"$instance"}[5m])) > 1e3 or vector(0)'
    ) == {"gpudiag_gpu_erors_total"}
    assert promql_metric_names("a_total / on (job_id) b_seconds") == {"a_total", "b_seconds"}


def test_every_dashboard_expression_reads_exported_metrics_and_evaluates(agent, prometheus):
    write_signal(agent.state / "spool", full_signal("dash-job"))
    exported = {ln.split("{")[0].split(" ")[0] for ln in agent.metrics().splitlines()
                if ln and not ln.startswith("#")}
    wait_series(prometheus, 'gpudiag_job_signal_age_seconds{job_id="dash-job"}')
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    for expr in exprs:
        assert promql_metric_names(expr) <= exported, (expr, promql_metric_names(expr) - exported)
        promql(prometheus, expr.replace("$instance", ".*").replace("$job_id", ".*"))
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.match(r"label_values\((\w+), (\w+)\)", var["query"])
            assert m, var["query"]
            assert m.group(1) in exported, var["query"]
            assert wait_series(prometheus, m.group(1))[0]["metric"].get(m.group(2)), var["query"]


@pytest.mark.parametrize("env,expected", [
    ({"GPUDIAG_JOB": "train-llm"}, "train-llm"),
    ({"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "r1"}, "slurm:4242"),
    ({"TORCHELASTIC_RUN_ID": "abc"}, "torchrun:abc"),
    ({}, ""),
])
def test_a_process_is_attributed_to_its_job_from_its_environment(env, expected):
    from gpudiag.agent.attribution import JobAttribution

    clean = {k: v for k, v in os.environ.items()
             if k not in ("GPUDIAG_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")}
    p = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                         env={**clean, **env}, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"  # exec'ed: /proc/<pid>/environ is the child's
        attribute = JobAttribution()
        assert attribute([p.pid]) == expected
    finally:
        p.kill()
        p.wait()
