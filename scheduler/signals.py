"""Where a scheduler runtime gets its jobs' efficiency signals: one interface, several sources.

The policy core takes ``{job id: Signal}``; the runtimes get those from the node agent (its
persisted job table or its ``/metrics``) on one machine, or from Prometheus' HTTP API beside a
Slurm cluster. Each source says, besides the signals, whether it could be read at all: "no
agent running" and "no signals yet" are different facts, and ``gpudiag queue`` / the Slurm
controller say which one holds (with no source the policy runs without its efficiency factor;
it never treats a missing source as "every job is efficient" or as "every job is idle").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpudiag.scheduler.model import Signal


@dataclass
class SignalRead:
    """One read of a source: agent job id (e.g. ``"gpudiag:17"``, ``"slurm:4242"``) -> Signal."""

    signals: dict[str, Signal] = field(default_factory=dict)
    available: bool = True  # False: the source could not be read (then ``why`` says why)
    why: str = ""


class SignalSource(Protocol):
    """Anything that can be asked for the current signals. Must not raise on a source that is
    down, empty or malformed: it returns ``SignalRead(available=False, why=...)`` instead."""

    def read(self, now: float) -> SignalRead: ...
