"""Slurm's jobs, nodes and partitions as the policy core's model (``scheduler/model.py``).

- Tiers are partitions ranked by ``PriorityTier``: the lowest is spot, the highest on-demand
  (when there are at least two ranks), anything between reserved; one rank only: reserved.
- A job is preemptible when its partition's PreemptMode (as configured, before the controller
  took preemption over) is not OFF; its grace is what Slurm gives a requeued job: ``KillWait``.
- A job's key (the "same job" across runs, whose MFU history applies) is ``user/job name``;
  its team is its account (fair share).
- A running job's last checkpoint is unknown to Slurm: its start (the pessimistic assumption:
  everything since the start is lost if it is requeued now).
- Only jobs that ask for GPUs are scheduled here, and of the pending ones only those Slurm
  could start now (reason None, Priority or Resources): held, delayed or dependent jobs cannot
  be the head a preemption is for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpudiag.scheduler.model import Cluster, Job, Node, Placement, Policy, Running, Tier
from gpudiag.scheduler.slurm.squeue import Partition, SlurmJob

# Pending reasons under which Slurm would start the job as soon as it fits.
SCHEDULABLE_REASONS = frozenset({"None", "Priority", "Resources"})
# What backfill planning assumes about a job without a time limit (Slurm's UNLIMITED).
NO_LIMIT_ESTIMATE_S = Policy.default_estimate_s


def tiers_of(partitions: Mapping[str, Partition]) -> dict[str, Tier]:
    ranks = sorted({p.priority_tier for p in partitions.values()})
    out = {}
    for name, p in partitions.items():
        if len(ranks) >= 2 and p.priority_tier == ranks[0]:
            out[name] = Tier.SPOT
        elif len(ranks) >= 2 and p.priority_tier == ranks[-1]:
            out[name] = Tier.ON_DEMAND
        else:
            out[name] = Tier.RESERVED
    return out


def cluster_of(nodes: Mapping[str, int]) -> tuple[Cluster, dict[str, int]]:
    names = sorted(n for n, g in nodes.items() if g > 0)
    index = {n: i for i, n in enumerate(names)}
    return Cluster(tuple(Node(i, nodes[n], 0) for i, n in enumerate(names))), index


def job_of(j: SlurmJob, tiers: Mapping[str, Tier], preemptible_modes: Mapping[str, str],
           grace_s: float) -> Job:
    return Job(id=j.id, gpus=j.gpus, submit=j.submit,
               estimate_s=j.time_limit_s or NO_LIMIT_ESTIMATE_S, user=j.user, team=j.account,
               key=f"{j.user}/{j.name}", tier=tiers.get(j.partition, Tier.RESERVED),
               preemptible=preemptible_modes.get(j.partition, "OFF").upper() != "OFF", grace_s=grace_s)


def _placement(j: SlurmJob, node_index: Mapping[str, int], nodes: Mapping[str, int],
               used: dict[int, set[int]]) -> Placement | None:
    """The GPUs a running job holds; synthetic indices where squeue did not say which."""
    slots = []
    per_node = max(1, j.gpus // max(1, len(j.nodes)))
    for k, name in enumerate(j.nodes):
        n = node_index.get(name)
        if n is None:
            return None
        taken = used.setdefault(n, set())
        idx = j.gpu_index[k] if k < len(j.gpu_index) and j.gpu_index[k] else ()
        if not idx:
            free = [g for g in range(nodes[name]) if g not in taken]
            idx = tuple(free[:per_node])
        idx = tuple(g for g in idx if g < nodes[name] and g not in taken)
        if idx:
            taken.update(idx)
            slots.append((n, idx))
    return Placement(tuple(slots)) if slots else None


def model_of(jobs: Sequence[SlurmJob], nodes: Mapping[str, int], partitions: Mapping[str, Partition],
             preempt_modes: Mapping[str, str], grace_s: float
             ) -> tuple[Cluster, list[Job], list[Running]]:
    """(cluster, schedulable pending GPU jobs, running GPU jobs)."""
    cluster, node_index = cluster_of(nodes)
    tiers = tiers_of(partitions)
    pending, running = [], []
    used: dict[int, set[int]] = {}
    for j in jobs:
        if j.gpus <= 0:
            continue
        job = job_of(j, tiers, preempt_modes, grace_s)
        if j.state == "PENDING" and j.reason in SCHEDULABLE_REASONS and j.priority > 0:
            pending.append(job)
        elif j.state == "RUNNING":
            pl = _placement(j, node_index, nodes, used)
            if pl is not None:
                job.gpus = pl.gpus
                running.append(Running(job, pl, j.start, j.start + job.estimate_s, last_checkpoint=j.start))
    return cluster, pending, running
