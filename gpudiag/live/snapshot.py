"""One moment of the fleet as ``gpudiag top`` shows it: pure functions from what the agents
exported (and the scheduler's queue) to a ``Snapshot`` of devices and jobs.

Nothing here reads a socket, a file or a clock: the view, ``--once --json`` and the tests all
build the same value from the same reads, and the UI only renders it.

Jobs are ordered by wasted GPU-time, ``GPUs x (1 - MFU / class median)``: the GPU-equivalents
a job holds beyond what a job of its size typically turns into model FLOPs, so a large job a
little below the median and a small one far below it compare on one scale. Classes are the
scheduler's (1, 2-8, >8 GPUs, ``scheduler.priority.job_class``); the median is over the jobs in
view, and a class with fewer than MIN_CLASS_JOBS jobs with an MFU is compared with the median of
all of them instead (the median of one job is itself, which would call no lone job wasteful).
Negative waste means better than that median. A stalled job (no step for its limit: the agent's
``gpudiag_job_stalled_seconds``) wastes every GPU it holds, and is left out of the medians. A
metric no series carries is None ("n/a" on
screen), never 0: a GPU without GPM has no SM activity, which is not the same as idle SMs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from gpudiag import contract as c
from gpudiag.live.sources import NodeRead, QueueRead
from gpudiag.rundir import REPORT_HTML

SNAPSHOT_SCHEMA_VERSION = 1
MIN_CLASS_JOBS = 3
# where an agent exported the job's owner, by the label it used (uid or user name)
OWNER_LABELS = ("owner", "user", "owner_uid", "uid")
ACTIVE_STATES = ("starting", "running", "stopping")  # scheduler jobs that hold their GPUs

# per-GPU series -> DeviceRow field (agent/gpu_collector.py names them)
_GPU_FIELDS = {
    c.GPU_SM_ACTIVITY: "sm_active",
    c.GPU_TENSOR_ACTIVITY: "tensor_active",
    c.GPU_DRAM_BANDWIDTH: "dram_bw",
    c.GPU_MEMORY_USED: "mem_used_bytes",
    c.GPU_MEMORY_TOTAL: "mem_total_bytes",
    c.GPU_POWER: "power_watts",
    c.GPU_UTILIZATION: "util",
}
_GPU_PAIRS = {  # transmit + receive, summed
    c.GPU_NVLINK_TX: "nvlink_bytes_s",
    c.GPU_NVLINK_RX: "nvlink_bytes_s",
    c.GPU_PCIE_TX: "pcie_bytes_s",
    c.GPU_PCIE_RX: "pcie_bytes_s",
}
# per-job series -> JobRow field (agent/job_table.py names them)
_JOB_FIELDS = {
    c.JOB_STEP_SECONDS: "step_seconds",
    c.JOB_MFU: "mfu",
    c.JOB_CONFIDENCE: "confidence",
    c.JOB_DILATION: "dilation",
    c.JOB_SIGNAL_AGE: "signal_age_seconds",
    c.JOB_INPUT_WAIT: "input_wait",
}


@dataclass
class DeviceRow:
    node: str
    gpu: str
    model: str
    up: bool
    sm_active: float | None = None  # ratios 0..1
    tensor_active: float | None = None
    dram_bw: float | None = None  # DRAM bandwidth used over its peak
    util: float | None = None  # legacy "a kernel was running"
    nvlink_bytes_s: float | None = None  # transmit + receive
    pcie_bytes_s: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    power_watts: float | None = None
    jobs: str = ""  # the job ids on it, comma-separated ("" when none)


@dataclass
class JobRow:
    job_id: str
    nodes: str = ""  # comma-separated
    owner: str | None = None
    gpus: int | None = None
    step_seconds: float | None = None
    mfu: float | None = None
    label: str | None = None
    confidence: float | None = None
    dilation: float | None = None
    signal_age_seconds: float | None = None  # age of the trace behind label and FLOPs
    last_signal_seconds_ago: float | None = None
    input_wait: float | None = None
    job_class: str | None = None
    class_median_mfu: float | None = None
    median_of: str | None = None  # the class, or "all jobs" when the class had too few
    waste_gpus: float | None = None
    tier: str | None = None  # from the local scheduler, when it runs the job
    reason: str | None = None
    state: str | None = None
    run_dir: str | None = None
    ended_seconds_ago: float | None = None  # the job reported its end (None: still running)
    # no step for this long, past the job's stall limit (None: not stalled), and why
    stalled_seconds: float | None = None
    stall_cause: str | None = None

    @property
    def ended(self) -> bool:
        return self.ended_seconds_ago is not None

    @property
    def report_path(self) -> str | None:
        return f"{self.run_dir.rstrip('/')}/{REPORT_HTML}" if self.run_dir else None


@dataclass
class Snapshot:
    """``--once --json`` prints ``to_dict()``: flat records, so ``pandas.DataFrame(doc["jobs"])``
    is a table with one column per field."""

    taken_at: float
    devices: list[DeviceRow] = field(default_factory=list)
    jobs: list[JobRow] = field(default_factory=list)
    sources: list[dict[str, str | None]] = field(default_factory=list)  # {"source", "error"}
    scheduler: str = ""  # one line: what the local scheduler said, or why there is none
    schema_version: int = SNAPSHOT_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for row, j in zip(d["jobs"], self.jobs, strict=True):
            row["report_path"] = j.report_path
        return {k: _finite(v) for k, v in d.items()}


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def _owner_name(raw: str) -> str:
    """A uid becomes its user name where this machine knows it (the view runs beside the agent
    in the common case); otherwise it stays "uid N"."""
    if not raw.isdigit():
        return raw
    import pwd

    try:
        return pwd.getpwuid(int(raw)).pw_name
    except (KeyError, OverflowError):
        return f"uid {raw}"


def _devices(read: NodeRead) -> tuple[list[DeviceRow], dict[str, set[tuple[str, str]]]]:
    """The node's GPUs, and per job id the GPUs (node, gpu) its series name."""
    rows: dict[str, DeviceRow] = {}
    values: dict[str, dict[str, float]] = {}  # gpu -> series -> value (hpc_job copies carry one)
    jobs_on: dict[str, list[str]] = {}
    for s in read.samples:
        if not s.name.startswith(c.GPU_PREFIX) or "gpu" not in s.labels:
            continue
        gpu = s.labels["gpu"]
        if gpu not in rows:
            rows[gpu] = DeviceRow(node=read.node, gpu=gpu, model=s.labels.get("model", ""), up=False)
        values.setdefault(gpu, {}).setdefault(s.name, s.value)
        job = s.labels.get("job_id", "")
        if job and job != "multiple" and job not in jobs_on.setdefault(gpu, []):
            jobs_on[gpu].append(job)
    by_job: dict[str, set[tuple[str, str]]] = {}
    for gpu, row in rows.items():
        v = values[gpu]
        row.up = v.get(c.GPU_UP) == 1
        for name, attr in _GPU_FIELDS.items():
            setattr(row, attr, v.get(name))
        for name, attr in _GPU_PAIRS.items():
            if name in v:
                setattr(row, attr, (getattr(row, attr) or 0.0) + v[name])
        row.jobs = ",".join(jobs_on.get(gpu, []))
        for j in jobs_on.get(gpu, []):
            by_job.setdefault(j, set()).add((read.node, gpu))
    ordered = sorted(rows.values(), key=lambda r: (int(r.gpu) if r.gpu.isdigit() else math.inf, r.gpu))
    return ordered, by_job


