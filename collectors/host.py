"""CPU and memory of the job's process tree, read from /proc (Linux)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2:].split()[1])


class ProcessTree:
    """The processes under a root, found from /proc once a sample.

    Why cached: finding children means reading the parent of every process on the machine; read
    afresh each second that cost 3.3 ms of CPU per sample with 146 processes (this project's
    2-core VM), taken from the cores the job runs on. A process's parent only changes when its
    parent dies (it is re-parented away from the job's tree), so each pid's parent is read once,
    when the pid first appears, and again only for the tree's own members (``refresh``), whose
    stat files the sampler reads anyway."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.parent: dict[int, int] = {}

    def pids(self) -> list[int]:
        alive = set()
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                alive.add(int(entry.name))
        for pid in list(self.parent):
            if pid not in alive:
                del self.parent[pid]
        for pid in alive:
            if pid not in self.parent:
                pp = _ppid(pid)
                if pp is not None:
                    self.parent[pid] = pp
        kids: dict[int, list[int]] = {}
        for pid, pp in self.parent.items():
            kids.setdefault(pp, []).append(pid)
        out, todo = [], [self.root]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(kids.get(p, []))
        return out

    def refresh(self, pid: int, ppid: int) -> None:
        """A member's parent as its stat read says now (re-parented members leave the tree)."""
        self.parent[pid] = ppid


def tree(root: int) -> list[int]:
    return ProcessTree(root).pids()


def _cpu_and_rss(pid: int) -> tuple[float, int, int, float] | None:
    """(CPU seconds, RSS bytes, parent pid, CPU seconds of its children it has reaped) of a
    process, from its stat file."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read()
    except OSError:
        return None
    fields = rest[rest.rfind(b")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    reaped = (int(fields[13]) + int(fields[14])) / _TICK  # cutime + cstime
    rss = int(fields[21]) * _PAGE
    return cpu, rss, int(fields[1]), reaped


def _machine_busy() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores; idle and I/O wait left out)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def _runq_s(pid: int) -> float:
    """Seconds the process's main thread has waited runnable for a core (0 where unknown): a
    loader that decodes on a busy machine waits there, one that reads from storage does not."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _threads_runq_s(pid: int) -> float:
    """Seconds all threads of the process have waited runnable for a core (0 where unknown):
    its intra-op threads too, which want a core each (``gpudiag.pace``: the job's demand)."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return total


# Reads of the machine's runnable tasks per host sample (/proc/loadavg holds an instant's count).
RUNNABLE_READS = 10


def _runnable() -> int | None:
    """Tasks running or runnable on the whole machine now, less the one reading (this thread)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return max(0, int(f.read().split()[3].split(b"/")[0]) - 1)
    except (OSError, IndexError, ValueError):
        return None


def _since(prev: dict[int, float], pid: int, now: float) -> float:
    """A counter's value at the last sample: a pid the tree did not hold then was born since
    (the tree is found afresh each sample), so its counters started at 0 within this interval.
    Counted from its first sighting instead, a DataLoader worker (re)started each epoch had its
    first second's CPU read as other processes' (blind check 17: "other processes took 17.8 ms
    of each traced step" where only the job ran). On the first sample nothing has a baseline."""
    if not prev:
        return now
    return prev.get(pid, 0.0)


def _reaped_since(reaped: float, prev: dict[int, float], cur: dict[int, float]) -> float:
    """CPU seconds of the tree's processes that ended since the last sample: a reaped child's
    whole time lands in its parent's ``cutime``/``cstime`` (``reaped``, the tree's growth in
    them), less what the last sample already counted of those gone (their last own time). A
    worker that exits and is joined between samples (``persistent_workers=False`` at an epoch's
    end) is otherwise lost, and the machine's busy cores read as another process's. One that
    left the tree without being reaped by it (re-parented) adds nothing here: never negative."""
    gone = sum(v for pid, v in prev.items() if pid not in cur)
    return max(0.0, reaped - gone)


class HostSampler:
    """Every ``interval`` seconds: process count, CPU utilisation (cores) and RSS of the tree,
    and the cores the whole machine kept busy (the job's and everybody else's): a DataLoader's
    workers, or a traced step, compete with the other work for what is left. Beside them, what
    ``gpudiag.pace`` splits a wait for a core by: the cores' worth all the tree's threads waited
    for one (``runq_threads_cores``), and the machine's runnable tasks, the mean of
    ``RUNNABLE_READS`` reads over the interval (``machine_runnable``)."""

    def __init__(self, root_pid: int, out: Path, interval: float = 1.0) -> None:
        self.root = root_pid
        self.out = out
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudiag-host", daemon=True)

    def start(self) -> HostSampler:
        if os.path.isdir("/proc"):
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        prev: dict[int, float] = {}
        prev_c: dict[int, float] = {}
        prev_q: dict[int, float] = {}
        prev_t = time.monotonic()
        prev_busy = _machine_busy()
        prev_qt: dict[int, float] = {}
        procs = ProcessTree(self.root)
        with self.out.open("a") as f:
            while True:
                running = []
                for _ in range(RUNNABLE_READS):
                    if self._stop.wait(self.interval / RUNNABLE_READS):
                        return
                    running.append(_runnable())
                now = time.monotonic()
                cpu_total = rss_total = q_total = qt_total = 0.0
                cur: dict[int, float] = {}
                cur_c: dict[int, float] = {}
                cur_q: dict[int, float] = {}
                cur_qt: dict[int, float] = {}
                reaped = 0.0
                pids = procs.pids()
                for pid in pids:
                    r = _cpu_and_rss(pid)
                    if r is None:
                        continue
                    if pid != self.root:
                        procs.refresh(pid, r[2])
                    cur[pid], cur_c[pid] = r[0], r[3]
                    cur_q[pid] = _runq_s(pid)
                    cur_qt[pid] = _threads_runq_s(pid)
                    cpu_total += r[0] - _since(prev, pid, r[0])
                    reaped += r[3] - _since(prev_c, pid, r[3])
                    q_total += cur_q[pid] - _since(prev_q, pid, cur_q[pid])
                    qt_total += max(0.0, cur_qt[pid] - _since(prev_qt, pid, cur_qt[pid]))
                    rss_total += r[1]
                cpu_total += _reaped_since(reaped, prev, cur)
                util = cpu_total / (now - prev_t) if prev else 0.0
                busy = _machine_busy()
                row = {"t": time.time(), "processes": len(cur), "cpu_cores": round(util, 3),
                       "rss_bytes": int(rss_total),
                       "runq_cores": round(q_total / (now - prev_t), 3) if prev else 0.0}
                if busy is not None and prev_busy is not None:
                    row["machine_cores_busy"] = round((busy - prev_busy) / (now - prev_t), 3)
                if prev:
                    row["runq_threads_cores"] = round(qt_total / (now - prev_t), 3)
                counts = [n for n in running if n is not None]
                if len(counts) == len(running):
                    row["machine_runnable"] = round(sum(counts) / len(counts), 2)
                prev, prev_c, prev_q, prev_qt, prev_t, prev_busy = cur, cur_c, cur_q, cur_qt, now, busy
                f.write(json.dumps(row) + "\n")
                f.flush()
