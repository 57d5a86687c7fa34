"""``gpudiag scheduler serve`` with real processes: CPU slots, real jobs, a real second user.

Every test starts its own daemon on its own state folder (``--slots N``: a machine without
GPUs) and talks to it through the real CLI or the real socket protocol; the database and
/proc are read directly to check what the daemon claims.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpudiag.scheduler.local.containment import Containment
from gpudiag.scheduler.local.protocol import call
from gpudiag.scheduler.local.store import read_prefix
from tests.paths import REPO
from tests.user_env import child_report, fork_as

ROOT = REPO
JOBS = ROOT / "tests" / "jobs"
WAIT_S = 60.0


class Sched:
    """A daemon on its own state folder, and the client commands pointed at it."""

    def __init__(self, base: Path, *args: str, env: dict | None = None, python: str = sys.executable,
                 cwd: Path = ROOT) -> None:
        self.python, self.cwd = python, cwd   # the daemon starts jobs with its own interpreter
        self.state = base / "state"
        self.args = ["--state-dir", str(self.state), *args]
        self.env = {**os.environ, **(env or {})}
        self.log = base / "daemon.log"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([self.python, "-m", "gpudiag", "scheduler", "serve", *self.args],
                                         stdout=log, stderr=log, env=self.env, cwd=self.cwd)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"daemon exited {self.proc.returncode}: {self.log.read_text()}"
            try:
                call(self.state / "sock", {"op": "ping"}, timeout=5)
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("daemon did not come up")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def cli(self, *args: str, check: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "gpudiag", args[0], "--state-dir", str(self.state), *args[1:]]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S, env=self.env, cwd=cwd)
        if check:
            assert r.returncode == 0, f"gpudiag {' '.join(args)}: {r.returncode} {r.stderr}"
        return r

    def submit(self, *args: str) -> int:
        opts, cmd = args[:args.index("--")], args[args.index("--") + 1:]
        return int(self.cli("submit", *opts, "--", *cmd).stdout)

    def ask(self, req: dict) -> dict:
        return call(self.state / "sock", req)

    def jobs(self) -> dict[int, dict]:
        return {j["id"]: j for j in self.ask({"op": "queue", "all": True})["jobs"]}

    def wait(self, what: str, pred: Callable[[dict[int, dict]], bool], timeout: float = WAIT_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            jobs = self.jobs()
            if pred(jobs):
                return jobs
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {json.dumps(self.jobs(), indent=1)[-3000:]}\n"
                             f"{self.log.read_text()[-2000:]}")

    def db(self) -> list[sqlite3.Row]:
        con = sqlite3.connect(f"file:{self.state / 'scheduler.db'}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        try:
            return con.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        finally:
            con.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)
        # jobs outlive the daemon by design: end what a test left running, cgroups included
        if (self.state / "scheduler.db").exists():
            Containment(self.prefix(), use_cgroups=False).end_all()

    def prefix(self) -> str:
        return read_prefix(self.state / "scheduler.db")


def state_of(jobs: dict[int, dict], i: int) -> str:
    return jobs[i]["state"]


def flat(text: str) -> str:
    """``gpudiag queue``'s text with its wrapping undone (its reasons wrap to fit 80 columns)."""
    return " ".join(text.split())


def job_block(queue_out: str, job: int) -> str:
    """A job's row in ``gpudiag queue`` and the reason lines under it, unwrapped."""
    lines = queue_out.splitlines()
    i = next(k for k, x in enumerate(lines) if x.lstrip().startswith(f"{job} "))
    block = [lines[i]]
    for x in lines[i + 1:]:
        if not x.startswith(" " * 7):   # the next job's row (its id ends in column 6)
            break
        block.append(x)
    return flat("\n".join(block))


# --- 1. gang -------------------------------------------------------------------------------------

def test_a_two_slot_job_waits_for_two_free_slots_and_gets_both(sched_factory, tmp_path):
    s = sched_factory("--slots", "2", "--no-monitor", "--min-runtime", "0",
                      "--agent-dir", str(tmp_path / "none"))
    gate = tmp_path / "gate"
    a = s.submit("--gpus", "1", "--", "sh", "-c",
                 f'echo "A $GPUDIAG_SLOTS"; while [ ! -e {gate} ]; do sleep 0.05; done')
    s.wait("A running", lambda j: state_of(j, a) == "running")
    b = s.submit("--gpus", "2", "--", "sh", "-c", 'echo "B $GPUDIAG_SLOTS"')
    c = s.submit("--gpus", "1", "--", "sh", "-c", 'echo "C $GPUDIAG_SLOTS"')
    time.sleep(1.5)   # several passes and ticks: one slot is free all along
    jobs = s.jobs()
    assert (state_of(jobs, b), state_of(jobs, c)) == ("pending", "pending")
    assert "needs 2 slots, 1 free" in jobs[b]["why"], jobs[b]["why"]
    assert f"behind job {b} (reserved)" in jobs[c]["why"], jobs[c]["why"]  # no backfill onto B's reservation
    q = flat(s.cli("queue").stdout)
    assert "needs 2 slots, 1 free" in q and "1 of 2 slots free" in q, q
    assert "signals: none (no agent job table at" in q and "without the efficiency factor" in q, q
    gate.touch()
    jobs = s.wait("all done", lambda j: all(state_of(j, i) == "done" for i in (a, b, c)))
    rows = {r["id"]: r for r in s.db()}
    assert rows[b]["started_t"] >= rows[a]["ended_t"]          # never on one free slot
    assert s.cli("logs", str(b)).stdout.strip() == "B 0,1"    # both slots, as one gang
    assert rows[c]["started_t"] >= rows[b]["ended_t"]
    assert s.cli("logs", str(a)).stdout.strip() == "A 0"


