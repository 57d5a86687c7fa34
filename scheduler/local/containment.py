"""Which processes belong to a launch, and ending every one of them before its slots are reused.

Two ways to know them, and one sweep (``Containment.sweep``) that settling, grace deadlines and
recovery all call: a cgroup v2 per launch where the daemon may create one (``cgroup.kill`` ends it
in one write), else the launch marker in every process's environment (a scan past its deadline,
``runner.ScanCut``, frees nothing). What each misses: docs/scheduler-daemon.md, "Containment".
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudiag.scheduler.local.runner import ProcInfo, ScanCut, alive, find_launches, proc_info

CGROUP_NAME = "gpudiag-{prefix}-{job}-{attempt}"
MAX_CGROUP_DEPTH = 12   # systemd's tree is a few levels deep; the walk at recovery stops here
# A process SIGKILLed dies within milliseconds unless it is in uninterruptible sleep (a GPU
# driver tearing down a context can take seconds): wait this long before leaving the rest to
# the next tick, with the launch's slots still taken.
SWEEP_WAIT_S = 0.2


@dataclass(frozen=True)
class Launch:
    """One start of one job: its marker, its user (None: a launch no job owns, whoever runs
    it), and when its wrapper started (clock ticks since boot; None when the daemon died
    before recording it)."""

    marker: str
    uid: int | None
    not_before: int | None


def _cgroup2_mount() -> Path | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.split(" ", 1)[0] == "cgroup2":
                fields = pre.split()
                if fields[3] == "/":
                    return Path(fields[4])
    return None


def _own_cgroup() -> str | None:
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    return None


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Containment:
    """The daemon's way of holding launches: a cgroup each where it can, else the marker."""

    def __init__(self, prefix: str, use_cgroups: bool) -> None:
        self.prefix = prefix
        self.base: Path | None = None      # the daemon's own cgroup: new launches are born under it
        self.known: dict[str, Path] = {}   # marker -> its cgroup (made here, or found at recovery)
        self.why = "cgroups off (--no-cgroups)"
        if use_cgroups:
            self.base, self.why = self._probe()

    def describe(self) -> str:
        if self.base is not None:
            return f"one cgroup v2 per job under {self.base} (killed with cgroup.kill)"
        return f"the launch marker only ({self.why})"

    def _probe(self) -> tuple[Path | None, str]:
        """Where launches' cgroups go, or why there is no such place (said once, at start)."""
        if os.geteuid() != 0:
            return None, "not root: a job's cgroup would be its user's to leave"
        mount, own = _cgroup2_mount(), _own_cgroup()
        if mount is None or own is None:
            return None, "no cgroup v2 hierarchy mounted (cgroup v1 only)"
        base = mount / own.lstrip("/")
        probe = base / CGROUP_NAME.format(prefix=self.prefix, job="probe", attempt=os.getpid())
        try:
            os.mkdir(probe)
        except OSError as e:
            return None, f"cannot create a cgroup under {base}: {e.strerror}"
        try:
            if not (probe / "cgroup.kill").exists():
                return None, "this kernel has no cgroup.kill (Linux < 5.14)"
        finally:
            os.rmdir(probe)
        return base, ""

    def _name(self, marker: str) -> str:
        _, job, attempt = marker.rsplit(":", 2)
        return CGROUP_NAME.format(prefix=self.prefix, job=job, attempt=attempt)

    @contextlib.contextmanager
    def born_in(self, marker: str) -> Iterator[None]:
        """Run the body (the fork of a launch) with the daemon inside the launch's cgroup, so
        the child starts there; the daemon steps back out whatever happens."""
        if self.base is None:
            yield
            return
        path = self.base / self._name(marker)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        self.known[marker] = path
        _write(path / "cgroup.procs", "0")
        try:
            yield
        finally:
            _write(self.base / "cgroup.procs", "0")

    def discover(self) -> None:
        """After a restart: the cgroups of this scheduler's launches, wherever the daemon that
        made them was (its own cgroup may have been another), also when this one makes none."""
        mount = _cgroup2_mount()
        if mount is None or os.geteuid() != 0:
            return
        head = f"gpudiag-{self.prefix}-"
        stack = [(mount, 0)]
        while stack:
            d, depth = stack.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            for e in entries:
                if not e.is_dir(follow_symlinks=False):
                    continue
                if e.name.startswith(head):
                    job, _, attempt = e.name[len(head):].partition("-")
                    if job.isdigit() and attempt.isdigit():
                        self.known.setdefault(f"{self.prefix}:{job}:{attempt}", Path(e.path))
                elif depth < MAX_CGROUP_DEPTH:
                    stack.append((Path(e.path), depth + 1))

    def _cgroup_pids(self, marker: str) -> list[int]:
        path = self.known.get(marker)
        if path is None:
            return []
        try:
            with open(path / "cgroup.procs") as f:
                return [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return []   # removed: nothing lives in it
        except OSError as e:   # unknown is not empty: no slot is freed on it
            raise ScanCut(f"cannot read {path / 'cgroup.procs'}: {e.strerror}") from None

    def processes(self, launch: Launch, scanned: dict[str, list[ProcInfo]] | None = None) -> list[ProcInfo]:
        """The launch's live processes: those of its cgroup where it has one (nothing of an
        unprivileged job can leave it), else every process of its user carrying its marker that
        started no earlier than the launch (a marker copied into a stranger's environment, or a
        recycled pid, never gets a stranger killed). The cgroup is also the cheap answer: the
        marker means reading every process's environment (10 ms for 140 processes here)."""
        if launch.marker in self.known:
            found = [proc_info(pid) for pid in self._cgroup_pids(launch.marker)]
            return [p for p in found if p is not None and p.state not in ("Z", "X")]
        by_marker = (scanned if scanned is not None else find_launches(self.prefix, launch.uid)
                     ).get(launch.marker, [])
        return [p for p in by_marker if launch.uid in (None, p.uid)
                and (launch.not_before is None or p.start >= launch.not_before)]

    def sweep(self, launch: Launch, keep: frozenset[int] = frozenset(),
              scanned: dict[str, list[ProcInfo]] | None = None) -> list[ProcInfo]:
        """SIGKILL every process of the launch but ``keep`` (pids); returns those still alive
        afterwards (a process takes a moment to die, longer in the kernel's uninterruptible
        sleep): the launch's slots stay taken until this is empty."""
        path = self.known.get(launch.marker)
        keep = keep | {os.getpid()}   # the daemon is in a launch's cgroup only while it forks it
        victims = [p for p in self.processes(launch, scanned) if p.pid not in keep]
        if path is not None and not (keep & set(self._cgroup_pids(launch.marker))):
            with contextlib.suppress(OSError):
                _write(path / "cgroup.kill", "1")
        for p in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + SWEEP_WAIT_S
        while any(alive(p.pid, p.start) for p in victims) and time.monotonic() < deadline:
            time.sleep(0.01)
        # a fresh look: a fork that raced the kills is found here (and killed at the next sweep)
        return [p for p in self.processes(launch) if p.pid not in keep]

    def release(self, marker: str) -> bool:
        """Remove the launch's cgroup once it is empty; False while something still lives in it."""
        path = self.known.get(marker)
        if path is None:
            return True
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.EBUSY:
                return False
            raise
        del self.known[marker]
        return True

    def end_all(self) -> None:
        """Kill every launch of this scheduler and remove their cgroups: what a test or a
        benchmark does after stopping a daemon whose jobs would otherwise outlive it."""
        self.discover()
        scanned = find_launches(self.prefix)
        for marker in set(scanned) | set(self.known):
            self.sweep(Launch(marker, None, None), scanned=scanned)
            self.release(marker)
