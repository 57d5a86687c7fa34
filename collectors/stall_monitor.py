"""``gpudiag profile``'s stall watch: notices a stall while the job runs, gathers the evidence at
that moment, and never stops the job.

Once a second it reads every rank's black box (``collectors/blackbox.py``: a few kilobytes,
read from outside the job) and asks ``judge`` (the stall rule, ``analyzers/stall.py``, passed in
by the command: collectors do not analyse) which ranks are past their limit. When one is, it
opens an incident: gathers the evidence (``stall_collect.collect``), hands it to
``on_incident`` (which returns the verdict's kind, the stall's cause), and keeps it open until
steps resume (``on_resolved``: a pause, not a hang) or the job ends. One incident at a time, at
most ``MAX_INCIDENTS`` per run.

``current()`` is what the node agent is told (``collectors/job_signals.py``): when the job last
finished a step, the limit after which no step means stalled, and the cause once known; the
agent then zeroes the job's MFU on its own clock, between signals.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudiag.collectors import blackbox, stall_collect, stall_evidence
from gpudiag.incident import MAX_INCIDENTS, NO_STEPS, Evidence

PERIOD_S = 1.0


@dataclass
class JobStall:
    """The job as the agent needs it: its progress, its limit, and the stall's cause."""

    last_step_at: float | None = None
    stall_after_s: float | None = None
    stalled: bool = False
    cause: str | None = None      # the verdict's kind (incident.CAUSES) while stalled
    incident: str | None = None   # the open incident's id


class StallMonitor:
    def __init__(self, run_dir: Path, root_pid: int, judge: Callable[[dict[int, Any], float], list[Any]],
                 on_incident: Callable[[Evidence], str], on_resolved: Callable[[str, float, str], None],
                 rule: str = "", on_change: Callable[[], None] | None = None,
                 period: float = PERIOD_S) -> None:
        self.run_dir = run_dir
        self.root_pid = root_pid
        self.judge = judge            # (boxes, now) -> per-rank limits (analyzers.stall.RankLimit)
        self.on_incident = on_incident
        self.on_resolved = on_resolved
        self.on_change = on_change    # the agent should hear now (a stall began or ended)
        self.rule = rule
        self.period = period
        self.count = 0
        self._steps_at_open: dict[int, int] = {}
        self.errors: list[str] = []
        self._state = JobStall()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpudiag-stall-monitor", daemon=True)

    def start(self) -> StallMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def current(self) -> JobStall:
        with self._lock:
            return JobStall(**vars(self._state))

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.tick(time.time())
            except Exception as e:  # noqa: BLE001 - the watch must not take the run down
                msg = f"stall watch failed: {type(e).__name__}: {e}"
                if msg not in self.errors:
                    self.errors.append(msg)

    def tick(self, now: float) -> None:
        boxes = blackbox.read_all(self.run_dir)
        if not boxes:
            return
        for box in boxes.values():
            box.alive = stall_evidence.alive(box.pid)
        limits = self.judge(boxes, now)
        stalled = [lim for lim in limits if lim.stalled]
        worst = min(limits, key=lambda lim: lim.since) if limits else None
        with self._lock:
            was = self._state.stalled
            self._state.last_step_at = worst.since if worst else None
            self._state.stall_after_s = worst.limit_s if worst else None
            self._state.stalled = bool(stalled)
            open_id = self._state.incident
        # resumed: every rank still runs and one has finished a step since the incident opened (a
        # rank that died is not a resumption: the job's end closes the incident)
        resumed = (open_id is not None and not stalled and all(b.alive for b in boxes.values())
                   and any(b.step > self._steps_at_open.get(r, b.step) for r, b in boxes.items()))
        if stalled and open_id is None and self.count < MAX_INCIDENTS:
            self._steps_at_open = {r: b.step for r, b in boxes.items()}
            self._open(boxes, {lim.rank: lim for lim in limits})
        elif resumed and open_id is not None:
            with self._lock:
                self._state.incident, self._state.cause = None, None
            at = time.strftime("%H:%M:%S", time.localtime(now))
            self.on_resolved(open_id, now, f"steps resumed at {at}: a pause, not a hang")
        if was != bool(stalled) and self.on_change is not None:
            self.on_change()

    def _open(self, boxes: dict[int, Any], limits: dict[int, Any]) -> None:
        self.count += 1
        ident = str(self.count)
        with self._lock:
            self._state.incident, self._state.cause = ident, NO_STEPS
        ev = stall_collect.collect(self.run_dir, ident, self.root_pid, boxes, limits, rule=self.rule)
        cause = self.on_incident(ev)
        with self._lock:
            if self._state.incident == ident:
                self._state.cause = cause
        if self.on_change is not None:
            self.on_change()
