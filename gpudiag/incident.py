"""A stall incident: the evidence gathered from every rank, the verdict, and where they are kept.

One home for the incident's contract. ``collectors/stall_monitor.py`` (while the job runs) and
``gpudiag hang-report`` (Flight Recorder dumps PyTorch wrote on its own) build an ``Evidence``;
``analyzers/hang.py`` turns it into a ``Verdict``; ``reports/incident.py`` renders both; the
node agent, ``top``, ``fleet`` and the schedulers carry only the verdict's ``kind`` (``CAUSES``),
as the stall's cause.

In a run directory::

    incidents/<N>/incident.json   Incident: evidence, verdict, and how it ended (schema-versioned)
    incidents/<N>/incident.html   the incident page
    incidents/<N>/rank-<R>.json   what rank R's own watcher answered (Python stacks, Flight Recorder)
    samples/stall-request.json    the request those answer ({"id": N})
    samples/stacks/pid-<P>.txt    faulthandler's dumps of process P (on the stack signal, or a crash)
    samples/blackbox-rank-<R>.bin rank R's black box (collectors/blackbox.py)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.codec import JsonValue, decode
from gpudiag.errors import BadInput

INCIDENT_SCHEMA_VERSION = 1
INCIDENT_KIND = "gpudiag-incident"
# a stall's cause: the verdict's kind; short words, exported as a label value by the agent
CAUSES = ("hung", "desync", "mismatch", "deadlock", "idle", "busy", "exited", "unknown")
STRAGGLER = "straggler"   # the one verdict that is not a stall: every step is slow, none stuck
NO_STEPS = "no-steps"     # the cause while the evidence is still being read
MAX_INCIDENTS = 20        # per run: a job that stalls and resumes all day keeps only the first ones


@dataclass
class Frame:
    file: str
    line: int
    func: str
    code: str = ""                # the source line, where the file was readable when collected

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line} {self.func}"


@dataclass
class ThreadStack:
    name: str                     # the Python thread's name ("?" where only faulthandler saw it)
    ident: str                    # "0x..." as faulthandler and threading print it
    frames: list[Frame] = field(default_factory=list)   # innermost first
    source: str = "python"        # python (the rank's watcher) | faulthandler (the signal) | none
    main: bool = False
    native_id: int | None = None
    state: str | None = None      # the kernel's: R running, S sleeping, D disk wait, ...
    wchan: str | None = None      # the kernel function it sleeps in
    syscall: str | None = None    # the system call it is blocked in (read, futex, ...)
    cpu_s: float | None = None    # CPU seconds it used while the evidence was read


@dataclass
class ProcessInfo:
    pid: int
    role: str                     # rank | dataloader worker | child
    rank: int | None = None
    ppid: int | None = None
    alive: bool = True
    state: str | None = None
    cpu_s: float | None = None    # CPU seconds over the evidence window (all threads)
    window_s: float | None = None
    threads: list[ThreadStack] = field(default_factory=list)
    answered: bool = False        # its watcher thread answered (Python stacks, Flight Recorder)
    crash: str | None = None      # a fatal error faulthandler recorded ("Aborted")


@dataclass
class Collective:
    source: str                   # black box | flight recorder
    pg: str                       # the process group's name ("0": the default group)
    seq: int                      # per group, from 1
    op: str
    state: str                    # in flight | completed | raised | issued (async)
    shape: str = ""
    dtype: str = ""
    entered: float | None = None  # unix time
    done: float | None = None
    step: int | None = None       # the rank's step counter when it was called
    pg_desc: str = ""
    where: Frame | None = None    # the job's line that called it (Flight Recorder's stack)


@dataclass
class RankState:
    rank: int
    pid: int | None = None
    alive: bool = True
    step: int = 0
    last_step_t: float | None = None
    median_step_s: float | None = None
    phase: str | None = None
    phase_since: float | None = None
    stalled_s: float | None = None   # seconds without a step when the evidence was read
    limit_s: float | None = None
    limit_why: str = ""
    collectives: list[Collective] = field(default_factory=list)   # oldest first
    fr_status: dict[str, dict[str, int]] = field(default_factory=dict)  # pg -> last_enqueued/_completed
    fr_note: str | None = None       # why there is no Flight Recorder record
    processes: list[ProcessInfo] = field(default_factory=list)   # the rank's own first


@dataclass
class GpuActivity:
    gpu: int
    samples: int
    util: float | None = None        # mean NVML utilisation over the stall, 0..1
    sm_active: float | None = None   # mean SM activity (GPM), 0..1


@dataclass
class Evidence(JsonValue):
    id: str
    source: str                      # stall (the live watch) | exit (the job ended) | dumps | steps
    detected_at: float
    ranks: list[RankState] = field(default_factory=list)
    gpus: list[GpuActivity] = field(default_factory=list)
    job_cores: float | None = None   # CPU cores the job's processes used during the stall
    machine_busy: float | None = None
    rule: str = ""                   # the stall limit as applied, in words
    notes: list[str] = field(default_factory=list)
    # per rank, the recent steps (rank -> [[step, end unix time, seconds, seconds in collectives]])
    timeline: dict[str, list[list[float]]] = field(default_factory=dict)


@dataclass
class WaveRow:
    """One rank's place in one process group at the wavefront."""

    pg: str
    rank: int
    entered: int                     # the last collective it entered (seq)
    completed: int                   # the last it completed
    op: str = ""                     # the op at ``entered``
    shape: str = ""
    state: str = ""                  # waiting | behind | ahead | idle | gone
    for_s: float | None = None


