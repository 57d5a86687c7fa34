"""Each job's life as transactions and side effects, in the order that survives a crash.

Rule: the transaction that records an intent commits before the side effect, and the one that
records its outcome after. A SIGKILL of the daemon between the two leaves a state that
``recover`` settles from what the kernel says (is the launch's process alive, with the start
time we recorded?) and what the job's wrapper left (its exit-code file):

- start:   STARTING (slots, attempt+1)  -> spawn  -> RUNNING (pid, start time)
- stop:    STOPPING (why, deadline)     -> SIGTERM -> killed=1; at the deadline SIGKILL, killed=2
- end:     wrapper gone -> SIGKILL leftovers of its session -> DONE / FAILED / CANCELLED, or PENDING
           with restarts+1 after a preemption (its checkpoint folder stays)

So a job's slots are free in the database only once no process of it is left, a job is never
started while a launch of it lives, and no submitted job is ever dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gpudiag.scheduler.local import runner
from gpudiag.scheduler.local.config import JOBS_DIR
from gpudiag.scheduler.local.engine import Machine
from gpudiag.scheduler.local.store import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    STARTING,
    STOPPING,
    JobRow,
    Store,
)
from gpudiag.scheduler.model import Signal
from gpudiag.scheduler.priority import MfuBook, job_class

SIGTERM_SENT, SIGKILL_SENT = 1, 2
# How long after a job ended its last signal is still awaited: the agent keeps an ended job's
# values 60 s (agent/job_table.py), and the job's reporter sends its final signal after the
# job's analysis, which can take a few seconds more.
LATE_SIGNAL_S = 90.0


def _log(msg: str) -> None:
    print(f"gpudiag scheduler: {msg}", file=sys.stderr, flush=True)


class Jobs:
    """The jobs the daemon is responsible for (pending and active), mirrored from the store."""

    def __init__(self, store: Store, state_dir: Path, machine: Machine, monitor: bool, book: MfuBook,
                 agent_dir: Path | None = None) -> None:
        self.store = store
        # the node agent whose job table this daemon reads: jobs report there (their own
        # environment may name another agent folder, or none)
        self.agent_dir = agent_dir
        self.awaiting_signal: dict[int, tuple[JobRow, float]] = {}  # ended without a signal yet
        self.book = book   # what ended jobs reached: the store's observations, replayed at start
        self.state_dir = state_dir
        self.machine = machine
        self.monitor = monitor
        self.pending: dict[int, JobRow] = {}
        self.active: dict[int, JobRow] = {}
        self.children: dict[int, subprocess.Popen] = {}

    def job_dir(self, row: JobRow) -> Path:
        return self.state_dir / JOBS_DIR / str(row.id)

    def marker(self, row: JobRow) -> str:
        return runner.launch_marker(self.store.prefix, row.id, row.attempt)

    def load(self) -> None:
        for row in self.store.jobs((PENDING, *ACTIVE)):
            (self.pending if row.state == PENDING else self.active)[row.id] = row

    # -- start ---------------------------------------------------------------------------------
    def start(self, row: JobRow, slots: list[int], now: float) -> None:
        taken = {s for r in self.active.values() for s in (r.slots or ())}
        if taken & set(slots):   # the policy allocates from free slots only; refuse rather than trust
            raise AssertionError(f"job {row.id}: slots {sorted(taken & set(slots))} are in use")
        self.store.update(row, state=STARTING, slots=slots, attempt=row.attempt + 1, started_t=now,
                          pid=None, pid_start=None, stop_kind=None, stop_deadline=None, killed=0,
                          reason=f"starting on {self.machine.unit} "
                                 f"{','.join(self.machine.ids[s] for s in slots)}")
        self.active[row.id] = self.pending.pop(row.id)
        jdir = self.job_dir(row)
        env = {k: v for k, v in row.env.items() if not k.startswith("GPUDIAG_SCHEDULER")}
        env.update(self.machine.env(slots))
        env.update({"GPUDIAG_JOB": f"{self.store.prefix}:{row.id}",
                    "GPUDIAG_RESTART_COUNT": str(row.restarts),
                    "GPUDIAG_CHECKPOINT_DIR": str(jdir / "checkpoint"), runner.LAUNCH_VAR: self.marker(row)})
        if self.agent_dir is not None:
            env["GPUDIAG_AGENT_DIR"] = str(self.agent_dir)
        try:
            runner.prepare_job_dir(jdir, row.uid)
            proc = runner.spawn(runner.LaunchSpec(row.id, row.attempt, row.uid, row.cmd, env, row.cwd, jdir,
                                                  self.monitor))
        except (OSError, subprocess.SubprocessError) as e:
            self.active.pop(row.id)
            self.store.update(row, state=FAILED, ended_t=now, slots=None,
                              reason=f"could not start: {getattr(e, 'strerror', None) or e}")
            _log(f"job {row.id} could not start: {e}")
            return
        self.children[row.id] = proc
        info = runner.proc_info(proc.pid)
        self.store.update(row, state=RUNNING, pid=proc.pid, pid_start=info.start if info else None,
                          reason="running")

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, row: JobRow, kind: str, reason: str, now: float) -> None:
        """Ask a running job to stop: SIGTERM now, SIGKILL after its grace period."""
        if row.state == STOPPING:
            if kind == "cancel" and row.stop_kind != "cancel":   # a preempted job cancelled: not requeued
                self.store.update(row, stop_kind="cancel", reason=reason)
            return
        self.store.update(row, state=STOPPING, stop_kind=kind, stop_deadline=now + row.grace_s, killed=0,
                          reason=reason)
        self.terminate(row)

    def terminate(self, row: JobRow) -> None:
        if row.pid is not None and row.pid_start is not None:
            runner.signal_group(row.pid, row.pid_start, signal.SIGTERM)
        self.store.update(row, killed=SIGTERM_SENT)

    def enforce(self, now: float) -> None:
        """Deadlines: SIGKILL at the end of a grace period; time limits start one."""
        for row in list(self.active.values()):
            if row.state == STOPPING and row.killed < SIGKILL_SENT and now >= (row.stop_deadline or 0):
                if row.pid is not None and row.pid_start is not None:
                    runner.signal_group(row.pid, row.pid_start, signal.SIGKILL)
                    runner.kill_leftovers(row.pid, self.marker(row), row.pid_start)
                self.store.update(row, killed=SIGKILL_SENT)
            elif (row.state == RUNNING and row.time_limit_s is not None and row.started_t is not None
                  and now - row.started_t > row.time_limit_s):
                self.stop(row, "timeout", f"time limit of {row.time_limit_s:.0f} s reached", now)

    # -- end -----------------------------------------------------------------------------------
    def reap(self, now: float, final_signal: Callable[[JobRow], Signal | None]) -> int:
        """Settle every active job whose wrapper is gone; returns how many ended."""
        ended = 0
        for row in list(self.active.values()):
            if row.state == STARTING:
                continue
            proc = self.children.get(row.id)
            if proc is not None:
                if proc.poll() is None:
                    continue
                code = proc.returncode
            elif runner.alive(row.pid, row.pid_start):
                continue
            else:
                code = None
            self.children.pop(row.id, None)
            self.settle(row, code, now, final_signal(row))
            ended += 1
        return ended

    def settle(self, row: JobRow, wait_code: int | None, now: float, sig: Signal | None) -> None:
        """The wrapper is gone: kill what is left of the launch, then record how the job ended."""
        if row.pid is not None and row.pid_start is not None:
            runner.kill_leftovers(row.pid, self.marker(row), row.pid_start)
        code = runner.read_exit_file(runner.job_paths(self.job_dir(row), row.attempt)["exit"])
        if code is None and wait_code is not None:
            code = wait_code if wait_code >= 0 else 128 - wait_code
        how = f"exit code {code}" if code is not None else "killed (no exit status)"
        changes: dict = {"pid": None, "pid_start": None, "slots": None, "exit_code": code}
        if row.stop_kind == "preempt":
            changes.update(state=PENDING, restarts=row.restarts + 1, stop_kind=None, stop_deadline=None,
                           reason=f"requeued after preemption ({how}); restart {row.restarts + 1}")
        elif row.stop_kind == "cancel":
            changes.update(state=CANCELLED, ended_t=now, reason=f"{row.reason} ({how})")
        elif row.stop_kind == "timeout":
            changes.update(state=FAILED, ended_t=now, reason=f"time limit reached ({how})")
        else:
            changes.update(state=DONE if code == 0 else FAILED, ended_t=now, reason=how)
        obs = None
        if sig is not None:
            changes.update(sig_mfu=sig.mfu, sig_label=sig.label, sig_conf=sig.confidence,
                           sig_t=now - sig.age_s)
            obs = (row.key or f"job:{row.id}", job_class(row.gpus), sig.mfu, sig.label, now)
        self.store.update_many([(row, changes)], observation=obs)
        if obs is not None:
            self.book.observe(*obs)
        elif row.state != PENDING:
            self.awaiting_signal[row.id] = (row, now)
        del self.active[row.id]
        if row.state == PENDING:
            self.pending[row.id] = row

    def late_signals(self, lookup: Callable[[JobRow], Signal | None], now: float) -> None:
        """A short job's only signal may be its last, sent after it exited (``gpudiag profile``
        reports once more when the job ends): taken into its key's history when it arrives, as
        long as the agent still holds an ended job's values (LATE_SIGNAL_S)."""
        for job_id, (row, ended) in list(self.awaiting_signal.items()):
            sig = lookup(row)
            if sig is not None:
                obs = (row.key or f"job:{row.id}", job_class(row.gpus), sig.mfu, sig.label, now)
                self.store.update_many([(row, {"sig_mfu": sig.mfu, "sig_label": sig.label,
                                               "sig_conf": sig.confidence, "sig_t": now - sig.age_s})],
                                       observation=obs)
                self.book.observe(*obs)
            if sig is not None or now - ended > LATE_SIGNAL_S:
                del self.awaiting_signal[job_id]

    # -- recovery ------------------------------------------------------------------------------
    def recover(self, now: float) -> list[str]:
        """After a restart: adopt live launches, settle the rest, kill launches nobody owns."""
        notes = []
        launches = runner.find_launches(self.store.prefix)
        for row in list(self.active.values()):
            procs = [p for p in launches.pop(self.marker(row), []) if p.uid in (row.uid, -1)]
            if runner.alive(row.pid, row.pid_start):
                notes.append(f"job {row.id}: re-adopted pid {row.pid}")
                if row.state == STOPPING and row.killed == 0:
                    self.terminate(row)
                continue
            leader = next((p for p in procs if p.pid == p.sid), None)
            if row.state == STARTING and leader is not None:
                self.store.update(row, state=RUNNING, pid=leader.pid, pid_start=leader.start,
                                  reason="running")
                notes.append(f"job {row.id}: found its launch (pid {leader.pid}) and adopted it")
            elif row.state == STARTING:
                runner.kill_launch(procs)
                self.store.update(row, state=PENDING, slots=None, pid=None, pid_start=None,
                                  reason="requeued: the scheduler stopped before the job started")
                self.pending[row.id] = self.active.pop(row.id)
                notes.append(f"job {row.id}: never started; pending again")
            else:
                runner.kill_launch(procs)
                self.settle(row, None, now, None)
                notes.append(f"job {row.id}: ended while the scheduler was down ({row.state})")
        for marker, procs in launches.items():
            runner.kill_launch(procs)
            notes.append(f"launch {marker}: no job owns it; killed {len(procs)} processes")
        return notes

    def checkpoint_time(self, row: JobRow) -> float | None:
        """When the job last wrote to its checkpoint folder (what preemption would lose since)."""
        try:
            return os.stat(self.job_dir(row) / "checkpoint").st_mtime
        except OSError:
            return None
