"""The controller's loop: a round every interval; slurmctld away means back off and change nothing.

slurmctld unreachable: one log line when it goes, rounds retried with a doubling backoff (the
interval up to ``MAX_BACKOFF_S``), one line when it is back. SIGTERM/SIGINT end the loop after
the current round; ``restore`` then puts back everything the controller changed.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

from gpudiag.scheduler.slurm.controller import Controller, RoundResult
from gpudiag.scheduler.slurm.slurmio import SlurmUnreachable

log = logging.getLogger("gpudiag.scheduler.slurm")

# A controller that retries slower than Slurm's own SlurmctldTimeout (default 120 s) would miss
# a backup controller taking over; five minutes bounds the wait after a long outage.
MAX_BACKOFF_S = 300.0


def describe(res: RoundResult) -> str:
    """A round in a few lines for people (``--json`` prints the whole RoundResult instead)."""
    if res.skipped:
        return res.skipped
    sig = f"{res.signals['jobs']} jobs" if res.signals.get("available") else res.signals.get("why", "")
    lines = [f"{res.jobs.get('pending', 0)} pending, {res.jobs.get('running', 0)} running; signals: {sig}"]
    for a in res.actions:
        state = "done" if a.applied else (f"not done: {a.error}" if a.error else "planned")
        lines.append(f"  {a.kind} {a.target}: {a.old} -> {a.new} [{state}] {a.reason}")
    for d in res.decisions:
        if d["kind"] != "start":
            lines.append(f"  {d['kind']} job {d['job_id']}: {d['reason']}")
    lines += [f"  note: {n}" for n in res.notes]
    return "\n".join(lines)


def serve(ctl: Controller, interval_s: float, once: bool, as_json: bool, restore: bool,
          emit: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
    """Run rounds until stopped (or one with ``once``); returns the exit code."""
    emit = emit or (lambda s: print(s, flush=True))
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    backoff, down_since, rc = interval_s, None, 0
    while not stop.is_set():
        try:
            res = ctl.round(time.time())
        except SlurmUnreachable as e:
            if down_since is None:
                down_since = time.monotonic()
                log.warning("slurmctld unreachable (%s): no changes; retrying with backoff up to %.0f s",
                            e, MAX_BACKOFF_S)
            backoff = min(MAX_BACKOFF_S, backoff * 2)
            if once:
                emit(json.dumps({"skipped": f"slurmctld unreachable: {e}"}) if as_json
                     else f"slurmctld unreachable: {e}")
                rc = 1
                break
            stop.wait(backoff)
            continue
        if down_since is not None:
            log.warning("slurmctld reachable again after %.0f s: resuming", time.monotonic() - down_since)
            down_since, backoff = None, interval_s
        emit(json.dumps(res.to_dict()) if as_json else describe(res))
        if once:
            rc = 1 if res.skipped else 0
            break
        stop.wait(interval_s)
    if restore:
        actions = ctl.restore()
        if as_json:
            emit(json.dumps({"restored": [a.__dict__ for a in actions]}))
        if any(a.error for a in actions):
            rc = 1
    sys.stdout.flush()
    return rc
