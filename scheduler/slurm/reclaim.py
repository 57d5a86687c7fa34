"""Quota reclaim enacted on Slurm: the policy core's reclaim decisions as requeues and one lift.

The policy core (``preempt.reclaim_victims``) decides: a waiting job of an account under its
``--quota`` may take GPUs back from accounts over theirs (same tier or lower, least useful work
lost, minimum runtime, never below a quota). Slurm cannot carry that out by itself (its
``preempt/partition_prio`` only preempts for a higher PriorityTier), so the controller does, with
the safety of its cross-tier victims (``serve_jobs``) and two things only reclaim needs:

- **Where a victim may sit.** In a partition gpudiag holds at PreemptMode=OFF, or in a *quiet*
  one: ``PreemptMode=REQUEUE`` (the administrator's consent that jobs there may be requeued for
  others) under ``preempt/partition_prio`` with no higher tier on its GPU nodes, so Slurm never
  preempts there and no race with Slurm's own choice exists. A partition at PreemptMode=OFF in
  slurm.conf (the usual top tier) is never reclaimed from: its jobs were promised no preemption.
- **The freed GPUs go to the job they were taken for.** Slurm starts the highest priority first
  (within a PriorityTier), and a later job of an under-quota account usually ranks below the
  backlog of the account it reclaims from: Slurm would hand the freed GPUs to that backlog. So
  before the requeue the reclaiming job's Nice is lowered just below every pending job that
  could take those nodes (``lift``: a ``Nice`` change in the ledger, marked ``lifted``, which the
  efficiency Nice leaves alone) and put back once it starts or leaves the queue (``lift_ends``)
  or on ``--restore-only``. Lowering it rather than checking that the job is already first is
  what makes reclaim happen at all: with ``priority/basic`` a later submission is never first.
  A waiting job of a higher PriorityTier on those nodes goes first whatever the Nice: then
  nothing is reclaimed. The victim itself cannot take its GPUs back: a requeued job waits
  (reason ``BeginTime``) for ``AuthInfo=cred_expire`` (default 120 s), seen in the tests.

Where it cannot act (a candidate victim without a usable signal or key history, a victim in a
partition Slurm preempts in, CPUs or memory short once the victims are gone, a higher-tier job
first in line, a lift beyond Slurm's Nice range) it says why in one line and changes nothing.
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


def reclaim_actions(head: SlurmJob, victims: Sequence[Decision], s, usable: set[str],  # noqa: ANN001 - a Serving
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
