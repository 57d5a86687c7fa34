"""The snapshot ``gpudiag top`` shows, built without a terminal: from a real agent collector's
exposition (replaying the recorded H100 readings) and from hand-computed job tables."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpudiag import contract as c
from gpudiag.agent.gpu_collector import GpuCollector
from gpudiag.collectors.nvml import ReplayBackend
from gpudiag.jobsignal import write_signal
from gpudiag.live.snapshot import build_snapshot, filter_owner, sort_jobs
from gpudiag.live.sources import NodeRead, Sample, parse_exposition
from gpudiag.reports.top_view import device_cells, render_text
from tests.conftest import SHARED
from tests.harness import free_port, prometheus_server
from tests.system.agent.test_agent import Agent, full_signal, wait_series

H100 = SHARED / "runs" / "h100-gpt-small" / "samples" / "gpu.jsonl"


def exposition(tmp_path, row: dict, mapping: dict[int, list[str]] | None) -> list[Sample]:
    """One recorded row on GPU 0, through the agent's own collector and Prometheus' text format."""
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({**row, "gpu": 0, "pids": []}) + "\n")
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(ReplayBackend(path), lambda pids: "",
                              (lambda: mapping) if mapping is not None else None))
    return parse_exposition(generate_latest(reg).decode())


def test_a_metric_the_gpu_did_not_give_reads_na_and_a_zero_reads_zero(tmp_path):
    rows = [json.loads(line) for line in H100.read_text().splitlines() if '"gpu"' in line]
    idle = next(r for r in rows if str(r["gpm_dram_bw_util"]).startswith("n/a"))   # NVML's NaN
    assert idle["gpm_sm_activity"] == 0.0
    snap = build_snapshot([NodeRead("n1", exposition(tmp_path, idle, None))], None, now=0.0)
    [dev] = snap.devices
    assert dev.dram_bw is None and dev.sm_active == 0.0
    cells = dict(zip(("node", "gpu", "model", "sm", "tensor", "dram"), device_cells(dev), strict=False))
    assert (cells["sm"], cells["dram"]) == ("0.0%", "n/a")
    assert json.loads(json.dumps(snap.to_dict()))["devices"][0]["dram_bw"] is None


def test_a_gpu_two_mapped_jobs_share_is_one_gpu_with_its_traffic_counted_once(tmp_path):
    rows = [json.loads(line) for line in H100.read_text().splitlines() if '"gpu"' in line]
    busy = max((r for r in rows if isinstance(r["gpm_pcie_rx_mib_s"], float)),
               key=lambda r: r["gpm_pcie_rx_mib_s"])
    snap = build_snapshot([NodeRead("n1", exposition(tmp_path, busy, {0: ["17", "18"]}))], None, now=0.0)
    [dev] = snap.devices
    assert dev.jobs == "slurm:17,slurm:18"
    assert dev.pcie_bytes_s == pytest.approx((busy["gpm_pcie_tx_mib_s"] + busy["gpm_pcie_rx_mib_s"]) * 2**20)
    assert {j.job_id: j.gpus for j in snap.jobs} == {"slurm:17": 1, "slurm:18": 1}


def job(job_id: str, mfu: float) -> list[Sample]:
    return [Sample(c.JOB_MFU, {"job_id": job_id}, mfu),
            Sample(c.JOB_LAST_SIGNAL, {"job_id": job_id}, 90.0)]


def gpus(job_id: str, n: int) -> list[Sample]:
    return [Sample(c.GPU_UP, {"gpu": str(i), "job_id": job_id, "model": "m"}, 1.0) for i in range(n)]


def test_jobs_come_in_wasted_gpu_time_order_against_their_class_median():
    # class "1 GPU" has three jobs (MFU 10%, 20%, 40%: median 20%); the 8-GPU job is alone in its
    # class, so it is held against the median of all four (12% and 20%: 16%)
    node = NodeRead("n1", [*job("a", 0.10), *gpus("a", 1)])
    other = NodeRead("n2", [*job("b", 0.20), *job("c", 0.40), *job("big", 0.12),
                            *[Sample(c.GPU_UP, {"gpu": str(g), "job_id": j, "model": "m"}, 1.0)
                              for g, j in enumerate(["b", "c", *["big"] * 8])]])
    snap = build_snapshot([node, other], None, now=100.0)
    waste = {j.job_id: round(j.waste_gpus, 6) for j in snap.jobs}
    assert waste == {"a": 0.5, "b": 0.0, "c": -1.0, "big": 2.0}
    assert [j.job_id for j in snap.jobs] == ["big", "a", "b", "c"]
    assert {j.job_id: j.median_of for j in snap.jobs} == {"a": "1 GPU", "b": "1 GPU", "c": "1 GPU",
                                                          "big": "all jobs"}
    assert [j.job_id for j in sort_jobs(snap.jobs, "mfu")] == ["a", "big", "b", "c"]
    assert snap.jobs[0].last_signal_seconds_ago == 10.0
    assert filter_owner(snap.jobs, "nobody") == []
    ids = {"a", "b", "c", "big"}
    shown = [ln.split()[0] for ln in render_text(snap).splitlines() if ln.split() and ln.split()[0] in ids]
    assert shown == ["big", "a", "b", "c"]   # --once prints the same order


def test_another_users_signals_naming_a_job_stay_in_a_row_of_their_own():
    # the agent's identity is (job_id, owner_uid): after root's job 7 ended, uid 54321 reported
    # MFU 0.1% under its id; the view must not show that MFU as root's job's
    def owned(mfu: float, uid: str) -> list[Sample]:
        return [Sample(c.JOB_MFU, {"job_id": "gpudiag:7", "owner_uid": uid}, mfu),
                Sample(c.JOB_LAST_SIGNAL, {"job_id": "gpudiag:7", "owner_uid": uid},
                       90.0)]
    snap = build_snapshot([NodeRead("n1", [*owned(0.40, "0"), *owned(0.001, "54321")])], None, now=100.0)
    by_owner = {j.owner: j.mfu for j in snap.jobs}
    assert by_owner == {"root": 0.40, "uid 54321": 0.001}


@pytest.mark.parametrize("args,needle", [
    (["top", "--agent", "ftp://gpu01:9835"], "use HOST:PORT"),
    (["top", "--agent", "gpu01:9835", "--prometheus", "http://prom:9090"], "not both"),
    (["top", "--interval", "10ms"], "--interval '10ms'"),
    (["top", "--interval", "soon"], "--interval 'soon'"),
    (["top"], "needs a terminal"),   # stdin/stdout are pipes here
    (["log", "/nonexistent-run", "--mlflow"], "not a gpudiag run directory"),
    (["log", "/nonexistent-run"], "--mlflow"),
])
def test_bad_top_and_log_invocations_are_one_line_and_exit_2(args, needle):
    r = subprocess.run([sys.executable, "-m", "gpudiag", *args], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (r.returncode, r.stderr)


def test_once_with_no_agent_answering_prints_why_and_exits_1():
    port = free_port()   # nothing listens there
    r = subprocess.run([sys.executable, "-m", "gpudiag", "top", "--once", "--agent", f"127.0.0.1:{port}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"127.0.0.1:{port}: not reachable" in r.stdout
    assert r.stderr.strip().splitlines() == [f"gpudiag: error: nothing could be read from "
                                             f"http://127.0.0.1:{port}/metrics"]


def test_through_a_real_prometheus_top_sees_what_it_sees_from_the_agent(tmp_path):
    """--prometheus: one query to a real Prometheus scraping a real agent gives the snapshot that
    reading the agent itself gives (Prometheus' instance label is the agent's address)."""
    rows = [json.loads(line) for line in H100.read_text().splitlines() if '"gpu"' in line]
    replay = tmp_path / "h100.jsonl"
    replay.write_text(json.dumps({**max(rows, key=lambda r: r["power_mw"]), "gpu": 0, "pids": []}) + "\n")
    agent = Agent(tmp_path / "state", backend=f"replay:{replay}")
    try:
        write_signal(agent.state / "spool", full_signal("slurm:9"))
        with prometheus_server(tmp_path, agent.port) as prom:
            wait_series(prom, 'gpudiag_job_mfu_ratio{job_id="slurm:9"}')
            wait_series(prom, c.GPU_POWER)
            via = {}
            for how in (["--prometheus", prom], ["--agent", f"127.0.0.1:{agent.port}"]):
                r = subprocess.run([sys.executable, "-m", "gpudiag", "top", "--once", "--json", *how],
                                   capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, r.stderr
                via[how[0]] = json.loads(r.stdout)
    finally:
        agent.stop()
    moving = ("signal_age_seconds", "last_signal_seconds_ago")   # ages: taken at each read
    jobs = {k: [{f: v for f, v in j.items() if f not in moving} for j in d["jobs"]] for k, d in via.items()}
    assert via["--prometheus"]["devices"] == via["--agent"]["devices"]
    assert jobs["--prometheus"] == jobs["--agent"] and jobs["--agent"][0]["mfu"] == 0.31
    assert via["--prometheus"]["devices"][0]["power_watts"] == max(r["power_mw"] for r in rows) / 1000


def test_an_ended_job_is_marked_from_the_agents_table_and_shown_once():
    """The agent's job table exports when a job said it ended; the view marks the row with its
    last values, and the next refresh drops it (the agent still exports it, for Prometheus)."""
    import tempfile
    from pathlib import Path

    from gpudiag.agent.job_table import JobTable
    from gpudiag.live.snapshot import drop_shown_ended

    with tempfile.TemporaryDirectory() as d:
        table = JobTable(Path(d))
        write_signal(table.spool, full_signal("run:1", mfu_ratio=0.25))
        write_signal(table.spool, full_signal("run:2", mfu_ratio=0.40))
        write_signal(table.spool, full_signal("run:2", mfu_ratio=0.41, ended=True))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(table)
        samples = parse_exposition(generate_latest(reg).decode())
    snap = build_snapshot([NodeRead("n1", samples)], None, now=time.time())
    by_id = {j.job_id: j for j in snap.jobs}
    assert not by_id["run:1"].ended and by_id["run:2"].ended and by_id["run:2"].mfu == 0.41
    assert 0 <= by_id["run:2"].ended_seconds_ago < 60
    text = render_text(snap)
    assert "run:2 (ended)" in text and "run:1 (ended)" not in text
    doc = {j["job_id"]: j for j in json.loads(json.dumps(snap.to_dict()))["jobs"]}
    assert doc["run:1"]["ended_seconds_ago"] is None and doc["run:2"]["ended_seconds_ago"] is not None
    shown = drop_shown_ended(snap, set())  # the first refresh shows it
    assert {j.job_id for j in snap.jobs} == {"run:1", "run:2"}
    again = build_snapshot([NodeRead("n1", samples)], None, now=0.0)
    drop_shown_ended(again, shown)  # the next one no longer does; the running job stays
    assert [j.job_id for j in again.jobs] == ["run:1"]