# --- 2. tiers, preemption, checkpoint --------------------------------------------------------------

def test_on_demand_preempts_spot_which_checkpoints_is_requeued_and_resumes(sched_factory):
    s = sched_factory("--slots", "1", "--min-runtime", "0")   # jobs under gpudiag profile --monitor
    spot = s.submit("--gpus", "1", "--tier", "spot", "--grace", "5s", "--",
                    sys.executable, str(JOBS / "ckpt_job.py"), "--steps", "40", "--sleep", "0.05",
                    "--hold-at", "5")   # on its first start, until preempted
    deadline = time.monotonic() + WAIT_S
    while "step 5\n" not in s.cli("logs", str(spot)).stdout:
        assert time.monotonic() < deadline, s.cli("logs", str(spot), "--stderr").stdout
        time.sleep(0.2)
    od = s.submit("--gpus", "1", "--tier", "on-demand", "--", "sh", "-c", "echo on-demand ran")
    s.wait("spot requeued", lambda j: j[spot]["restarts"] == 1)
    s.wait("both done", lambda j: state_of(j, spot) == "done" and state_of(j, od) == "done")
    out = s.cli("logs", str(spot)).stdout
    saved = int(out.split("checkpointed at step ")[1].split()[0])
    assert f"resumed at step {saved} (restart 1)" in out, out   # the job asserted its restored state
    assert out.startswith("fresh start (restart 0)") and out.rstrip().endswith("finished at step 40"), out
    rows = {r["id"]: r for r in s.db()}
    assert rows[spot]["attempt"] == 2 and rows[spot]["exit_code"] == 0
    assert rows[od]["started_t"] < rows[spot]["started_t"]    # the spot job's second start came after
    assert "on-demand ran" in s.cli("logs", str(od)).stdout
    # the daemon's log says who was preempted, for whom, and the pass's reason
    assert f"job {spot} of root (team root, spot) preempted for job {od}: victim: " in s.log.read_text()


# --- 5. bad input and permissions ---------------------------------------------------------------------

