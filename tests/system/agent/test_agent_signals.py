"""The agent's job table: concurrent scrapes, signal schema 2, jobs.json, and signals whose
identity includes their writer (with real second users, created here and removed after)."""

from __future__ import annotations

import json
import math
import os
import pwd
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
from gpudiag.agent.server import intake
from gpudiag.agent.signals import BadSignal, JobTableError, parse_signal, read_job_table
from gpudiag.collectors.nvml import ReplayBackend
from gpudiag.jobsignal import write_signal
from gpudiag.scheduler.local.signals import JobTableSource, MetricsSource
from tests.harness import unix_users
from tests.system.agent.test_agent import REPLAY, Agent, full_signal, sample_value

SCRAPERS, SCRAPES_EACH = 8, 60  # 480 scrapes racing the intake: 1,600 cost 38 CPU-s of the suite


def registry(state: Path, backend: ReplayBackend) -> tuple[CollectorRegistry, JobTable]:
    """What the agent registers, in its order: GPUs (attributing processes to jobs and
    owners) before the job table."""
    owners = JobOwners()
    table = JobTable(state, owners)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpuCollector(backend, JobAttribution(owners)))
    reg.register(table)
    return reg, table


def test_concurrent_scrapes_and_intake_apply_every_signal_once_and_jobs_json_stays_valid(tmp_path):
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
    # and the agent's own intake timer, as fast as it goes, racing the scrapes for every file
    others = [threading.Thread(target=producer), threading.Thread(target=reader),
              threading.Thread(target=intake, args=(table, done, 0.0))]
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
    assert {j: s.signals_applied for (j, _), s in jobs.items()} == written
    assert all(s.step_seconds == written[j] - 1 for (j, _), s in jobs.items())  # the last one won
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
    age = sample_value(text, 'gpudiag_job_signal_age_seconds{job_id="traced",owner_uid="0"}')
    assert 300.0 <= age < 330.0
    assert 'gpudiag_job_signal_age_seconds{job_id="untraced",owner_uid="0"}' not in text
    assert 'gpudiag_job_signal_confidence{job_id="untraced",owner_uid="0"}' not in text
    # the MFU follows the job's live step time: each signal's MFU replaces the last
    write_signal(table.spool, {"job_id": "traced", "ts": time.time(), "step_seconds": 0.4,
                               "mfu_ratio": 0.155})
    text = generate_latest(reg).decode()
    assert 'gpudiag_job_mfu_ratio{job_id="traced",owner_uid="0"} 0.155' in text
    assert 'gpudiag_job_step_seconds{job_id="traced",owner_uid="0"} 0.4' in text
    assert 'gpudiag_job_signal_confidence{job_id="traced",owner_uid="0"} 0.8' in text  # omitted: kept


def test_a_late_older_signal_is_counted_stale_not_applied(tmp_path):
    table = JobTable(tmp_path / "state")
    write_signal(table.spool, {"job_id": "j", "ts": 2000.0, "mfu_ratio": 0.5})
    table.ingest(now=2000.0)
    write_signal(table.spool, {"job_id": "j", "ts": 1999.0, "mfu_ratio": 0.1})
    table.ingest(now=2001.0)
    assert table.jobs[("j", 0)].mfu_ratio == 0.5 and table.jobs[("j", 0)].signals_applied == 1
    assert table.applied == 1 and table.rejected == {"stale": 1}


