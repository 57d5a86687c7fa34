"""Start, watch, signal and reap jobs so that they outlive the daemon and are never mistaken.

A job is a new session whose first process is a ``/bin/sh`` wrapper, already the job's user, that
runs the command and writes its exit code to the job's folder (how a restarted daemon learns how a
job ended). A process is identified by pid and start time (``/proc/PID/stat`` field 22), and every
process of a launch carries ``GPUDIAG_SCHEDULER_LAUNCH=<prefix>:<job>:<attempt>``.
docs/scheduler-daemon.md.
"""

from __future__ import annotations

import errno
import os
import pwd
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gpudiag.contract import ENV_SCHEDULER_LAUNCH
from gpudiag.rundir import RUN_JSON, RUN_SCHEMA_VERSION
from gpudiag.scheduler.local import jobfiles, untrusted
from gpudiag.scheduler.local.protocol import SHELL_NAME

LAUNCH_VAR = ENV_SCHEDULER_LAUNCH
ENV_EXE = "/usr/bin/env"   # coreutils: sets any NAME=VALUE it is given, then runs the command
# Can the shell run "$1"? The same test as the one it takes before it runs it: a name with a
# slash must be an executable file; a bare name is looked up on PATH (dash's `command -v`
# finds only executables there, and builtins).
CAN_RUN = ('can_run() { case $1 in */*) [ -f "$1" ] && [ -x "$1" ];; '
           '*) command -v -- "$1" >/dev/null 2>&1;; esac; }\n')
# $1 exit file, $2 working folder, $3 the user's command, then what to run (the user's command,
# or gpudiag profile --monitor around it). The exit file holds "CODE" or "CODE WHY" (why it
# never started: one of START_FAILURES).
WRAPPER = CAN_RUN + """trap : TERM INT HUP
f=$1 d=$2 c=$3; shift 3
end() { echo "$*" > "$f.tmp" && mv -f "$f.tmp" "$f"; exit "$1"; }
no() { w=$1; shift; echo "gpudiag: job not started: $*" >&2; end $w; }
cd -- "$d" 2>/dev/null || no "126 cwd" "cannot enter $d"
can_run "$c" || no "127 command" "$c: command not found or not executable"
can_run "$1" || no "126 monitor" "$1 (the scheduler's gpudiag profile) cannot be run by this user"
"$@"; end $?"""
START_FAILURES = {
    "cwd": "cannot enter its working folder {cwd} (as {user})",
    "command": "{cmd}: command not found or not executable (on its PATH, in {cwd}, as {user})",
    "monitor": "{user} cannot run {exe}, which runs jobs under gpudiag profile --monitor (install gpudiag "
               "where every user can run it, or serve with --no-monitor)",
}
MAX_EXIT_FILE = 32
ENV_READ_CAP = 64 * 1024  # of one process's environment: the marker is set first, so it is at its start
SCAN_DEADLINE_S = 2.0     # one scan of /proc; a few ms for hundreds of processes
MAX_RUN_JSON = 1 << 20   # run.json of a --monitor run: a few KiB; more is not ours to parse


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str
    sid: int
    start: int     # clock ticks after boot
    uid: int = -1  # owner of /proc/PID (its real uid), where it was read
    ppid: int = -1


class UnknownUser(OSError):
    """The job's uid has no passwd entry (deleted after submitting, or never had one)."""


def proc_info(pid: int) -> ProcInfo | None:
    """Fields 3 (state), 4 (parent), 6 (session) and 22 (start time) of /proc/PID/stat; None if
    gone (a process that ends while it is read leaves an empty or short file: gone too)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read(4096)
        rest = raw[raw.rindex(b")") + 2:].split()   # the command name may hold spaces and ')'
        return ProcInfo(pid, rest[0].decode("ascii", "replace"), int(rest[3]), int(rest[19]),
                        ppid=int(rest[1]))
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int | None, start: int | None) -> bool:
    """The process ``pid`` that started at ``start`` still runs (a zombie has ended)."""
    if pid is None or start is None:
        return False
    p = proc_info(pid)
    return p is not None and p.start == start and p.state not in ("Z", "X")


class ScanCut(Exception):
    """The scan of /proc for a launch's processes ran past its deadline: what it found is not
    all there may be, so no slot may be freed on its word (the caller tries again later)."""


def find_launches(prefix: str, uid: int | None = None, deadline_s: float = SCAN_DEADLINE_S
                  ) -> dict[str, list[ProcInfo]]:
    """Every live process (of ``uid``, where given) whose environment names a launch of this
    scheduler, by launch, with its owner (the uid of /proc/PID).

    Bounded work, whatever the users run: only processes of ``uid`` are read (a job end looks
    for its own user's), each environment only up to ``ENV_READ_CAP`` bytes (300 processes with
    1.9 MB environments once held the daemon 25 s per job end; a marker further in is missed,
    as one cleared with ``env -i`` is: docs/scheduler-daemon.md), and the scan raises
    ``ScanCut`` past ``deadline_s``."""
    out: dict[str, list[ProcInfo]] = {}
    head = f"{LAUNCH_VAR}={prefix}:".encode()
    deadline = time.monotonic() + deadline_s
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        if time.monotonic() > deadline:
            raise ScanCut(f"the scan of /proc for this scheduler's jobs ran past {deadline_s:g} s")
        try:
            owner = os.stat(f"/proc/{name}").st_uid
            if uid is not None and owner != uid:
                continue
            with open(f"/proc/{name}/environ", "rb", buffering=0) as f:
                env = f.read(ENV_READ_CAP)
        except OSError:
            continue
        at = 0 if env.startswith(head) else env.find(b"\0" + head) + 1
        if at == 0 and not env.startswith(head):
            continue   # find gave -1: no marker of ours
        item = env[at:].split(b"\0", 1)[0]
        p = proc_info(int(name))
        if p is not None and p.state not in ("Z", "X"):
            marker = item.split(b"=", 1)[1].decode("ascii", "replace")
            out.setdefault(marker, []).append(replace(p, uid=owner))
    return out


def launch_marker(prefix: str, job_id: int, attempt: int) -> str:
    return f"{prefix}:{job_id}:{attempt}"


def signal_group(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to the job's process group (its wrapper leads it) if it is still the job."""
    if not alive(pid, start):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False


