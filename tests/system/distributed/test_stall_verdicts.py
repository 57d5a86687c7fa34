"""The stall watch on real torchrun gloo jobs (2-3 ranks, CPU): each job stalls the way the test
arranged (tests/jobs/hang_job.py), and the verdict must name exactly that: the rank, the
collective, the place, the kind. The job is never stopped by gpudiag: the evidence is read while
it still hangs, and the test stops it. Every wait is for an event (a file, the process's end),
with a deadline; the stall limit is 3 s so each job takes seconds.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudiag.analyzers.hang_place import IDLE_CORES
from gpudiag.incident import Incident, read_incident
from tests.browser import BrowserError, Chromium
from tests.harness import torchrun, torchrun_failure, torchrun_ran
from tests.paths import REPO

ROOT = REPO
JOB = ROOT / "tests" / "jobs" / "hang_job.py"
DEADLINE_S = 180.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUDIAG_", "SLURM_", "TORCHELASTIC"))}
    env["GPUDIAG_AGENT_DIR"] = "/nonexistent-gpudiag-agent"   # no agent: no signals
    env["OMP_NUM_THREADS"] = "1"
    return env


def wait_for(pred, what: str, proc: subprocess.Popen | None = None, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if pred():
            return
        if proc is not None and proc.poll() is not None and not pred():
            out, err = proc.communicate()
            raise AssertionError(f"{what}: gpudiag exited {proc.returncode} first\n{err[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {deadline_s:.0f} s")


def kill_mine(marker: str) -> None:
    """SIGKILL what is left of a job this test started: the processes whose command line holds
    ``marker`` (a path of this test's own temporary folder)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM gpudiag (it forwards it to the job), then what it printed on stderr."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return err


def stall(tmp_path: Path, nproc: int, *job: str, incident: str = "1") -> tuple[Incident, bool, str, Path]:
    """Run the job under gpudiag profile until incident ``incident`` is written; (the incident,
    whether the job still ran after it, gpudiag's stderr, the run directory)."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "1000",
           "--stall-after", "3s", "--", *torchrun(nproc), str(JOB), *job]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    path = run / "incidents" / incident / "incident.json"
    if incident == "exit":   # written once the job has ended by itself: wait for gpudiag to finish
        _, err = proc.communicate(timeout=DEADLINE_S)
        return read_incident(path), False, err, run
    try:
        wait_for(path.exists, f"incident {incident}", proc)
        still_running = proc.poll() is None
    finally:
        err = stop(proc)
    return read_incident(path), still_running, err, run


def test_a_rank_that_sleeps_before_a_collective_is_named_with_its_line_and_the_job_is_not_stopped(tmp_path):
    inc, running, err, run = stall(tmp_path, 2, "--mode", "sleep", "--rank", "1", "--at", "4")
    v = inc.verdict
    assert running, "gpudiag stopped the job to read its evidence"
    assert (v.kind, v.culprits, v.waiting, v.op, v.pg) == ("hung", [1], [0], "all_reduce", "0"), v.headline
    src = JOB.read_text().splitlines()
    line = next(i for i, t in enumerate(src, 1) if "time.sleep(3600)" in t and "sleep" in src[i - 2])
    assert v.where == f"hang_job.py:{line} <module>", v.headline
    assert "`time.sleep`" in v.headline and "sleeping" in v.headline
    rows = {w.rank: w for w in v.wavefront}
    assert rows[0].state == "waiting" and rows[1].state == "behind" and rows[1].entered == rows[0].entered - 1
    assert v.seq == rows[0].entered
    # the evidence: both ranks answered (Python stacks, the Flight Recorder), nothing was missing
    assert all(p.answered for r in inc.evidence.ranks for p in r.processes if p.role == "rank")
    assert all(r.fr_note is None for r in inc.evidence.ranks)
    assert "HUNG: rank 1 never entered all_reduce" in err
    page = open_page(run / "incidents" / "1" / "incident.html", tmp_path)
    assert page.data == json.loads(inc.to_json()) and "never entered all_reduce" in page.text
    assert {"verdict", "timeline", "wavefront", "ranks", "stacks"} <= set(page.sections)
    assert page.charts, "no timeline of the last steps"


def open_page(path: Path, tmp: Path):  # tests.browser.Page
    """The page as headless Chromium shows it: nothing fetched, no script run, no error, no
    horizontal scroll."""
    try:
        browser = Chromium.launch(tmp / "chromium")
    except BrowserError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        page = browser.open(path)
    finally:
        browser.close()
    assert page.page_errors == [] and page.dialogs == [] and page.foreign_requests == []
    assert page.scripts == [{"type": "application/json", "id": "gpudiag-data"}]
    assert page.scroll_width <= page.client_width
    return page


def test_a_rank_stuck_in_its_dataloader_workers_read_is_named_in_the_worker(tmp_path):
    inc, running, _, _ = stall(tmp_path, 2, "--mode", "loader", "--rank", "1", "--at", "4")
    v = inc.verdict
    assert running and (v.kind, v.culprits, v.op) == ("hung", [1], "all_reduce"), v.headline
    line = next(i for i, t in enumerate(JOB.read_text().splitlines(), 1) if "os.read(self.fd, 1)" in t)
    assert v.where == f"hang_job.py:{line} __getitem__", v.headline
    assert "DataLoader worker pid" in v.headline and "waiting on a read" in v.headline
    worker = [p for r in inc.evidence.ranks if r.rank == 1 for p in r.processes
              if p.role == "dataloader worker"]
    assert worker and worker[0].threads[-1].syscall == "read"


def test_a_rank_that_skips_a_collective_is_a_desync_named_with_the_step_it_skipped_in(tmp_path):
    inc, running, _, _ = stall(tmp_path, 3, "--mode", "skip", "--rank", "1", "--at", "4")
    v = inc.verdict
    assert running and (v.kind, v.culprits, v.op) == ("desync", [1], "all_reduce"), v.headline
    assert "rank 1 called broadcast where the others called all_reduce" in v.headline
    assert any("rank 1 skipped all_reduce in step 4" in d for d in v.details), v.details
    assert sorted(v.waiting) == [0, 2]


def test_a_mismatched_tensor_size_is_named_after_gloo_aborts_the_rank(tmp_path):
    """gloo aborts the process that receives more bytes than it expects (std::terminate), so this
    one is not a stall: the verdict comes from the black boxes the ranks left behind."""
    inc, _, err, _ = stall(tmp_path, 3, "--mode", "mismatch", "--rank", "1", "--at", "4", incident="exit")
    v = inc.verdict
    assert (v.kind, v.culprits, v.op) == ("mismatch", [1], "all_reduce"), v.headline
    assert "rank 1: [2048], where the others have [4096]" in v.headline
    assert any("rank 1 died in it: Aborted" in d for d in v.details), v.details
    assert "MISMATCH" in err


def test_a_deadlock_between_two_threads_is_named_with_both_threads(tmp_path):
    inc, running, _, _ = stall(tmp_path, 2, "--mode", "deadlock", "--rank", "1", "--at", "4")
    v = inc.verdict
    assert running and (v.kind, v.culprits, v.op) == ("deadlock", [1], "all_reduce"), v.headline
    assert "'holds-a'" in v.headline and "'holds-b'" in v.headline
    locks = [t for r in inc.evidence.ranks if r.rank == 1 for p in r.processes for t in p.threads
             if t.name.startswith("holds-")]
    assert {t.syscall for t in locks} == {"futex"} and all("with " in t.frames[0].code for t in locks)


def test_a_job_that_finished_training_and_sleeps_is_idle_with_no_collective_pending(tmp_path):
    inc, running, _, _ = stall(tmp_path, 2, "--mode", "idle", "--steps", "6")
    v = inc.verdict
    assert running and v.kind == "idle", v.headline
    assert "all ranks idle, no collective pending, main thread in `time.sleep`" in v.headline
    # the rule is per rank (each under IDLE_CORES), the number the job's sum over its 2 ranks: it
    # read 0.069 in a clean-clone run at load ~3 (2026-12-01), each rank under 0.05
    assert v.numbers["job_cores"] < 2 * IDLE_CORES


def test_a_pause_that_ends_closes_its_incident_and_a_marked_phase_is_no_stall(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "1000", "--stall-after",
           "3s", "--", *torchrun(2), str(JOB), "--mode", "pauses", "--at", "5", "--steps", "16",
           "--pause-s", "6"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert torchrun_ran(proc, steps=16), torchrun_failure(proc)
    inc = read_incident(run / "incidents" / "1" / "incident.json")
    assert inc.verdict.kind == "idle" and "a pause, not a hang" in inc.resolution, inc.resolution
    assert inc.resolved_at > inc.evidence.detected_at
    # the marked pause, the same length, at step 10 (a job's end may still stall past a 3 s limit
    # on a busy machine: torch's teardown is no step either)
    later = [read_incident(p) for p in sorted((run / "incidents").glob("*/incident.json"))][1:]
    assert [i.evidence.id for i in later if any(r.step == 10 for r in i.evidence.ranks)] == [], \
        "the marked phase was called a stall"
    assert "incident 1: steps resumed" in proc.stderr


def test_a_straggler_rank_with_twice_slower_steps_is_named_with_where_its_time_goes(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "1000", "--",
           *torchrun(2), str(JOB), "--mode", "straggler", "--rank", "1", "--steps", "30"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=DEADLINE_S)
    assert torchrun_ran(proc, steps=30), torchrun_failure(proc)
    v = read_incident(run / "incidents" / "straggler" / "incident.json").verdict
    assert (v.kind, v.culprits, v.op) == ("straggler", [1], "all_reduce"), v.headline
    # the job arranged rank 1's own work at 2x the others' (an extra sleep as long as their step)
    assert 1.5 <= v.numbers["ratio"] <= 3.0, v.numbers
    assert v.numbers["blocked_s"] > v.numbers["on_core_s"], v.numbers   # a sleep: blocked, not compute
    assert "STRAGGLER: rank 1 slows every step" in proc.stderr
    assert not (run / "incidents" / "1").exists()   # slow, but never stuck


def test_hang_report_reads_flight_recorder_dumps_of_a_job_not_run_under_gpudiag(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    cmd = [*torchrun(3), str(JOB), "--mode", "sleep", "--rank", "2", "--at", "3", "--fr-dump", str(dumps)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**_env(), "TORCH_FR_BUFFER_SIZE": "200"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: len(list(dumps.glob("nccl_trace_rank_*"))) == 3, "three Flight Recorder dumps")
    finally:
        proc.terminate()   # torchrun stops its workers on SIGTERM
        proc.wait(timeout=60)
        kill_mine(str(dumps))
    p = subprocess.run([sys.executable, "-m", "gpudiag", "hang-report", str(dumps), "--json",
                        "--output", str(tmp_path / "hang.html")], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    (inc,) = json.loads(p.stdout)
    v = inc["verdict"]
    assert (v["kind"], v["culprits"], sorted(v["waiting"]), v["op"]) == ("hung", [2], [0, 1], "all_reduce"), v
    line = next(i for i, t in enumerate(JOB.read_text().splitlines(), 1) if "dist.broadcast(state, 0)" in t)
    assert f"its last collective was broadcast #{v['seq'] - 1}" in v["headline"]
    assert f"hang_job.py:{line}" in v["headline"]
    assert "never entered all_reduce" in (tmp_path / "hang.html").read_text()


def test_hang_report_refuses_a_pickle_that_would_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    p = subprocess.run([sys.executable, "-m", "gpudiag", "hang-report", str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT)
    assert p.returncode == 2 and not (tmp_path / "ran").exists()
    assert p.stderr.count("\n") == 1 and "not a Flight Recorder dump" in p.stderr and "os" in p.stderr


@pytest.mark.parametrize("bad", ["", "0", "soon"])
def test_a_bad_stall_limit_is_one_line(bad):
    p = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--stall-after", bad, "--", "true"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "--stall-after" in p.stderr and "Traceback" not in p.stderr
