"""The agent's job table: concurrent scrapes, signal schema 2, jobs.json, and signals bound
to the user who runs the job (with real second users, created here and removed after)."""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpudiag.agent.attribution import JobAttribution, JobOwners
from gpudiag.agent.gpu_collector import GpuCollector
from gpudiag.agent.job_table import JobTable
from gpudiag.agent.signals import BadSignal, JobTableError, parse_signal, read_job_table
from gpudiag.collectors.nvml import ReplayBackend
from gpudiag.jobsignal import write_signal
from tests.harness import unix_users
from tests.test_agent import REPLAY, Agent, full_signal, sample_value

SCRAPERS, SCRAPES_EACH = 8, 200


def registry(state: Path, backend: ReplayBackend) -> tuple[CollectorRegistry, JobTable]:
    """What the agent registers, in its order: GPUs (attributing processes to jobs and
    owners) before the job table."""
    owners = JobOwners()
    table = JobTable(state, owners)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(backend, JobAttribution(owners)))
    reg.register(table)
    return reg, table


def test_concurrent_scrapes_apply_every_signal_once_and_jobs_json_stays_valid(tmp_path):
    backend = ReplayBackend(REPLAY)
    reg, table = registry(tmp_path / "state", backend)
    written: dict[str, int] = {}
    errors: list[str] = []
    reads = 0
    scraping, done = threading.Event(), threading.Event()

    def scraper() -> None:
        scraping.wait()
        for _ in range(SCRAPES_EACH):
            try:
                generate_latest(reg)
            except Exception as e:  # noqa: BLE001 - collected and asserted on below
                errors.append(f"scrape: {e!r}")

    def producer() -> None:  # signals flow for as long as the scrapes last
        k = 0
        scraping.set()
        while not done.is_set() or k < 3:
            for j in range(16):
                job = f"job-{j}"
                write_signal(table.spool, {"job_id": job, "ts": time.time(), "step_seconds": float(k),
                                           "collective_seconds_total": {"all_reduce": float(k)}})
                written[job] = written.get(job, 0) + 1
            k += 1
            time.sleep(0.002)

    def reader() -> None:  # another process's view: jobs.json at any moment
        nonlocal reads
        while not done.is_set():
            try:
                read_job_table(table.state_file)
                reads += 1
            except FileNotFoundError:
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(f"jobs.json: {e!r}")

    scrapers = [threading.Thread(target=scraper) for _ in range(SCRAPERS)]
    others = [threading.Thread(target=producer), threading.Thread(target=reader)]
    for t in [*others, *scrapers]:
        t.start()
    for t in scrapers:
        t.join()
    done.set()
    for t in others:
        t.join()
    table.ingest()  # what the producer wrote after the last scrape
    assert errors == []
    assert reads > 0
    assert table.rejected == {}
    assert table.applied == sum(written.values())
    jobs = read_job_table(table.state_file)
    assert {j: s.signals_applied for j, s in jobs.items()} == written
    assert all(s.step_seconds == written[j] - 1 for j, s in jobs.items())  # the last one won
    assert backend.pos == [SCRAPERS * SCRAPES_EACH]  # each scrape read the GPU exactly once
    assert list(table.spool.iterdir()) == []


# --- schema 2 ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_schema_1_and_2_signals_are_accepted(version):
    sig = parse_signal(json.dumps({"schema_version": version, "job_id": "j", "ts": 5.0,
                                   "mfu_ratio": 0.4}).encode())
    assert sig.mfu_ratio == 0.4 and sig.confidence is None and sig.traced_at is None


@pytest.mark.parametrize("field,value", [
    ("schema_version", 3), ("confidence", 1.5), ("confidence", -0.1), ("confidence", "high"),
    ("dilation", 0), ("dilation", -2.0), ("dilation", math.inf), ("traced_steps", -1),
    ("traced_steps", 2.5), ("traced_steps", True), ("traced_at", -5), ("traced_at", "yesterday"),
    ("run_dir", "runs/relative"), ("run_dir", "/a\nb"), ("run_dir", "/" + "x" * 1024), ("run_dir", 7),
])
def test_bad_schema_2_fields_are_refused_with_a_reason(field, value):
    doc = {"schema_version": 2, "job_id": "j", "ts": 5.0, field: value}
    with pytest.raises(BadSignal) as e:
        parse_signal(json.dumps(doc).encode())
    assert e.value.reason == ("schema" if field == "schema_version" else "bad_value")


