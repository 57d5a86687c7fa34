"""Slurm's nodes, partitions and configuration, parsed from ``scontrol show node|partition|config``.

``scontrol show node -o`` rather than ``sinfo``: one line per node with what the controller
models beside GPUs (``CPUTot``/``CPUAlloc``, ``RealMemory``/``AllocMem``) and the node's full
state with its flags (``IDLE+DRAIN``, ``MIXED+NOT_RESPONDING``): only a node Slurm would start a
job on counts in the model. The cluster's identity (``ClusterName``, the first
``SlurmctldHost`` and ``StateSaveLocation``) binds the controller's ledger to one cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, expand_hostlist, gpus_requested, limit_s

# Node states (base and flags, joined by "+") under which Slurm starts new jobs on a node; any
# other word (DRAIN, DOWN, FAIL, NOT_RESPONDING, MAINTENANCE, RESERVED, POWERED_DOWN, ...) keeps
# it out of the model: freeing its GPUs would help no pending job.
USABLE_NODE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED", "CLOUD"})


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    gpus: int
    cpus: int
    cpus_alloc: int
    mem_mb: float
    mem_alloc_mb: float
    state: str

    @property
    def usable(self) -> bool:
        return bool(self.state) and set(self.state.upper().split("+")) <= USABLE_NODE_STATES


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    priority_tier: int
    preempt_mode: str
    grace_s: float
    nodes: tuple[str, ...] = ()


def _kv(line: str) -> dict[str, str]:
    return dict(tok.split("=", 1) for tok in line.split() if "=" in tok)


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """``scontrol show node -o``: one ``Key=Value ...`` line per node."""
    out = {}
    for line in text.splitlines():
        kv = _kv(line)
        if "NodeName" not in kv:
            continue
        try:
            out[kv["NodeName"]] = SlurmNode(
                kv["NodeName"], gpus_requested(kv.get("Gres", ""), "", 1), int(kv.get("CPUTot", "0")),
                int(kv.get("CPUAlloc", "0")), float(kv.get("RealMemory", "0")),
                float(kv.get("AllocMem", "0")), kv.get("State", ""))
        except ValueError:
            raise BadSlurmOutput(f"node line {line[:120]!r}") from None
    return out


def parse_partitions(text: str) -> dict[str, Partition]:
    """``scontrol show partition -o``: one ``Key=Value ...`` line per partition."""
    out = {}
    for line in text.splitlines():
        kv = _kv(line)
        if "PartitionName" not in kv:
            continue
        try:
            nodes = kv.get("Nodes", "")
            out[kv["PartitionName"]] = Partition(
                kv["PartitionName"], int(kv.get("PriorityTier", "1")), kv.get("PreemptMode", "OFF"),
                float(kv.get("GraceTime", "0")),
                expand_hostlist(nodes) if nodes not in ("", "(null)") else ())
        except ValueError:
            raise BadSlurmOutput(f"partition line {line[:120]!r}") from None
    return out


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Key = Value`` lines."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() and " " not in k.strip():
            out[k.strip()] = v.strip()
    return out


def duration_s(text: str) -> float:
    """Slurm durations in ``scontrol show config``: ``30 sec``, ``00:05:00``, ``7-00:00:00``, ``NONE``."""
    t = text.strip()
    if t.upper() in ("", "NONE", "UNLIMITED", "N/A"):
        return 0.0
    m = re.fullmatch(r"(\d+)\s*(sec|min)?", t)
    if m:
        return float(m.group(1)) * (60 if m.group(2) == "min" else 1)
    limit = limit_s(t)
    return limit or 0.0


def cluster_identity(cfg: dict[str, str]) -> dict[str, str]:
    """What tells this cluster from another one, or from itself with its state wiped (a new
    StateSaveLocation); a reset of the same folder is told apart per job (``ledger.JobRef``)."""
    host = cfg.get("SlurmctldHost[0]", cfg.get("ControlMachine", ""))
    return {"name": cfg.get("ClusterName", ""), "controller": host.split("(")[0],
            "state": cfg.get("StateSaveLocation", "")}


def memory_is_consumable(cfg: dict[str, str]) -> bool:
    """Slurm allocates memory (and so it can be what a job waits for) only with a ``*_Memory``
    SelectTypeParameters (CR_Core_Memory, CR_CPU_Memory, CR_Socket_Memory)."""
    return "MEMORY" in cfg.get("SelectTypeParameters", "").upper()
