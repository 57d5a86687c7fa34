"""Slurm's jobs, parsed from ``squeue`` (nodes, partitions and config: ``slurmconf``).

``squeue --json`` (OpenAPI v0.0.38 in Slurm 22.05, the dialect read here; later versions add
fields, which are ignored) is preferred; Slurms without it get the fixed ``squeue -o`` format
below, which lacks what the controller needs to take preemption over safely (the requeue flag,
``preempt_time``, the restart count), so with it gpudiag only changes Nice. Anything that does
not parse raises ``BadSlurmOutput`` with what was wrong, and the controller skips that round
(acting on half-read state could requeue the wrong job).

GPU counts come from the request (``tres_per_node``/``tres_per_job``: ``gres:gpu:2``,
``gres/gpu:2``, ``gres:gpu:a100:2``) and, for a running job, which GPUs it holds from
``gres_detail`` (``gpu:2(IDX:0-1)``, one entry per node, in node order). CPUs and memory come
from ``tres_alloc_str`` (running) or ``tres_req_str`` (pending): ``cpu=2,mem=100M,node=1``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime

from gpudiag.durations import slurm_duration

# What squeue prints with the fixed format; "|" never occurs in the fields we ask for but %j,
# and a job name is the last field so a "|" in it is still recoverable.
FIXED_FORMAT = "%i|%u|%a|%P|%T|%r|%y|%Q|%V|%S|%l|%b|%D|%C|%N|%U|%j"
FIXED_FIELDS = 17
# States whose jobs hold (RUNNING, CONFIGURING, COMPLETING: until their processes are gone) or
# want (PENDING) resources; Slurm 22.05's job_state_string() names a completing job COMPLETING
# whatever its base state, and a requeued job is COMPLETING until its processes are gone.
ACTIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
HOLDING_STATES = ("RUNNING", "CONFIGURING", "COMPLETING")

_GPU_REQ = re.compile(r"(?:^|[,;])(?:gres[:/])?gpu(?::[\w.-]+)?:(\d+)")
_IDX = re.compile(r"IDX:([0-9,\-]+)")
_HOSTLIST = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")
_MEM_UNITS = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2}


class BadSlurmOutput(ValueError):
    """Slurm's output did not have the shape this module reads."""


@dataclass(frozen=True, slots=True)
class SlurmJob:
    id: int
    name: str
    user: str
    account: str
    partition: str
    state: str                      # one of ACTIVE_STATES (others are dropped)
    reason: str                     # the pending reason (Resources, Priority, BeginTime, ...)
    nice: int
    priority: int
    submit: float
    start: float                    # actual start (running) or Slurm's estimate (pending)
    time_limit_s: float | None      # None: no limit
    gpus: int                       # GPUs in total
    nodes: tuple[str, ...] = ()
    gpu_index: tuple[tuple[int, ...], ...] = field(default=())   # per node, for running jobs
    user_id: int | None = None      # the uid the job runs as: only its signals are the job's
    requeue: bool = True            # may be requeued (sbatch --no-requeue: False)
    preempt_time: float = 0.0       # when Slurm began preempting it (0: it is not)
    restarts: int = 0               # times requeued: with submit, tells a requeued job from a new one
    cpus: int = 0                   # CPUs in total (allocated when running, asked for when pending)
    mem_mb: float = 0.0             # memory in total, MB (0: not tracked by this Slurm)
    node_count: int = 1             # nodes asked for (running: held)
    exclusive: bool = False         # --exclusive (squeue's ``shared`` "none", "user" or "mcs"): whole nodes
    array_job_id: int = 0           # an array's id (its pending tasks' record); 0: not an array task
    het_job_id: int = 0             # a heterogeneous job's id (its first component's); 0: not one
    constraints: str = ""           # what else it asks Slurm for (features, licenses, ...), in words
    qos: str = ""                   # its QOS (--json only; "" without accounting storage)

    @property
    def split_task(self) -> bool:
        """An array task that left its array's record (on starting) under a job id of its own: it
        carries the Nice its array had then."""
        return self.array_job_id > 0 and self.array_job_id != self.id

    @property
    def unmodelled(self) -> str:
        """What Slurm weighs for this job that gpudiag's model of GPUs per node does not, in words
        ("" when nothing): such a job, waiting, is Slurm's to serve."""
        if self.exclusive:
            return "asks for whole nodes (--exclusive)"
        if self.het_job_id:
            return f"is a component of heterogeneous job {self.het_job_id}, which Slurm places as a whole"
        return self.constraints

    @property
    def holds(self) -> bool:
        """Holds resources on its nodes (running, starting, or its processes still stopping)."""
        return self.state in HOLDING_STATES


