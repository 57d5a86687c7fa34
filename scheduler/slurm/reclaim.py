"""Quota reclaim enacted on Slurm: the policy core's reclaim decisions as requeues and one lift.

Victims only in partitions gpudiag holds or *quiet* ones (REQUEUE, no higher tier on their GPU
nodes: Slurm never preempts there); before the requeue the reclaiming job's Nice is lowered below
every pending job that could take those nodes (``lift``, put back by ``lift_ends``), so the freed
GPUs go to it. Where it cannot act it says why in one line. docs/slurm.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpudiag.scheduler.model import Decision, Job, Running
from gpudiag.scheduler.slurm.actions import Action
from gpudiag.scheduler.slurm.adapter import Model, schedulable
from gpudiag.scheduler.slurm.efficiency import SLURM_NICE_LIMIT
from gpudiag.scheduler.slurm.ledger import JobRef, NiceEntry
from gpudiag.scheduler.slurm.slurmconf import Partition, SlurmNode
from gpudiag.scheduler.slurm.squeue import SlurmJob
from gpudiag.scheduler.slurm.takeover import PARTITION_PRIO, TAKEOVER_MODE, ModeView, eligible, fits_after


def quiet_partitions(parts: Mapping[str, Partition], modes: ModeView, nodes: Mapping[str, SlurmNode],
                     preempt_type: str) -> set[str]:
    """REQUEUE partitions with GPU nodes where Slurm never preempts (no higher tier on them)."""
    if preempt_type != PARTITION_PRIO:
        return set()
    gpu = {n for n, node in nodes.items() if node.gpus > 0}
    requeue = {name for name, p in parts.items()
               if modes.original[name].upper() == TAKEOVER_MODE and gpu & set(p.nodes)}
    return requeue - eligible(parts, modes, nodes, preempt_type)


def is_reclaim(victims: Sequence[Decision]) -> bool:
    return any(d.numbers.get("reclaim") for d in victims)


def _unjudged(model: Model, head: Job, by_id: Mapping[int, SlurmJob], quotas: Mapping[str, float],
              evidence: Callable[[SlurmJob], bool], min_runtime_s: float, now: float) -> str:
    """A job the pass could have reclaimed instead, valued at an assumed MFU: "" when none."""
    def candidate(r: Running) -> bool:
        return (r.job.preemptible and not r.terminating and r.job.team != head.team
                and quotas.get(r.job.team, 0.0) > 0 and r.job.tier <= head.tier
                and now - r.start >= min_runtime_s)
    for r in model.running:
        if candidate(r) and not evidence(by_id[r.job.id]):
            return (f"job {r.job.id} could be its reclaim victim and has no usable MFU signal: nothing "
                    "reclaimed (jobs without signals are neither protected nor penalised)")
    return ""


def lift(head: SlurmJob, freed: Sequence[SlurmJob], jobs: Sequence[SlurmJob],
         parts: Mapping[str, Partition]) -> tuple[int | None, str]:
    """(the Nice that puts ``head`` first in Slurm's order for the freed nodes, or None when it is
    first already; why not, "" when it can be put first)."""
    on = {n for v in freed for n in v.nodes}
    tier = parts[head.partition].priority_tier if head.partition in parts else 0
    rivals = [j for j in jobs if j.id != head.id and j.state == "PENDING" and j.partition in parts
              and on & set(parts[j.partition].nodes)]
    for j in rivals:
        if parts[j.partition].priority_tier > tier and schedulable(j):
            return None, (f"job {j.id} waits in higher-tier partition {j.partition} for the same nodes: "
                          "Slurm would start it first on the freed GPUs; nothing reclaimed")
    top = max([j.priority for j in rivals if parts[j.partition].priority_tier == tier]
              + [v.priority for v in freed], default=0)
    if head.priority > top:
        return None, ""
    nice = head.nice - (top - head.priority + 1)
    if nice < -SLURM_NICE_LIMIT:
        return None, f"it would need Nice {nice} to go first, beyond Slurm's range: nothing reclaimed"
    return nice, ""


def reclaim_actions(head: SlurmJob, victims: Sequence[Decision], s, usable: set[str],  # a Serving
                    quotas: Mapping[str, float]) -> tuple[list[Action], str]:
    """The head's lift and its victims' requeues, or why none (one line)."""
    vs = [s.by_id[d.job_id] for d in victims]
    for v in vs:
        if v.partition not in usable:
            return [], (f"job {v.id} could be its reclaim victim and partition {v.partition} is preempted by "
                        f"Slurm itself (PreemptMode={s.modes.original.get(v.partition)}): nothing reclaimed")
    job = next(j for j in s.model.pending if j.id == head.id)
    why = _unjudged(s.model, job, s.by_id, quotas, s.evidence, s.min_runtime_s, s.now)
    if why:
        return [], why
    fit = fits_after(head, sorted({n for v in vs for n in v.nodes}), vs, s.nodes, s.memory, s.jobs)
    if fit:
        return [], f"job {head.id} {fit} once its reclaim victims are gone: nothing reclaimed"
    nice, why = lift(head, vs, s.jobs, s.parts)
    if why:
        return [], why
    out = []
    if nice is not None:
        out.append(Action("lift", str(head.id), str(head.nice), str(nice),
                          f"reclaim for team {head.account}: Nice lowered so that Slurm starts job {head.id} "
                          "first on the GPUs its victims free; put back when it starts", ref=JobRef.of(head)))
    out += [Action("requeue", str(v.id), "RUNNING", "PENDING", d.reason, for_job=head.id, ref=JobRef.of(v),
                   reclaim=True) for v, d in zip(vs, victims, strict=True)]
    return out, ""


def lifted_jobs(entries: Mapping[int, NiceEntry]) -> set[int]:
    """Jobs whose Nice is a reclaim's lift: the efficiency Nice does not change them."""
    return {jid for jid, e in entries.items() if e.lifted}


def lift_ends(jobs: Mapping[int, SlurmJob], entries: Mapping[int, NiceEntry]) -> list[Action]:
    """A lifted job that no longer waits gets its Nice back (one that left the queue needs none)."""
    out = []
    for jid, e in entries.items():
        j = jobs.get(jid)
        if e.lifted and e.want is None and j is not None and e.ref.matches(j) and j.state != "PENDING" \
                and j.nice != e.original:
            out.append(Action("restore", str(jid), str(j.nice), str(e.original),
                              f"reclaim done: job {jid} is {j.state}; the Nice it had before gpudiag",
                              ref=JobRef.of(j)))
    return out
