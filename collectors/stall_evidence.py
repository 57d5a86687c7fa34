"""What the kernel and the job's own files say about its processes at a stall (Linux /proc).

Read from outside the job, so it works whatever state the job is in: per process and thread
the kernel's state, the function it sleeps in (``wchan``), the system call it is blocked in
and the CPU it used over a short window; the stacks faulthandler writes when sent
``STACK_SIGNAL`` (the bootstrap registered it, ``collectors/stall_watch.py``), parsed.

A process is signalled only when ``/proc/PID/status`` shows the stack signal caught (a
real-time signal's default action ends the process) and it belongs to the job's process tree.
"""

from __future__ import annotations

import linecache
import os
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.collectors.host import tree
from gpudiag.collectors.stall_watch import STACK_SIGNAL
from gpudiag.incident import Frame, ThreadStack, stacks_path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# the blocking system calls a stuck thread is usually in, by number (x86-64, arm64)
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 23: "select", 35: "nanosleep", 43: "accept",
               45: "recvfrom", 47: "recvmsg", 61: "wait4", 202: "futex", 230: "clock_nanosleep",
               232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
               17: "pread64", 19: "readv"},
    "aarch64": {63: "read", 64: "write", 65: "readv", 67: "pread64", 72: "pselect6", 73: "ppoll",
                22: "epoll_pwait", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
                202: "accept", 207: "recvfrom", 212: "recvmsg", 242: "accept4", 260: "wait4"},
}


@dataclass
class ThreadRaw:
    tid: int
    state: str | None
    ticks: int
    wchan: str | None
    syscall: str | None


@dataclass
class ProcRaw:
    pid: int
    ppid: int
    state: str | None
    ticks: int
    threads: dict[int, ThreadRaw] = field(default_factory=dict)


def _stat(path: str) -> tuple[str, list[bytes]] | None:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    return rest[0].decode(), rest


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def syscall_name(text: str | None) -> str | None:
    """The first field of /proc/.../syscall as a name ("running" when not in a system call)."""
    if not text:
        return None
    first = text.split()[0]
    if first == "running":
        return "running"
    if not first.lstrip("-").isdigit():
        return None
    nr = int(first)
    return _SYSCALLS.get(platform.machine(), {}).get(nr, f"syscall {nr}")


def snapshot(pids: list[int]) -> dict[int, ProcRaw]:
    out = {}
    for pid in pids:
        st = _stat(f"/proc/{pid}/stat")
        if st is None:
            continue
        state, f = st
        p = ProcRaw(pid, int(f[1]), state, int(f[11]) + int(f[12]))
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
        except OSError:
            tids = []
        for tid in tids:
            ts = _stat(f"/proc/{pid}/task/{tid}/stat")
            if ts is None:
                continue
            wchan = _read(f"/proc/{pid}/task/{tid}/wchan")
            p.threads[tid] = ThreadRaw(tid, ts[0], int(ts[1][11]) + int(ts[1][12]),
                                       wchan if wchan and wchan != "0" else None,
                                       syscall_name(_read(f"/proc/{pid}/task/{tid}/syscall")))
        out[pid] = p
    return out


def job_pids(root: int) -> list[int]:
    """The job's process tree (gpudiag profile's child and everything under it)."""
    return tree(root)


def catches_stack_signal(pid: int) -> bool:
    status = _read(f"/proc/{pid}/status") or ""
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.M)
    return m is not None and bool(int(m.group(1), 16) >> (STACK_SIGNAL - 1) & 1)


def signal_stacks(run_dir: Path, pids: list[int], wait_s: float = 2.0) -> dict[int, str]:
    """Ask each process's faulthandler for its stacks; what each appended to its file."""
    before: dict[int, int] = {}
    for pid in pids:
        path = stacks_path(run_dir, pid)
        if not path.exists() or not catches_stack_signal(pid):
            continue
        before[pid] = path.stat().st_size
        try:
            os.kill(pid, STACK_SIGNAL)
        except OSError:
            before.pop(pid)
    end = time.monotonic() + wait_s
    sizes: dict[int, int] = {}
    while before and time.monotonic() < end:
        time.sleep(0.1)
        now = {pid: stacks_path(run_dir, pid).stat().st_size for pid in before}
        if all(now[p] > before[p] for p in before) and now == sizes:
            break   # every file grew, and stopped growing
        sizes = now
    out = {}
    for pid, off in before.items():
        try:
            with open(stacks_path(run_dir, pid), "rb") as f:
                f.seek(off)
                out[pid] = f.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            continue
    return out


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> tuple[list[ThreadStack], str | None]:
    """faulthandler's text as thread stacks (innermost frame first), and the fatal error it
    names where the process crashed ("Fatal Python error: Aborted" -> "Aborted")."""
    threads: list[ThreadStack] = []
    crash = None
    cur: ThreadStack | None = None
    for line in text.splitlines():
        if line.startswith("Fatal Python error:"):
            crash = line.split(":", 1)[1].strip()
            threads, cur = [], None   # the crash's dump supersedes earlier ones in the text
            continue
        m = _THREAD.match(line)
        if m:
            if m.group(1) == "Thread" and cur is not None and any(t.ident == m.group(2) for t in threads):
                threads, cur = [], None   # a later dump: keep only the last one
            cur = ThreadStack(name="?", ident=m.group(2).lower(), source="faulthandler",
                              main=False)
            threads.append(cur)
            continue
        if line.startswith("Stack (most recent call first):"):
            cur = ThreadStack(name="?", ident="?", source="faulthandler")
            threads.append(cur)
            continue
        f = _FRAME.match(line)
        if f and cur is not None:
            cur.frames.append(with_code(Frame(f.group(1), int(f.group(2)), f.group(3))))
    return threads, crash


def with_code(fr: Frame) -> Frame:
    """The frame with its source line, where the file is readable here."""
    if not fr.code:
        fr.code = linecache.getline(fr.file, fr.line).strip()[:200]
    return fr


def cpu_seconds(a: ProcRaw | ThreadRaw | None, b: ProcRaw | ThreadRaw | None) -> float | None:
    if a is None or b is None:
        return None
    return max(0, b.ticks - a.ticks) / _TICK


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    st = _stat(f"/proc/{pid}/stat")
    return st is not None and st[0] != "Z"

