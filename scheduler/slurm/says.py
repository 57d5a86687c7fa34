"""What the controller tells the log about how it steers this cluster, each thing once while it
stays true: whether it acts on signals, which partitions' preemption it takes and which it leaves
to Slurm (and why), and each quota reclaim it could not enact. Said truly: "gpudiag chooses
preemption victims" only where it holds a partition (issue 41). docs/slurm.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpudiag.scheduler.slurm.actions import Action
from gpudiag.scheduler.slurm.qos import QosTiers

if TYPE_CHECKING:
    from gpudiag.scheduler.slurm.round_result import RoundResult
    from gpudiag.scheduler.slurm.serve_jobs import Serving

log = logging.getLogger("gpudiag.scheduler.slurm")


def mode_line(takeover: bool, holdable: set[str], qos: QosTiers | None, unsafe: Mapping[str, str]) -> str:
    """What gpudiag does about preemption here, in one line (``holdable``: the partitions it
    holds, or takes, while nothing transient keeps one out)."""
    if qos is not None:
        return qos.line
    if not takeover:
        return "takeover off (--no-takeover, or squeue without --json): Nice only, Slurm preempts"
    if holdable:
        return (f"gpudiag chooses the preemption victims of partition(s) {', '.join(sorted(holdable))} "
                "(held at PreemptMode=OFF while it runs); Slurm chooses them everywhere else")
    why = "none can be held without exposing another partition's jobs" if unsafe else \
        "no PreemptMode=REQUEUE partition with GPU nodes under a higher tier"
    return f"gpudiag holds no partition ({why}): Nice only, Slurm preempts"


class Said:
    """The lines already logged, and the state they describe."""

    def __init__(self) -> None:
        self.no_evidence: str | None = None
        self.mode = ""
        self.unsafe: dict[str, str] = {}
        self.not_reclaimed: dict[int, str] = {}

    def evidence(self, why: str) -> None:
        """"" when signals are usable, else why not; a line when that changes."""
        if why != self.no_evidence:
            (log.warning if why else log.info)("%s", why or "usable MFU signals: gpudiag acts on them")
            self.no_evidence = why
            self.mode = ""     # what it then does is said again

    def steering(self, line: str) -> None:
        if line and line != self.mode:
            log.info("%s", line)
            self.mode = line

    def layout(self, res: RoundResult, why: Mapping[str, str]) -> None:
        """Partitions not held because holding them would expose another partition's jobs: each
        line when it first appears (or its reason changes), in the log and the round's notes."""
        for name, w in sorted(why.items()):
            if self.unsafe.get(name) != w:
                log.warning("partition %s: %s", name, w)
                res.notes.append(f"partition {name}: {w}")
        self.unsafe = dict(why)

    def reclaims(self, res: RoundResult, serving: Serving | None, requeues: Sequence[Action]) -> None:
        """The round's notes name each reclaim, enacted or not (the log says each once)."""
        res.not_reclaimed = dict(serving.not_reclaimed) if serving is not None else {}
        for head, why in res.not_reclaimed.items():
            res.notes.append(f"job {head}: quota reclaim not enacted: {why}")
            if self.not_reclaimed.get(head) != why:
                log.info("job %d: quota reclaim not enacted: %s", head, why)
        self.not_reclaimed = res.not_reclaimed
        victims = [a.target for a in requeues if a.reclaim]
        if victims:
            head = next(a.for_job for a in requeues if a.reclaim)
            res.notes.append(f"job {head}: quota reclaim: requeueing job{'s' if len(victims) > 1 else ''} "
                             f"{', '.join(victims)} of teams over their quotas"
                             + ("; its Nice lifted first" if any(a.kind == "lift" for a in requeues) else ""))
