"""Report a profiled job's signals to the node's agent while it runs, and once at its end.

Cheap by design: every ``interval`` seconds it reads the tail of rank 0's step file and
drops one small file into the agent's spool. No agent on the node (no spool): nothing is
sent and the run says so once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudiag.jobsignal import run_dir_field, team_from_env, write_signal
from gpudiag.pace import at_own_pace
from gpudiag.rundir import StepRow, read_bootstrap, read_host_cpu, read_steps, samples_dir
from gpudiag.steps import split_step_rows

RECENT_STEPS = 50


def rank0_rows(run_dir: Path) -> list[StepRow]:
    """Rank 0's step rows: every signal reads one rank's file, not all of them, and once."""
    return read_steps(run_dir, rank=0).get(0, [])


def step_stats(run_dir: Path, rows: list[StepRow] | None = None
               ) -> tuple[float | None, dict[str, float], int]:
    """(median of the recent untraced steps in seconds, collective seconds so far, last step)
    from rank 0 (``rows``, where the caller read them). Untraced only: a step the profiler
    slowed is not the job's pace."""
    rows = rank0_rows(run_dir) if rows is None else rows
    colls: dict[str, float] = {}
    for r in rows:
        for name, c in r.collectives.items():
            if isinstance(c, dict) and isinstance(c.get("seconds"), (int, float)):
                colls[name] = colls.get(name, 0.0) + float(c["seconds"])
    live = split_step_rows(0, rows, last=RECENT_STEPS).median_untraced()
    return live, colls, (rows[-1].step if rows else 0)


def own_step(run_dir: Path, rows: list[StepRow] | None = None) -> float | None:
    """The median of the recent untraced steps of rank 0 at the job's own pace: each less the
    wait for cores that processes outside the job caused, on its training thread, the threads
    it waited for, or a peer rank it waited for in a collective (``pace.at_own_pace``). What MFU
    is exported from, so that another tenant's load is not charged to the job (its own workers,
    threads and ranks are its own). The other ranks' files are read only where they exist (a
    job of one rank reads rank 0's, as before), and only their recent steps are used."""
    rows = rank0_rows(run_dir) if rows is None else rows
    boot = read_bootstrap(run_dir)
    steps = {0: rows}
    first = rows[max(0, len(rows) - 2 * RECENT_STEPS)].step if rows else 0
    for f in samples_dir(run_dir).glob("steps-rank-*.jsonl") if rows else ():
        name = f.name[len("steps-rank-"):-len(".jsonl")]
        if name.isdigit() and int(name) != 0:  # rank 0's rows are the caller's, read once
            rank = int(name)
            steps[rank] = [r for r in read_steps(run_dir, boot, rank=rank).get(rank, []) if r.step >= first]
    own = at_own_pace(steps, read_host_cpu(run_dir), boot)[0]
    return split_step_rows(0, own, last=RECENT_STEPS).median_untraced()


class SignalReporter:
    def __init__(self, spool: Path, job_id: str, run_dir: Path, interval: float = 15.0,
                 estimate: Callable[[float | None], dict[str, Any]] | None = None,
                 extra: Callable[[], dict[str, Any]] | None = None) -> None:
        self.spool = spool
        # given the recent step time, the fields only an analysis can give (MFU, label):
        # supplied by the caller, which may use analyzers (collectors may not)
        self.estimate = estimate
        self.extra = extra   # fields every signal carries besides (the stall watch's)
        self.job_id = job_id
        self.run_dir = run_dir
        self.interval = interval
        self.sent = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudiag-signals", daemon=True)

    @classmethod
    def for_node(cls, state_dir: Path, job_id: str, run_dir: Path, interval: float,
                 estimate: Callable[[float | None], dict[str, Any]] | None = None,
                 extra: Callable[[], dict[str, Any]] | None = None) -> SignalReporter | None:
        spool = state_dir / "spool"
        if not spool.is_dir() or not os.access(spool, os.W_OK | os.X_OK):
            return None
        return cls(spool, job_id, run_dir, interval, estimate, extra)

    def start(self) -> SignalReporter:
        self._thread.start()
        return self

    def send(self, **fields: Any) -> None:
        rows = rank0_rows(self.run_dir)
        step, colls, _ = step_stats(self.run_dir, rows)
        extra: dict[str, Any] = {}
        if self.estimate is not None and not fields:
            try:
                extra = self.estimate(own_step(self.run_dir, rows))
            except Exception as e:  # noqa: BLE001 - signals are best effort, the job goes on
                self.error = f"MFU estimate failed: {e}"
        if self.extra is not None:
            try:
                extra.update(self.extra())
            except Exception as e:  # noqa: BLE001 - signals are best effort
                self.error = f"stall fields failed: {e}"
        sig = {"job_id": self.job_id, "ts": time.time(), "step_seconds": step,
               "run_dir": run_dir_field(self.run_dir),
               "collective_seconds_total": colls, **extra, **fields}
        team = team_from_env()
        if team:
            sig.setdefault("team", team)
        try:
            write_signal(self.spool, sig)
            self.sent += 1
        except OSError as e:
            self.error = f"cannot write to the agent's spool {self.spool}: {e.strerror or e}"

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.send()

    def finish(self, **fields: Any) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.send(ended=True, **fields)
