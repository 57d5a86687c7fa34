"""Efficiency as Nice: a pending GPU job's efficiency factor becomes ``scontrol update Nice=``.

``Nice = original + (1 - factor) x nice_max``, quantised (``NICE_STEPS``), at most ``max_changes``
a round and one per job per ``min_change_interval_s``; ``original`` is the ledger's, and a Nice
someone else set is theirs. The top tier, the top QOS tier and unmanaged partitions are
``neutral``; ``lift_all`` puts every original back once signals are out past their staleness
limit. docs/slurm.md.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping, Sequence

from gpudiag.scheduler.model import Policy, Signal, Tier
from gpudiag.scheduler.priority import MfuBook, efficiency_factor, job_class
from gpudiag.scheduler.slurm.actions import Action
from gpudiag.scheduler.slurm.adapter import job_of, schedulable, tiers_of
from gpudiag.scheduler.slurm.ledger import JobRef, NiceEntry
from gpudiag.scheduler.slurm.slurmconf import Partition, duration_s
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob

log = logging.getLogger("gpudiag.scheduler.slurm")

# With priority/basic every submission gets a priority one below the previous one, so Nice n
# files a job behind the next n submissions; 10,000 is several days of a busy cluster's
# submissions, the scale of the policy's efficiency delay. priority/multifactor: derived from
# PriorityWeightAge / PriorityMaxAge so that Nice equals the policy's delay in age points.
DEFAULT_NICE_MAX = 10_000
SLURM_NICE_LIMIT = 2_147_483_645     # scontrol rejects |Nice| above this (NICE_OFFSET - 3)
NICE_STEPS = 20                      # factor quantised to 5 % steps: no change for jitter
DEFAULT_MIN_CHANGE_INTERVAL_S = 300.0
DEFAULT_MAX_CHANGES = 200            # Nice writes per round, whatever the queue
MULTIFACTOR = "priority/multifactor"


def nice_scale(cfg: Mapping[str, str], policy: Policy) -> int:
    """Nice for factor 0 when not given: the policy's delay, in this Slurm's priority units."""
    if cfg.get("PriorityType") == MULTIFACTOR:
        try:
            w, age = float(cfg.get("PriorityWeightAge", "0")), duration_s(cfg.get("PriorityMaxAge", "0"))
        except (ValueError, BadSlurmOutput):
            w, age = 0.0, 0.0
        if w > 0 and age > 0:
            return int(min(SLURM_NICE_LIMIT, max(1.0, w * min(1.0, policy.max_efficiency_delay_s / age))))
    return DEFAULT_NICE_MAX


def neutral_jobs(jobs: Sequence[SlurmJob], parts: Mapping[str, Partition],
                 managed: Container[str] | None, top_qos: Container[str] = ()) -> dict[int, str]:
    """Jobs whose Nice gpudiag leaves at (or puts back to) their original -> why. ``top_qos``:
    the top QOS tier where Slurm preempts by QOS (``qos.qos_tiers``)."""
    tiers = tiers_of(parts)
    out = {}
    for j in jobs:
        if managed is not None and j.partition not in managed:
            out[j.id] = f"partition {j.partition} is not one gpudiag manages (--partitions)"
        elif tiers.get(j.partition) == Tier.ON_DEMAND:
            out[j.id] = f"partition {j.partition} is the top tier: its jobs are never penalised"
        elif j.qos and j.qos in top_qos:
            out[j.id] = f"QOS {j.qos} is the top QOS tier: its jobs are never penalised"
    return out


def lift_all(jobs: Sequence[SlurmJob], entries: Mapping[int, NiceEntry], why: str) -> list[Action]:
    """Every efficiency penalty gpudiag holds (still at its value) put back to its original."""
    by_id = {j.id: j for j in jobs}
    return [Action("restore", str(jid), str(by_id[jid].nice), str(e.original), f"penalty lifted: {why}",
                   ref=JobRef.of(by_id[jid]))
            for jid, e in sorted(entries.items())
            if jid in by_id and not e.lifted and e.ours(by_id[jid].nice) and by_id[jid].nice != e.original]


def nice_actions(jobs: Sequence[SlurmJob], parts: Mapping[str, Partition], entries: Mapping[int, NiceEntry],
                 theirs: Container[int], signals: Mapping[int, Signal], book: MfuBook, now: float,
                 policy: Policy, scale: int, min_change_interval_s: float, max_changes: int,
                 neutral: Mapping[int, str] | None = None) -> list[Action]:
    tiers = tiers_of(parts)
    out: list[Action] = []
    step = max(1, scale // NICE_STEPS)
    neutral = neutral or {}
    for j in jobs:
        if j.gpus <= 0 or not schedulable(j) or j.id in theirs:
            continue
        entry = entries.get(j.id)
        original = entry.original if entry else j.nice
        if j.id in neutral:
            if entry is not None and not entry.lifted and j.nice != original and entry.ours(j.nice):
                out.append(Action("restore", str(j.id), str(j.nice), str(original),
                                  f"original Nice restored: {neutral[j.id]}", ref=JobRef.of(j)))
            continue
        job = job_of(j, tiers, (), 0.0)
        factor, why = efficiency_factor(job, signals.get(j.id), book.lookup(job.key, now), policy,
                                        book.class_median(job_class(job.gpus)))
        delta = int(round((1.0 - factor) * scale / step)) * step
        want = max(-SLURM_NICE_LIMIT, min(SLURM_NICE_LIMIT, original + delta))
        if want == j.nice or (entry is not None and now - entry.at < min_change_interval_s):
            continue
        if len(out) >= max_changes:
            log.info("more than %d Nice changes due: the rest wait for the next round", max_changes)
            break
        kind = "nice" if delta else "restore"
        reason = (f"efficiency factor {factor:.2f}: {why}" if delta else
                  f"efficiency back to neutral ({why}): original Nice restored")
        out.append(Action(kind, str(j.id), str(j.nice), str(want), reason, ref=JobRef.of(j)))
    return out