@dataclass(frozen=True)
class ExitRecord:
    """What the wrapper's exit file says: its code, and which start check failed (None: it
    started). ``problem``: why the file says nothing usable, naming it (None when it does)."""

    code: int | None
    why: str | None = None
    problem: str | None = None


def read_exit_file(dir_fd: int, attempt: int, uid: int) -> ExitRecord:
    """The wrapper's exit file, as a claim: never through a link, never a FIFO or anything but a
    small regular file of the job's user, never more than "CODE [WHY]". The daemon takes a job's
    exit code from waitpid while it is the wrapper's parent; this file only says which start
    check failed, and the code of a job re-adopted after a restart (no longer its child)."""
    name = f"exit-{attempt}"
    try:
        raw = jobfiles.read_file(dir_fd, name, uid, MAX_EXIT_FILE + 1)
    except OSError as e:
        return ExitRecord(None, problem=str(e.strerror or e))
    if not raw:
        return ExitRecord(None, problem=f"no {name} (the job's wrapper did not end by itself)")
    head, _, why = raw[:MAX_EXIT_FILE].decode("ascii", "replace").strip().partition(" ")
    if len(raw) > MAX_EXIT_FILE or not head.isdigit() or not 0 <= int(head) <= 255 \
            or (why and why not in START_FAILURES):
        return ExitRecord(None, problem=f"{name} holds {raw[:40]!r}, not what the job's wrapper writes")
    return ExitRecord(int(head), why or None)


class BadJobFile(untrusted.Untrusted):
    """A file in the job's folder that the scheduler's own code writes, not as it writes it: the
    job fails alone, with this line (it names the file)."""


@dataclass(frozen=True)
class CommandEnded:
    """run.json says the job's command ended, with this exit code (a claim: display only)."""

    code: int | None


def run_json_claim(dir_fd: int, attempt: int, uid: int) -> CommandEnded | None:
    """Under --monitor: ``gpudiag profile`` writes run.json (atomically) as the job starts and
    again, with its end and exit code, before it analyses the run. Returns what it says once
    the command ended, None before (or while there is no run.json yet). It is the user's file,
    so a claim: it makes ``queue`` say "finishing" and bounds the analysis (``POST_RUN_S``),
    never ends the job or frees a slot. ``BadJobFile`` when it is not a run.json gpudiag writes
    (a link, a FIFO, too large, nested, not JSON, the wrong fields)."""
    where = f"run-{attempt}/{RUN_JSON}"
    try:
        with jobfiles.open_dir(f"run-{attempt}", uid, dir_fd) as run_fd:
            raw = jobfiles.read_file(run_fd, RUN_JSON, uid, MAX_RUN_JSON + 1, what=where)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return None
        raise BadJobFile(str(e.strerror or e)) from None
    if not raw:
        return None
    try:
        run = untrusted.json_value(raw, where, MAX_RUN_JSON)
    except untrusted.Untrusted as e:
        raise BadJobFile(str(e)) from None
    if not isinstance(run, dict) or run.get("kind") != "gpudiag-run" \
            or run.get("schema_version") != RUN_SCHEMA_VERSION:
        raise BadJobFile(f"{where} is not a run.json of this gpudiag (kind gpudiag-run, schema "
                         f"{RUN_SCHEMA_VERSION})")
    end, code = run.get("end"), run.get("exit_code")
    if end is None:
        return None
    if isinstance(end, bool) or not isinstance(end, (int, float)):
        raise BadJobFile(f"{where}: its end is {str(end)[:40]!r}, not a time")
    ok = isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255
    return CommandEnded(code if ok else None)