def one_line_refusal(r: subprocess.CompletedProcess, words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and words in r.stderr, r.stderr


def test_bad_requests_are_one_line_exit_2_and_change_nothing(sched_factory):
    s = sched_factory("--slots", "2", "--no-monitor")
    before = [dict(r) for r in s.db()]
    one_line_refusal(s.cli("submit", "--gpus", "3", "--", "true", check=False),
                     "needs 3 slots, this machine has 2")
    one_line_refusal(s.cli("submit", "--gpus", "1", "--tier", "gold", "--", "true", check=False),
                     "unknown tier")
    one_line_refusal(s.cli("submit", "--gpus", "1", "--", check=False), "empty command")
    one_line_refusal(s.cli("submit", "--gpus", "1", "--", "echo", "x" * 70_000, check=False),
                     "command too large")
    big = {f"BIG{i}": "y" * 100_000 for i in range(3)}
    r = subprocess.run([sys.executable, "-m", "gpudiag", "submit", "--state-dir", str(s.state), "--gpus", "1",
                        "--", "true"], capture_output=True, text=True, env={**s.env, **big}, timeout=WAIT_S)
    one_line_refusal(r, "environment too large")
    one_line_refusal(s.cli("cancel", "99", check=False), "no job 99")
    one_line_refusal(s.cli("logs", "99", check=False), "no job 99")
    # what click once answered in three lines (usage, hint, error): one line too
    one_line_refusal(s.cli("cancel", "-5", check=False), "cancel -5: job ids are positive whole numbers")
    one_line_refusal(s.cli("logs", "abc", check=False), "logs abc: not a job id")
    one_line_refusal(s.cli("submit", "--gpus", "abc", "--", "true", check=False),
                     "--gpus must be a positive whole number, not 'abc'")
    one_line_refusal(s.cli("queue", "--bogus", check=False), "(see gpudiag queue --help)")
    # what another client could send over the socket, bypassing the CLI's own checks
    base = {"op": "submit", "cmd": ["true"], "gpus": 1, "tier": "spot", "grace_s": 1, "env": {}, "cwd": "/"}
    for bad, words in [({"tier": "gold"}, "unknown tier"), ({"cmd": []}, "empty command"),
                       ({"gpus": 0}, "positive"), ({"gpus": 3}, "this machine has 2"),
                       ({"cmd": ["x" * 70_000]}, "command too large"), ({"cwd": "relative"}, "absolute"),
                       ({"env": {"A": "b" * 300_000}}, "environment too large"),
                       ({"grace_s": -1}, "--grace must be between 0s and 1h"),
                       ({"name": "../../etc"}, "name must be"), ({"op": "rm"}, "unknown request"),
                       ({"cmd": [[[[["true"]]]]]}, "request is nested deeper than 4 levels")]:
        answer = s.ask({**base, **bad})
        assert not answer["ok"] and words in answer["error"], (bad, answer)
    assert [dict(r) for r in s.db()] == before == []


def test_unsafe_state_dir_or_socket_is_refused(open_base, users, sched_factory):
    alice, _ = users
    loose = open_base / "loose"
    loose.mkdir(mode=0o777)
    os.chmod(loose, 0o777)
    r = subprocess.run([sys.executable, "-m", "gpudiag", "scheduler", "serve", "--state-dir", str(loose),
                        "--slots", "1"], capture_output=True, text=True, timeout=WAIT_S)
    one_line_refusal(r, "unsafe state dir")
    assert list(loose.iterdir()) == []   # nothing created there
    s = sched_factory("--slots", "1", "--no-monitor", base=open_base)
    assert s.cli("queue").returncode == 0
    os.chmod(s.state, 0o777)
    one_line_refusal(s.cli("queue", check=False), "writable by group or others")
    os.chmod(s.state, 0o755)
    os.chown(s.state / "sock", alice.pw_uid, alice.pw_gid)   # someone else's socket: could be anyone's daemon
    one_line_refusal(s.cli("submit", "--gpus", "1", "--", "true", check=False), "owned by uid")
    os.chown(s.state / "sock", 0, 0)
    assert s.db() == []


def run_as(uid: int, gid: int, fn: Callable[[], object]) -> object:
    """``fn()`` (its value as JSON) in a fork of this process that has become ``uid``:gid with
    no other groups (``user_env.fork_as``), waited for. An exception in ``fn`` comes back as
    {"ok": False, "error": "client failed: ..."}."""
    return child_report(fork_as(uid, gid, fn, on_error=lambda e: {"ok": False,
                                                                    "error": f"client failed: {e}"}))


def as_user(user: pwd.struct_passwd, sock: Path, req: dict) -> dict:
    """Send ``req`` from a process of ``user``, so the daemon's SO_PEERCRED sees that user."""
    return run_as(user.pw_uid, user.pw_gid, lambda: call(sock, req))


def cli_as(uid: int, gid: int, args: list[str], cwd: Path | str = "/") -> subprocess.CompletedProcess:
    """The real ``gpudiag`` command line, run by a process of ``uid`` (in a fork, as above)
    from ``cwd``: its exit code, stdout and stderr."""
    def cli() -> list:
        import contextlib
        import io

        from gpudiag.cli import run

        os.chdir(cwd)
        out, err = io.StringIO(), io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            sys.argv = ["gpudiag", *args]
            try:
                run()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        return [code, out.getvalue(), err.getvalue()]

    code, out, err = run_as(uid, gid, cli)
    return subprocess.CompletedProcess(args, code, out, err)


def test_jobs_run_as_their_submitter_and_only_owner_or_root_may_cancel(open_base, users, sched_factory):
    alice, mallory = users
    s = sched_factory("--slots", "2", "--no-monitor", "--min-runtime", "0", base=open_base)
    sock = s.state / "sock"
    mine = s.submit("--gpus", "1", "--", "sleep", "30")
    sub = {"op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": {"PATH": "/usr/bin:/bin"},
           "cwd": "/"}
    a = as_user(alice, sock, {**sub, "cmd": ["sh", "-c", "id -u; pwd; echo $GPUDIAG_JOB; "
                                                                 "echo $GPUDIAG_TEAM"]})
    assert a["ok"], a
    s.wait("alice's job done", lambda j: state_of(j, a["id"]) == "done")
    logs = as_user(alice, sock, {"op": "logs", "id": a["id"]})
    team = next(r["team"] for r in s.db() if r["id"] == a["id"])   # gpudiag fleet's team
    assert logs["data"].split() == [str(alice.pw_uid), "/", a["agent_job_id"], team]
    assert (s.state / "jobs" / str(a["id"]) / "exit-1").stat().st_uid == alice.pw_uid
    before = [dict(r) for r in s.db()]
    for who, job in ((alice, mine), (mallory, a["id"])):
        for op in ("cancel", "logs"):
            answer = as_user(who, sock, {"op": op, "id": job})
            assert not answer["ok"] and "only its owner or root" in answer["error"], answer
    assert [dict(r) for r in s.db()] == before
    b = as_user(alice, sock, {**sub, "cmd": ["sleep", "30"]})
    s.wait("alice's second job running", lambda j: state_of(j, b["id"]) == "running")
    assert as_user(alice, sock, {"op": "cancel", "id": b["id"]})["ok"]
    assert s.cli("cancel", str(mine)).returncode == 0   # root may cancel anyone's; here its own
    jobs = s.wait("both cancelled", lambda j: state_of(j, b["id"]) == state_of(j, mine) == "cancelled")
    assert "cancelled by" in jobs[b["id"]]["why"]