def test_signal_age_is_scrape_time_minus_traced_at_and_absent_without_it(tmp_path):
    table = JobTable(tmp_path / "state")
    now = time.time()
    write_signal(table.spool, full_signal("traced", traced_at=now - 300.0))
    write_signal(table.spool, {"job_id": "untraced", "ts": now, "step_seconds": 0.5})
    reg = CollectorRegistry(auto_describe=False)
    reg.register(table)
    text = generate_latest(reg).decode()
    assert 300.0 <= sample_value(text, 'gpudiag_job_signal_age_seconds{job_id="traced"}') < 330.0
    assert 'gpudiag_job_signal_age_seconds{job_id="untraced"}' not in text
    assert 'gpudiag_job_signal_confidence{job_id="untraced"}' not in text
    # the MFU follows the job's live step time: each signal's MFU replaces the last
    write_signal(table.spool, {"job_id": "traced", "ts": time.time(), "step_seconds": 0.4,
                               "mfu_ratio": 0.155})
    text = generate_latest(reg).decode()
    assert 'gpudiag_job_mfu_ratio{job_id="traced"} 0.155' in text
    assert 'gpudiag_job_step_seconds{job_id="traced"} 0.4' in text
    assert 'gpudiag_job_signal_confidence{job_id="traced"} 0.8' in text  # omitted: kept


def test_a_late_older_signal_is_counted_stale_not_applied(tmp_path):
    table = JobTable(tmp_path / "state")
    write_signal(table.spool, {"job_id": "j", "ts": 2000.0, "mfu_ratio": 0.5})
    table.ingest(now=2000.0)
    write_signal(table.spool, {"job_id": "j", "ts": 1999.0, "mfu_ratio": 0.1})
    table.ingest(now=2001.0)
    assert table.jobs["j"].mfu_ratio == 0.5 and table.jobs["j"].signals_applied == 1
    assert table.applied == 1 and table.rejected == {"stale": 1}


# --- jobs.json -----------------------------------------------------------------------------

def test_jobs_json_is_a_versioned_table_with_every_field_a_scheduler_reads(tmp_path):
    table = JobTable(tmp_path / "state")
    write_signal(table.spool, full_signal("a"))
    write_signal(table.spool, {"job_id": "b", "ts": time.time(), "ended": True})
    table.ingest()
    doc = json.loads(table.state_file.read_text())
    assert doc["schema_version"] == 2 and doc["kind"] == "gpudiag-job-table"
    assert oct(table.state_file.stat().st_mode & 0o777) == "0o644"
    row = next(j for j in doc["jobs"] if j["job_id"] == "a")
    for key in ("job_id", "owner_uid", "mfu_ratio", "bottleneck", "confidence", "traced_at", "dilation",
                "traced_steps", "step_seconds", "ts", "received_at", "ended", "signals_applied"):
        assert key in row, key
    assert row["owner_uid"] is None  # only root (this test) wrote: bound to no one yet
    assert read_job_table(table.state_file) == table.jobs
    assert [p.name for p in table.state_dir.iterdir() if p.name.endswith(".partial")] == []


@pytest.mark.parametrize("content,needle", [
    ("{half", "not JSON"),
    ('{"schema_version": 99, "jobs": []}', "schema"),
    ('{"schema_version": 2, "jobs": {}}', "list"),
    ('{"schema_version": 2, "jobs": [{"job_id": "a", "ts": 1, "confidence": 2}]}', "confidence"),
])
def test_read_job_table_refuses_what_it_does_not_understand(tmp_path, content, needle):
    p = tmp_path / "jobs.json"
    p.write_text(content)
    with pytest.raises(JobTableError, match=needle):
        read_job_table(p)


def test_an_agent_upgraded_over_a_schema_1_table_keeps_its_jobs(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.json").write_text(json.dumps({"schema_version": 1, "jobs": [
        {"job_id": "old", "ts": time.time(), "mfu_ratio": 0.42, "bottleneck": "compute-bound",
         "input_wait_ratio": None, "step_seconds": None, "collective_seconds_total": {}, "ended": False}]}))
    table = JobTable(state)
    assert table.jobs["old"].mfu_ratio == 0.42 and table.jobs["old"].owner_uid is None


# --- signals bound to their writer -------------------------------------------------------------

@pytest.fixture
def users():
    """Two real unprivileged users (unique names), removed afterwards."""
    with unix_users("gpdu") as made:
        yield made


