"""Signal sources that stop answering, each named once: an agent (by its URL) or Prometheus.

A dead agent among several leaves the round running on the others' signals; its jobs simply
have none. Without a line the administrator would not know, and with one per round the log
would say nothing else: so one line when a source goes (with the error), one when it is back
(with how long it was out), nothing in between.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("gpudiag.scheduler.slurm")


class SourceOutages:
    """Remembers which sources were out at the last round and since when."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}     # source -> when it stopped answering (monotonic)

    def update(self, down: dict[str, str], now: float | None = None) -> list[str]:
        """This round's ``SignalRead.down``; returns (and logs) the lines for what changed."""
        t = time.monotonic() if now is None else now
        lines = []
        for what in sorted(set(down) - set(self.since)):
            lines.append(f"{what} unreachable ({down[what]}): its jobs' signals are missing until it answers")
            log.warning("%s", lines[-1])
        for what in sorted(set(self.since) - set(down)):
            lines.append(f"{what} answers again after {t - self.since[what]:.0f} s")
            log.info("%s", lines[-1])
        self.since = {w: self.since.get(w, t) for w in down}
        return lines
