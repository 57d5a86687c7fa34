"""Slurm's jobs, nodes and partitions as the policy core's model (``scheduler/model.py``).

Tiers are partitions ranked by PriorityTier; nodes are those Slurm would start a job on; a running
job is a victim only in a partition gpudiag holds and when requeueable (grace: KillWait); stopping
jobs (COMPLETING, in Slurm's grace, requeued by gpudiag) are never victims; key = ``user/job name``,
team = account; last checkpoint = start (pessimistic); only GPU jobs Slurm could start now are
pending. docs/slurm.md.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field

from gpudiag.scheduler.model import Cluster, Job, Node, Placement, Policy, Running, Tier
from gpudiag.scheduler.slurm.slurmconf import Partition, SlurmNode
from gpudiag.scheduler.slurm.squeue import SlurmJob

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


def schedulable(j: SlurmJob) -> bool:
    return j.state == "PENDING" and j.reason in SCHEDULABLE_REASONS and j.priority > 0


def job_of(j: SlurmJob, tiers: Mapping[str, Tier], held: Container[str], grace_s: float) -> Job:
    return Job(id=j.id, gpus=j.gpus, submit=j.submit,
               estimate_s=j.time_limit_s or NO_LIMIT_ESTIMATE_S, user=j.user, team=j.account,
               key=f"{j.user}/{j.name}", tier=tiers.get(j.partition, Tier.RESERVED),
               preemptible=j.partition in held and j.requeue and not j.het_job_id, grace_s=grace_s)


def whole_node_gpus(j: SlurmJob, nodes: Mapping[str, SlurmNode], partitions: Mapping[str, Partition]) -> int:
    """The GPUs a waiting ``--exclusive`` job takes: each of its nodes whole - the smallest node of
    its partition that holds its per-node request, as many as it asks nodes."""
    k = max(1, j.node_count)
    per_node = -(-j.gpus // k)
    names = partitions[j.partition].nodes if j.partition in partitions else tuple(nodes)
    sizes = sorted(nodes[n].gpus for n in names
                   if n in nodes and nodes[n].usable and nodes[n].gpus >= per_node)
    return max(j.gpus, (sizes[0] if sizes else per_node) * k)


@dataclass
class Model:
    cluster: Cluster
    node_index: dict[str, int]
    pending: list[Job] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    unmodelled: dict[int, str] = field(default_factory=dict)   # holding job id -> why not in the model


def cluster_of(nodes: Mapping[str, SlurmNode]) -> tuple[Cluster, dict[str, int]]:
    names = sorted(n for n, node in nodes.items() if node.gpus > 0 and node.usable)
    index = {n: i for i, n in enumerate(names)}
    return Cluster(tuple(Node(i, nodes[n].gpus, 0) for i, n in enumerate(names))), index


def _placement(j: SlurmJob, node_index: Mapping[str, int], nodes: Mapping[str, SlurmNode],
               used: dict[int, set[int]]) -> Placement | None:
    """The GPUs a running job holds; synthetic indices where squeue did not say which."""
    slots = []
    per_node = max(1, j.gpus // max(1, len(j.nodes)))
    for k, name in enumerate(j.nodes):
        n = node_index.get(name)
        if n is None:
            return None
        size = nodes[name].gpus
        taken = used.setdefault(n, set())
        idx = j.gpu_index[k] if k < len(j.gpu_index) and j.gpu_index[k] else ()
        if j.exclusive:        # Slurm gave it the whole node: no other job starts beside it
            idx = tuple(range(size))
        if not idx:
            free = [g for g in range(size) if g not in taken]
            idx = tuple(free[:per_node])
        idx = tuple(g for g in idx if g < size and g not in taken)
        if idx:
            taken.update(idx)
            slots.append((n, idx))
    return Placement(tuple(slots)) if slots else None


def stopping_until(j: SlurmJob, parts: Mapping[str, Partition], kill_wait_s: float, now: float,
                   requeued_at: float | None) -> float | None:
    """When a stopping job's GPUs are free at the latest; None for a job that is not stopping."""
    if j.state == "COMPLETING":
        return now + kill_wait_s
    if j.preempt_time > 0:
        grace = parts[j.partition].grace_s if j.partition in parts else 0.0
        return max(now, j.preempt_time + grace + kill_wait_s)
    if requeued_at is not None:
        return max(now, requeued_at + kill_wait_s)
    return None


def model_of(jobs: Sequence[SlurmJob], nodes: Mapping[str, SlurmNode], partitions: Mapping[str, Partition],
             held: Container[str], kill_wait_s: float, now: float,
             requeued: Mapping[int, float] | None = None) -> Model:
    """The policy's view: schedulable pending GPU jobs, GPU jobs holding GPUs on usable nodes.

    ``held``: partitions whose jobs gpudiag may requeue; ``requeued``: job id -> when gpudiag
    requeued it (still stopping)."""
    cluster, node_index = cluster_of(nodes)
    tiers = tiers_of(partitions)
    m = Model(cluster, node_index)
    used: dict[int, set[int]] = {}
    for j in jobs:
        if j.gpus <= 0:
            if j.holds:
                m.unmodelled[j.id] = "asks for no GPUs"
            continue
        job = job_of(j, tiers, held, kill_wait_s)
        if schedulable(j):
            if j.exclusive:
                job.gpus = whole_node_gpus(j, nodes, partitions)
            m.pending.append(job)
        elif j.holds:
            pl = _placement(j, node_index, nodes, used)
            if pl is None:
                m.unmodelled[j.id] = f"on a node gpudiag does not model ({','.join(j.nodes) or 'none'})"
                continue
            job.gpus = pl.gpus
            end = stopping_until(j, partitions, kill_wait_s, now, (requeued or {}).get(j.id))
            if end is not None:
                m.running.append(Running(job, pl, j.start, end, last_checkpoint=j.start, terminating=True))
            else:
                m.running.append(Running(job, pl, j.start, j.start + job.estimate_s, last_checkpoint=j.start))
    return m
