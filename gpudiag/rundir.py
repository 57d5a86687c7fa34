"""The run directory: one folder per ``gpudiag profile`` run, readable after any crash.

    run.json        what ran, where, when, how it ended (schema-versioned)
    samples/        append-only JSONL: gpu.jsonl, host.jsonl, steps-rank-N.jsonl; and
                    bootstrap-rank-N.json, what the job's bootstrap did (incl. which steps it traced),
                    syncs-rank-N.json, the host syncs it saw in the window's warm-up step
    traces/         rank-N.json.gz, written whole or not at all
    diagnosis.json  the Diagnosis of what was collected

This module is the one place that knows this layout: every reader (analyzers, reports,
commands, benchmarks) asks it, so "is this a run dir", "where are its samples" and "which steps
were traced" have one answer each. Which untraced steps are a window's reference, and how long
they took, is ``gpudiag/steps.py``'s question, asked of the rows read here.

``run.json`` is rewritten atomically (write to a temp file, rename), so a reader sees the
old or the new version, never half of one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.census import SyncCensus, parse_census
from gpudiag.census import is_number as _num
from gpudiag.errors import BadInput

RUN_SCHEMA_VERSION = 1

# The layout above, by name: every other module reaches these files through the functions below
# (tests/unit/test_contract_literals.py finds a second spelling). The job-side bootstrap
# (collectors/torch_bootstrap.py and the modules it loads, which run without gpudiag installed)
# spells the names it writes itself; what it writes is read back through these names.
RUN_JSON = "run.json"
SAMPLES = "samples"
TRACES = "traces"
DIAGNOSIS_JSON = "diagnosis.json"
REPORT_HTML = "report.html"
GPU_SAMPLES = "gpu.jsonl"
HOST_SAMPLES = "host.jsonl"
STACKS = "stacks"
TRACE_GLOB = "rank-*.json.gz"


def samples_dir(run_dir: Path) -> Path:
    return run_dir / SAMPLES


def traces_dir(run_dir: Path) -> Path:
    return run_dir / TRACES


def trace_path(run_dir: Path, rank: int) -> Path:
    """One rank's Kineto trace."""
    return run_dir / TRACES / f"rank-{rank}.json.gz"


def rank_traces(run_dir: Path) -> list[Path]:
    """The run's traces, one per rank that wrote one, in name order."""
    return sorted((run_dir / TRACES).glob(TRACE_GLOB))


def diagnosis_path(run_dir: Path) -> Path:
    return run_dir / DIAGNOSIS_JSON


def report_path(run_dir: Path) -> Path:
    return run_dir / REPORT_HTML


def gpu_samples_path(run_dir: Path) -> Path:
    return run_dir / SAMPLES / GPU_SAMPLES


def host_samples_path(run_dir: Path) -> Path:
    return run_dir / SAMPLES / HOST_SAMPLES


def stacks_dir(run_dir: Path) -> Path:
    """Where the stall watch leaves each process's stacks (``pid-N.txt``)."""
    return run_dir / SAMPLES / STACKS


@dataclass
class RunInfo:
    command: list[str]
    cwd: str
    host: str
    start: float
    options: dict[str, Any]
    versions: dict[str, str]
    status: str = "running"  # running | completed | failed | killed | interrupted
    end: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    gpu_counters: str = "not started"  # "nvml", "replay:<file>", or "not sampled: <why>"
    pid: int | None = None
    last_step: int | None = None
    notes: list[str] = field(default_factory=list)
    sampler: dict[str, Any] = field(default_factory=dict)  # samples, cpu_seconds, wall_seconds
    # what was asked of CUPTI after trace windows, and per rank what was done (torch_cupti)
    cupti_teardown: dict[str, Any] = field(default_factory=dict)
    schema_version: int = RUN_SCHEMA_VERSION
    kind: str = "gpudiag-run"


