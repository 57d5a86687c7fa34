"""One local user against the root daemon's socket: idle connections by the thousand, at
systemd's default of 1,024 open files. Real daemon, real second users, real sockets.

Before the caps, 1,100 idle connections from one user made ``accept`` fail with EMFILE, which
ended the daemon: nothing started and nobody could submit until it was restarted.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import selectors
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpudiag.scheduler.local.clients import (
    ACCEPT_PAUSE_S,
    IDLE_ERROR,
    PER_UID_MAX,
    REQUEST_TIMEOUT_S,
    Clients,
    Limits,
)
from gpudiag.scheduler.local.protocol import call
from tests.system.local_scheduler.test_local_scheduler import Sched, run_as, state_of

DAEMON_NOFILE = 1024    # systemd's default soft limit, the issue's `ulimit -n 1024`
ANSWER_S = 1.0          # the bound for another user's queue and submit
PATH_ENV = {"PATH": "/usr/bin:/bin"}


def daemon_at_nofile(base: Path, limit: int) -> Sched:
    """A daemon whose soft and hard RLIMIT_NOFILE are ``limit`` (so it cannot raise it)."""
    wrapper = base / "python-nofile"
    wrapper.write_text(f"#!/bin/sh\nulimit -n {limit} || exit 99\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return Sched(base, "--slots", "1", "--no-monitor", "--min-runtime", "0", python=str(wrapper))


def hold_connections(user, sock: Path, n: int, partial_every: int = 0) -> tuple[int, int, int]:
    """A process of ``user`` that opens ``n`` connections to ``sock`` and keeps them open (every
    ``partial_every``-th sends half a request and stops). Returns (pid, the fd it reports on, the
    fd that releases it); its report is one JSON line once all are open, another after release:
    how many the daemon closed, and the last one's seconds since it was opened."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(ready_r)
            os.close(go_w)
            signal.alarm(120)
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            socks, opened, said = [], [], set()
            for i in range(n):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(sock))   # blocking: queued until the daemon accepts it
                if partial_every and i % partial_every == 0:
                    try:   # the daemon may already have refused it (over the per-uid cap) and closed
                        s.send(b'{"op": "que')
                    except (BrokenPipeError, ConnectionResetError):
                        pass   # still one of bob's connections: its refusal line is read below
                socks.append(s)
                opened.append(time.monotonic())
            os.write(ready_w, (json.dumps({"open": len(socks)}) + "\n").encode())
            os.read(go_r, 1)
            sel = selectors.DefaultSelector()
            for i, s in enumerate(socks):
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ, i)
            closed, last = 0, 0.0
            deadline = time.monotonic() + REQUEST_TIMEOUT_S + 20
            while closed < len(socks) and time.monotonic() < deadline:
                for key, _ in sel.select(1.0):
                    s = socks[key.data]
                    try:
                        data = s.recv(65536)
                    except ConnectionResetError:
                        data = b""
                    if data and len(said) < 8:
                        said.add(json.loads(data.split(b"\n")[0])["error"])
                    if not data or b"\n" in data:
                        sel.unregister(s)
                        closed += 1
                        last = max(last, time.monotonic() - opened[key.data])
            out = {"closed": closed, "last_s": last, "said": sorted(said)}
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = {"error": f"{type(e).__name__}: {e}"}
        os.write(ready_w, (json.dumps(out) + "\n").encode())
        os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    return pid, ready_r, go_w


def read_report(fd: int) -> dict:
    line = b""
    while not line.endswith(b"\n"):
        b = os.read(fd, 4096)
        assert b, "the connecting process ended without a report"
        line += b
    return json.loads(line)


def timed_queue_and_submit(user, sock: Path) -> dict:
    """As ``user``: a queue and a submit, each timed (seconds) from connect to answer."""
    def both() -> dict:
        t0 = time.monotonic()
        q = call(sock, {"op": "queue"}, timeout=30)
        t1 = time.monotonic()
        sub = call(sock, {"op": "submit", "gpus": 1, "tier": "reserved", "grace_s": 1, "env": PATH_ENV,
                          "cwd": "/", "cmd": ["true"]}, timeout=30)
        t2 = time.monotonic()
        return {"queue": q, "queue_s": t1 - t0, "submit": sub, "submit_s": t2 - t1}
    return run_as(user.pw_uid, user.pw_gid, both)


def connectors(n: int) -> list[int]:
    """How many connections each of bob's processes opens: his own open-file limit (this
    process's hard limit, which a container may not let even root raise) caps one process."""
    per = resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 64
    return [min(per, n - i) for i in range(0, n, per)]


