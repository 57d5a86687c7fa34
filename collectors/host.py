"""CPU and memory of the job's process tree, read from /proc (Linux)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(entry.name))
    return kids


def tree(root: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _cpu_and_rss(pid: int) -> tuple[float, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read()
    except OSError:
        return None
    fields = rest[rest.rfind(b")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    rss = int(fields[21]) * _PAGE
    return cpu, rss


class HostSampler:
    """Every ``interval`` seconds: process count, CPU utilisation (cores) and RSS of the tree."""

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
        prev_t = time.monotonic()
        with self.out.open("a") as f:
            while not self._stop.wait(self.interval):
                now = time.monotonic()
                cpu_total = rss_total = 0.0
                cur: dict[int, float] = {}
                pids = tree(self.root)
                for pid in pids:
                    r = _cpu_and_rss(pid)
                    if r is None:
                        continue
                    cur[pid] = r[0]
                    cpu_total += r[0] - prev.get(pid, r[0])
                    rss_total += r[1]
                util = cpu_total / (now - prev_t) if prev else 0.0
                prev, prev_t = cur, now
                f.write(json.dumps({"t": time.time(), "processes": len(cur), "cpu_cores": round(util, 3),
                                    "rss_bytes": int(rss_total)}) + "\n")
                f.flush()
