"""Who may hold the daemon's socket, and for how long: one local user must not take it from the others.

Connections are capped per uid and in all (leaving ``RESERVED_FDS``), must send within
``REQUEST_TIMEOUT_S`` and take the answer within ``SEND_TIMEOUT_S``; ``EMFILE``/``ENFILE`` pauses
accepting for ``ACCEPT_PAUSE_S`` instead of ending the daemon; a connection over a cap is closed at
once with one line. Why (1,100 idle connections ran a daemon out of descriptors):
docs/scheduler-daemon.md, "One user cannot take the socket from the others".
"""

from __future__ import annotations

import contextlib
import errno
import math
import resource
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpudiag.scheduler.local import protocol
from gpudiag.scheduler.local.protocol import Peer

PER_UID_MAX = 64          # one user's concurrent requests; `gpudiag` itself opens one at a time
TOTAL_MAX = 4096          # all users' together, at most (and at most what the fd limit leaves)
MIN_TOTAL = 16            # a daemon started with very few descriptors still serves someone
RESERVED_FDS = 256        # the database and its WAL, job files, checks' and jobs' pipes, the log
NOFILE_CEILING = 1 << 20  # raising the soft limit beyond this buys nothing (fs.nr_open's default)
REQUEST_TIMEOUT_S = 10.0  # a request is one line a client has ready: 10 s is an idle client
SEND_TIMEOUT_S = 10.0     # an answer is at most a few hundred KiB: a client that takes longer left
ACCEPT_PAUSE_S = 0.5      # after EMFILE/ENFILE: long enough to stop spinning, short for a user
MAX_ACCEPTS = 256         # per wakeup: a flood of connects must not starve the loop's other work
IDLE_ERROR = (f"no request within {REQUEST_TIMEOUT_S:g} s of connecting: closed (a request is one JSON "
              "line, sent at once)")
_LOAD_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (at most ``NOFILE_CEILING``); returns
    (soft, hard) as they are afterwards. Never fails: a limit that cannot be raised is kept."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_CEILING if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CEILING)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass(frozen=True)
class Limits:
    per_uid: int
    total: int

    @classmethod
    def for_nofile(cls, soft: int) -> Limits:
        """Caps that fit ``soft`` open files with ``RESERVED_FDS`` to spare."""
        room = TOTAL_MAX if soft == resource.RLIM_INFINITY else soft - RESERVED_FDS
        total = max(MIN_TOTAL, min(TOTAL_MAX, room))
        return cls(per_uid=max(1, min(PER_UID_MAX, total // 4)), total=total)

    def describe(self) -> str:
        return f"at most {self.per_uid} connections per user, {self.total} in all"


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    peer: Peer
    deadline: float = math.inf   # time.monotonic() by which it must have sent or taken what it owes
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytes = b""


class Clients:
    """The open connections, their owners and deadlines, and the listener's accept pauses."""

    def __init__(self, limits: Limits, log: Callable[[str], None]) -> None:
        self.limits = limits
        self.log = log
        self.conns: dict[int, Conn] = {}      # by socket fd
        self.by_uid: dict[int, int] = {}
        self.paused_until: float | None = None   # time.monotonic() to accept again, after EMFILE
        self.in_episode = False
        self.refused = 0                      # connections closed at once over a cap (for the log)

    # -- accept -------------------------------------------------------------------------------
    def accept(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        """Accept what is waiting (at most ``MAX_ACCEPTS``): admit, or answer and close."""
        for _ in range(MAX_ACCEPTS):
            try:
                s, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _LOAD_ERRNOS:
                    self._pause(listener, sel, e)
                elif e.errno not in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    self.log(f"accept: {e}")
                return
            self.in_episode = False
            try:
                if s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    s.close()   # connected and closed already, without a word: nobody to answer
                    continue
            except BlockingIOError:
                pass   # nothing sent yet: an ordinary client, served below
            except OSError:
                s.close()
                continue
            try:
                peer = protocol.peer_of(s)
            except OSError:
                s.close()
                continue
            why = self._over_cap(peer.uid)
            if why:
                self.refused += 1
                refuse(s, why)
                continue
            s.setblocking(False)
            c = Conn(s, peer, deadline=time.monotonic() + REQUEST_TIMEOUT_S)
            self.conns[s.fileno()] = c
            self.by_uid[peer.uid] = self.by_uid.get(peer.uid, 0) + 1
            sel.register(s, selectors.EVENT_READ, c)

    def _over_cap(self, uid: int) -> str | None:
        if self.by_uid.get(uid, 0) >= self.limits.per_uid:
            return (f"too many connections from uid {uid} (at most {self.limits.per_uid} at once): close "
                    "idle ones and retry")
        if len(self.conns) >= self.limits.total:
            return f"the scheduler is serving {len(self.conns)} connections, its limit: retry in a moment"
        return None

    def _pause(self, listener: socket.socket, sel: selectors.BaseSelector, e: OSError) -> None:
        if not self.in_episode:   # one line per episode: until an accept succeeds again
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            self.log(f"accept: {e.strerror} ({len(self.conns)} connections open, open-file limit {soft}): "
                     f"not accepting for {ACCEPT_PAUSE_S:g} s at a time until it passes")
            self.in_episode = True
        self.paused_until = time.monotonic() + ACCEPT_PAUSE_S
        sel.unregister(listener)

    def resume(self, listener: socket.socket, sel: selectors.BaseSelector, now: float) -> None:
        """Accept again once a pause has passed."""
        if self.paused_until is not None and now >= self.paused_until:
            sel.register(listener, selectors.EVENT_READ, "listen")
            self.paused_until = None

    def wake_in(self, now: float) -> float:
        """Seconds until the loop must look at a pause again (inf when none)."""
        return math.inf if self.paused_until is None else max(0.0, self.paused_until - now)

    # -- the rest of a connection's life -------------------------------------------------------
    def close(self, c: Conn, sel: selectors.BaseSelector | None) -> None:
        if self.conns.pop(c.sock.fileno(), None) is None:
            return
        if sel is not None:
            try:
                sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
        n = self.by_uid.get(c.peer.uid, 1) - 1
        if n:
            self.by_uid[c.peer.uid] = n
        else:
            self.by_uid.pop(c.peer.uid, None)
        c.sock.close()

    def expire(self, now: float, sel: selectors.BaseSelector) -> int:
        """Close the connections past their deadline (idle, slow to send or to read); how many.
        One that never sent a whole request is told why, if its socket takes the line."""
        late = [c for c in self.conns.values() if c.deadline <= now]
        for c in late:
            if not c.outbuf:
                with contextlib.suppress(OSError):
                    c.sock.send(protocol.encode({"ok": False, "error": IDLE_ERROR}))
            self.close(c, sel)
        return len(late)


def refuse(s: socket.socket, why: str) -> None:
    """Answer a connection that will not be served with one line, and close it. What the client
    already sent is read first, so the close reads as the end of the answer, not a reset."""
    try:
        s.setblocking(False)
        s.send(protocol.encode({"ok": False, "error": why}))
        s.recv(65536)
    except OSError:
        pass
    s.close()