def _owner_of(labels: dict[str, str]) -> str | None:
    for key in OWNER_LABELS:
        if labels.get(key):
            return _owner_name(labels[key])
    return None


def _jobs_of(read: NodeRead, now: float) -> dict[tuple[str, str | None], JobRow]:
    """One row per (job id, owner): a job is its id and the user who wrote its signals (the
    agent's identity), so another user's signals naming the same id never mix into its row."""
    rows: dict[tuple[str, str | None], JobRow] = {}
    for s in read.samples:
        job = s.labels.get("job_id")
        if not job or not s.name.startswith(c.JOB_PREFIX):
            continue
        owner = _owner_of(s.labels)
        row = rows.setdefault((job, owner), JobRow(job_id=job, nodes=read.node, owner=owner))
        if s.name in _JOB_FIELDS:
            setattr(row, _JOB_FIELDS[s.name], s.value)
        elif s.name == c.JOB_BOTTLENECK and s.value == 1:
            row.label = s.labels.get("label")
        elif s.name == c.JOB_LAST_SIGNAL:
            row.last_signal_seconds_ago = max(0.0, now - s.value)
        elif s.name == c.JOB_RUN_INFO and s.labels.get("run_dir"):
            row.run_dir = s.labels["run_dir"]
        elif s.name == c.JOB_ENDED:
            row.ended_seconds_ago = max(0.0, now - s.value)
        elif s.name == c.JOB_STALLED:
            row.stalled_seconds, row.stall_cause = s.value, s.labels.get("cause") or None
    return rows