def test_a_future_dated_signal_is_refused_and_counted_and_the_jobs_next_honest_one_is_taken(tmp_path):
    table = JobTable(tmp_path / "state")
    t = time.time()
    write_signal(table.spool, {"job_id": "j", "ts": t, "mfu_ratio": 0.2})
    table.ingest(now=t)
    write_signal(table.spool, {"job_id": "j", "ts": t + 27 * 3600, "mfu_ratio": 0.6})  # 27 h ahead
    table.ingest(now=t + 1)
    assert table.rejected == {"future": 1} and table.jobs[("j", 0)].mfu_ratio == 0.2
    write_signal(table.spool, {"job_id": "j", "ts": t + 2 + 3.0, "mfu_ratio": 0.3})   # a clock 3 s ahead
    table.ingest(now=t + 2)
    assert table.jobs[("j", 0)].ts == t + 2           # taken as written now, not 3 s ahead
    write_signal(table.spool, {"job_id": "j", "ts": t + 3, "mfu_ratio": 0.25})        # honest, a second on
    table.ingest(now=t + 3)
    assert table.jobs[("j", 0)].mfu_ratio == 0.25 and table.rejected == {"future": 1}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(table)
    text = generate_latest(reg).decode()
    assert 'gpudiag_agent_signals_rejected_total{reason="future"} 1.0' in text
    # what a scheduler reads as "last heard from": the agent's receive time, never the job's claim
    seen = sample_value(text, 'gpudiag_job_last_signal_timestamp_seconds{job_id="j",owner_uid="0"}')
    assert seen == table.jobs[("j", 0)].received_at == t + 3


def test_a_table_written_with_a_future_dated_job_is_taken_as_of_now(tmp_path):
    table = JobTable(tmp_path / "state")
    write_signal(table.spool, {"job_id": "j", "ts": time.time(), "mfu_ratio": 0.2})
    table.ingest()
    doc = json.loads(table.state_file.read_text())
    doc["jobs"][0]["ts"] = time.time() + 27 * 3600     # as an agent without the check kept it
    table.state_file.write_text(json.dumps(doc))
    again = JobTable(tmp_path / "state")
    assert again.jobs[("j", 0)].ts <= time.time()


# --- jobs.json -----------------------------------------------------------------------------

def test_jobs_json_is_a_versioned_table_with_every_field_a_scheduler_reads(tmp_path):
    table = JobTable(tmp_path / "state")
    write_signal(table.spool, full_signal("a"))
    write_signal(table.spool, {"job_id": "b", "ts": time.time(), "ended": True})
    table.ingest()
    doc = json.loads(table.state_file.read_text())
    assert doc["schema_version"] == 3 and doc["kind"] == "gpudiag-job-table"
    assert oct(table.state_file.stat().st_mode & 0o777) == "0o644"
    row = next(j for j in doc["jobs"] if j["job_id"] == "a")
    for key in ("job_id", "owner_uid", "mfu_ratio", "bottleneck", "confidence", "traced_at", "dilation",
                "traced_steps", "step_seconds", "ts", "received_at", "ended", "signals_applied"):
        assert key in row, key
    assert row["owner_uid"] == 0  # root (this test) wrote it: root's job
    assert read_job_table(table.state_file) == table.jobs
    assert [p.name for p in table.state_dir.iterdir() if p.name.endswith(".partial")] == []


@pytest.mark.parametrize("content,needle", [
    ("{half", "not JSON"),
    ('{"schema_version": 99, "jobs": []}', "schema"),
    ('{"schema_version": 2, "jobs": {}}', "list"),
    ('{"schema_version": 2, "jobs": [{"job_id": "a", "ts": 1, "confidence": 2}]}', "confidence"),
    ('{"schema_version": 3, "jobs": [{"job_id": "a", "ts": 1}]}', "no owner_uid"),
    ('{"schema_version": 3, "jobs": [{"job_id": "a", "ts": 1, "owner_uid": 5}, '
     '{"job_id": "a", "ts": 2, "owner_uid": 5}]}', "twice"),
])
def test_read_job_table_refuses_what_it_does_not_understand(tmp_path, content, needle):
    p = tmp_path / "jobs.json"
    p.write_text(content)
    with pytest.raises(JobTableError, match=needle):
        read_job_table(p)


