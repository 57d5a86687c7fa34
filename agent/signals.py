"""Job signals and the agent's job table: their formats, validation and files.

Intake is a spool directory, local only: a job writes one small JSON file (atomically, by
rename) and the agent ingests it within a second (agent/job_table.py, agent/server.py). No
socket to attack from the network, nothing executed, every file size-limited and validated
here; a bad file is logged, counted and deleted, never fatal.

A signal's writer is its file's owner, as the kernel reports it (``fstat`` of the opened file),
never a field of the JSON. A job's identity is (``job_id``, ``owner_uid``): a job id is per
owner, so one user's file can only ever land in that user's own job.

The agent persists its table of jobs in ``STATE_DIR/jobs.json`` (``write_job_table``): a
versioned document replaced atomically (write a temporary file, fsync, rename), so another
process — the embedded scheduler's ``SignalSource`` — can read it at any moment with
``read_job_table`` and see either the previous table or the next one, never half of one.

``jobs.json``, schema 3::

    {"schema_version": 3, "kind": "gpudiag-job-table", "written_at": <unix time>,
     "jobs": [{"job_id", "owner_uid", "ts", "received_at", "signals_applied",
               "step_seconds", "mfu_ratio", "bottleneck", "confidence", "mfu_confidence", "traced_at",
               "dilation", "traced_steps", "input_wait_ratio",
               "run_dir", "collective_seconds_total", "ended", "last_step_at", "stall_after_s",
               "stall_cause"}, ...]}

``owner_uid`` is the uid that wrote the job's signals (a job id appears once per owner), ``ts``
the job's own time of its last applied signal, ``received_at`` the agent's time when it
applied it. Older tables are still read: in schema 2 a null owner meant "only root reported"
(read as uid 0); schema 1 had no owners, and its jobs keep ``owner_uid`` None, which no
scheduler attributes to any job.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.jobsignal import (
    ACCEPTED_SIGNAL_VERSIONS,
    MAX_JOB_ID,
    MAX_RUN_DIR,
    clean_job_id,
    valid_run_dir,
)

MAX_SIGNAL_BYTES = 16 * 1024
MAX_COLLECTIVES = 16
LABELS = {"compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound",
          "unknown"}
JOB_TABLE_SCHEMA_VERSION = 3
JOB_TABLE_KIND = "gpudiag-job-table"
_READABLE_TABLE_VERSIONS = (1, 2, 3)
# plausibility bounds: anything outside is a broken or hostile writer, not a measurement
MAX_UNIX_TIME = 1e11  # year ~5138
MAX_STEP_SECONDS = 1e6
MAX_DILATION = 1e6
MAX_TRACED_STEPS = 10**9
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no uid" to the kernel
# A job writes its signal on the agent's own machine, so by the agent's clock its ``ts`` is in
# the past; a few seconds of slack cover a container's clock read and a slow rename. A ``ts``
# further ahead is a forgery or a broken clock: taken, it would read as fresh for as long as it
# is ahead, never expire, and make the job's honest signals look older than it ("stale").
MAX_FUTURE_S = 5.0
ROOT_UID = 0
MAX_ACTION = 64  # a recommendation's stable id ("dataloader-workers", ...)
MAX_TEAM = 64    # as the local scheduler's --team
MAX_CAUSE = 16   # a stall's cause: one of gpudiag.incident.CAUSES, or "no-steps" while it is judged
_WORD = re.compile(r"[A-Za-z0-9_.:@-]+")


class BadSignal(ValueError):
    """``reason`` is a short fixed code (a metric label), the message is for the log."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


class JobTableError(ValueError):
    """jobs.json is not a job table this reader understands; the message says why."""


@dataclass
class JobSignal:
    """One job as the agent knows it: the merge of the signals it applied for the job."""

    job_id: str
    ts: float
    step_seconds: float | None = None
    mfu_ratio: float | None = None
    bottleneck: str | None = None
    confidence: float | None = None
    mfu_confidence: float | None = None  # of ``mfu_ratio`` (the step it divides by), 0..1
    traced_at: float | None = None
    dilation: float | None = None
    traced_steps: int | None = None
    input_wait_ratio: float | None = None
    run_dir: str | None = None  # where the job's report.html is written (gpudiag top shows it)
    # the diagnosis' top recommendation (its stable id) and the step time it predicts, and the
    # job's team (Slurm account or the local scheduler's team) where the job knows it
    action: str | None = None
    predicted_step_seconds: float | None = None
    team: str | None = None
    collective_seconds_total: dict[str, float] = field(default_factory=dict)
    ended: bool = False
    # the stall watch's: when the job last finished a step, the limit after which no step is a
    # stall, and the cause of the stall that began then (see ``stalled_for``)
    last_step_at: float | None = None
    stall_after_s: float | None = None
    stall_cause: str | None = None
    # kept by the agent, not sent by jobs: the uid that wrote the signals (None: a schema-1 table's)
    owner_uid: int | None = None
    received_at: float | None = None
    signals_applied: int = 0


    def stalled_for(self, now: float) -> float | None:
        """Seconds since the job's last step while that is longer than its stall limit, else None.

        A signal's MFU describes steps that happened: once none has for the limit, the job is
        stalled, on this clock, whether or not it has said so yet (its signals come every 15 s,
        the stall is measured here at every scrape). An ended job is not stalled."""
        if self.ended or self.last_step_at is None or self.stall_after_s is None:
            return None
        idle = now - self.last_step_at
        return idle if idle > self.stall_after_s else None

    def mfu_at(self, now: float) -> float | None:
        """The MFU to export and schedule by: 0 while stalled (the GPUs do no model work)."""
        return 0.0 if self.mfu_ratio is not None and self.stalled_for(now) is not None else self.mfu_ratio


