"""The daemon's one loop: the socket, the clients' connections, the wakeup pipe, the tick.

No thread, so no lock: after anything happened (a request, SIGCHLD through the wakeup pipe, the
one-second tick) it runs one pass on the state it answers from. Nothing a user sends may end it
(``Daemon.guarded``), a failing pass is logged once per cause and retried, and ready requests are
served round-robin by user (``PER_UID_PER_ROUND``). docs/scheduler-daemon.md.
"""

from __future__ import annotations

import errno
import math
import os
import selectors
import signal
import socket
import time
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.scheduler.local.clients import SEND_TIMEOUT_S, Clients, Conn, Limits, raise_nofile_limit
from gpudiag.scheduler.local.config import MAX_REQUEST_BYTES, SOCKET_NAME
from gpudiag.scheduler.local.lifecycle import log_line
from gpudiag.scheduler.local.protocol import encode
from gpudiag.scheduler.local.room import StateFull

if TYPE_CHECKING:
    from gpudiag.scheduler.local.daemon import Daemon, Deferred

TICK_S = 1.0              # grace periods and time limits are seconds; a second late is fine
MIN_BACKLOG = 128         # the kernel's old default
PER_UID_PER_ROUND = 8     # requests of one user served per turn of the loop while others wait
SOMAXCONN = "/proc/sys/net/core/somaxconn"
FAILURE_REPEAT_S = 300.0  # a pass that keeps failing the same way is logged again this often


def listen_backlog(limits: Limits) -> int:
    """Room in the listen queue for one user's whole burst (their connection cap) and as much
    again for everyone else: a client that finds it full waits and retries within its deadline
    (``protocol.connect``), so a larger queue buys no success, only a longer wait behind a flood.
    Measured on the 2-core VM under one user's connect/close loop (load average ~15-20): another
    user's queue and submit took a median of 85/47 ms with 128 places, 184/133 ms with 256 and
    612/600 ms with 4,096 (each queued connection costs the daemon an accept), and none failed;
    before the client connected blocking, 46 of 50 failed with 128 places."""
    try:
        with open(SOMAXCONN) as f:
            most = int(f.read().strip())
    except (OSError, ValueError):
        most = MIN_BACKLOG
    return max(MIN_BACKLOG, min(2 * limits.per_uid, most))


def fair(conns: list[Conn]) -> Iterator[Conn]:
    """Ready connections round-robin by user, at most ``PER_UID_PER_ROUND`` of each: the rest
    stay ready for the next turn, after every other user's."""
    by_uid: dict[int, list[Conn]] = {}
    for c in conns:
        by_uid.setdefault(c.peer.uid, []).append(c)
    for k in range(PER_UID_PER_ROUND):
        for mine in by_uid.values():
            if k < len(mine):
                yield mine[k]