@pytest.fixture
def open_state():
    """A state folder other users can reach (pytest's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="gpudiag-owner-"))
    os.chmod(d, 0o755)
    yield d / "state"
    shutil.rmtree(d, ignore_errors=True)


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def write_as(user: pwd.struct_passwd, spool: Path, sig: dict) -> None:
    """Drop a schema-2 signal into the spool from a process of ``user``, the way
    ``write_signal`` does (hidden temp file, then rename): the file is that user's.
    The shell does the writing because this interpreter lives where other users cannot
    run it; the agent sees only the file and its owner."""
    name = f"{sig['job_id']}-{uuid.uuid4().hex}"
    r = subprocess.run(["/bin/sh", "-c", 'umask 022; cat > "$0/.$1.tmp" && mv "$0/.$1.tmp" "$0/$1.json"',
                        str(spool), name], input=json.dumps({"schema_version": 2, **sig}),
                       user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=_env(), cwd="/",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (spool / f"{name}.json").stat().st_uid == user.pw_uid  # scrapes consume it later


def test_a_job_is_bound_to_its_first_writer_and_others_cannot_report_for_it(users, open_state):
    alice, mallory = users
    a = Agent(open_state)
    spool = open_state / "spool"
    try:
        write_as(alice, spool, full_signal("train-7", mfu_ratio=0.5))
        assert sample_value(a.metrics(), 'gpudiag_job_mfu_ratio{job_id="train-7"}') == 0.5
        write_as(mallory, spool, full_signal("train-7", mfu_ratio=0.01, bottleneck="input-bound"))
        text = a.metrics()
        assert sample_value(text, 'gpudiag_job_mfu_ratio{job_id="train-7"}') == 0.5
        assert 'gpudiag_job_bottleneck{job_id="train-7",label="input-bound"}' not in text
        assert 'gpudiag_agent_signals_rejected_total{reason="owner"} 1.0' in text
        write_signal(spool, {"job_id": "train-7", "ts": time.time(), "mfu_ratio": 0.6})  # root may
        write_as(mallory, spool, full_signal("mallory-1", mfu_ratio=0.2))  # her own job
        text = a.metrics()
        assert sample_value(text, 'gpudiag_job_mfu_ratio{job_id="train-7"}') == 0.6
        assert sample_value(text, 'gpudiag_job_mfu_ratio{job_id="mallory-1"}') == 0.2
        jobs = read_job_table(open_state / "jobs.json")
        assert (jobs["train-7"].owner_uid, jobs["mallory-1"].owner_uid) == (alice.pw_uid, mallory.pw_uid)
    finally:
        err = a.stop()
    assert re.search(r"rejected signal train-7-\S+: job train-7 belongs to uid \d+.*: owner", err), err


class ReplayWithPids(ReplayBackend):
    """The real H200 recording, its GPU running these live processes of this host (NVML
    reports the pids of whatever runs on the GPU; only the hardware is replayed)."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(REPLAY)
        self.pids = pids

    def sample(self, index: int) -> dict:
        return {**super().sample(index), "pids": list(self.pids)}


def start_as(user: pwd.struct_passwd, job: str) -> subprocess.Popen:
    p = subprocess.Popen(["/bin/sh", "-c", "echo up; exec sleep 120"], user=user.pw_uid,
                         group=user.pw_gid, extra_groups=[], cwd="/", env={**_env(), "GPUDIAG_JOB": job},
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "up"  # started: /proc/<pid>/environ is the job's
    return p


def test_the_uid_running_a_jobs_processes_owns_its_signals(users, open_state):
    alice, mallory = users
    pids: list[int] = []
    reg, table = registry(open_state, ReplayWithPids(pids))
    procs = [start_as(alice, "victim")]
    try:
        pids.append(procs[0].pid)
        # mallory names alice's running job before any signal of alice: the process owner wins
        write_as(mallory, table.spool, full_signal("victim", mfu_ratio=0.01))
        text = generate_latest(reg).decode()
        assert 'gpudiag_gpu_up{gpu="0",job_id="victim"' in text
        assert 'job_id="victim"' not in text.split("gpudiag_job_mfu_ratio", 1)[1]
        assert table.rejected == {"owner": 1}
        write_as(alice, table.spool, full_signal("victim", mfu_ratio=0.45))
        text = generate_latest(reg).decode()
        assert sample_value(text, 'gpudiag_job_mfu_ratio{job_id="victim"}') == 0.45
        # mallory reports first for a job whose processes have not run yet; when alice's start,
        # mallory's values leave the table, and alice's own signals are taken
        write_as(mallory, table.spool, full_signal("victim2", mfu_ratio=0.02))
        assert sample_value(generate_latest(reg).decode(), 'gpudiag_job_mfu_ratio{job_id="victim2"}') == 0.02
        procs.append(start_as(alice, "victim2"))
        pids.append(procs[1].pid)
        text = generate_latest(reg).decode()  # attributes alice's process, then ingests
        assert 'job_id="victim2"}' not in text.split("gpudiag_job_mfu_ratio", 1)[1]
        write_as(alice, table.spool, full_signal("victim2", mfu_ratio=0.33))
        assert sample_value(generate_latest(reg).decode(), 'gpudiag_job_mfu_ratio{job_id="victim2"}') == 0.33
        assert read_job_table(table.state_file)["victim2"].owner_uid == alice.pw_uid
    finally:
        for p in procs:
            p.kill()
            p.wait()
