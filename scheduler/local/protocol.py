"""The client/daemon protocol: one JSON request line, one JSON answer, over the state folder's Unix socket.

Arguments, environment and working folder are carried byte-exact (``to_wire``/``from_wire``:
UTF-8 with ``surrogateescape``); who calls comes from the kernel (``SO_PEERCRED``), never from the
request; every request is validated here, and a refusal is one line (exit 2).
docs/scheduler-daemon.md, "Arguments, environment and output are bytes".
"""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from gpudiag.scheduler.local import fields, untrusted
from gpudiag.scheduler.local.config import (
    MAX_ARGS,
    MAX_COMMAND_BYTES,
    MAX_ENV_BYTES,
    MAX_REQUEST_BYTES,
)
from gpudiag.scheduler.model import TIER_NAMES, Tier

SHELL_NAME = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")   # what a POSIX shell exports (runner.shell_env)

TIERS = {name: tier for tier, name in TIER_NAMES.items()}
OPS = ("submit", "queue", "cancel", "logs", "ping")
MAX_LOG_CHUNK = 256 * 1024   # one `logs` answer: -f asks again from the next offset
CLIENT_TIMEOUT_S = 30.0
CONNECT_RETRY_S = 0.005     # the first pause after EAGAIN; doubled up to 0.1 s
MAX_REQUEST_DEPTH = 4       # a request is an object of lists and objects of strings: 2 levels
MAX_JOB_ID = 2**63 - 1      # SQLite's INTEGER


class Refused(ValueError):
    """A request the daemon will not act on; the message is the one line the client shows."""


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(conn: socket.socket) -> Peer:
    """The connecting process as the kernel saw it at connect() (struct ucred: pid, uid, gid)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return Peer(*struct.unpack("3i", raw))


@dataclass(frozen=True)
class SubmitRequest:
    cmd: list[str]
    gpus: int
    tier: Tier
    team: str
    name: str
    grace_s: float
    time_limit_s: float | None
    env: dict[str, str]
    cwd: str


def to_wire(b: bytes) -> str:
    """POSIX bytes (an argument, a name or value of the environment, a path, job output) as a
    protocol string: UTF-8 where they are UTF-8, a lone surrogate per byte where not."""
    return b.decode("utf-8", "surrogateescape")


def from_wire(s: str, what: str) -> bytes:
    """The bytes a protocol string stands for; ``Refused`` names the first character that no
    bytes decode to (a lone surrogate outside U+DC80..U+DCFF)."""
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise Refused(f"{what} holds {s[e.start]!r}, which stands for no bytes: send arguments and "
                      "environment as UTF-8, other bytes as surrogateescape (U+DC80..U+DCFF)") from None


def printable(s: str) -> str:
    """A protocol string for a terminal: bytes that are not UTF-8 as \\xNN, never an error."""
    try:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def _number(req: dict, key: str, optional: bool = False) -> float | None:
    """A duration field, refused in its option's words (``fields``: "--grace must be between ...")."""
    v = req.get(key)
    if v is None and optional:
        return None
    why = fields.duration_error(key, v)
    if why:
        raise Refused(why)
    return float(v)


def _label(req: dict, key: str) -> str:
    v = req.get(key, "")
    why = fields.label_error(key, v)
    if why:
        raise Refused(why)
    return v


def parse_submit(req: dict) -> SubmitRequest:
    """A submit request, checked field by field; ``Refused`` says what is wrong."""
    cmd = req.get("cmd")
    if not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd):
        raise Refused("cmd must be a list of strings")
    if not cmd or not cmd[0]:
        raise Refused("empty command: gpudiag submit --gpus N -- python train.py")
    if len(cmd) > MAX_ARGS or sum(len(from_wire(a, f"argument {i}")) + 1
                                  for i, a in enumerate(cmd)) > MAX_COMMAND_BYTES:
        raise Refused(f"command too large: at most {MAX_ARGS} arguments and {MAX_COMMAND_BYTES // 1024} KiB")
    if any("\0" in a for a in cmd):
        raise Refused("command arguments cannot contain NUL bytes")
    env = req.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in env.items()):
        raise Refused("env must be an object of strings")
    if sum(len(from_wire(f"{k}={v}", f"environment variable {printable(k)[:40]}")) + 1
           for k, v in env.items()) > MAX_ENV_BYTES:
        raise Refused(f"environment too large: at most {MAX_ENV_BYTES // 1024} KiB (unset what the job "
                      "does not need)")
    if any("\0" in k or "=" in k or not k or "\0" in v for k, v in env.items()):
        raise Refused("environment names and values cannot contain NUL bytes (or '=' in a name)")
    if "=" in cmd[0] and not all(SHELL_NAME.fullmatch(from_wire(k, "a name")) for k in env):
        raise Refused(f"command {printable(cmd[0])[:60]!r} has '=' in its name and the environment a name "
                      "that is not a shell name (such names reach the job through env(1), which would take "
                      "the command for one more variable): rename one of them")
    gpus = req.get("gpus")
    tier = req.get("tier", "reserved")
    why = fields.gpus_error(gpus) or fields.tier_error(tier, list(TIERS))
    if why:
        raise Refused(why)
    cwd = req.get("cwd", "/")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd \
            or len(from_wire(cwd, "cwd")) > 4096:
        raise Refused("cwd must be an absolute path")
    return SubmitRequest(
        cmd=cmd, gpus=gpus, tier=TIERS[tier], team=_label(req, "team"), name=_label(req, "name"),
        grace_s=_number(req, "grace_s"), time_limit_s=_number(req, "time_limit_s", optional=True),
        env=env, cwd=cwd)