@pytest.mark.parametrize("version,owner,expected", [(1, None, None), (2, None, 0), (2, 1234, 1234)])
def test_an_agent_upgraded_over_an_older_table_keeps_its_jobs_and_their_owners(tmp_path, version, owner,
                                                                              expected):
    """Schema 1 recorded no writers (its jobs stay unowned: no scheduler attributes them);
    schema 2 left a job unowned while only root had reported for it: root's."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.json").write_text(json.dumps({"schema_version": version, "jobs": [
        {"job_id": "old", "ts": time.time(), "mfu_ratio": 0.42, "bottleneck": "compute-bound",
         "input_wait_ratio": None, "step_seconds": None, "collective_seconds_total": {}, "ended": False,
         **({"owner_uid": owner} if version > 1 else {})}]}))
    table = JobTable(state)
    assert table.jobs[("old", expected)].mfu_ratio == 0.42


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


def mfu_of(text: str, job: str, uid: int) -> float:
    return sample_value(text, f'gpudiag_job_mfu_ratio{{job_id="{job}",owner_uid="{uid}"}}')


def test_a_job_id_is_per_owner_so_no_user_writes_into_anothers_job(users, open_state):
    alice, mallory = users
    a = Agent(open_state)
    spool = open_state / "spool"
    try:
        write_as(alice, spool, full_signal("train-7", mfu_ratio=0.5))
        assert mfu_of(a.metrics(), "train-7", alice.pw_uid) == 0.5
        # mallory names alice's job, with a later ts (it would win a merge): her own job, not alice's
        write_as(mallory, spool, full_signal("train-7", mfu_ratio=0.01, bottleneck="input-bound",
                                             ts=time.time() + 3))
        write_signal(spool, {"job_id": "train-7", "ts": time.time(), "mfu_ratio": 0.6})  # root: root's own
        text = a.metrics()
        assert mfu_of(text, "train-7", alice.pw_uid) == 0.5
        label = f'gpudiag_job_bottleneck{{job_id="train-7",label="memory-bound",owner_uid="{alice.pw_uid}"}}'
        assert f"{label} 1.0" in text
        assert mfu_of(text, "train-7", mallory.pw_uid) == 0.01
        assert mfu_of(text, "train-7", 0) == 0.6
        jobs = read_job_table(open_state / "jobs.json")
        assert sorted(k for k in jobs if k[0] == "train-7") == sorted(
            [("train-7", alice.pw_uid), ("train-7", mallory.pw_uid), ("train-7", 0)])
        assert jobs[("train-7", alice.pw_uid)].signals_applied == 1
        # what a scheduler takes for alice's job: alice's values only
        read = JobTableSource(open_state / "jobs.json").read(time.time())
        mine = read.of("train-7", alice.pw_uid)
        assert (mine.mfu, mine.label) == (0.5, "memory-bound")
        assert read.attributed({"train-7": alice.pw_uid})["train-7"].mfu == 0.5
        scraped = MetricsSource(a.url).read(time.time())   # the same through /metrics
        assert scraped.of("train-7", alice.pw_uid).mfu == 0.5
        assert scraped.of("train-7", mallory.pw_uid).mfu == 0.01
    finally:
        err = a.stop()
    assert "only this user's jobs" not in err   # every folder above the spool is open to others


def test_a_spool_other_users_cannot_reach_is_said_at_start(tmp_path):
    """pytest's tmp_path is root's alone (0700): no other user's job could report there."""
    a = Agent(tmp_path / "agent", backend="none")
    err = a.stop()
    assert f"only this user's jobs can report to spool {tmp_path / 'agent' / 'spool'}" in err, err
    assert "other users cannot reach it" in err, err