@pytest.mark.parametrize("n", [1100, 20000])
def test_one_users_idle_connections_neither_end_the_daemon_nor_delay_another_user(open_base, users, n):
    bob, alice = users
    s = daemon_at_nofile(open_base, DAEMON_NOFILE)
    held: list[tuple[int, int, int]] = []
    try:
        sock = s.state / "sock"
        for k in connectors(n):
            held.append(hold_connections(bob, sock, k, partial_every=7))
        opened = [read_report(report) for _, report, _ in held]
        assert sum(o.get("open", 0) for o in opened) == n, opened
        assert s.proc.poll() is None, s.log.read_text()
        answers = [timed_queue_and_submit(alice, sock) for _ in range(2)]   # the second: warm caches
        for a in answers:
            assert a["queue"]["ok"] and a["submit"]["ok"], a
        best = min(answers, key=lambda a: a["queue_s"] + a["submit_s"])
        assert best["queue_s"] < ANSWER_S and best["submit_s"] < ANSWER_S, answers
        for _, _, release in held:
            os.write(release, b"x")
        reports = [read_report(report) for _, report, _ in held]
        done = {"closed": sum(r.get("closed", 0) for r in reports),
                "said": {line for r in reports for line in r.get("said", ())},
                "last_s": max(r.get("last_s", 0.0) for r in reports), "reports": reports}
        # every connection of bob's ended by the daemon with a line that says why: those over his
        # cap at once, those it admitted once idle for REQUEST_TIMEOUT_S
        assert done.get("closed") == n, done
        over_cap = f"too many connections from uid {bob.pw_uid} (at most {PER_UID_MAX} at once): close idle"
        assert done["said"] == {f"{over_cap} ones and retry", IDLE_ERROR}, done
        assert done["last_s"] < REQUEST_TIMEOUT_S + 10, done
        jobs = s.wait("alice's jobs ran", lambda j: all(state_of(j, a["submit"]["id"]) == "done"
                                                         for a in answers))
        assert all(jobs[a["submit"]["id"]]["user"] == alice.pw_name for a in answers)
        assert s.proc.poll() is None
        log = s.log.read_text()
        assert "Traceback" not in log and "clients: at most 64 connections per user" in log, log
    finally:
        for pid, _, _ in held:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        s.stop()


def _accept_until_emfile() -> dict:
    """In a child process (its own open-file limit): a listener with 12 clients waiting, and the
    descriptors filled up to 4 below the soft limit. ``Clients.accept`` must admit 4, meet
    EMFILE, pause with one line, and accept the rest once descriptors are free and the pause is
    over."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        listener.setblocking(False)
        waiting = []
        for _ in range(12):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(path)
            waiting.append(c)
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        lines: list[str] = []
        clients = Clients(Limits(per_uid=100, total=100), lines.append)
        # garbage of earlier tests that holds descriptors (the fork copied it) is closed now, not
        # by a collection while the descriptors are counted (it admitted 7 in a full run)
        gc.collect()
        gc.disable()
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(map(int, os.listdir("/proc/self/fd"))) + 8, hard))
        fillers = []
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        for fd in fillers[-4:]:
            os.close(fd)
        clients.accept(listener, sel)
        first = {"admitted": len(clients.conns), "paused": clients.paused_until is not None,
                 "listening": listener in [k.fileobj for k in sel.get_map().values()]}
        clients.accept(listener, sel) if first["listening"] else None
        for c in list(clients.conns.values()):
            clients.close(c, sel)
        for fd in fillers[:-4]:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        clients.resume(listener, sel, time.monotonic())   # too early: still paused
        early = clients.paused_until is not None
        time.sleep(ACCEPT_PAUSE_S)
        clients.resume(listener, sel, time.monotonic())
        clients.accept(listener, sel)
        return {**first, "early_still_paused": early, "after": len(clients.conns), "lines": lines}


def test_emfile_in_accept_pauses_accepting_with_one_line_and_goes_on():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            out = json.dumps(_accept_until_emfile())
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = json.dumps({"error": f"{type(e).__name__}: {e}"})
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    assert got.get("admitted") == 4 and got["paused"] and not got["listening"], got
    assert got["early_still_paused"] and got["after"] == 8, got
    assert len(got["lines"]) == 1 and got["lines"][0].startswith("accept: Too many open files"), got


def test_the_soft_open_file_limit_is_raised_to_the_hard_one_at_start(open_base):
    wrapper = open_base / "python-soft"
    wrapper.write_text(f"#!/bin/sh\nulimit -S -n 1024 && ulimit -H -n 4096 || exit 99\n"
                       f"exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    s = Sched(open_base, "--slots", "1", "--no-monitor", python=str(wrapper))
    try:
        limits = Path(f"/proc/{s.proc.pid}/limits").read_text()
        assert any(line.startswith("Max open files") and line.split()[3:5] == ["4096", "4096"]
                   for line in limits.splitlines()), limits
        assert "clients: at most 64 connections per user, 3840 in all (open files: 4096 of at most 4096)" \
            in s.log.read_text()
    finally:
        s.stop()