def user_of(req: dict) -> str | None:
    """``queue --user NAME`` / ``cancel --user NAME``: a user name (None: every user's)."""
    v = req.get("user")
    if v is None:
        return None
    if not isinstance(v, str) or not 0 < len(v) <= 256 or "\0" in v:
        raise Refused("--user must be a user name")
    return v


def is_job_id(v: object) -> bool:
    """A job number as the store can hold it (SQLite's INTEGER is 64-bit signed)."""
    return not isinstance(v, bool) and isinstance(v, int) and 1 <= v <= MAX_JOB_ID


def job_id_of(req: dict) -> int:
    v = req.get("id")
    if not is_job_id(v):
        raise Refused("id must be a positive job number")
    return v


def encode(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def decode_request(line: bytes) -> dict:
    """One request line, parsed within bounds (``untrusted``): a line nested 100,000 deep, a
    4,000-digit number or NaN is refused in one line, as any other malformed request."""
    try:
        req = untrusted.json_value(line, "request", MAX_REQUEST_BYTES, MAX_REQUEST_DEPTH)
    except untrusted.Untrusted as e:
        raise Refused(f"{e}: a request is one JSON object per line (gpudiag submit/queue/cancel/logs "
                      "send them)") from None
    if not isinstance(req, dict) or req.get("op") not in OPS:
        raise Refused(f"unknown request: op must be one of {', '.join(OPS)}")
    return req


def connect(sock_path: Path, deadline: float) -> socket.socket:
    """A connection to the daemon, made by ``time.monotonic()`` ``deadline`` or OSError.

    The connect blocks (a socket with a Python timeout connects non-blocking, and on a Unix
    socket whose listen queue is full that fails at once with EAGAIN: another user looping
    connect/close once failed 9 of 25 ``queue`` calls so), bounded by ``SO_SNDTIMEO``, which a
    blocking Unix connect waits by; EAGAIN (the queue stayed full that long, or the kernel
    said so at once) is retried, with a short pause, until the deadline."""
    pause = CONNECT_RETRY_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the scheduler's socket did not accept a connection within "
                               f"{CLIENT_TIMEOUT_S:g} s (its listen queue stayed full)")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sec = int(left)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                         struct.pack("ll", sec, max(1, int((left - sec) * 1e6))))
            s.connect(str(sock_path))
            return s
        except (BlockingIOError, InterruptedError):
            s.close()
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.1)
        except BaseException:
            s.close()
            raise


def call(sock_path: Path, req: dict, timeout: float = CLIENT_TIMEOUT_S) -> dict:
    """Send one request and return the daemon's answer (raises OSError when it cannot be reached)."""
    data = encode(req)
    if len(data) > MAX_REQUEST_BYTES:
        raise Refused(f"request too large ({len(data) // 1024} KiB; at most {MAX_REQUEST_BYTES // 1024} KiB)")
    deadline = time.monotonic() + timeout
    with connect(sock_path, deadline) as s:
        s.settimeout(max(0.001, deadline - time.monotonic()))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            try:
                b = s.recv(65536)
            except ConnectionResetError:
                if chunks:   # the daemon answered and closed before reading all we sent (a refusal)
                    break
                raise
            if not b:
                break
            chunks.append(b)
    raw = b"".join(chunks)
    if not raw:
        raise ConnectionError("the scheduler closed the connection without an answer")
    return json.loads(raw)