def _rows_named(jobs: dict[tuple[str, str | None], JobRow], job_id: str,
                owner: str | None = None) -> list[JobRow]:
    """The rows of ``job_id`` (of ``owner`` where one is given, or of no known owner); a new
    row when there is none."""
    rows = [r for (j, o), r in jobs.items() if j == job_id and (owner is None or o in (owner, None))]
    if not rows:
        rows = [jobs.setdefault((job_id, owner), JobRow(job_id=job_id, owner=owner))]
    return rows


def _merge(old: JobRow, new: JobRow) -> JobRow:
    """A job two agents report (a multi-node job): the fresher report's values, both nodes."""

    def age(j: JobRow) -> float:
        return math.inf if j.last_signal_seconds_ago is None else j.last_signal_seconds_ago

    fresher, other = (new, old) if age(new) < age(old) else (old, new)
    for f in ("owner", "run_dir", "label"):
        if getattr(fresher, f) is None:
            setattr(fresher, f, getattr(other, f))
    fresher.nodes = ",".join(sorted(set(filter(None, f"{old.nodes},{new.nodes}".split(",")))))
    return fresher


def _apply_queue(jobs: dict[tuple[str, str | None], JobRow], queue: QueueRead) -> None:
    """Tier, reason, owner and (where no GPU series names the job) size from the scheduler: to
    the job's rows of its submitter (or of no known owner), never to another user's row of the
    same id."""
    for q in queue.jobs:
        if q.get("state") not in ACTIVE_STATES:
            continue
        job_id = f"{queue.prefix}:{q['id']}"
        for row in _rows_named(jobs, job_id, q.get("user")):
            _queue_row(row, q, queue)


def _queue_row(row: JobRow, q: dict[str, Any], queue: QueueRead) -> None:
    from gpudiag.scheduler.model import TIER_NAMES, Tier

    row.tier = TIER_NAMES.get(Tier(q["tier"]), str(q["tier"])) if "tier" in q else None
    row.reason = q.get("why")
    row.state = q.get("state")
    row.owner = row.owner or q.get("user")
    if row.gpus is None and isinstance(q.get("gpus"), int):
        row.gpus = q["gpus"]
    if row.run_dir is None and queue.state_dir is not None and q.get("attempt"):
        row.run_dir = str(queue.state_dir / "jobs" / str(q["id"]) / f"run-{q['attempt']}")


def _waste(jobs: list[JobRow]) -> None:
    from gpudiag.scheduler.priority import job_class

    for j in jobs:
        if j.gpus and j.stalled_seconds is not None:   # no step: every GPU it holds is wasted,
            j.waste_gpus = float(j.gpus)               # whatever its peers do
    # (job, its GPUs, its MFU) of the jobs that step and report an MFU
    sized = [(j, j.gpus, j.mfu) for j in jobs if j.gpus and j.mfu is not None and j.stalled_seconds is None]
    by_class: dict[str, list[float]] = {}
    for j, gpus, mfu in sized:
        j.job_class = job_class(gpus)
        by_class.setdefault(j.job_class, []).append(mfu)
    every = [mfu for _, _, mfu in sized]
    for j, gpus, mfu in sized:
        mine = by_class[job_class(gpus)]
        if len(mine) >= MIN_CLASS_JOBS:
            median, j.median_of = statistics.median(mine), job_class(gpus)
        else:
            median, j.median_of = statistics.median(every), "all jobs"
        j.class_median_mfu = median
        if median > 0:
            j.waste_gpus = gpus * (1.0 - mfu / median)


