"""Slurm's nodes, partitions and configuration, parsed from ``scontrol show node|partition|config``.

``scontrol show node -o`` rather than ``sinfo``: one line per node with what the controller
models beside GPUs (``CPUTot``/``CPUAlloc``, ``RealMemory``/``AllocMem``) and the node's full
state with its flags (``IDLE+DRAIN``, ``MIXED+NOT_RESPONDING``): only a node Slurm would start a
job on counts in the model. The cluster's identity (``ClusterName``, the first
``SlurmctldHost`` and ``StateSaveLocation``) binds the controller's ledger to one cluster.

``slurm.conf`` itself (``conf_modes``) says what each partition's PreemptMode will be after the
next ``scontrol reconfigure``: what tells an administrator's ``scontrol update`` (a value of their
own, until slurm.conf is reloaded) from a reload, and what a restore must not write over.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

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


MAX_INCLUDE_DEPTH = 8   # slurm.conf ``Include`` nesting followed (Slurm's own parser allows a few)


@dataclass(frozen=True)
class ConfModes:
    """Each partition's PreemptMode as slurm.conf sets it now, and when slurm.conf (or a file it
    includes) last changed."""

    modes: dict[str, str] = field(default_factory=dict)
    mtime: float = 0.0

    def mode(self, partition: str) -> str | None:
        return self.modes.get(partition)


def same_mode(a: str, b: str) -> bool:
    """PreemptMode values compared as Slurm prints them (``GANG,SUSPEND`` = ``suspend,gang``)."""
    return set(a.upper().replace(" ", "").split(",")) == set(b.upper().replace(" ", "").split(","))


def _conf_lines(path: Path, depth: int, files: list[Path]) -> list[str]:
    files.append(path)
    text = path.read_text(errors="replace").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        word, _, rest = line.partition(" ")
        if word.lower() == "include" and rest.strip():
            if depth >= MAX_INCLUDE_DEPTH:
                raise OSError(f"{path}: Include nested deeper than {MAX_INCLUDE_DEPTH}")
            inc = Path(rest.strip().strip('"'))
            out += _conf_lines(inc if inc.is_absolute() else path.parent / inc, depth + 1, files)
        else:
            out.append(line)
    return out


def conf_modes(path: str | Path) -> ConfModes:
    """Partition -> PreemptMode from slurm.conf at ``path`` (and what it includes): the partition's
    own ``PreemptMode=``, else ``PartitionName=DEFAULT``'s, else the global ``PreemptMode``
    (Slurm's default OFF). Raises OSError when the file cannot be read (a configless client)."""
    files: list[Path] = []
    lines = _conf_lines(Path(path), 0, files)
    glob, default, modes = "OFF", None, {}
    for line in lines:
        kv = {k.lower(): v for k, v in (t.split("=", 1) for t in line.split() if "=" in t)}
        name = kv.get("partitionname")
        if name is None:
            if "preemptmode" in kv and "nodename" not in kv:
                glob = kv["preemptmode"]
        elif name.upper() == "DEFAULT":
            default = kv.get("preemptmode", default)
        else:
            modes[name] = kv.get("preemptmode") or default
    return ConfModes({n: (m or glob).upper() for n, m in modes.items()},
                     max(f.stat().st_mtime for f in files))