# fields a signal may omit, so that the previous signal's value stands (``stall_cause`` is not
# one: it belongs to the stall that began at its signal's ``last_step_at``, see JobTable._apply)
OPTIONAL_FIELDS = ("step_seconds", "mfu_ratio", "bottleneck", "confidence", "mfu_confidence", "traced_at",
                   "dilation",
                   "traced_steps", "input_wait_ratio", "run_dir", "action", "predicted_step_seconds",
                   "team", "last_step_at", "stall_after_s")


def _opt_float(d: dict[str, Any], key: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
            or not lo <= v <= hi or (lo_open and v == lo)):
        span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise BadSignal(f"{key} must be a number in {span}", "bad_value")
    return float(v)


def _opt_int(d: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadSignal(f"{key} must be an integer in [{lo}, {hi}]", "bad_value")
    return v


def _opt_path(d: dict[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not valid_run_dir(v):
        raise BadSignal(f"{key} must be an absolute path of at most {MAX_RUN_DIR} printable characters",
                        "bad_value")
    return v


def _opt_word(d: dict[str, Any], key: str, limit: int) -> str | None:
    """A short identifier (an action id, a team name): it becomes a label value, so it is
    bounded and limited to ``[A-Za-z0-9_.:@-]``."""
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > limit or not _WORD.fullmatch(v):
        raise BadSignal(f"{key} must be 1-{limit} characters of A-Z a-z 0-9 _ . : @ -", "bad_value")
    return v


def _signal_from_dict(d: dict[str, Any]) -> JobSignal:
    """The fields a job sends, validated (shared by the spool intake and the table reader)."""
    job = d.get("job_id")
    if not isinstance(job, str) or not job.strip() or len(job) > MAX_JOB_ID:
        raise BadSignal(f"job_id must be a non-empty string of at most {MAX_JOB_ID} characters", "job_id")
    ts = _opt_float(d, "ts", 0, MAX_UNIX_TIME)
    if ts is None:
        raise BadSignal("ts is required", "bad_value")
    label = d.get("bottleneck")
    if label is not None and label not in LABELS:
        raise BadSignal(f"bottleneck must be one of {sorted(LABELS)}", "bad_value")
    colls = d.get("collective_seconds_total") or {}
    if not isinstance(colls, dict) or len(colls) > MAX_COLLECTIVES:
        raise BadSignal(f"collective_seconds_total must be an object of at most {MAX_COLLECTIVES}",
                        "bad_value")
    clean_colls = {}
    for k, v in colls.items():
        if not isinstance(k, str) or not k or len(k) > 32:
            raise BadSignal("collective names must be short strings", "bad_value")
        clean_colls[clean_job_id(k)] = _opt_float({"v": v}, "v", 0, 1e12) or 0.0
    ended = d.get("ended", False)
    if not isinstance(ended, bool):
        raise BadSignal("ended must be true or false", "bad_value")
    return JobSignal(
        job_id=clean_job_id(job), ts=ts,
        step_seconds=_opt_float(d, "step_seconds", 0, MAX_STEP_SECONDS),
        mfu_ratio=_opt_float(d, "mfu_ratio", 0, 1.0),
        bottleneck=label,
        confidence=_opt_float(d, "confidence", 0, 1.0),
        mfu_confidence=_opt_float(d, "mfu_confidence", 0, 1.0),
        traced_at=_opt_float(d, "traced_at", 0, MAX_UNIX_TIME),
        dilation=_opt_float(d, "dilation", 0, MAX_DILATION, lo_open=True),
        traced_steps=_opt_int(d, "traced_steps", 0, MAX_TRACED_STEPS),
        input_wait_ratio=_opt_float(d, "input_wait_ratio", 0, 1.0),
        run_dir=_opt_path(d, "run_dir"),
        action=_opt_word(d, "action", MAX_ACTION),
        predicted_step_seconds=_opt_float(d, "predicted_step_seconds", 0, MAX_STEP_SECONDS),
        team=_opt_word(d, "team", MAX_TEAM),
        collective_seconds_total=clean_colls, ended=ended,
        last_step_at=_opt_float(d, "last_step_at", 0, MAX_UNIX_TIME),
        stall_after_s=_opt_float(d, "stall_after_s", 0, MAX_STEP_SECONDS, lo_open=True),
        stall_cause=_opt_word(d, "stall_cause", MAX_CAUSE),
    )


def parse_signal(raw: bytes) -> JobSignal:
    """Validate one signal file (schema 1 or 2). Raises BadSignal with the reason."""
    if len(raw) > MAX_SIGNAL_BYTES:
        raise BadSignal(f"larger than {MAX_SIGNAL_BYTES} bytes", "too_large")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadSignal("not JSON", "not_json") from None
    if not isinstance(d, dict):
        raise BadSignal("not a JSON object", "not_json")
    if d.get("schema_version") not in ACCEPTED_SIGNAL_VERSIONS:
        raise BadSignal(f"schema_version must be one of {list(ACCEPTED_SIGNAL_VERSIONS)}", "schema")
    return _signal_from_dict(d)


def prepare_spool(state_dir: Path) -> Path:
    """state_dir/spool: anyone may drop a file, only the agent may list or delete others'.

    Mode 1733 (like /tmp without read): jobs of every user can write signals, no job can
    read, replace or remove another job's (the sticky bit). Who wrote a file is its owner,
    which the agent reads from the kernel: per-file ownership is the identity.
    """
    spool = state_dir / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o755)
    os.chmod(spool, 0o1733)
    return spool


def closed_to_others(folder: Path) -> str | None:
    """Why a user who neither owns nor shares a group with ``folder``'s parents cannot reach
    it (the first folder on its path without search permission for others), or None.

    A spool under a private home (``~`` 0700, ``/root``) takes only its owner's signals; every
    other user's job would report nowhere, which the agent and the scheduler say at start.
    """
    p = Path(os.path.abspath(folder))
    for d in (*reversed(p.parents), p):
        try:
            mode = os.stat(d).st_mode
        except OSError as e:
            return f"{d}: {e.strerror or e}"
        if not mode & stat.S_IXOTH:
            return f"{d} is mode {stat.S_IMODE(mode):04o}: other users cannot reach it"
    return None


def write_job_table(path: Path, jobs: list[JobSignal], now: float) -> None:
    """Replace ``path`` atomically with the table (temporary file in the same folder, fsync,
    rename): a reader sees the old table or the new one, and a crash leaves one of them.
    World-readable (0644) so a scheduler running as another user can read it."""
    doc = {"schema_version": JOB_TABLE_SCHEMA_VERSION, "kind": JOB_TABLE_KIND, "written_at": now,
           "jobs": [asdict(j) for j in jobs]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


JobKey = tuple[str, int | None]  # (job_id, owner_uid): a job's identity at the agent


def read_job_table(path: Path) -> dict[JobKey, JobSignal]:
    """The jobs of an agent's ``jobs.json``, by (job id, owner uid). Pure: reads the file,
    nothing else.

    Safe at any moment while the agent runs (the file is only ever replaced whole). Raises
    OSError when it cannot be read (FileNotFoundError: no agent has written one yet) and
    JobTableError when it is not a job table of a known schema.
    """
    try:
        doc = json.loads(Path(path).read_bytes())
    except ValueError:
        raise JobTableError(f"{path}: not JSON") from None
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version not in _READABLE_TABLE_VERSIONS:
        raise JobTableError(f"{path}: not a job table of schema {list(_READABLE_TABLE_VERSIONS)}")
    rows = doc.get("jobs")
    if not isinstance(rows, list):
        raise JobTableError(f"{path}: 'jobs' must be a list")
    out: dict[JobKey, JobSignal] = {}
    for n, row in enumerate(rows):
        if not isinstance(row, dict):
            raise JobTableError(f"{path}: job {n} is not an object")
        try:
            sig = _signal_from_dict(row)
            sig.owner_uid = _opt_int(row, "owner_uid", 0, MAX_UID)
            sig.received_at = _opt_float(row, "received_at", 0, MAX_UNIX_TIME)
            sig.signals_applied = _opt_int(row, "signals_applied", 0, 2**63 - 1) or 0
        except BadSignal as e:
            raise JobTableError(f"{path}: job {n}: {e}") from None
        if sig.owner_uid is None and version == 2:
            sig.owner_uid = ROOT_UID  # schema 2 left a job unowned while only root had reported
        if version == 3 and sig.owner_uid is None:
            raise JobTableError(f"{path}: job {n} has no owner_uid")
        key = (sig.job_id, sig.owner_uid)
        if key in out:
            raise JobTableError(f"{path}: job {sig.job_id} of uid {sig.owner_uid} appears twice")
        out[key] = sig
    return out
