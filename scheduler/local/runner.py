"""Start, watch, signal and reap jobs so that they outlive the daemon and are never mistaken.

A job is a new session (``start_new_session``): its first process is a tiny ``/bin/sh``
wrapper, already running as the job's user, that enters the job's folder, checks that the
command can run, runs the job and writes its exit code to a file in the job's folder, so the
daemon learns how a job ended even when it is no longer its parent (after a restart), and why
it never started where it did not (that file then says which check failed). Entering the
folder and finding the command happen as the user, so they see what the user may see, and a
folder that hangs stalls the job, never the daemon. The wrapper traps SIGTERM only to outlive
its child long enough to write that file; the trap is not inherited (a trapped signal is
reset to the default in children, an ignored one would not be).

A process is identified by pid *and* start time (``/proc/PID/stat`` field 22, clock ticks
since boot): a recycled pid never passes for the job. Every process of a launch carries
``GPUDIAG_SCHEDULER_LAUNCH=<prefix>:<job>:<attempt>`` in its environment, which is how
recovery finds a launch whose pid the daemon died before recording, and how leftovers are
told apart from strangers before anything is killed.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from gpudiag.rundir import RUN_SCHEMA_VERSION
from gpudiag.scheduler.local import jobfiles
from gpudiag.scheduler.local.protocol import SHELL_NAME

LAUNCH_VAR = "GPUDIAG_SCHEDULER_LAUNCH"
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
    """Fields 3 (state), 4 (parent), 6 (session) and 22 (start time) of /proc/PID/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2:].split()   # the command name may hold spaces and ')'
    return ProcInfo(pid, rest[0].decode(), int(rest[3]), int(rest[19]), ppid=int(rest[1]))


def alive(pid: int | None, start: int | None) -> bool:
    """The process ``pid`` that started at ``start`` still runs (a zombie has ended)."""
    if pid is None or start is None:
        return False
    p = proc_info(pid)
    return p is not None and p.start == start and p.state not in ("Z", "X")


def find_launches(prefix: str) -> dict[str, list[ProcInfo]]:
    """Every live process whose environment names a launch of this scheduler, by launch, with
    its owner (the uid of /proc/PID)."""
    out: dict[str, list[ProcInfo]] = {}
    head = f"{LAUNCH_VAR}={prefix}:".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            uid = os.stat(f"/proc/{name}").st_uid
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(head):
                p = proc_info(int(name))
                if p is not None and p.state not in ("Z", "X"):
                    out.setdefault(item.split(b"=", 1)[1].decode(), []).append(replace(p, uid=uid))
                break
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


def read_exit_file(dir_fd: int, attempt: int, uid: int) -> tuple[int | None, str | None]:
    """(exit code, why it never started) from the wrapper's file: never through a link, never
    a FIFO or anything but a small regular file of the job's user."""
    try:
        raw = jobfiles.read_file(dir_fd, f"exit-{attempt}", uid, MAX_EXIT_FILE)
    except OSError:
        return None, None
    head, _, why = raw.decode("ascii", "replace").strip().partition(" ")
    try:
        code = int(head)
    except ValueError:
        return None, None
    return (code, why if why in START_FAILURES else None) if 0 <= code <= 255 else (None, None)


def monitor_exit_code(dir_fd: int, attempt: int, uid: int) -> int | None:
    """The job's exit code once ``gpudiag profile --monitor`` has recorded that its command
    ended (run.json, written before the post-run analysis); None while it runs, or if the file
    is not a run.json this gpudiag wrote."""
    try:
        with jobfiles.open_dir(f"run-{attempt}", uid, dir_fd) as run_fd:
            raw = jobfiles.read_file(run_fd, "run.json", uid, MAX_RUN_JSON + 1)
    except OSError:
        return None
    if len(raw) > MAX_RUN_JSON:
        return None
    try:
        run = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(run, dict) or run.get("kind") != "gpudiag-run" \
            or run.get("schema_version") != RUN_SCHEMA_VERSION or run.get("end") is None:
        return None
    code = run.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255 else None


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