def expand_hostlist(expr: str) -> tuple[str, ...]:
    """``n[1-3,5],gpu7`` -> (n1, n2, n3, n5, gpu7); zero padding kept (``n[01-02]``)."""
    out: list[str] = []
    for m in _HOSTLIST.finditer(expr.replace(" ", "")):
        prefix, ranges = m.group(1), m.group(2)
        if not prefix and not ranges:
            continue
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise BadSlurmOutput(f"bad host list {expr!r}")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{len(lo)}d}")
    return tuple(out)


def _indices(spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def gpus_requested(per_node: str, per_job: str, node_count: int) -> int:
    m = _GPU_REQ.search(per_job or "")
    if m:
        return int(m.group(1))
    m = _GPU_REQ.search(per_node or "")
    return int(m.group(1)) * max(1, node_count) if m else 0


def tres(text: str) -> tuple[int, float]:
    """(CPUs, memory MB) of a TRES string ``cpu=2,mem=100M,node=1,billing=2``; 0 where absent."""
    cpus, mem = 0, 0.0
    for item in (text or "").split(","):
        k, _, v = item.partition("=")
        try:
            if k == "cpu":
                cpus = int(v)
            elif k == "mem" and v:
                mem = float(v[:-1]) * _MEM_UNITS[v[-1]] if v[-1] in _MEM_UNITS else float(v)
        except ValueError:
            raise BadSlurmOutput(f"TRES {text!r}: {item!r} is not a number") from None
    return cpus, mem


def _num(v: object, what: str, job: object) -> float:
    """v0.0.38 gives numbers, or null for "unset" (nice 0, no limit)."""
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadSlurmOutput(f"job {job}: {what} is {v!r}, not a number")
    return float(v)


def _signed32(v: int) -> int:
    """squeue --json (22.05) prints a negative Nice as its unsigned 32-bit value: -6 is
    4294967290 (seen in tests/system/slurm_faults/test_slurm_safety.py's quota reclaim, which
    lowers a Nice)."""
    return v - (1 << 32) if v >= 1 << 31 else v


def _uid(v: object) -> int | None:
    """squeue's user id (an int in --json, digits with -o %U); None when absent or odd."""
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 - 1 else None


# squeue --json's ``shared`` (22.05): "none" for --exclusive, "user"/"mcs" for --exclusive=user|mcs,
# "oversubscribe"/null otherwise. Any of the three keeps other users' jobs off the job's nodes.
EXCLUSIVE_SHARED = frozenset({"none", "user", "mcs"})


def _constraints(j: dict) -> str:
    """Requests beside GPUs, CPUs and memory that decide where (or whether) a job may start."""
    for key, what in (("features", "node features"), ("required_nodes", "named nodes"),
                      ("licenses", "licenses"), ("resv_name", "reservation")):
        v = j.get(key)
        if v and str(v) not in ("(null)", "None"):
            return f"asks for {what} ({str(v)[:60]})"
    return ""


def _id(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def parse_squeue_json(raw: bytes | str) -> list[SlurmJob]:
    """Pending and running jobs from ``squeue --json``."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise BadSlurmOutput(f"squeue --json is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise BadSlurmOutput("squeue --json has no 'jobs' list")
    if doc.get("errors"):
        raise BadSlurmOutput(f"squeue --json reports errors: {str(doc['errors'])[:200]}")
    out = []
    for j in doc["jobs"]:
        if not isinstance(j, dict):
            raise BadSlurmOutput("squeue --json: a job is not an object")
        state = j.get("job_state")
        if state not in ACTIVE_STATES:
            continue
        jid = j.get("job_id")
        if not isinstance(jid, int) or isinstance(jid, bool):
            raise BadSlurmOutput(f"squeue --json: job_id {jid!r} is not an integer")
        holds = state in HOLDING_STATES
        nodes = expand_hostlist(j.get("nodes") or "") if holds else ()
        detail = j.get("gres_detail") or []
        idx = []
        for d in detail if isinstance(detail, list) else []:
            m = _IDX.search(str(d))
            idx.append(_indices(m.group(1)) if m else ())
        gpus = gpus_requested(str(j.get("tres_per_node") or ""), str(j.get("tres_per_job") or ""),
                              int(_num(j.get("node_count"), "node_count", jid)))
        if holds and idx and sum(len(i) for i in idx):
            gpus = sum(len(i) for i in idx)
        limit = j.get("time_limit")
        cpus, mem = tres(str((j.get("tres_alloc_str") if holds else j.get("tres_req_str")) or ""))
        out.append(SlurmJob(
            id=jid, name=str(j.get("name") or ""), user=str(j.get("user_name") or ""),
            account=str(j.get("account") or ""), partition=str(j.get("partition") or ""),
            state=state, reason=str(j.get("state_reason") or "None"),
            nice=_signed32(int(_num(j.get("nice"), "nice", jid))),
            priority=int(_num(j.get("priority"), "priority", jid)),
            submit=_num(j.get("submit_time"), "submit_time", jid),
            start=_num(j.get("start_time"), "start_time", jid),
            time_limit_s=None if limit is None else _num(limit, "time_limit", jid) * 60.0,
            gpus=gpus, nodes=nodes, gpu_index=tuple(idx), user_id=_uid(j.get("user_id")),
            requeue=j.get("requeue") is not False,
            preempt_time=_num(j.get("preempt_time"), "preempt_time", jid),
            restarts=int(_num(j.get("restart_cnt"), "restart_cnt", jid)),
            cpus=cpus or int(_num(j.get("cpus"), "cpus", jid)), mem_mb=mem,
            node_count=max(1, int(_num(j.get("node_count"), "node_count", jid))),
            exclusive=str(j.get("shared") or "").lower() in EXCLUSIVE_SHARED,
            array_job_id=_id(j.get("array_job_id")), het_job_id=_id(j.get("het_job_id")),
            constraints=_constraints(j), qos=str(j.get("qos") or "")))
    return out


def limit_s(text: str) -> float | None:
    """squeue's %l: UNLIMITED (None), else Slurm's [days-]hours:minutes:seconds or
    minutes:seconds (``gpudiag.durations.slurm_duration``)."""
    if text in ("UNLIMITED", "INVALID", "NOT_SET", "Partition_Limit"):
        return None
    try:
        return slurm_duration(text)
    except ValueError:
        raise BadSlurmOutput(f"time limit {text!r}") from None


def _time(text: str) -> float:
    if text in ("N/A", "Unknown", "None", ""):
        return 0.0
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise BadSlurmOutput(f"time {text!r}") from None


def parse_squeue_fixed(text: str) -> list[SlurmJob]:
    """Pending and running jobs from ``squeue -h -o FIXED_FORMAT`` (no GPU indices in it)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        f = line.split("|", FIXED_FIELDS - 1)
        if len(f) != FIXED_FIELDS:
            raise BadSlurmOutput(f"squeue line {n}: {len(f)} fields, expected {FIXED_FIELDS}")
        jid, user, acct, part, state, reason, nice, prio, sub, start, limit, req, ncount, cpus, nodes, uid, \
            name = f
        if state not in ACTIVE_STATES:
            continue
        if not (jid.isdigit() and ncount.isdigit() and prio.isdigit() and nice.lstrip("-").isdigit()
                and cpus.isdigit()):
            raise BadSlurmOutput(f"squeue line {n}: not a job line: {line[:120]!r}")
        out.append(SlurmJob(
            id=int(jid), name=name, user=user, account=acct, partition=part, state=state, reason=reason,
            nice=int(nice), priority=int(prio), submit=_time(sub), start=_time(start),
            time_limit_s=limit_s(limit), gpus=gpus_requested(req, "", int(ncount)), cpus=int(cpus),
            node_count=max(1, int(ncount)),
            nodes=expand_hostlist(nodes) if state in HOLDING_STATES and nodes not in ("", "(null)") else (),
            user_id=_uid(uid)))
    return out