def is_run_dir(path: Path) -> bool:
    """A ``gpudiag profile`` run directory (its run.json says so), as opposed to a trace folder.

    Any schema version counts: reading one this gpudiag does not know is then a clear error
    (``read_run``), not a silent fallback to "just traces"."""
    try:
        data = json.loads((path / RUN_JSON).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("kind") == "gpudiag-run"


def write_run(run_dir: Path, info: RunInfo) -> None:
    tmp = run_dir / f".{RUN_JSON}.partial"
    tmp.write_text(json.dumps(asdict(info), indent=1))
    os.replace(tmp, run_dir / RUN_JSON)


def read_run(run_dir: Path) -> RunInfo:
    path = run_dir / RUN_JSON
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a readable gpudiag run ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "gpudiag-run":
        raise BadInput(f"{path}: not a gpudiag run.json")
    if data.get("schema_version") != RUN_SCHEMA_VERSION:
        raise BadInput(f"{path}: run schema version {data.get('schema_version')!r} is not "
                       f"supported (this gpudiag reads {RUN_SCHEMA_VERSION})")
    known = set(RunInfo.__dataclass_fields__)
    return RunInfo(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class HostSample:
    """One row of samples/host.jsonl: averages over the time since the row before it."""

    t: float  # unix time at its end
    cores: float  # CPU cores the job's process tree used
    runq_cores: float  # cores' worth of time its processes waited runnable for a core
    machine_busy: float | None  # cores the whole machine kept busy (None: not recorded)
    # cores' worth all threads of the job's processes waited runnable for a core, and the
    # machine's runnable tasks (mean of instants): ``gpudiag.pace`` splits a wait by them (None:
    # recorded before the sampler read them)
    runq_threads: float | None = None
    runnable: float | None = None


def read_host_cpu(run_dir: Path) -> list[HostSample]:
    """samples/host.jsonl in time order (the first row's figures mean nothing: no interval yet)."""
    def num(v: Any) -> float | None:  # a JSON value
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    out = []
    for r in read_jsonl(host_samples_path(run_dir)):
        t, cores = num(r.get("t")), num(r.get("cpu_cores"))
        if t is not None and cores is not None:
            out.append(HostSample(t, cores, num(r.get("runq_cores")) or 0.0, num(r.get("machine_cores_busy")),
                                  num(r.get("runq_threads_cores")), num(r.get("machine_runnable"))))
    return sorted(out, key=lambda h: h.t)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Object rows of an append-only JSONL file. A torn line (a crash mid-write) or a
    missing file loses only that line or nothing: readers of run directories never fail
    on what a crash left behind."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (and its parts); BadInput if it cannot be written."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out {path}: exists and is not a folder; choose a new folder name")
    if path.exists() and any(path.iterdir()):
        raise BadInput(f"--out {path}: folder exists and is not empty; choose a new one")
    try:
        for sub in (SAMPLES, TRACES):
            (path / sub).mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise BadInput(f"--out {path}: cannot write there ({e.strerror or e})") from None
    return path


# -- what the job's bootstrap recorded --------------------------------------------------------

# Step rows carry a "profiler" key for every step the profiler touched (the bootstrap marks
# them as they happen); these are its values.
PROFILER_WARMUP = "warmup"  # profiler on, events discarded (torch's warm-up step)
PROFILER_TRACED = "traced"  # events kept in the trace
PROFILER_EXPORT = "export"  # the trace was written during this step (its wall time includes that)
# The first steps of any job are slow for reasons that have nothing to do with the profiler
# (allocator growth, cuDNN autotuning, lazy init, torch.compile): left out of the untraced
# reference so they do not drag its median.
STARTUP_STEPS = 2


@dataclass
class BootstrapMeta:
    """samples/bootstrap-rank-N.json: what the bootstrap saw and did in one rank."""

    rank: int
    steps_seen: int = 0
    skip: int = 0
    steps: int = 0
    torch: str | None = None
    notes: list[str] = field(default_factory=list)
    dataloader_workers: list[int] = field(default_factory=list)
    # the most batches one of the job's DataLoaders holds ready (num_workers x prefetch_factor):
    # the queue its workers fill while the traced steps run slow, and the steps after the window
    # drain (``steps.window_steps``); as the job's file said it: read with ``prefetch_depth``
    dataloader_prefetch: object = 0
    explicit_steps: bool = False
    traced_steps: list[int] = field(default_factory=list)  # job step numbers in the trace(s)
    windows: list[dict[str, Any]] = field(default_factory=list)  # one per trace window written
    cpus: int | None = None  # cores the job's process could run on
    intra_op_threads: int | None = None  # torch's intra-op threads as the job left them
    cupti_teardown: dict[str, Any] = field(default_factory=dict)  # the last window's (torch_cupti)
    # what reading the other threads' waits cost the job (collectors.thread_waits.PeerWaits.meta)
    thread_waits: dict[str, Any] = field(default_factory=dict)
    # microseconds one minor page fault cost the process (``collectors.page_faults``); None: not
    # measured (runs from before it was)
    fault_us: float | None = None
    # the job's OMP_WAIT_POLICY as it left it (None: unset, or runs from before it was read);
    # as the job's file said it: read with ``passive_policy``
    omp_wait_policy: object = None

    @property
    def passive_policy(self) -> bool:
        """Whether the job's OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE)."""
        return isinstance(self.omp_wait_policy, str) and self.omp_wait_policy.strip().upper() == "PASSIVE"


def read_bootstrap(run_dir: Path) -> dict[int, BootstrapMeta]:
    """Per rank, what its bootstrap recorded (ranks whose file is missing or torn are absent)."""
    out: dict[int, BootstrapMeta] = {}
    known = set(BootstrapMeta.__dataclass_fields__)
    for f in sorted(samples_dir(run_dir).glob("bootstrap-rank-*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("rank"), int):
            continue
        out[data["rank"]] = BootstrapMeta(**{k: v for k, v in data.items() if k in known})
    return out


# Bounds on what a job's census file may claim (a job's own file is a claim: bound every read).
MAX_CENSUS_BYTES = 4 << 20


def read_syncs(run_dir: Path, cwd: str | None = None) -> dict[int, SyncCensus]:
    """Per rank, the sync census its bootstrap wrote (``samples/syncs-rank-N.json``; torn,
    oversized or malformed files are left out, as missing ones). ``cwd``: the job's working
    directory; call sites under it are shown relative to it."""
    out: dict[int, SyncCensus] = {}
    for f in sorted(samples_dir(run_dir).glob("syncs-rank-*.json")):
        try:
            if f.stat().st_size > MAX_CENSUS_BYTES:
                continue
            rec = parse_census(json.loads(f.read_text()), cwd)
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            continue
        if rec is not None:
            out[rec.rank] = rec
    return out


@dataclass
class StepRow:
    step: int
    t: float  # unix time at the end of the step
    dt: float  # wall seconds of the step
    profiler: str | None = None  # None, or one of the PROFILER_* values
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    # the thread that ended the step (the training loop's), over the step, from its schedstat:
    # seconds on a core, and seconds runnable but waiting for one (None: not recorded, as in
    # run directories written before the step timer read them)
    run_s: float | None = None
    wait_s: float | None = None
    # the times that thread was put on a core over the step (schedstat's third field: each wake
    # from a sleep, each return after a preemption); None: not recorded (runs written before)
    slices: int | None = None
    # CPU seconds the collectives' own threads (gloo's) ran over the step; None: none ran, or
    # not recorded (``collectors.torch_collectives.CommThreads``)
    comm_cpu_s: float | None = None
    # the largest wait for a core of the job's other threads over the step (intra-op threads,
    # DataLoader workers: ``collectors.thread_waits``; a read that covered several steps is
    # spread over them); None: not recorded
    peer_wait_s: float | None = None
    # that thread's seconds on a core over the same read (its run is the job's own work, which
    # the training thread would wait for on a quiet machine too); None: not recorded (runs
    # written before the step timer read it)
    peer_run_s: float | None = None
    # the job's DataLoader workers over the step (the same reads, spread the same way): all
    # their threads' seconds on a core, and each worker's busiest thread's seconds on a core or
    # runnable waiting for one, summed over the workers (in steady state a batch's time: its
    # pace); None: no workers read, or not recorded (runs written before the step timer read them)
    workers_run_s: float | None = None
    workers_busy_s: float | None = None
    # at the job's own pace (``gpudiag.pace.at_own_pace``): the part of the wall step other
    # processes took, ``dt`` then being the rest; 0 in rows as the step timer wrote them
    machine_s: float = 0.0
    # the training thread's time in next(loader) over the step (the step timer's DataLoader
    # hook): wall seconds, seconds on a core, seconds runnable waiting for one; the rest it was
    # blocked (storage, a sleep, the workers' queue). None: no batch asked for, or not recorded
    input_s: float | None = None
    input_run_s: float | None = None
    input_wait_s: float | None = None
    # seconds the training process's main thread spent in torch.save over the step (0: none)
    save_s: float = 0.0
    # the whole process over the step (``collectors.page_faults``): minor page faults, seconds
    # in the kernel, seconds on a core (all threads); None: not recorded
    minflt: int | None = None
    sys_s: float | None = None
    cpu_s: float | None = None

    @property
    def input_blocked_s(self) -> float | None:
        """Seconds of the loader wait the thread was neither on a core nor waiting for one."""
        if self.input_s is None or self.input_run_s is None or self.input_wait_s is None:
            return None
        return max(0.0, self.input_s - self.input_run_s - self.input_wait_s)


def collective_wait(c: object) -> float:
    """Seconds a step waited for one collective type (a step row's ``collectives`` entry): its
    ``exposed`` seconds, else its time; nothing for an entry a torn or hostile file made."""
    if not isinstance(c, dict):
        return 0.0
    v = c.get("exposed", c.get("seconds", 0.0))
    return float(v) if _num(v) and v > 0 else 0.0


def collectives_wait_s(r: StepRow) -> float:
    """Seconds the step's thread waited in collectives, over every type."""
    return sum(collective_wait(c) for c in r.collectives.values())


def read_steps(run_dir: Path, boot: dict[int, BootstrapMeta] | None = None,
               rank: int | None = None) -> dict[int, list[StepRow]]:
    """Per rank (or only ``rank``), the step timer's rows (torn or malformed lines are skipped),
    each marked with what the profiler did in that step."""
    boot = read_bootstrap(run_dir) if boot is None else boot
    out: dict[int, list[StepRow]] = {}
    for f in sorted(samples_dir(run_dir).glob(f"steps-rank-{'*' if rank is None else rank}.jsonl")):
        try:
            rank = int(f.name[len("steps-rank-"):-len(".jsonl")])
        except ValueError:
            continue
        rows = []
        for r in read_jsonl(f):
            step, t, dt = r.get("step"), r.get("t"), r.get("dt")
            if not isinstance(step, int) or not _num(t) or not _num(dt):
                continue
            prof = r.get("profiler")
            colls = r.get("collectives")
            run_s, wait_s, peer = r.get("run_s"), r.get("wait_s"), r.get("peer_wait_s")
            peer_run = r.get("peer_run_s")
            workers_run, workers_busy = r.get("workers_run_s"), r.get("workers_busy_s")
            workers = (float(workers_run), float(workers_busy)) if (
                _num(peer) and peer >= 0 and _num(workers_run) and workers_run >= 0
                and _num(workers_busy) and workers_busy >= 0) else (None, None)
            comm_cpu = r.get("comm_cpu_s")
            rows.append(StepRow(step=step, t=float(t), dt=float(dt),
                                profiler=prof if isinstance(prof, str) else None,
                                collectives=colls if isinstance(colls, dict) else {},
                                run_s=float(run_s) if _num(run_s) and run_s >= 0 else None,
                                wait_s=float(wait_s) if _num(wait_s) and wait_s >= 0 else None,
                                slices=sl if type(sl := r.get("slices")) is int and sl >= 0 else None,
                                comm_cpu_s=float(comm_cpu) if _num(comm_cpu) and comm_cpu >= 0 else None,
                                peer_wait_s=float(peer) if _num(peer) and peer >= 0 else None,
                                peer_run_s=float(peer_run) if _num(peer) and peer >= 0
                                and _num(peer_run) and peer_run >= 0 else None,
                                workers_run_s=workers[0], workers_busy_s=workers[1],
                                save_s=_save_s(r.get("save_s")),
                                **_input_times(r), **_usage(r)))
            over = r.get("peer_steps")
            if rows[-1].peer_wait_s is not None and isinstance(over, int) and over > 1:
                _spread_peer_wait(rows, over)
        if rank in boot and not any(r.profiler for r in rows):
            _mark_legacy_window(rows, boot[rank])
        out[rank] = rows
    return out


def _save_s(v: object) -> float:
    return float(v) if _num(v) and v > 0 else 0.0


def _usage(r: dict[str, Any]) -> dict[str, Any]:
    """The process's faults and CPU times over the step, where all three are recorded and sane."""
    f, sys_s, cpu_s = r.get("minflt"), r.get("sys_s"), r.get("cpu_s")
    if isinstance(f, int) and f >= 0 and _num(sys_s) and sys_s >= 0 and _num(cpu_s) and cpu_s >= 0:
        return {"minflt": f, "sys_s": float(sys_s), "cpu_s": float(cpu_s)}
    return {}


def _input_times(r: dict[str, Any]) -> dict[str, Any]:
    """The loader-wait fields of a step row, each a non-negative number or left out."""
    out = {}
    for k in ("input_s", "input_run_s", "input_wait_s"):
        v = r.get(k)
        if _num(v) and v >= 0:
            out[k] = float(v)
    return out if len(out) == 3 else {}


def _spread_peer_wait(rows: list[StepRow], over: int) -> None:
    """The last row's other threads' wait (and that thread's run, and the workers' run) was read
    over ``over`` steps (the reads' budget): each of them, the last and the rows before it that
    have none, gets an even part."""
    last = rows[-1]
    if last.peer_wait_s is None:  # the caller spreads only a wait that was read
        return
    parts = {k: (v / over if (v := getattr(last, k)) is not None else None)
             for k in ("peer_wait_s", "peer_run_s", "workers_run_s", "workers_busy_s")}
    for r in [*rows[-over:-1], last]:
        if r is last or r.peer_wait_s is None:
            for k, v in parts.items():
                setattr(r, k, v)


def _mark_legacy_window(rows: list[StepRow], meta: BootstrapMeta) -> None:
    """Run directories written before the bootstrap marked its rows (gpudiag 0.1 runs): the one
    window it opened after ``skip`` steps was a warm-up step, ``steps`` traced steps, and the
    export inside the step after them. Only for those; new runs carry the marks."""
    if meta.steps <= 0:
        return
    first = meta.skip + 1
    for r in rows:
        if r.step == first:
            r.profiler = PROFILER_WARMUP
        elif first < r.step <= first + meta.steps:
            r.profiler = PROFILER_TRACED
        elif r.step == first + meta.steps + 1:
            r.profiler = PROFILER_EXPORT


def last_step(run_dir: Path) -> int | None:
    steps = [r.step for rows in read_steps(run_dir).values() for r in rows]
    return max(steps) if steps else None
