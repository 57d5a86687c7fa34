"""The root daemon at the machine's limits: a state folder a job filled, one user's connect/close
flood, a restart with other ``--gpus``, huge environments. Real daemon, real second users.

Each of these once failed another user or the daemon (issue 40): a full disk answered
``internal error: OperationalError`` and then crashed the daemon at the filling job's end; a
flood failed 20 of 50 of another user's commands; a restart with GPU 0 added gave GPU 2 to two
jobs; with fewer GPUs than the running jobs held, ``queue`` was an IndexError, then a crash.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gpudiag.scheduler.local.protocol import CLIENT_TIMEOUT_S, call, connect
from gpudiag.scheduler.local.runner import ENV_READ_CAP, LAUNCH_VAR, find_launches
from gpudiag.scheduler.local.store import Store
from tests.system.local_scheduler.test_local_scheduler import (
    WAIT_S,
    cli_as,
    one_line_refusal,
    run_as,
    state_of,
)
from tests.user_env import PATH_ENV, child_report, fork_as, user_job

FLOOD_CALLS = 25   # the issue's: 25 queue and 25 submit of another user


def gated(gate: Path, before: str = "") -> list[str]:
    return ["sh", "-c", f"{before}while [ ! -e {gate} ]; do sleep 0.05; done"]


# --- a full state folder -----------------------------------------------------------------------

@pytest.fixture
def small_state(open_base):
    """``open_base/state`` on a 64 MiB tmpfs of its own (mode 0755, as the daemon requires)."""
    state = open_base / "state"
    state.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "tmpfs", str(state)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"these tests mount a tmpfs: run them as root where mount works ({r.stderr.strip()})")
    yield state
    subprocess.run(["umount", "-l", str(state)], capture_output=True)


def test_a_job_that_fills_the_state_folder_is_load_not_a_crash_and_the_daemon_recovers_by_itself(
        open_base, small_state, users, sched_factory):
    alice, bob = users
    s = sched_factory("--slots", "2", "--no-monitor", "--min-runtime", "0", base=open_base)
    sock = s.state / "sock"
    fill_go, bob_gate = open_base / "fill-go", open_base / "bob-gate"
    bobs = user_job(bob, sock, gated(bob_gate))          # running throughout
    filler = user_job(alice, sock, ["sh", "-c", f"while [ ! -e {fill_go} ]; do sleep 0.05; done; "
                                   'head -c 100M /dev/zero > "$GPUDIAG_CHECKPOINT_DIR/fill"; exec sleep 600'])
    s.wait("both running", lambda j: state_of(j, bobs) == state_of(j, filler) == "running")
    waiting = user_job(bob, sock, ["true"])   # no slot free: pending
    fill_go.touch()
    deadline = time.monotonic() + WAIT_S
    while os.statvfs(small_state).f_bavail > 0:   # (its output cannot say so: the disk is full)
        assert time.monotonic() < deadline, s.cli("logs", str(filler), "--stderr").stdout
        time.sleep(0.1)
    # another user's submit: one line, exit 2, nothing queued; their queue: answered
    r = cli_as(bob.pw_uid, bob.pw_gid, ["submit", "--state-dir", str(s.state), "--gpus", "1", "--", "true"])
    one_line_refusal(r, "the scheduler's state folder is full: ")
    assert "free; no job was changed" in r.stderr and "internal" not in r.stderr, r.stderr
    q = cli_as(bob.pw_uid, bob.pw_gid, ["queue", "--state-dir", str(s.state)])
    assert q.returncode == 0 and str(bobs) in q.stdout, q
    assert [r["id"] for r in s.db()] == [bobs, filler, waiting]
    # a cancel and the filling job's end are recorded (the reserve), no job starts on the slot it
    # leaves (its start could not be recorded), and bob's running job runs on
    assert s.cli("cancel", str(filler)).returncode == 0
    jobs = s.wait("the filling job cancelled", lambda j: state_of(j, filler) == "cancelled")
    assert "cancelled by root" in jobs[filler]["why"] and state_of(jobs, bobs) == "running", jobs
    seen = s.ask({"op": "ping"})["passes"]
    jobs = s.wait("two more passes", lambda j: s.ask({"op": "ping"})["passes"] >= seen + 2)
    assert state_of(jobs, waiting) == "pending", jobs[waiting]
    assert "state folder is full" in jobs[waiting]["why"], jobs[waiting]
    assert s.proc.poll() is None
    # room comes back (the admin removes the file): the daemon takes submits and starts jobs again
    (s.state / "jobs" / str(filler) / "checkpoint" / "fill").unlink()
    again = user_job(bob, sock, ["true"])
    bob_gate.touch()
    s.wait("bob's jobs done", lambda j: all(state_of(j, i) == "done" for i in (bobs, waiting, again)))
    log = s.log.read_text()
    assert "Traceback" not in log and "internal error" not in log, log
    assert "the scheduler's state folder is full" in log and "has room again" in log, log


# --- one user's connect/close flood ----------------------------------------------------------------

def flood(user, sock: Path, stop: Path) -> tuple[int, int]:
    """A process of ``user`` connecting and closing at once, as fast as it can (non-blocking, so
    a full listen queue costs it nothing), until ``stop`` exists. Returns (pid, report fd)."""
    def connect_close() -> dict:
        made = full = 0
        while not stop.exists():
            for _ in range(200):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(str(sock))
                    made += 1
                except BlockingIOError:
                    full += 1
                except OSError:
                    pass
                s.close()
        return {"connects": made, "queue_full": full}

    return fork_as(user.pw_uid, user.pw_gid, connect_close, alarm_s=WAIT_S * 3)


def test_a_connect_close_flood_fails_none_of_another_users_commands(open_base, users, sched_factory):
    bob, alice = users
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0", base=open_base)
    sock, stop = s.state / "sock", open_base / "stop-flood"
    flooders = [flood(bob, sock, stop)]   # the issue's: one process looping connect/close

    def commands() -> dict:
        out: dict = {"failed": [], "latency": [], "ids": []}
        for i in range(2 * FLOOD_CALLS):
            req = {"op": "queue"} if i % 2 == 0 else {
                "op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV, "cwd": "/",
                "cmd": ["true"]}
            t0 = time.monotonic()
            try:
                a = call(sock, req)
            except OSError as e:
                out["failed"].append(f"{req['op']}: {type(e).__name__}: {e}")
                continue
            out["latency"].append(time.monotonic() - t0)
            if not a.get("ok"):
                out["failed"].append(f"{req['op']}: {a}")
            elif "id" in a:
                out["ids"].append(a["id"])
        return out

    try:
        got = run_as(alice.pw_uid, alice.pw_gid, commands)
    finally:
        stop.touch()
        reports = [child_report(child) for child in flooders]
    assert got.get("failed") == [] and len(got["latency"]) == 2 * FLOOD_CALLS, got
    assert sum(r.get("connects", 0) for r in reports if isinstance(r, dict)) > 0, reports
    print(f"alice: {len(got['latency'])}/{2 * FLOOD_CALLS} answered, worst "
          f"{max(got['latency']) * 1e3:.0f} ms, all {sum(got['latency']):.1f} s; bob's flood: {reports}")
    s.wait("alice's jobs ran", lambda j: all(state_of(j, i) == "done" for i in got["ids"]))
    assert s.proc.poll() is None and "Traceback" not in s.log.read_text()


def test_a_client_waits_for_a_full_listen_queue_within_its_own_deadline(tmp_path):
    """Before, the client's timeout made its connect non-blocking: a full queue failed it at once
    with EAGAIN. Now it waits (and retries) until its own deadline, then says so."""
    path = tmp_path / "sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    queued = []
    while True:   # fill the queue
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            break
        queued.append(c)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not accept a connection within"):
        connect(path, time.monotonic() + 0.3)
    assert time.monotonic() - t0 >= 0.3   # it waited for its deadline, not one EAGAIN
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(s=connect(path, time.monotonic() + CLIENT_TIMEOUT_S)))
    t.start()
    for _ in range(len(queued) + 1):   # the daemon catches up: the waiting client gets in
        listener.accept()[0].close()
    t.join(CLIENT_TIMEOUT_S)
    assert "s" in got
    got["s"].close()
    for c in queued:
        c.close()
    listener.close()


# --- another --gpus across a restart -------------------------------------------------------------

def test_a_restart_with_other_gpus_keeps_jobs_on_theirs_and_never_gives_one_gpu_twice(tmp_path,
                                                                                       sched_factory):
    gates = {k: tmp_path / f"gate-{k}" for k in ("a", "b", "c")}

    def job(k: str) -> list[str]:   # prints the GPUs it sees, then holds them until its gate
        return gated(gates[k], 'echo "$CUDA_VISIBLE_DEVICES"; ')

    s = sched_factory("--gpus", "1,2,3", "--no-monitor", "--min-runtime", "0")
    a = s.submit("--gpus", "1", "--", *job("a"))
    b = s.submit("--gpus", "1", "--", *job("b"))
    jobs = s.wait("both running", lambda j: state_of(j, a) == state_of(j, b) == "running")
    assert (jobs[a]["slot_ids"], jobs[b]["slot_ids"]) == (["1"], ["2"]), jobs
    s.kill(signal.SIGTERM)
    s.args[s.args.index("1,2,3")] = "0,1"   # GPU 0 added, 2 and 3 gone (2 held by job b)
    s.start()
    c = s.submit("--gpus", "1", "--", *job("c"))
    d = s.submit("--gpus", "1", "--", "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"')

    def held(j: dict) -> list[str]:
        ids = [i for x in j.values() if x["state"] in ("starting", "running", "stopping", "finishing")
               for i in x["slot_ids"]]
        assert len(ids) == len(set(ids)), f"a GPU given twice: {j}"
        return ids

    jobs = s.wait("c running", lambda j: state_of(j, c) == "running" and held(j) is not None)
    assert (jobs[a]["slot_ids"], jobs[b]["slot_ids"], jobs[c]["slot_ids"]) == (["1"], ["2"], ["0"]), jobs
    assert state_of(jobs, d) == "pending"
    q = s.ask({"op": "queue"})
    assert (q["total"], q["free"], q["undeclared"]) == (2, 0, {"2": b}), q
    assert f"job {b} of root holds GPUs 2, which this start does not declare (0,1)" in s.log.read_text()
    gates["b"].touch()   # GPU 2 comes free, but it is not this start's to give
    jobs = s.wait("b done", lambda j: state_of(j, b) == "done" and held(j) is not None)
    assert state_of(jobs, d) == "pending" and s.ask({"op": "queue"})["free"] == 0, jobs
    gates["a"].touch()
    jobs = s.wait("d done", lambda j: state_of(j, d) == "done" and held(j) is not None)
    assert [s.cli("logs", str(i)).stdout.strip() for i in (a, b, c, d)] == ["1", "2", "0", "1"]
    gates["c"].touch()
    s.wait("all done", lambda j: all(state_of(j, i) == "done" for i in (a, b, c, d)))
    assert "Traceback" not in s.log.read_text()


def test_a_schema_1_database_holds_positions_read_once_as_ids(tmp_path):
    path = tmp_path / "scheduler.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    con.execute("INSERT INTO jobs (uid, user, team, name, key, tier, gpus, grace_s, cmd, env, cwd, submit_t, "
                "state, slots) VALUES (0, 'root', 'root', '', '', 1, 2, 1, '[\"true\"]', '{}', '/', 0, "
                "'running', '[0, 2]')")
    con.commit()
    con.close()
    store = Store(path, ("4", "5", "6"))
    assert [r.slots for r in store.jobs()] == [["4", "6"]]
    assert store.migrated == ["job 1: slot positions [0, 2] read as ids 4,6"]
    store.close()
    assert [r.slots for r in Store(path, ("0",)).jobs()] == [["4", "6"]]   # once


# --- what the log and queue say ----------------------------------------------------------------------

def test_a_quota_reclaim_is_logged_with_its_reason(tmp_path, sched_factory):
    s = sched_factory("--slots", "2", "--no-monitor", "--min-runtime", "0", "--quota", "a=1",
                      "--quota", "b=1")
    gate = tmp_path / "gate"
    held = [s.submit("--gpus", "1", "--team", "b", "--grace", "1s", "--", *gated(gate)) for _ in range(2)]
    s.wait("team b holds both", lambda j: all(state_of(j, i) == "running" for i in held))
    small = s.submit("--gpus", "1", "--team", "a", "--", "true")
    jobs = s.wait("a's job done", lambda j: state_of(j, small) == "done")
    victim = next(i for i in held if jobs[i]["restarts"] == 1)
    log = s.log.read_text()
    assert (f"job {victim} of root (team b, reserved) reclaimed for its quota by job {small}: reclaim: "
            "team a holds 0 of its 1-slot quota") in log, log
    gate.touch()
    s.wait("all done", lambda j: all(state_of(j, i) == "done" for i in held))


def test_a_head_that_any_one_running_job_lets_start_says_any_one_of():
    from gpudiag.scheduler.local.engine import Engine, Machine
    from gpudiag.scheduler.local.store import PENDING, RUNNING, JobRow
    from gpudiag.scheduler.model import Policy
    from gpudiag.scheduler.priority import MfuBook

    def row(jid: int, gpus: int, state: str, slots: list[str] | None = None) -> JobRow:
        return JobRow(id=jid, uid=0, user="u", team="u", name="", key="", tier=1, gpus=gpus, grace_s=30.0,
                      time_limit_s=None, cmd=["true"], env={}, cwd="/", submit_t=0.0, state=state,
                      slots=slots, started_t=100.0 if slots else None)

    engine = Engine(Machine(("0", "1", "2", "3"), gpus=True), Policy(), MfuBook(1e6), {})
    running = [row(i, 1, RUNNING, [str(i - 1)]) for i in range(1, 5)]   # started together, no limits
    for head, words in ((row(5, 1, PENDING), "waits for any one of jobs 1, 2, 3, 4 to end"),
                        (row(6, 4, PENDING), "waits for jobs 1, 2, 3, 4 to end")):
        p = engine.plan([head], running, {}, {r.id: None for r in running}, 200.0, False)
        said = engine.describe(p.why[head.id], {r.id: r for r in [*running, head]}, 200.0, head)
        assert words in said, said


# --- huge environments ------------------------------------------------------------------------------

def test_a_job_end_reads_each_environment_only_up_to_its_cap_and_only_the_jobs_users(tmp_path, users):
    alice, _ = users
    prefix = "sched-test"
    filler = {f"PAD{i}": "x" * 1000 for i in range(ENV_READ_CAP // 1000 + 8)}   # past the cap
    procs = []
    try:
        for first in (True, False):
            env = {LAUNCH_VAR: f"{prefix}:1:{int(first)}", **filler} if first else \
                {**filler, LAUNCH_VAR: f"{prefix}:1:{int(first)}"}
            procs.append(subprocess.Popen(["sleep", "60"], env=env, user=alice.pw_uid, group=alice.pw_gid,
                                          extra_groups=[]))
        found = find_launches(prefix)
        assert set(found) == {f"{prefix}:1:1"}, found   # the marker past the cap is not seen
        assert [p.uid for p in found[f"{prefix}:1:1"]] == [alice.pw_uid]
        assert find_launches(prefix, uid=0) == {}        # a job end looks at its own user's only
    finally:
        for p in procs:
            p.kill()
            p.wait()
