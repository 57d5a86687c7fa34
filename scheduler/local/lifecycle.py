"""Each job's life as transactions and side effects, in the order that survives a crash.

The transaction that records an intent commits before the side effect, the one that records its
outcome after; ``recover`` settles what a SIGKILL between them left, from the kernel (the launch's
process, by pid and start time) and the wrapper's exit-code file:

- start:   STARTING (slots, attempt+1)  -> spawn (in its own cgroup) -> RUNNING (pid, start time)
- stop:    STOPPING (why, deadline)     -> SIGTERM -> killed=1; at the deadline SIGKILL all, killed=2
- end:     the leader ended (waitpid) -> every other process of the launch swept -> DONE / FAILED /
           CANCELLED, or PENDING with restarts+1 after a preemption

Nothing the job writes decides when it ends (its files are bounded claims, for words only);
under ``--monitor`` it is FINISHING while its analysis runs, at most ``POST_RUN_S``.
docs/scheduler-daemon.md, "A job ends when its processes end" and "--monitor".
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from gpudiag.contract import (
    ENV_AGENT_DIR,
    ENV_CHECKPOINT_DIR,
    ENV_JOB,
    ENV_RESTART_COUNT,
    ENV_SCHEDULER_PREFIX,
    ENV_TEAM,
)
from gpudiag.scheduler.local import jobfiles, runner
from gpudiag.scheduler.local.config import JOBS_DIR
from gpudiag.scheduler.local.containment import Containment, Launch
from gpudiag.scheduler.local.engine import Machine
from gpudiag.scheduler.local.room import StateFull, is_full
from gpudiag.scheduler.local.store import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    FINISHING,
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
# How long a --monitor job's analysis may run after its command ended, holding the job's slots:
# its only purpose is the final signal, which is not taken in after LATE_SIGNAL_S (the run
# folder is complete before the analysis starts: `gpudiag analyze run-N` redoes it at any time).
POST_RUN_S = LATE_SIGNAL_S
FINISH_GRACE_S = 10.0    # SIGTERM to SIGKILL for an analysis past POST_RUN_S: gpudiag profile exits at once
RECOVERY_SCAN_S = 60.0   # the one scan of every process at start: nothing is served before it


def log_line(msg: str) -> None:
    """One line to the daemon's log; a log that cannot be written (its disk full) loses the line,
    never the daemon."""
    try:
        print(f"gpudiag scheduler: {msg}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Jobs:
    """The jobs the daemon is responsible for (pending and active), mirrored from the store."""

    def __init__(self, store: Store, state_dir: Path, machine: Machine, monitor: bool, book: MfuBook,
                 agent_dir: Path | None = None, containment: Containment | None = None) -> None:
        self.store = store
        self.containment = containment or Containment(store.prefix, use_cgroups=False)
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
    def start(self, row: JobRow, slots: list[str], now: float) -> None:
        """Launch ``row`` on the slots with these ids (free, and declared: the pass placed it)."""
        taken = {s for r in self.active.values() for s in (r.slots or ())}
        if taken & set(slots) or not set(slots) <= set(self.machine.ids):   # refuse rather than trust
            raise AssertionError(f"job {row.id}: slots {sorted(slots)} are in use or not declared "
                                 f"(in use: {sorted(taken)}; declared: {', '.join(self.machine.ids)})")
        self.store.update(row, essential=False, state=STARTING, slots=slots, attempt=row.attempt + 1,
                          started_t=now, pid=None, pid_start=None, stop_kind=None, stop_deadline=None,
                          killed=0, reason=f"starting on {self.machine.unit} {','.join(slots)}")
        self.active[row.id] = self.pending.pop(row.id)
        jdir = self.job_dir(row)
        # the marker first: a process's environment is searched only so far (runner.ENV_READ_CAP)
        env = {runner.LAUNCH_VAR: self.marker(row)}
        env.update({k: v for k, v in row.env.items() if not k.startswith(ENV_SCHEDULER_PREFIX)})
        env.update(self.machine.env(slots))
        env.update({ENV_JOB: f"{self.store.prefix}:{row.id}",
                    ENV_RESTART_COUNT: str(row.restarts),
                    ENV_CHECKPOINT_DIR: str(jdir / "checkpoint")})
        if self.agent_dir is not None:
            env[ENV_AGENT_DIR] = str(self.agent_dir)
        env[ENV_TEAM] = row.team   # the job's signals name its team (gpudiag fleet)
        try:
            runner.prepare_job_dir(jdir, row.uid)
            with self.containment.born_in(self.marker(row)):
                proc = runner.spawn(runner.LaunchSpec(row.id, row.attempt, row.uid, row.cmd, env, row.cwd,
                                                      jdir, self.monitor))
        except Exception as e:  # noqa: BLE001 - one job that cannot start fails alone, never the daemon
            if not isinstance(e, (OSError, subprocess.SubprocessError)):
                log_line(f"job {row.id}: unexpected error starting it:\n{traceback.format_exc()}")
            self.containment.release(self.marker(row))
            if is_full(e):   # the state folder is full: load, not the job's fault; it waits
                self.store.update(row, state=PENDING, slots=None,
                                  reason=f"waiting: {self.store.room.line().split(';')[0]}")
                self.pending[row.id] = self.active.pop(row.id)
                return
            self.store.update(row, state=FAILED, ended_t=now, slots=None, exit_code=None,
                              reason=f"could not start: {getattr(e, 'strerror', None) or e}")
            self.active.pop(row.id)
            log_line(f"job {row.id} {row.reason}")
            return
        self.children[row.id] = proc
        self._record_running(row)

    def _record_running(self, row: JobRow) -> None:
        """STARTING -> RUNNING with the wrapper's pid and start time, once spawned (retried at
        the next pass if the state folder was too full to record it)."""
        proc = self.children[row.id]
        info = runner.proc_info(proc.pid)
        self.store.update(row, state=RUNNING, pid=proc.pid, pid_start=info.start if info else None,
                          reason="running")

    # -- stop ----------------------------------------------------------------------------------
    def stop(self, row: JobRow, kind: str, reason: str, now: float, grace_s: float | None = None) -> None:
        """Ask a running job to stop: SIGTERM now, SIGKILL after its grace period. ``kind``:
        preempt (requeued; an optional write: no preemption while the state folder is full),
        cancel, timeout, finish (an analysis past ``POST_RUN_S``), badfile (a scheduler file in
        its folder that the scheduler did not write; ``reason`` names it)."""
        if row.state == STOPPING:
            if kind == "cancel" and row.stop_kind != "cancel":   # a preempted job cancelled: not requeued
                self.store.update(row, stop_kind="cancel", reason=reason)
            return
        grace = row.grace_s if grace_s is None else grace_s
        self.store.update(row, essential=kind != "preempt", state=STOPPING, stop_kind=kind,
                          stop_deadline=now + grace, killed=0, reason=reason)
        self.terminate(row)

    def terminate(self, row: JobRow) -> None:
        if row.pid is not None and row.pid_start is not None:
            runner.signal_group(row.pid, row.pid_start, signal.SIGTERM)
        self.store.update(row, killed=SIGTERM_SENT)

    def enforce(self, now: float) -> None:
        """Deadlines: SIGKILL at the end of a grace period; time limits and the analysis bound
        start one."""
        for row in list(self.active.values()):
            if row.state == STOPPING and row.killed < SIGKILL_SENT and now >= (row.stop_deadline or 0):
                try:
                    self.containment.sweep(self.launch(row))   # every process of it, wherever it went
                except runner.ScanCut:
                    continue   # killed at the next tick
                self.store.update(row, killed=SIGKILL_SENT)
            elif (row.state == RUNNING and row.time_limit_s is not None and row.started_t is not None
                  and now - row.started_t > row.time_limit_s):
                self.stop(row, "timeout", f"time limit of {row.time_limit_s:.0f} s reached", now)
            elif row.state == FINISHING and now >= (row.stop_deadline or 0):
                log_line(f"job {row.id}: gpudiag profile's analysis ran past {POST_RUN_S:.0f} s after its "
                     "command ended; stopping it")
                self.stop(row, "finish", f"{row.reason}; its analysis ran past {POST_RUN_S:.0f} s: stopped",
                          now, grace_s=FINISH_GRACE_S)

    # -- end -----------------------------------------------------------------------------------
    def reap(self, now: float, final_signal: Callable[[JobRow], Signal | None]) -> int:
        """Settle every active job whose leader has ended and of which no process is left;
        returns how many ended. The end is the kernel's word (waitpid of the wrapper, or its pid
        and start time gone), never a file's; a job's slots are kept while anything of it lives."""
        ended = 0
        for row in list(self.active.values()):
            if row.state == STARTING:
                if row.id in self.children:   # spawned, but the state folder was too full to say so
                    self._record_running(row)
                else:                         # what recovery could not tell at start
                    self._unstarted(row, None)
                continue
            proc = self.children.get(row.id)
            leader_runs = proc.poll() is None if proc is not None else runner.alive(row.pid, row.pid_start)
            if leader_runs:
                if self.monitor and row.state == RUNNING:
                    self._finishing(row, now)
                continue
            try:
                left = self.containment.sweep(self.launch(row))
            except runner.ScanCut as e:
                self._note(row, f"ended; {e}: its {self.machine.unit} are kept until a scan completes")
                continue
            if left:   # its slots stay taken until the last one is gone
                self._note(row, f"ended; {len(left)} of its processes still to be killed "
                                f"(pid {', '.join(str(p.pid) for p in left[:5])})")
                continue
            if not self.containment.release(self.marker(row)):
                continue   # something entered its cgroup since the sweep: the next tick kills it
            self.settle(row, None if proc is None else proc.returncode, now, final_signal(row))
            self.children.pop(row.id, None)
            ended += 1
        return ended

    def _note(self, row: JobRow, note: str) -> None:
        if row.state in (RUNNING, FINISHING) and row.reason != note:
            try:
                self.store.update(row, essential=False, reason=note)
            except StateFull:
                pass   # words only

    def _finishing(self, row: JobRow, now: float) -> None:
        """Under --monitor: RUNNING -> FINISHING once run.json says the command ended (a claim:
        the job keeps its slots; only ``queue``'s words and the analysis bound follow from it).
        A run.json gpudiag did not write fails the job, with the line that names it."""
        try:
            with jobfiles.open_dir(self.job_dir(row), row.uid) as fd:
                claim = runner.run_json_claim(fd, row.attempt, row.uid)
        except runner.BadJobFile as e:
            log_line(f"job {row.id} of {row.user}: {e}; stopping it")
            self.stop(row, "badfile", f"{e}: stopped (gpudiag profile writes that file; the job may not)",
                      now)
            return
        except OSError:
            return   # its folder replaced: its next start says so
        if claim is None:
            return
        said = f"exit {claim.code}" if claim.code is not None else "no exit code"
        try:
            self.store.update(row, essential=False, state=FINISHING, stop_deadline=now + POST_RUN_S,
                              reason=f"finishing: its command ended ({said}, says "
                                     f"run-{row.attempt}/run.json); "
                                     f"gpudiag profile analyses the run, and the job keeps its "
                                     f"{self.machine.unit} until its last process ends")
        except StateFull:
            pass   # still RUNNING, which it is as far as its slots go

    def settle(self, row: JobRow, wait_code: int | None, now: float, sig: Signal | None) -> None:
        """No process of the launch is left: record how the job ended. ``wait_code``: the
        wrapper's status from waitpid (Popen's returncode), None when the daemon is not its
        parent (re-adopted after a restart): then the wrapper's exit file says, as a claim."""
        try:
            with jobfiles.open_dir(self.job_dir(row), row.uid) as fd:
                record = runner.read_exit_file(fd, row.attempt, row.uid)
        except OSError as e:
            record = runner.ExitRecord(None, problem=f"its folder: {e.strerror or e}")
        if wait_code is not None:
            code = wait_code if wait_code >= 0 else 128 - wait_code
            why = record.why if record.code == code else None   # the file names the check that failed
            how = f"exit code {code}"
        else:
            code, why = record.code, record.why
            how = f"exit code {code}" if code is not None else \
                f"exit code unknown: it ended while the scheduler was down, and {record.problem}"
        changes: dict = {"pid": None, "pid_start": None, "slots": None, "exit_code": code}
        if why is not None:
            changes.update(state=CANCELLED if row.stop_kind == "cancel" else FAILED, ended_t=now,
                           reason=f"could not start: {self._start_failure(row, why)}")
        elif row.stop_kind == "preempt":
            changes.update(state=PENDING, restarts=row.restarts + 1, stop_kind=None, stop_deadline=None,
                           reason=f"requeued after preemption ({how}); restart {row.restarts + 1}")
        elif row.stop_kind in ("cancel", "badfile"):
            changes.update(state=CANCELLED if row.stop_kind == "cancel" else FAILED, ended_t=now,
                           reason=f"{row.reason} ({how})")
        elif row.stop_kind == "timeout":
            changes.update(state=FAILED, ended_t=now, reason=f"time limit reached ({how})")
        elif row.stop_kind == "finish":
            changes.update(state=DONE if code == 0 else FAILED, ended_t=now,
                           reason=f"{how}; its analysis was stopped after {POST_RUN_S:.0f} s")
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
                try:
                    self.store.update_many([(row, {"sig_mfu": sig.mfu, "sig_label": sig.label,
                                                   "sig_conf": sig.confidence, "sig_t": now - sig.age_s})],
                                           observation=obs, essential=False)
                except StateFull:
                    continue   # taken in at a later pass, while the agent still has it
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
        launches = runner.find_launches(self.store.prefix, deadline_s=RECOVERY_SCAN_S)
        for row in list(self.active.values()):
            procs = [p for p in launches.pop(self.marker(row), []) if p.uid == row.uid]
            if runner.alive(row.pid, row.pid_start):
                notes.append(f"job {row.id}: re-adopted pid {row.pid}")
                if row.state == STOPPING and row.killed == 0:
                    self.terminate(row)
            elif row.state == STARTING:
                notes.append(self._unstarted(row, procs))
            else:
                notes.append(f"job {row.id}: ended while the scheduler was down ({row.state})")
        owned = {self.marker(r) for r in self.active.values()}
        for marker in sorted((set(launches) | set(self.containment.known)) - owned):
            try:
                left = self.containment.sweep(Launch(marker, None, None), scanned=launches)
            except runner.ScanCut as e:
                notes.append(f"launch {marker}: no job owns it; killed, but {e}")
                continue
            if not left:
                self.containment.release(marker)
            notes.append(f"launch {marker}: no job owns it; killed what was left of it")
        return notes

    def _unstarted(self, row: JobRow, procs: list[runner.ProcInfo] | None) -> str:
        """A STARTING job the daemon did not see start (it stopped, or could not record it):
        adopt its launch if one lives (``procs``: its processes, None to look now), else kill
        whatever of it there is and requeue it. Retried at the next pass while it cannot be
        told (a scan past its deadline)."""
        try:
            if procs is None:
                procs = self.containment.processes(self.launch(row))
            leader = next((p for p in procs if p.pid == p.sid), None)
            if leader is not None:
                self.store.update(row, state=RUNNING, pid=leader.pid, pid_start=leader.start,
                                  reason="running")
                return f"job {row.id}: found its launch (pid {leader.pid}) and adopted it"
            left = self.containment.sweep(self.launch(row))
        except runner.ScanCut as e:
            return f"job {row.id}: not started yet as far as can be told ({e}); looked at again next pass"
        if left:   # cannot happen short of a process stuck in the kernel: retried next pass
            return f"job {row.id}: {len(left)} processes of its launch outlived SIGKILL"
        self.containment.release(self.marker(row))
        self.store.update(row, state=PENDING, slots=None, pid=None, pid_start=None,
                          reason="requeued: the scheduler stopped before the job started")
        self.pending[row.id] = self.active.pop(row.id)
        return f"job {row.id}: never started; pending again"

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