def test_a_finished_root_jobs_signal_cannot_be_forged_by_another_user(users, open_state):
    """Issue 15's reproduction: a root job reports as GPUDIAG_JOB=victim and ends; then a user
    drops MFU 0.001, input-bound for victim into the spool. Root's job keeps its values for as
    long as the agent remembers it, and what the user wrote is the user's own job."""
    _, mallory = users
    a = Agent(open_state, backend="none")
    spool = open_state / "spool"
    try:
        for final in (False, True):   # what `gpudiag profile`'s reporter sends: live, then ended
            write_signal(spool, full_signal("victim", mfu_ratio=0.61, bottleneck="compute-bound",
                                            ended=final))
        wait_for_table(open_state, lambda jobs: jobs.get(("victim", 0)) and jobs[("victim", 0)].ended)
        write_as(mallory, spool, {"job_id": "victim", "ts": time.time(), "mfu_ratio": 0.001,
                                  "bottleneck": "input-bound", "step_seconds": 9.0})
        jobs = wait_for_table(open_state, lambda jobs: ("victim", mallory.pw_uid) in jobs)
        assert jobs[("victim", 0)].mfu_ratio == 0.61 and jobs[("victim", 0)].bottleneck == "compute-bound"
        assert jobs[("victim", mallory.pw_uid)].mfu_ratio == 0.001
        text = a.metrics()
        assert mfu_of(text, "victim", 0) == 0.61
        assert 'gpudiag_job_bottleneck{job_id="victim",label="input-bound",owner_uid="0"}' not in text
        read = JobTableSource(open_state / "jobs.json").read(time.time())
        assert read.of("victim", 0).mfu == 0.61 and read.of("victim", 0).label == "compute-bound"
    finally:
        a.stop()


def wait_for_table(state: Path, ok, timeout: float = 30.0) -> dict:
    """jobs.json once ``ok(jobs)``: the agent takes in its spool on its own, nothing scrapes here."""
    end = time.monotonic() + timeout
    jobs: dict = {}
    while time.monotonic() < end:
        try:
            jobs = read_job_table(state / "jobs.json")
        except FileNotFoundError:
            pass
        if ok(jobs):
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"jobs.json never got there: {sorted(jobs)}")


def test_a_hard_link_to_another_users_file_is_refused(users, open_state):
    """A link carries its target's owner: a spool entry that is another name of a file kept
    elsewhere (where fs.protected_hardlinks is off, anyone can link anyone's file) is refused."""
    alice, _ = users
    table = JobTable(open_state)
    elsewhere = open_state.parent / "alice-kept-this.json"
    elsewhere.write_text(json.dumps({"schema_version": 2, **full_signal("a-job", mfu_ratio=0.001)}))
    os.chown(elsewhere, alice.pw_uid, alice.pw_gid)
    os.link(elsewhere, table.spool / "a-job-1.json")
    table.ingest()
    assert table.rejected == {"hard_link": 1} and table.jobs == {}


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


def test_a_signal_for_a_job_running_as_another_uid_is_rejected(users, open_state):
    alice, mallory = users
    pids: list[int] = []
    reg, table = registry(open_state, ReplayWithPids(pids))
    procs = [start_as(alice, "victim")]
    try:
        pids.append(procs[0].pid)
        # mallory names alice's running job: its processes say whose it is
        write_as(mallory, table.spool, full_signal("victim", mfu_ratio=0.01))
        text = generate_latest(reg).decode()
        assert 'gpudiag_gpu_up{gpu="0",job_id="victim"' in text
        assert 'job_id="victim"' not in text.split("gpudiag_job_mfu_ratio", 1)[1]
        assert table.rejected == {"owner": 1}
        write_as(alice, table.spool, full_signal("victim", mfu_ratio=0.45))
        assert mfu_of(generate_latest(reg).decode(), "victim", alice.pw_uid) == 0.45
        # mallory reports first for a job whose processes have not run yet (her own job then);
        # when alice's start, mallory's entry leaves the table, and alice's signals are taken
        write_as(mallory, table.spool, full_signal("victim2", mfu_ratio=0.02))
        assert mfu_of(generate_latest(reg).decode(), "victim2", mallory.pw_uid) == 0.02
        procs.append(start_as(alice, "victim2"))
        pids.append(procs[1].pid)
        text = generate_latest(reg).decode()  # attributes alice's process, then ingests
        assert 'job_id="victim2"' not in text.split("gpudiag_job_mfu_ratio", 1)[1]
        write_as(alice, table.spool, full_signal("victim2", mfu_ratio=0.33))
        assert mfu_of(generate_latest(reg).decode(), "victim2", alice.pw_uid) == 0.33
        jobs = read_job_table(table.state_file)
        assert [k for k in jobs if k[0] == "victim2"] == [("victim2", alice.pw_uid)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
