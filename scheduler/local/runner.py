"""Start, watch, signal and reap jobs so that they outlive the daemon and are never mistaken.

A job is a new session (``start_new_session``): its first process is a tiny ``/bin/sh``
wrapper that runs the job and writes its exit code to a file in the job's folder, so the
daemon learns how a job ended even when it is no longer its parent (after a restart). The
wrapper traps SIGTERM only to outlive its child long enough to write that file; the trap
is not inherited (a trapped signal is reset to the default in children, an ignored one would
not be).

A process is identified by pid *and* start time (``/proc/PID/stat`` field 22, clock ticks
since boot): a recycled pid never passes for the job. Every process of a launch carries
``GPUDIAG_SCHEDULER_LAUNCH=<prefix>:<job>:<attempt>`` in its environment, which is how
recovery finds a launch whose pid the daemon died before recording, and how leftovers are
told apart from strangers before anything is killed.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LAUNCH_VAR = "GPUDIAG_SCHEDULER_LAUNCH"
WRAPPER = 'trap : TERM INT HUP; f=$1; shift; "$@"; c=$?; echo $c > "$f.tmp" && mv -f "$f.tmp" "$f"; exit $c'
MAX_EXIT_FILE = 32


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    state: str
    sid: int
    start: int     # clock ticks after boot
    uid: int = -1  # owner of /proc/PID (its real uid), where it was read


def proc_info(pid: int) -> ProcInfo | None:
    """Fields 3 (state), 6 (session) and 22 (start time) of /proc/PID/stat; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2:].split()   # the command name may hold spaces and ')'
    return ProcInfo(pid, rest[0].decode(), int(rest[3]), int(rest[19]))


def alive(pid: int | None, start: int | None) -> bool:
    """The process ``pid`` that started at ``start`` still runs (a zombie has ended)."""
    if pid is None or start is None:
        return False
    p = proc_info(pid)
    return p is not None and p.start == start and p.state not in ("Z", "X")


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def find_launches(prefix: str) -> dict[str, list[ProcInfo]]:
    """Every live process whose environment names a launch of this scheduler, by launch."""
    out: dict[str, list[ProcInfo]] = {}
    head = f"{LAUNCH_VAR}={prefix}:".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item.startswith(head):
                p = proc_info(int(name))
                try:
                    uid = os.stat(f"/proc/{name}").st_uid
                except OSError:
                    break
                if p is not None and p.state not in ("Z", "X"):
                    p = ProcInfo(p.pid, p.state, p.sid, p.start, uid)
                    out.setdefault(item.split(b"=", 1)[1].decode(), []).append(p)
                break
    return out


def launch_marker(prefix: str, job_id: int, attempt: int) -> str:
    return f"{prefix}:{job_id}:{attempt}"


def kill_leftovers(sid: int, marker: str, not_before: int) -> int:
    """SIGKILL what is left of a launch's session once its wrapper is gone (a job's children
    in their own process group). Only processes of that session, started no earlier than the
    launch and carrying its marker: a recycled session id never gets a stranger killed."""
    needle = f"{LAUNCH_VAR}={marker}".encode()
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        p = proc_info(int(name))
        if p is None or p.sid != sid or p.start < not_before or p.state in ("Z", "X"):
            continue
        if _environ_has(p.pid, needle):
            try:
                os.kill(p.pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
    return n


def kill_launch(procs: list[ProcInfo]) -> None:
    """SIGKILL every process of a launch found by ``find_launches`` (an orphan nobody owns)."""
    for p in procs:
        if alive(p.pid, p.start):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def signal_group(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to the job's process group (its wrapper leads it) if it is still the job."""
    if not alive(pid, start):
        return False
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        return False


def read_exit_file(path: Path) -> int | None:
    """The wrapper's exit code; the folder is the job user's, so never follow a link, read little."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_EXIT_FILE)
    finally:
        os.close(fd)
    try:
        code = int(raw.strip())
    except ValueError:
        return None
    return code if 0 <= code <= 255 else None


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


def job_paths(job_dir: Path, attempt: int) -> dict[str, Path]:
    return {"stdout": job_dir / "stdout", "stderr": job_dir / "stderr",
            "exit": job_dir / f"exit-{attempt}", "checkpoint": job_dir / "checkpoint",
            "run": job_dir / f"run-{attempt}"}


def prepare_job_dir(job_dir: Path, uid: int) -> None:
    """The job's folder (logs, exit codes, its checkpoints), owned by the job's user: kept
    across requeues so a preempted job finds its checkpoint. Never through a link."""
    for d in (job_dir, job_dir / "checkpoint"):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        if os.path.islink(d) or not os.path.isdir(d):
            raise OSError(f"{d} is not a folder")
        if os.geteuid() == 0:
            gid = pwd.getpwuid(uid).pw_gid if _has_user(uid) else uid
            os.chown(d, uid, gid)


def _has_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def spawn(spec: LaunchSpec) -> subprocess.Popen:
    """Start the job's wrapper in a new session, as the job's user; returns its Popen.

    Raises OSError when it cannot start (the user cannot enter ``cwd``, no such user, ...).
    """
    paths = job_paths(spec.job_dir, spec.attempt)
    inner = list(spec.cmd)
    if spec.monitor:
        inner = [sys.executable, "-m", "gpudiag", "profile", "--monitor", "--out", str(paths["run"]),
                 "--", *inner]
    kw: dict = {}
    if os.geteuid() == 0 and spec.uid != 0:
        pw = pwd.getpwuid(spec.uid)
        kw = {"user": pw.pw_uid, "group": pw.pw_gid,
              "extra_groups": [g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != pw.pw_gid]}
    elif spec.uid != os.geteuid():
        raise PermissionError(f"this scheduler runs as uid {os.geteuid()} and cannot run uid "
                              f"{spec.uid}'s jobs")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    out = os.open(paths["stdout"], flags, 0o600)
    err = os.open(paths["stderr"], flags, 0o600)
    try:
        if os.geteuid() == 0:
            gid = kw.get("group", 0)
            os.fchown(out, spec.uid, gid)
            os.fchown(err, spec.uid, gid)
        return subprocess.Popen(["/bin/sh", "-c", WRAPPER, "gpudiag-job", str(paths["exit"]), *inner],
                                env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True, close_fds=True, **kw)
    finally:
        os.close(out)
        os.close(err)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
