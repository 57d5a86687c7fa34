"""A root daemon and its users' input: uids without a passwd entry, users deleted, hostile files
in a job's folder, commands that cannot run. Real second users, real processes, the real CLI.

Each of these once took the whole machine's queue down (a KeyError crash loop, a daemon
blocked in ``open()`` on a FIFO); here each must fail alone, in one line, while every other
client is answered.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpudiag.scheduler.local.protocol import call, encode
from tests.system.local_scheduler.test_local_scheduler import (
    WAIT_S,
    as_user,
    cli_as,
    one_line_refusal,
    run_as,
    state_of,
)

NO_PASSWD_UID = 54321   # the uid: no passwd entry on this machine (checked below)
PATH_ENV = {"PATH": "/usr/bin:/bin"}


def user_submit(user, sock: Path, cmd: list[str], cwd: str = "/", **extra) -> dict:
    req = {"op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV, "cwd": cwd,
           "cmd": cmd, **extra}
    return as_user(user, sock, req)


def gate_job(s, gate: Path) -> int:
    """A root job holding the machine's one slot until ``gate`` exists."""
    job = s.submit("--gpus", "1", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    s.wait("the gate job running", lambda j: state_of(j, job) == "running")
    return job


def users_gate_job(s, user, gate: Path) -> tuple[int, Path]:
    """``user``'s spot job, running until ``gate`` exists: its id and its folder."""
    job = user_submit(user, s.state / "sock",
                      ["sh", "-c", f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done"], tier="spot")
    assert job["ok"], job
    jid = job["id"]
    s.wait(f"{user.pw_name}'s job running", lambda j: state_of(j, jid) == "running")
    return jid, s.state / "jobs" / str(jid)


def test_a_uid_without_a_passwd_entry_is_refused_in_one_line_and_the_daemon_lives(open_base, sched_factory):
    import pwd

    with pytest.raises(KeyError):
        pwd.getpwuid(NO_PASSWD_UID)
    s = sched_factory("--slots", "1", "--no-monitor", base=open_base)
    r = cli_as(NO_PASSWD_UID, NO_PASSWD_UID, ["submit", "--state-dir", str(s.state), "--gpus", "1", "--",
                                               "sleep", "1"])
    one_line_refusal(r, f"uid {NO_PASSWD_UID} has no user on this machine (no passwd entry)")
    assert s.proc.poll() is None and s.ask({"op": "ping"})["ok"]
    assert s.db() == []
    done = s.submit("--gpus", "1", "--", "true")
    s.wait("root's job done", lambda j: state_of(j, done) == "done")


def test_a_job_whose_user_was_deleted_fails_alone_even_across_a_restart(open_base, users, sched_factory):
    alice, _ = users
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0", base=open_base)
    gate = open_base / "gate"
    blocker = gate_job(s, gate)
    orphan = user_submit(alice, s.state / "sock", ["true"])
    assert orphan["ok"], orphan
    r = subprocess.run(["userdel", "-f", alice.pw_name], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s.kill()      # and the database now holds a pending job of a uid with no passwd entry
    s.start()     # the restart comes up (it crash-looped here)
    gate.touch()
    jobs = s.wait("the deleted user's job settled", lambda j: state_of(j, orphan["id"]) == "failed")
    assert jobs[orphan["id"]]["why"] == (f"could not start: uid {alice.pw_uid} has no passwd entry "
                                         "(was the user deleted?)"), jobs[orphan["id"]]
    after = s.submit("--gpus", "1", "--", "true")
    s.wait("the queue goes on", lambda j: state_of(j, after) == "done" and state_of(j, blocker) == "done")
    assert s.proc.poll() is None


def test_a_fifo_or_link_in_a_users_job_folder_is_refused_and_stalls_nobody(open_base, users, sched_factory):
    alice, _ = users
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0", base=open_base)
    sock = s.state / "sock"
    secret = open_base / "root-only"
    secret.write_text("root's secret\n")
    os.chmod(secret, 0o600)
    vault = open_base / "vault"
    vault.mkdir(mode=0o700)
    gate = open_base / "gate"
    jid, jdir = users_gate_job(s, alice, gate)

    def vandalise() -> bool:   # as alice, in her own job's folder, while the job runs
        os.unlink(jdir / "stdout")
        os.mkfifo(jdir / "stdout")
        os.unlink(jdir / "stderr")
        os.symlink(secret, jdir / "stderr")
        os.rmdir(jdir / "checkpoint")
        os.symlink(vault, jdir / "checkpoint")
        return True

    assert run_as(alice.pw_uid, alice.pw_gid, vandalise) is True
    # a logs request on the FIFO, and meanwhile another client's queue: both answered at once
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as hung:
        hung.settimeout(WAIT_S)
        hung.connect(str(sock))
        hung.sendall(encode({"op": "logs", "id": jid}))
        t0 = time.monotonic()
        queue = call(sock, {"op": "queue"}, timeout=10)
        assert queue["ok"] and time.monotonic() - t0 < 10
        assert str(jid) in s.cli("queue").stdout   # the command line too (it would wait forever)
        answer = json.loads(hung.makefile("rb").readline())
    assert not answer["ok"] and f"stdout of job {jid} is a FIFO" in answer["error"], answer
    one_line_refusal(s.cli("logs", str(jid), check=False),
                     f"stdout of job {jid} is a FIFO, not a regular file")
    r = s.cli("logs", str(jid), "--stderr", check=False)
    one_line_refusal(r, f"stderr of job {jid} is a symbolic link")
    assert "secret" not in r.stdout + r.stderr
    mine = as_user(alice, sock, {"op": "logs", "id": jid, "stream": "stderr"})
    assert not mine["ok"] and "symbolic link" in mine["error"] and "secret" not in json.dumps(mine), mine
    # preempted and requeued, its next start meets the link where its checkpoint folder was
    od = s.submit("--gpus", "1", "--tier", "on-demand", "--", "true")
    jobs = s.wait("alice's job failed to restart", lambda j: state_of(j, jid) == "failed"
                  and state_of(j, od) == "done")
    assert jobs[jid]["restarts"] == 1
    assert jobs[jid]["why"] == "could not start: checkpoint is a symbolic link, not a folder: refused", \
        jobs[jid]
    assert jobs[jid]["exit_code"] is None, jobs[jid]   # not the preempted attempt's (it said 143)
    for path in (vault, secret):   # never chowned through the link
        st = os.stat(path)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700 if path == vault else 0o600)
    assert secret.read_text() == "root's secret\n"
    assert s.proc.poll() is None


def test_a_command_is_checked_as_its_submitter_and_a_job_that_cannot_start_says_why(
        open_base, users, sched_factory):
    alice, _ = users
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0", base=open_base)
    sub = ["submit", "--state-dir", str(s.state), "--gpus", "1", "--"]
    one_line_refusal(s.cli("submit", "--gpus", "1", "--", "no-such-command-xyz", check=False),
                     "no-such-command-xyz: command not found or not executable (looked up as root")
    private = open_base / "private"   # root may enter it and run what is in it; alice may not
    private.mkdir(mode=0o700)
    tool = private / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    one_line_refusal(cli_as(alice.pw_uid, alice.pw_gid, [*sub, str(tool)]),
                     f"{tool}: command not found or not executable (looked up as {alice.pw_name}")
    ok = cli_as(alice.pw_uid, alice.pw_gid, [*sub, "true"], cwd=open_base)   # the refusals are about access
    assert ok.returncode == 0 and s.db()[-1]["uid"] == alice.pw_uid, ok
    denied = user_submit(alice, s.state / "sock", ["true"], cwd=str(private))
    assert not denied["ok"] and f"{alice.pw_name} cannot enter {private}" in denied["error"], denied
    # accepted, then its command disappears before it starts: it fails and says why
    pub = open_base / "pub"
    pub.mkdir(mode=0o755)
    hello = pub / "hello.sh"
    hello.write_text("#!/bin/sh\necho hello\n")
    hello.chmod(0o755)
    gate = open_base / "gate"
    gate_job(s, gate)
    r = cli_as(alice.pw_uid, alice.pw_gid, [*sub, "./hello.sh"], cwd=pub)
    assert r.returncode == 0, r.stderr
    jid = int(r.stdout)
    hello.unlink()
    gate.touch()
    jobs = s.wait("alice's job failed to start", lambda j: state_of(j, jid) == "failed")
    why = jobs[jid]["why"]
    assert why.startswith("could not start: ./hello.sh: command not found or not executable") and \
        f"in {pub}, as {alice.pw_name}" in why, why
    assert jobs[jid]["exit_code"] == 127
    logs = s.cli("logs", str(jid))
    assert logs.stdout == "" and f"job {jid} could not start: ./hello.sh" in logs.stderr, logs
    err = s.cli("logs", str(jid), "--stderr").stdout
    assert "gpudiag: job not started: ./hello.sh: command not found" in err, err
    assert "could not start: ./hello.sh" in s.cli("queue").stdout


def test_a_hard_link_or_a_root_owned_file_in_a_job_folder_is_neither_read_nor_written(
        open_base, users, sched_factory):
    alice, _ = users
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0", base=open_base)
    sock = s.state / "sock"
    gate = open_base / "gate"
    jid, jdir = users_gate_job(s, alice, gate)
    for name in ("stdout", "stderr", "checkpoint"):   # made by and for alice, never root's
        assert (jdir / name).stat().st_uid == alice.pw_uid, name
    # planted as root: this VM has fs.protected_hardlinks=1, the kernel's default is 0, where
    # alice could link root's file herself
    secret = open_base / "root-only"
    secret.write_text("root's secret\n")
    os.chmod(secret, 0o600)
    os.unlink(jdir / "stdout")
    os.link(secret, jdir / "stdout")
    os.unlink(jdir / "stderr")
    (jdir / "stderr").write_text("root's own file\n")   # one link, readable by all, root's
    os.chmod(jdir / "stderr", 0o644)
    for args, words in (((), f"stdout of job {jid} belongs to uid 0"),
                        (("--stderr",), f"stderr of job {jid} belongs to uid 0")):
        r = s.cli("logs", str(jid), *args, check=False)
        one_line_refusal(r, words)
        assert "root's" not in r.stdout + r.stderr
    mine = as_user(alice, sock, {"op": "logs", "id": jid})
    assert not mine["ok"] and "belongs to uid 0" in mine["error"] and "secret" not in json.dumps(mine), mine
    # a hard link to alice's own file is refused too: the daemon cannot tell whose name it is
    own = open_base / "alices"
    own.write_text("hers\n")
    os.chown(own, alice.pw_uid, alice.pw_gid)
    os.unlink(jdir / "stderr")
    os.link(own, jdir / "stderr")
    one_line_refusal(s.cli("logs", str(jid), "--stderr", check=False), "has 2 links")
    os.unlink(jdir / "stderr")
    (jdir / "stderr").write_text("root's own file\n")
    os.chmod(jdir / "stderr", 0o644)
    # preempted and requeued: its next start must not append to either as root (or as alice)
    od = s.submit("--gpus", "1", "--tier", "on-demand", "--", "true")
    jobs = s.wait("alice's job failed to restart", lambda j: state_of(j, jid) == "failed"
                  and state_of(j, od) == "done")
    assert jobs[jid]["restarts"] == 1
    assert jobs[jid]["why"] == "could not start: stdout belongs to uid 0, not to the job's user: refused", \
        jobs[jid]
    assert secret.read_text() == "root's secret\n" and (jdir / "stderr").read_text() == "root's own file\n"
    assert (os.stat(secret).st_uid, stat.S_IMODE(os.stat(secret).st_mode)) == (0, 0o600)
    assert s.proc.poll() is None
