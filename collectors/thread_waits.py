"""The wait for a core of every other thread of the job, per step: its intra-op threads and its
DataLoader workers' threads, beside the training thread the step timer reads itself.

Why: a step is as slow as its slowest thread. The training thread's own schedstat shows the
time it waited runnable for a core, but where an intra-op thread waited (a busy loop on its
core), the training thread was asleep at the end of the parallel region, not waiting for a
core: the step was slower and its thread's counters do not say why. The same holds for a
DataLoader worker crowded off its core while the training thread waits for its batch. So at
each step's end the bootstrap reads ``/proc/<pid>/task/<tid>/schedstat`` of every thread of
the process and of its DataLoader workers (each file kept open and re-read with ``pread``) and
records the largest wait any of them had over the step (``peer_wait_s``): how long the step
could have waited on a thread that waited for a core, and that thread's time on a core over the
same read (``peer_run_s``). ``gpudiag.pace.step_wait`` bounds the wait by the time the training
thread was not running or waiting itself (the only time it could have been waiting on another
thread), and takes out of that time the part the other thread spent running: its run is the
job's own work, which a quiet machine would have had to wait for too.

The same reads give the DataLoader workers' CPU over the step (``workers_run_s``, all their
threads) and their pace (``workers_busy_s``: each worker's busiest thread on a core or waiting
for one, summed over the workers). In steady state the loader makes one batch a step, so the
pace is a batch's time; a step can be no shorter than that over the workers, whatever fix
shortens the training thread's work. The busiest thread, not the sum: a worker's queue feeder
thread pickles the last batch while its main thread makes the next (a 1-worker FFT loader, 2-core
AMD VM: its threads ran 8.2 ms a 7.7 ms step). The host sampler's 1 s samples, which gave the
workers' CPU before, give none over a job of a few seconds (blind check 37: a compiled optimizer
step told 0.73x on a loader held by its one worker ran 0.97x).

What it costs is measured on the job's own clock, in the job: the time spent reading, over the
steps, written into the bootstrap's meta file. Where reading every thread every step would cost
more than ``BUDGET`` of the step (many threads, short steps), the threads are read every k-th
step, and the row that reads them says over how many steps (``peer_steps``) the waits fell.

Only the standard library is used here: the bootstrap loads this file into the job's Python.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable

# The share of a step the reads may cost (measured, per step, in the job): half the 1%.
BUDGET = 0.005
# Steps between reads at most (a 0.2 ms step with 100 threads): the waits are still counted,
# over more steps.
MAX_EVERY = 64


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class PeerWaits:
    """The threads of the job but the one that ends each step, and their waits since the last
    read. ``discover`` (about once a second, at the step file's flush, and at the end of a step
    in which the process's thread count changed: ``threads_changed``) finds new threads and
    workers and lets go of those that ended; ``on_step`` reads them. A thread that starts and
    ends within one step is never seen: its counters end with it."""

    def __init__(self) -> None:
        self.fds: dict[tuple[int, int], int] = {}  # (pid, tid) -> its schedstat, open
        # (pid, tid) -> (ns on a core, ns waited for one) at the last read
        self.last: dict[tuple[int, int], tuple[int, int]] = {}
        self.workers: set[int] = set()  # DataLoader worker pids (the bootstrap's DataLoader hook)
        self.every = 1  # read every k-th step (``BUDGET``)
        self.pending = 0  # steps since the last read
        self.step_s = 0.0  # moving mean of the step, for the budget
        self.cost_s = 0.0  # seconds spent reading and discovering, in the job, so far
        self.steps = 0  # steps seen
        self.read_s = 0.0  # the last read's cost
        self.own_threads = 0  # threads of this process at the last discovery, the stepping one too
        self.me = os.getpid()  # this process: threads of other pids are its DataLoader workers'

    def add_workers(self, pids: Iterable[int]) -> None:
        self.workers.update(int(p) for p in pids if p)

    def threads_changed(self) -> bool:
        """Whether this process has another number of threads than at the last discovery (one
        ``stat`` of its task directory, whose link count is its threads + 2: about 3 us), so
        that a thread started since is found at the end of the step it started in, not up to a
        second later, when the steps it held were written without it."""
        t0 = time.perf_counter()
        try:
            n = os.stat("/proc/self/task").st_nlink - 2
        except OSError:
            return False
        finally:
            self.cost_s += time.perf_counter() - t0
        return n != self.own_threads

    def discover(self, stepping_tid: int, fresh: bool = False) -> None:
        """Open the schedstat of every thread of this process (but the stepping thread) and of
        the live DataLoader workers; close those of threads that ended. ``fresh``: the thread
        set was checked at the end of the last step (``threads_changed``), so a thread found now
        started within this step, and its whole time since it started is this step's."""
        t0 = time.perf_counter()
        me = self.me = os.getpid()
        want: set[tuple[int, int]] = set()
        for pid in (me, *sorted(self.workers)):
            try:
                tids = os.listdir(f"/proc/{pid}/task" if pid != me else "/proc/self/task")
            except OSError:
                self.workers.discard(pid)
                continue
            if pid == me:
                self.own_threads = len(tids)
            want.update((pid, int(t)) for t in tids if not (pid == me and int(t) == stepping_tid))
        for key in [k for k in self.fds if k not in want]:
            os.close(self.fds.pop(key))
            self.last.pop(key, None)
        for key in want - self.fds.keys():
            pid, tid = key
            fd = _open(f"/proc/self/task/{tid}/schedstat" if pid == me
                       else f"/proc/{pid}/task/{tid}/schedstat")
            if fd is not None:
                self.fds[key] = fd
                if fresh and pid == me:
                    self.last[key] = (0, 0)
        self.cost_s += time.perf_counter() - t0

    def on_step(self, dt: float) -> dict[str, float | int]:
        """The fields this step's row gets: ``peer_wait_s`` (the largest wait for a core any
        other thread of the job had since the last read), ``peer_run_s`` (that thread's time on
        a core since then), ``peers`` (how many were read), where the job has DataLoader workers
        ``workers_run_s`` and ``workers_busy_s`` (their threads' time on a core, and each
        worker's busiest thread's on a core or waiting for one, summed, since the last read;
        threads read at it too) and, where the read covers more than this step,
        ``peer_steps``; nothing between reads."""
        self.steps += 1
        self.pending += 1
        self.step_s = dt if self.steps == 1 else 0.9 * self.step_s + 0.1 * dt
        if self.pending < self.every or not self.fds:
            return {}
        t0 = time.perf_counter()
        worst, worst_run, workers_run = 0, 0, 0
        busiest: dict[int, int] = {}  # worker pid -> its busiest thread's run + wait
        gone = []
        for key, fd in self.fds.items():
            try:
                fields = os.pread(fd, 128, 0).split()
                run, wait = int(fields[0]), int(fields[1])
            except (OSError, ValueError, IndexError):
                gone.append(key)
                continue
            prev = self.last.get(key)
            self.last[key] = (run, wait)
            if prev is None:
                continue
            if wait - prev[1] > worst:
                worst, worst_run = wait - prev[1], run - prev[0]
            if key[0] != self.me:
                workers_run += run - prev[0]
                busy = run - prev[0] + wait - prev[1]
                busiest[key[0]] = max(busy, busiest.get(key[0], 0))
        for key in gone:
            os.close(self.fds.pop(key))
            self.last.pop(key, None)
        self.read_s = time.perf_counter() - t0
        self.cost_s += self.read_s
        row: dict[str, float | int] = {"peer_wait_s": worst / 1e9, "peer_run_s": worst_run / 1e9,
                                       "peers": len(self.fds)}
        if busiest:
            row["workers_run_s"], row["workers_busy_s"] = workers_run / 1e9, sum(busiest.values()) / 1e9
        if self.pending > 1:
            row["peer_steps"] = self.pending
        self.pending = 0
        if self.step_s > 0:
            self.every = max(1, min(MAX_EVERY, math.ceil(self.read_s / (BUDGET * self.step_s))))
        return row

    def meta(self) -> dict[str, float | int | None]:
        """What the reads cost the job, for the bootstrap's meta file."""
        return {"threads": len(self.fds), "workers": len(self.workers), "every": self.every,
                "cost_s": round(self.cost_s, 6), "steps": self.steps,
                "cost_per_step_s": round(self.cost_s / self.steps, 9) if self.steps else None}


def native_tid() -> int:
    return threading.get_native_id()