class Loop:
    """``serve`` runs until SIGTERM or SIGINT; the daemon answers and schedules."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.failing: dict[str, float] = {}   # a pass's failure -> when it was last logged

    def serve(self) -> None:
        d = self.d
        sock_path = d.state_dir / SOCKET_NAME
        try:
            sock_path.unlink()   # ours to remove: the lock says no other daemon uses it
        except FileNotFoundError:
            pass
        soft, hard = raise_nofile_limit()
        self.clients = Clients(Limits.for_nofile(soft), log_line)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(sock_path))
        os.chmod(sock_path, 0o666)  # everybody may connect; SO_PEERCRED says who they are
        backlog = listen_backlog(self.clients.limits)
        listener.listen(backlog)
        listener.setblocking(False)
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, d.stop)
        sel = selectors.DefaultSelector()
        self.sel = sel
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(rfd, selectors.EVENT_READ, "wake")
        log_line(f"serving {len(d.machine.ids)} {d.machine.unit} on {sock_path} (pid {os.getpid()}); "
             f"signals: {'available' if d.signals.available else d.signals.why}; "
             f"containment: {d.containment.describe()}; clients: {self.clients.limits.describe()} "
             f"(open files: {soft} of at most {hard}); listen queue: {backlog}")
        next_tick = 0.0
        while not d.stopping:
            now = time.monotonic()
            timeout = min(max(0.0, next_tick - now), self.clients.wake_in(now)) if not d.dirty else 0.0
            ready = []
            for key, mask in sel.select(timeout):
                if key.data == "listen":
                    self.clients.accept(listener, sel)
                elif key.data == "wake":
                    try:
                        while os.read(rfd, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    d.dirty = True
                elif isinstance(key.data, Conn):
                    ready.append((key.data, mask))
                else:
                    self._checked(key.data)
            masks = {id(c): m for c, m in ready}
            for c in fair([c for c, _ in ready]):
                self._io(c, masks[id(c)])
            for conn, deferred in list(d.waiting.values()):
                if deferred.check.expired():
                    self._checked((conn, deferred))
            now = time.monotonic()
            self.clients.resume(listener, sel, now)
            if d.dirty or now >= next_tick:
                d.dirty = False
                self.clients.expire(now, sel)
                self.pass_guarded()
                next_tick = time.monotonic() + TICK_S
        log_line("stopped (running jobs keep running and are re-adopted at the next start)")
        listener.close()
        sock_path.unlink(missing_ok=True)
        d.store.close()

    def pass_guarded(self) -> None:
        """One scheduling pass; what stops it is logged (once per cause, again every
        ``FAILURE_REPEAT_S``) and the pass runs again at the next tick."""
        try:
            note = self.d.store.top_up()
            if note:
                log_line(note)
            self.d.schedule(time.time())
            self.failing.clear()
        except StateFull as e:
            self._failed("full", f"a scheduling pass stopped: {e}; it runs again at the next tick")
        except Exception as e:  # noqa: BLE001 - the loop outlives any one pass: every client is still answered
            self._failed(f"{type(e).__name__}: {e}", f"a scheduling pass failed (it runs again at the next "
                         f"tick; clients are answered meanwhile):\n{traceback.format_exc()}")

    def _failed(self, cause: str, line: str) -> None:
        now = time.monotonic()
        if now - self.failing.get(cause, -math.inf) >= FAILURE_REPEAT_S:
            log_line(line)
            self.failing[cause] = now

    def _io(self, c: Conn, mask: int) -> None:
        sel = self.sel
        try:
            if mask & selectors.EVENT_READ and not c.outbuf:
                b = c.sock.recv(65536)
                c.inbuf += b
                if len(c.inbuf) > MAX_REQUEST_BYTES:
                    self._answer(c, {"ok": False, "error": f"request larger than {MAX_REQUEST_BYTES} bytes"})
                elif not b and not c.inbuf:
                    self.clients.close(c, sel)   # connected and closed without a word: nobody to answer
                elif b"\n" in c.inbuf or not b:
                    line = bytes(c.inbuf).split(b"\n", 1)[0]
                    answer = self.d.guarded(lambda: self.d.handle_line(line, c.peer))
                    if not isinstance(answer, dict):   # answered when the check ends (_checked)
                        sel.unregister(c.sock)
                        c.deadline = math.inf          # the check has its own (CHECK_TIMEOUT_S)
                        sel.register(answer.check, selectors.EVENT_READ, (c, answer))
                        self.d.waiting[answer.check.fileno()] = (c, answer)
                    else:
                        self._answer(c, answer)
            elif mask & selectors.EVENT_WRITE:
                n = c.sock.send(c.outbuf)
                c.outbuf = c.outbuf[n:]
                if not c.outbuf:
                    self.clients.close(c, sel)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                log_line(f"client connection: {e}")
            self.clients.close(c, sel)

    def _checked(self, waiting: tuple[Conn, Deferred]) -> None:
        """A submit's check ended (or ran out of time): answer its client."""
        c, deferred = waiting
        self.d.waiting.pop(deferred.check.fileno(), None)
        self.sel.unregister(deferred.check)
        answer = self.d.guarded(lambda: deferred.done(deferred.check.verdict()))
        self.sel.register(c.sock, selectors.EVENT_READ, c)
        self._answer(c, answer)

    def _answer(self, c: Conn, msg: dict) -> None:
        """Send now what the socket takes (the client need not wait for the pass that follows
        a submit); the rest when it is writable, within ``SEND_TIMEOUT_S``."""
        c.outbuf = encode(msg)
        c.deadline = time.monotonic() + SEND_TIMEOUT_S
        self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self._io(c, selectors.EVENT_WRITE)