@dataclass
class Verdict(JsonValue):
    kind: str                        # one of CAUSES, or STRAGGLER
    headline: str                    # one line, as the terminal prints it
    details: list[str] = field(default_factory=list)
    culprits: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    pg: str | None = None
    seq: int | None = None
    op: str | None = None
    where: str | None = None         # "file.py:88 __getitem__"
    for_s: float | None = None
    wavefront: list[WaveRow] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)   # what decided it


@dataclass
class Incident(JsonValue):
    evidence: Evidence
    verdict: Verdict
    resolved_at: float | None = None     # steps resumed (a pause), or the job ended
    resolution: str | None = None
    schema_version: int = INCIDENT_SCHEMA_VERSION
    kind: str = INCIDENT_KIND


# frames that are not the job's own code: torch, the standard library, installed packages, and
# gpudiag's own wrappers in the job (its collectives' timing and black box, the bootstrap)
_LIBRARY = ("/torch/", "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen")
_OBSERVER = ("stall_watch.py", "torch_collectives.py", "torch_bootstrap.py", "sitecustomize.py",
             "torch_cupti.py")


def is_job_code(f: Frame) -> bool:
    if any(p in f.file for p in _LIBRARY):
        return False
    return not (os.path.basename(f.file) in _OBSERVER and "collectors" in f.file)


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame of the job's own code."""
    return next((f for f in frames if is_job_code(f)), None)


def incidents_dir(run_dir: Path) -> Path:
    return run_dir / "incidents"


def request_path(run_dir: Path) -> Path:
    return run_dir / "samples" / "stall-request.json"


def stacks_path(run_dir: Path, pid: int) -> Path:
    return run_dir / "samples" / "stacks" / f"pid-{pid}.txt"


def write_incident(folder: Path, inc: Incident) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".incident.json.partial"
    tmp.write_text(inc.to_json(indent=1))
    tmp.replace(folder / "incident.json")
    return folder / "incident.json"


def read_incident(path: Path) -> Incident:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a readable incident ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != INCIDENT_KIND:
        raise BadInput(f"{path}: not a gpudiag incident")
    if data.get("schema_version") != INCIDENT_SCHEMA_VERSION:
        raise BadInput(f"{path}: incident schema version {data.get('schema_version')!r} is not "
                       f"supported (this gpudiag reads {INCIDENT_SCHEMA_VERSION})")
    try:
        return decode(Incident, data)
    except (TypeError, ValueError, KeyError) as e:
        raise BadInput(f"{path}: incident is malformed: {e}") from None


def list_incidents(run_dir: Path) -> list[Path]:
    """The run's incident files, in the order they happened."""
    def key(p: Path) -> tuple[int, str]:
        name = p.parent.name
        return (int(name), name) if name.isdigit() else (10**9, name)

    return sorted(incidents_dir(run_dir).glob("*/incident.json"), key=key)


def read_rank_answer(path: Path) -> dict[str, Any] | None:
    """A rank watcher's answer (``collectors/stall_watch.write_evidence``), or None."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