def build_snapshot(reads: list[NodeRead], queue: QueueRead | None, now: float,
                   source_errors: list[dict[str, str | None]] | None = None) -> Snapshot:
    """Devices of every node read, and every job an agent reports or the scheduler runs, in
    waste order."""
    snap = Snapshot(taken_at=now, sources=list(source_errors or []))
    jobs: dict[tuple[str, str | None], JobRow] = {}
    gpus_of: dict[str, set[tuple[str, str]]] = {}
    for read in reads:
        snap.sources.append({"source": read.node, "error": read.error})
        devices, by_job = _devices(read)
        snap.devices.extend(devices)
        for job, where in by_job.items():
            gpus_of.setdefault(job, set()).update(where)
        for key, row in _jobs_of(read, now).items():
            jobs[key] = _merge(jobs[key], row) if key in jobs else row
    for job, where in gpus_of.items():
        # the agent refuses signals for a job from anyone but its processes' user, so while the
        # job holds GPUs its rows are its owner's
        for row in _rows_named(jobs, job):
            nodes = {node for node, _ in where} | set(filter(None, row.nodes.split(",")))
            row.nodes = ",".join(sorted(nodes))
            row.gpus = len(where)
    if queue is not None:
        if queue.error is None:
            _apply_queue(jobs, queue)
            active = sum(1 for q in queue.jobs if q.get("state") in ACTIVE_STATES)
            pending = sum(1 for q in queue.jobs if q.get("state") == "pending")
            snap.scheduler = f"scheduler at {queue.state_dir}: {active} running, {pending} pending"
        else:
            snap.scheduler = f"scheduler: {queue.error}"
    _waste(list(jobs.values()))
    snap.jobs = sort_jobs(list(jobs.values()), "waste")
    return snap


# sort keys: (field, largest first); None sorts last whatever the direction
SORT_KEYS: dict[str, tuple[str, bool]] = {
    "waste": ("waste_gpus", True),
    "mfu": ("mfu", False),
    "step": ("step_seconds", True),
    "gpus": ("gpus", True),
    "age": ("signal_age_seconds", True),
    "owner": ("owner", False),
    "job": ("job_id", False),
}


def sort_jobs(jobs: list[JobRow], key: str, reverse: bool = False) -> list[JobRow]:
    """Jobs by one of SORT_KEYS (``reverse`` flips its direction); ties by job id; rows without
    the value last."""
    attr, desc = SORT_KEYS[key]
    desc ^= reverse
    known = [j for j in jobs if getattr(j, attr) is not None]
    unknown = sorted((j for j in jobs if getattr(j, attr) is None), key=lambda j: j.job_id)
    known.sort(key=lambda j: j.job_id)
    known.sort(key=lambda j: getattr(j, attr), reverse=desc)
    return known + unknown


def drop_shown_ended(snap: Snapshot, shown: set[tuple[str, str | None]]
                     ) -> set[tuple[str, str | None]]:
    """Leave out of ``snap`` the ended jobs a previous refresh already showed (``shown``), and
    return the ended jobs this one shows: an ended job is shown once, marked, with its last
    values, then dropped, although its agent keeps exporting it a while for Prometheus."""
    snap.jobs = [j for j in snap.jobs if not (j.ended and (j.job_id, j.owner) in shown)]
    return {(j.job_id, j.owner) for j in snap.jobs if j.ended}


def filter_owner(jobs: list[JobRow], owner: str) -> list[JobRow]:
    """The jobs of ``owner`` (exact user name or uid; "" keeps every job)."""
    return [j for j in jobs if not owner or j.owner == owner]
