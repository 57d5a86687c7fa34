"""Who serves each waiting job that Slurm could preempt for: gpudiag's victims, or Slurm itself.

``serve_waiting``: gpudiag serves a blocked job when it can judge every candidate victim (signal
or key history, in a held partition) and act (requeueable, CPUs and memory fit); a quota reclaim
is gpudiag's alone (``reclaim``); otherwise, and for jobs Slurm weighs by more than GPUs
(``SlurmJob.unmodelled``), Slurm serves it, with one line why. docs/slurm.md, step 3.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpudiag.scheduler.model import Decision
from gpudiag.scheduler.slurm.actions import Action
from gpudiag.scheduler.slurm.adapter import Model, schedulable
from gpudiag.scheduler.slurm.ledger import JobRef
from gpudiag.scheduler.slurm.reclaim import is_reclaim, reclaim_actions
from gpudiag.scheduler.slurm.slurmconf import Partition, SlurmNode
from gpudiag.scheduler.slurm.squeue import SlurmJob
from gpudiag.scheduler.slurm.takeover import ModeView, candidates, fits_after


@dataclass
class Serving:
    jobs: Sequence[SlurmJob]
    by_id: Mapping[int, SlurmJob]
    model: Model
    modes: ModeView
    parts: Mapping[str, Partition]
    nodes: Mapping[str, SlurmNode]
    decisions: Sequence[Decision]
    want: set[str]                         # partitions gpudiag holds or takes this round
    evidence: Callable[[SlurmJob], bool]
    requeued: Mapping[int, float]          # gpudiag's victims still stopping
    in_flight: set[int | None]             # jobs those victims were for
    handed_back: dict[int, str]            # from earlier rounds, still waiting
    memory: bool
    min_runtime_s: float
    now: float
    quiet: set[str] = field(default_factory=set)          # REQUEUE partitions Slurm never preempts in
    quotas: Mapping[str, float] = field(default_factory=dict)
    cands: dict[str, list[SlurmJob]] = field(default_factory=dict)
    not_reclaimed: dict[int, str] = field(default_factory=dict)   # out: a reclaim not enacted, why

    def node_names(self, placement) -> list[str]:  # a model Placement
        names = {i: n for n, i in self.model.node_index.items()}
        return [names[n] for n in placement.nodes]


def _unjudged(s: Serving, cs: Sequence[SlurmJob]) -> str:
    """Why gpudiag cannot choose among these candidates at all ("" when it can)."""
    for c in cs:
        if c.partition not in s.want:
            return (f"job {c.id} could be its victim and partition {c.partition} is preempted by Slurm "
                    f"itself (PreemptMode={s.modes.original.get(c.partition)})")
    for c in cs:
        if c.het_job_id:
            return (f"job {c.id} could be its victim and is a component of heterogeneous job {c.het_job_id}, "
                    "which Slurm preempts as a whole")
    for c in cs:
        if not s.evidence(c):
            return f"job {c.id} could be its victim and has no usable MFU signal: Slurm's order decides"
    return ""


def _why_slurms(s: Serving, p: SlurmJob, head: int | None, victims: list[Decision],
                starts: Mapping[int, Decision], pending: set[int], unjudged: dict[str, str]) -> str:
    """Why Slurm, not gpudiag, serves waiting job ``p``; "" when gpudiag can."""
    cs = s.cands.get(p.partition, [])
    if p.unmodelled:       # Slurm may find no room where gpudiag's GPU count sees some (or need more)
        return f"job {p.id} {p.unmodelled}: gpudiag does not model that, so it cannot start under the hold"
    if p.id not in pending:
        return f"job {p.id} asks for no GPUs: gpudiag does not model it"
    if p.partition not in unjudged:
        unjudged[p.partition] = _unjudged(s, cs)
    if unjudged[p.partition]:
        return unjudged[p.partition]
    if p.id == head:
        if victims:
            fit = fits_after(p, sorted({n for v in victims for n in s.by_id[v.job_id].nodes}),
                             [s.by_id[v.job_id] for v in victims], s.nodes, s.memory, s.jobs)
            if fit:
                return f"job {p.id} {fit} once gpudiag's victims are gone"
        else:
            for c in cs:
                if not c.requeue:
                    return f"job {c.id} could be its victim and gpudiag cannot requeue it (--no-requeue)"
                if c.id in s.model.unmodelled:
                    return f"job {c.id} could be its victim and {s.model.unmodelled[c.id]}"
    d = starts.get(p.id)
    if d is not None and d.placement is not None and p.reason == "Resources":
        fit = fits_after(p, s.node_names(d.placement), [], s.nodes, s.memory)
        if fit:
            return f"job {p.id} {fit}: gpudiag models GPUs only there"
    return ""


def serve_waiting(s: Serving, allow_victims: bool) -> tuple[list[Action], dict[int, str], set[str]]:
    """(requeues, waiting jobs Slurm serves -> why, partitions to give back to Slurm)."""
    s.cands = candidates(s.parts, s.jobs, s.modes.original, s.min_runtime_s, s.now,
                         lambda j: j.preempt_time > 0 or j.id in s.requeued)
    head = next((d.job_id for d in s.decisions if d.kind == "hold"), None)
    victims = [d for d in s.decisions if d.kind == "preempt" and d.numbers.get("for_job") == head]
    starts = {d.job_id: d for d in s.decisions if d.kind == "start"}
    handed = {k: v for k, v in s.handed_back.items() if k in s.by_id and s.by_id[k].state == "PENDING"}
    pending = {j.id for j in s.model.pending}
    unjudged: dict[str, str] = {}
    for p in s.jobs:
        if p.id in handed or not schedulable(p) or not s.cands.get(p.partition):
            continue
        if p.reason != "Resources" and p.id != head:
            continue
        why = _why_slurms(s, p, head, victims, starts, pending, unjudged)
        if why:
            handed[p.id] = why
    give_back = {c.partition for k in handed for c in s.cands.get(s.by_id[k].partition, [])
                 if c.partition in s.modes.held}
    out: list[Action] = []
    if not (allow_victims and victims and head not in handed and head not in s.in_flight):
        return out, handed, give_back
    if is_reclaim(victims):
        out, why = reclaim_actions(s.by_id[head], victims, s, (s.modes.held - give_back) | s.quiet, s.quotas)
        if why:
            s.not_reclaimed[head] = why
        return out, handed, give_back
    if all(s.by_id[v.job_id].partition in (s.modes.held & s.want) - give_back for v in victims):
        for d in victims:
            v = s.by_id[d.job_id]
            out.append(Action("requeue", str(v.id), "RUNNING", "PENDING", d.reason, for_job=head,
                              ref=JobRef.of(v)))
    return out, handed, give_back
