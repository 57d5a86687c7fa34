"""What the controller does where Slurm does not preempt by partition: ``PreemptType=preempt/qos``
(and ``preempt/none``), in one honest line.

gpudiag holds no partition there and only changes Nice; the jobs of the top QOS tier (the highest
QOS ``Priority`` of ``sacctmgr show qos``) are never penalised, and where the QOS priorities cannot
be read no Nice is changed. docs/slurm.md, "Clusters that preempt by QOS".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

QOS_PREEMPT = "preempt/qos"
PARTITION_PRIO = "preempt/partition_prio"
NO_ACCOUNTING = "accounting_storage/none"


@dataclass(frozen=True)
class QosTiers:
    top: frozenset[str] = frozenset()    # QOS whose jobs are never penalised
    line: str = ""                       # what gpudiag does on this cluster, in one line
    nice_ok: bool = True                 # False: no Nice is changed (the paid jobs cannot be told)
    priority: int = 0                    # the top QOS tier's priority


def parse_qos(text: str) -> dict[str, int]:
    """``sacctmgr -nP show qos format=Name,Priority``: ``name|priority`` lines."""
    out = {}
    for line in text.splitlines():
        name, sep, prio = line.strip().partition("|")
        if sep and name:
            try:
                out[name] = int(prio.split("|")[0] or 0)
            except ValueError:
                raise ValueError(f"sacctmgr show qos: {line[:80]!r} has no priority") from None
    return out


def qos_tiers(cfg: dict[str, str], read_qos: Callable[[], str], squeue_json: bool) -> QosTiers | None:
    """None on a ``preempt/partition_prio`` cluster (partitions are the tiers); else the line to
    say and the QOS to exempt. ``read_qos``: sacctmgr's answer (raises when it cannot be read)."""
    pt = cfg.get("PreemptType", "")
    if pt == PARTITION_PRIO:
        return None
    if pt != QOS_PREEMPT:
        return QosTiers(line=f"PreemptType={pt or '?'}: gpudiag holds no partition: Nice only, Slurm "
                             "preempts (or not) as it would alone")
    head = ("PreemptType=preempt/qos: Slurm preempts by QOS and gpudiag holds no partition: Nice only, "
            "Slurm preempts")
    if cfg.get("AccountingStorageType", "") in ("", NO_ACCOUNTING):
        return QosTiers(line=f"{head} (no accounting storage, so no QOS: the partition tiers are the only "
                             "ones)")
    if not squeue_json:
        return QosTiers(line=f"{head}; squeue has no --json, so no job's QOS can be read: gpudiag cannot "
                             "tell the top QOS tier's jobs and changes no Nice", nice_ok=False)
    try:
        prios = parse_qos(read_qos())
    except (OSError, ValueError, RuntimeError) as e:
        return QosTiers(line=f"{head}; the QOS priorities cannot be read ({str(e)[:160]}): gpudiag cannot "
                             "tell the top QOS tier's jobs and changes no Nice until it can", nice_ok=False)
    if len(set(prios.values())) < 2:
        return QosTiers(line=f"{head} (every QOS has priority {next(iter(prios.values()), 0)}: no QOS tier "
                             "above the others)")
    top = max(prios.values())
    names = frozenset(n for n, p in prios.items() if p == top)
    return QosTiers(names, f"{head}; jobs of QOS {', '.join(sorted(names))} (priority {top}, the top QOS "
                           "tier) are never penalised", priority=top)