@dataclass(frozen=True)
class LaunchSpec:
    job_id: int
    attempt: int
    uid: int
    cmd: list[str]
    env: dict[str, str]
    cwd: str
    job_dir: Path
    monitor: bool


@dataclass(frozen=True)
class Credentials:
    uid: int
    gid: int
    groups: list[int]


def credentials(uid: int) -> Credentials:
    """Who the job runs as: its uid, primary group and supplementary groups from the passwd
    and group databases. ``UnknownUser`` when the uid has no passwd entry."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise UnknownUser(f"uid {uid} has no passwd entry (was the user deleted?)") from None
    return Credentials(pw.pw_uid, pw.pw_gid,
                       [g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid])


def popen_user(uid: int) -> dict:
    """Popen's arguments that run a process as ``uid`` (none when the daemon already is that
    user); ``PermissionError`` when a daemon that is not root is asked for another user."""
    if os.geteuid() == uid:
        return {}
    if os.geteuid() != 0:
        raise PermissionError(f"this scheduler runs as uid {os.geteuid()} and cannot run uid {uid}'s jobs")
    c = credentials(uid)
    return {"user": c.uid, "group": c.gid, "extra_groups": c.groups}


def job_paths(job_dir: Path, attempt: int) -> dict[str, Path]:
    return {"stdout": job_dir / "stdout", "stderr": job_dir / "stderr",
            "exit": job_dir / f"exit-{attempt}", "checkpoint": job_dir / "checkpoint",
            "run": job_dir / f"run-{attempt}"}


def monitor_command(run_dir: Path, cmd: list[str]) -> list[str]:
    return [sys.executable, "-m", "gpudiag", "profile", "--monitor", "--out", str(run_dir), "--", *cmd]


def prepare_job_dir(job_dir: Path, uid: int) -> None:
    """The job's folder (logs, exit codes, its checkpoints), owned by the job's user: kept
    across requeues so a preempted job finds its checkpoint. Made and handed over through
    descriptors: a link put in the place of either folder is refused, never followed."""
    c = credentials(uid) if os.geteuid() == 0 and uid != 0 else Credentials(uid, os.getegid(), [])
    with jobfiles.open_dir(job_dir.parent, os.geteuid()) as jobs_fd:
        jobfiles.make_dir(jobs_fd, job_dir.name, uid, c.gid)
    with jobfiles.open_dir(job_dir, uid) as fd, jobfiles.acting_as(c.uid, c.gid, c.groups):
        jobfiles.make_dir(fd, "checkpoint", uid, c.gid)


def spawn(spec: LaunchSpec) -> subprocess.Popen:
    """Start the job's wrapper in a new session, as the job's user; returns its Popen.

    Raises OSError when it cannot start (no such user, a job file that is not a regular file
    of the user's, ...); what only the user can find out (its folder, its command) the wrapper
    checks, as the user, and reports in its exit file.
    """
    paths = job_paths(spec.job_dir, spec.attempt)
    inner: list[str | bytes] = [*(monitor_command(paths["run"], spec.cmd) if spec.monitor else spec.cmd)]
    env, odd = shell_env(env_bytes(spec.env))
    if odd:   # names the wrapper's /bin/sh would drop reach the job through env(1), unchanged
        inner = [ENV_EXE, *odd, *inner]
    kw = popen_user(spec.uid)
    with jobfiles.open_dir(spec.job_dir, spec.uid) as dir_fd, \
            jobfiles.acting_as(spec.uid, kw.get("group", -1), kw.get("extra_groups", [])):
        out = jobfiles.open_output(dir_fd, "stdout", spec.uid)
        try:
            err = jobfiles.open_output(dir_fd, "stderr", spec.uid)
        except BaseException:
            os.close(out)
            raise
    try:
        return subprocess.Popen(["/bin/sh", "-c", WRAPPER, "gpudiag-job", str(paths["exit"]),
                                 *map(as_bytes, [spec.cwd, spec.cmd[0], *inner])],
                                env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, close_fds=True, **kw)
    finally:
        os.close(out)
        os.close(err)


def as_bytes(s: str | bytes) -> bytes:
    """A stored argument, path or environment string as the bytes the user submitted
    (``protocol.to_wire``), whatever this daemon's locale: never re-encoded as text."""
    return s if isinstance(s, bytes) else s.encode("utf-8", "surrogateescape")


def env_bytes(env: dict[str, str]) -> dict[bytes, bytes]:
    return {as_bytes(k): as_bytes(v) for k, v in env.items()}


def shell_env(env: dict[bytes, bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
    """(what ``/bin/sh`` passes on, ``NAME=VALUE`` of what it would drop). A POSIX shell exports
    only names that are shell names (dash drops ``BASH_FUNC_module%%``, a name with a byte that
    is not ASCII, ...), so those go around the wrapper, as arguments of env(1)."""
    kept = {k: v for k, v in env.items() if SHELL_NAME.fullmatch(k)}
    return kept, [k + b"=" + v for k, v in env.items() if k not in kept]


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
