"""Each job's life as transactions and side effects, in the order that survives a crash.

Rule: the transaction that records an intent commits before the side effect, and the one that
records its outcome after. A SIGKILL of the daemon between the two leaves a state that
``recover`` settles from what the kernel says (is the launch's process alive, with the start
time we recorded?) and what the job's wrapper left (its exit-code file):

- start:   STARTING (slots, attempt+1)  -> spawn (in its own cgroup) -> RUNNING (pid, start time)
- stop:    STOPPING (why, deadline)     -> SIGTERM -> killed=1; at the deadline SIGKILL all, killed=2
- end:     the job's command ended (its wrapper is gone, or under --monitor its run.json says
           so) -> SIGKILL every other process of the launch (``Containment.sweep``, the same
           sweep recovery uses) -> once none is left: DONE / FAILED / CANCELLED, or PENDING
           with restarts+1 after a preemption (its checkpoint folder stays)

So a job's slots are free in the database only once no process of it is left, a job is never
started while a launch of it lives, and no submitted job is ever dropped.

Under ``--monitor`` the job's wrapper runs ``gpudiag profile``, which analyses the run for a few
seconds after the job's own processes ended. That analysis holds no slot: once run.json records
the job's exit code and only the wrapper and profile remain, the job is settled and its slots
go to the next job, while the two finish as a *post-run* (bounded by POST_RUN_S, then killed)
whose final signal is still taken in (LATE_SIGNAL_S).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudiag.scheduler.local import jobfiles, runner
from gpudiag.scheduler.local.config import JOBS_DIR
from gpudiag.scheduler.local.containment import Containment, Launch
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
# How long a --monitor job's analysis may run after its slots were released: its only purpose
# is the final signal, which is not taken in after LATE_SIGNAL_S (the run folder is complete
# before the analysis starts: `gpudiag analyze run-N` redoes it at any time).
POST_RUN_S = LATE_SIGNAL_S


def _log(msg: str) -> None:
    print(f"gpudiag scheduler: {msg}", file=sys.stderr, flush=True)


@dataclass
class PostRun:
    """A --monitor launch whose job has been settled while gpudiag profile still analyses it."""

    job_id: int
    launch: Launch
    pid: int
    start: int
    proc: subprocess.Popen | None
    deadline: float


class Jobs:
    """The jobs the daemon is responsible for (pending and active), mirrored from the store."""

    def __init__(self, store: Store, state_dir: Path, machine: Machine, monitor: bool, book: MfuBook,
                 agent_dir: Path | None = None, containment: Containment | None = None) -> None:
        self.store = store
        self.containment = containment or Containment(store.prefix, use_cgroups=False)
        self.post_run: dict[str, PostRun] = {}   # by marker
        # the node agent whose job table this daemon reads: jobs report there (their own
        # environment may name another agent folder, or none)
        self.agent_dir = agent_dir
        self.awaiting_signal: dict[int, tuple[JobRow, float]] = {}  # ended without a signal yet
        self.book = book   # what ended jobs reached: the store's observations, replayed at start
        self.state_dir = state_dir.absolute()   # the wrapper's paths must not depend on a cwd
        self.machine = machine
        self.monitor = monitor
        self.pending: dict[int, JobRow] = {}
        self.active: dict[int, JobRow] = {}
        self.children: dict[int, subprocess.Popen] = {}

    def job_dir(self, row: JobRow) -> Path:
        return self.state_dir / JOBS_DIR / str(row.id)

    def marker(self, row: JobRow) -> str:
        return runner.launch_marker(self.store.prefix, row.id, row.attempt)

    def launch(self, row: JobRow) -> Launch:
        return Launch(self.marker(row), row.uid, row.pid_start)

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
        env["GPUDIAG_TEAM"] = row.team   # the job's signals name its team (gpudiag fleet)
        try:
            runner.prepare_job_dir(jdir, row.uid)
            with self.containment.born_in(self.marker(row)):
                proc = runner.spawn(runner.LaunchSpec(row.id, row.attempt, row.uid, row.cmd, env, row.cwd,
                                                      jdir, self.monitor))
        except Exception as e:  # noqa: BLE001 - one job that cannot start fails alone, never the daemon
            if not isinstance(e, (OSError, subprocess.SubprocessError)):
                _log(f"job {row.id}: unexpected error starting it:\n{traceback.format_exc()}")
            self.active.pop(row.id)
            self.containment.release(self.marker(row))
            self.store.update(row, state=FAILED, ended_t=now, slots=None,
                              reason=f"could not start: {getattr(e, 'strerror', None) or e}")
            _log(f"job {row.id} {row.reason}")
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
                self.containment.sweep(self.launch(row))   # every process of it, wherever it went
                self.store.update(row, killed=SIGKILL_SENT)
            elif (row.state == RUNNING and row.time_limit_s is not None and row.started_t is not None
                  and now - row.started_t > row.time_limit_s):
                self.stop(row, "timeout", f"time limit of {row.time_limit_s:.0f} s reached", now)

    # -- end -----------------------------------------------------------------------------------
    def reap(self, now: float, final_signal: Callable[[JobRow], Signal | None]) -> int:
        """Settle every active job whose command has ended and of which no process is left;
        returns how many ended."""
        ended = 0
        for row in list(self.active.values()):
            if row.state == STARTING:
                continue
            proc = self.children.get(row.id)
            wrapper_runs = proc.poll() is None if proc is not None else runner.alive(row.pid, row.pid_start)
            code, keep = None, frozenset()
            if wrapper_runs:
                code = self._monitor_ended(row)
                if code is None:
                    continue
                keep = self._monitor_pids(row)
            left = self.containment.sweep(self.launch(row), keep)
            if left:   # its slots stay taken until the last one is gone
                note = (f"ended; {len(left)} of its processes still to be killed "
                        f"(pid {', '.join(str(p.pid) for p in left[:5])})")
                if row.state == RUNNING and row.reason != note:
                    self.store.update(row, reason=note)
                continue
            self.children.pop(row.id, None)
            if keep:
                self.post_run[self.marker(row)] = PostRun(row.id, self.launch(row), row.pid or 0,
                                                          row.pid_start or 0, proc, now + POST_RUN_S)
            else:
                self.containment.release(self.marker(row))
            wait_code = None if proc is None or wrapper_runs else proc.returncode
            self.settle(row, wait_code, now, final_signal(row), code=code)
            ended += 1
        self._post_runs(now)
        return ended

    def _monitor_ended(self, row: JobRow) -> int | None:
        """Under --monitor: the job's exit code once gpudiag profile recorded that its command
        ended (it then analyses the run for a while), else None."""
        if not self.monitor:
            return None
        try:
            with jobfiles.open_dir(self.job_dir(row), row.uid) as fd:
                return runner.monitor_exit_code(fd, row.attempt, row.uid)
        except OSError:
            return None

    def _monitor_pids(self, row: JobRow) -> frozenset[int]:
        """What may outlive the job's processes: the process tree under its wrapper, which once
        gpudiag profile has reaped the job's command is the wrapper, profile and the workers of
        its analysis (an orphan of the job is re-parented to init, out of that tree)."""
        procs = self.containment.processes(self.launch(row))
        keep = {row.pid or 0}
        grew = True
        while grew:
            more = {p.pid for p in procs if p.ppid in keep} - keep
            keep |= more
            grew = bool(more)
        return frozenset(keep)

    def _post_runs(self, now: float) -> None:
        for marker, pr in list(self.post_run.items()):
            running = pr.proc.poll() is None if pr.proc is not None else runner.alive(pr.pid, pr.start)
            if running and now < pr.deadline:
                continue
            if running:
                _log(f"job {pr.job_id}: gpudiag profile's analysis ran past {POST_RUN_S:.0f} s; killed")
            if not self.containment.sweep(pr.launch) and self.containment.release(marker):
                del self.post_run[marker]

    def settle(self, row: JobRow, wait_code: int | None, now: float, sig: Signal | None,
               code: int | None = None) -> None:
        """No process of the launch is left: record how the job ended."""
        why = None
        if code is None:
            try:
                with jobfiles.open_dir(self.job_dir(row), row.uid) as fd:
                    code, why = runner.read_exit_file(fd, row.attempt, row.uid)
            except OSError:
                code = None
        if code is None and wait_code is not None:
            code = wait_code if wait_code >= 0 else 128 - wait_code
        how = f"exit code {code}" if code is not None else "killed (no exit status)"
        changes: dict = {"pid": None, "pid_start": None, "slots": None, "exit_code": code}
        if why is not None:
            changes.update(state=CANCELLED if row.stop_kind == "cancel" else FAILED, ended_t=now,
                           reason=f"could not start: {self._start_failure(row, why)}")
        elif row.stop_kind == "preempt":
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

    def _start_failure(self, row: JobRow, why: str) -> str:
        """What the wrapper's check found, in words (the exit file names only which check)."""
        exe = runner.monitor_command(Path(), row.cmd)[0]
        return runner.START_FAILURES[why].format(cwd=row.cwd, cmd=row.cmd[0], user=row.user, exe=exe)

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
        """After a restart: adopt live launches, requeue those that never started, kill launches
        nobody owns (the same sweep as settling). A job that ended while the daemon was down is
        settled by the first pass's ``reap``, like any other."""
        notes = []
        self.containment.discover()
        launches = runner.find_launches(self.store.prefix)
        for row in list(self.active.values()):
            procs = [p for p in launches.pop(self.marker(row), []) if p.uid == row.uid]
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
                left = self.containment.sweep(self.launch(row))
                if left:   # cannot happen short of a process stuck in the kernel: say so
                    notes.append(f"job {row.id}: {len(left)} processes of its launch outlived SIGKILL")
                self.containment.release(self.marker(row))
                self.store.update(row, state=PENDING, slots=None, pid=None, pid_start=None,
                                  reason="requeued: the scheduler stopped before the job started")
                self.pending[row.id] = self.active.pop(row.id)
                notes.append(f"job {row.id}: never started; pending again")
            else:
                notes.append(f"job {row.id}: ended while the scheduler was down ({row.state})")
        owned = {self.marker(r) for r in self.active.values()}
        for marker in sorted((set(launches) | set(self.containment.known)) - owned):
            left = self.containment.sweep(Launch(marker, None, None), scanned=launches)
            if not left:
                self.containment.release(marker)
            notes.append(f"launch {marker}: no job owns it; killed what was left of it")
        return notes

    def checkpoint_time(self, row: JobRow) -> float | None:
        """When the job last wrote to its checkpoint folder (what preemption would lose since).
        The folder is its user's: a link in its place counts as no checkpoint, and a time in
        the future as now."""
        try:
            with jobfiles.open_dir(self.job_dir(row), row.uid) as fd:
                t = jobfiles.dir_mtime(fd, "checkpoint")
        except OSError:
            return None
        return None if t is None else min(t, time.time())
