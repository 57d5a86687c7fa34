"""A round's changes written to Slurm (the controller decides them; ``controller`` has the order).

Each PreemptMode or requeue write is made only if Slurm, read again just before it, still shows
what the round decided on (``fresh``); a reclaim's requeue only after its waiting job's Nice was
lifted. Partitions just taken in which Slurm turns out to be preempting are given back at once
(``Fresh.after_take``). A requeue Slurm refuses hands its waiting job to Slurm's own preemption:
the candidates' partitions get their original PreemptMode back; a reclaim not done stays
gpudiag's (Slurm does not reclaim) and is named in ``not_reclaimed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudiag.scheduler.slurm.actions import PREEMPT_OFF, Action, apply
from gpudiag.scheduler.slurm.fresh import Fresh
from gpudiag.scheduler.slurm.ledger import Ledger, LedgerStore
from gpudiag.scheduler.slurm.serve_jobs import Serving
from gpudiag.scheduler.slurm.slurmconf import Partition
from gpudiag.scheduler.slurm.slurmio import SlurmIO
from gpudiag.scheduler.slurm.squeue import SlurmJob

if TYPE_CHECKING:
    from gpudiag.scheduler.slurm.round_result import RoundResult

log = logging.getLogger("gpudiag.scheduler.slurm")


@dataclass
class Writer:
    io: SlurmIO
    store: LedgerStore
    renew: Callable[..., None]    # the controller's lease renewal: (ledger, now=None)
    renew_every_s: float          # between commands of a long round


def write_round(res: RoundResult, w: Writer, now: float, by_id: dict[int, SlurmJob], serving: Serving | None,
                parts_read: Mapping[str, Partition], prepare: Callable[[Ledger], None]) -> None:
    """Writes ``res.actions`` (write-ahead, ``actions.apply``; ``prepare`` goes into the first ledger
    write), then what the writes call for: takes undone, refused requeues handed back."""
    quiet = serving.quiet - serving.modes.held if serving is not None else set()
    fresh = Fresh(w.io, by_id, parts_read,
                  {p: serving.modes.original.get(p, "") for p in quiet} if serving is not None else {})

    def precheck(a: Action) -> str:
        """Just before a PreemptMode or requeue write: a reclaim's lift went first, and Slurm,
        read again, still shows what the decision relied on (``fresh``)."""
        if a.kind == "requeue":
            lift = next((b for b in res.actions if b.kind == "lift" and b.target == str(a.for_job)), None)
            if lift is not None and not lift.applied:
                return f"job {a.for_job}'s lift in Slurm's order failed ({lift.error}): not requeued"
        return fresh.before(a)

    apply(res.actions, w.io, w.store, now, w.renew, w.renew_every_s, precheck, prepare)
    taken = {a.target: a.old for a in res.actions if a.kind == "preempt_mode" and a.applied
             and a.new.upper() == PREEMPT_OFF}
    undo = fresh.after_take(taken)
    if undo:
        for a in undo:
            log.warning("partition %s: %s", a.target, a.reason)
        apply(undo, w.io, w.store, now, w.renew, w.renew_every_s)
        res.actions += undo
    refused = [a for a in res.actions if a.kind == "requeue" and a.error and not a.applied
               and "not requeued" not in a.error and "not tried" not in a.error]
    for a in res.actions:   # a reclaim not done stays gpudiag's: Slurm does not reclaim
        if a.kind == "requeue" and a.reclaim and a.error and not a.applied and a.for_job is not None:
            res.not_reclaimed.setdefault(a.for_job, f"requeue of job {a.target} not done: {a.error}")
    refused = [a for a in refused if not a.reclaim]
    if not refused or serving is None:
        return
    back: list[Action] = []
    with w.store.update() as ledger:
        for a in refused:
            why = f"Slurm refused to requeue job {a.target} ({a.error})"
            if a.for_job is not None and a.for_job in by_id:
                ledger.handed_back[a.for_job] = res.handed_back[a.for_job] = why
                for c in serving.cands.get(by_id[a.for_job].partition, []):
                    if c.partition in ledger.modes and c.partition not in {b.target for b in back}:
                        back.append(Action("preempt_mode", c.partition, PREEMPT_OFF,
                                           ledger.modes[c.partition].original,
                                           f"preemption given back to Slurm: {why}"))
        w.renew(ledger)
    apply(back, w.io, w.store, now, w.renew, w.renew_every_s)
    res.actions += back
