"""Job signals: what jobs running under gpudiag report to their node's agent.

Intake is a spool directory, local only: a job writes one small JSON file (atomically, by
rename) and the agent ingests it at the next scrape. No socket to attack from the network,
nothing executed, every file size-limited and validated; a bad file is logged, counted and
deleted, never fatal. The table of jobs is bounded (so label values cannot explode), and
persisted in the state directory on every change, so an agent restart or crash loses
nothing a job reported. Jobs expire when they say they ended or go silent.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudiag.jobsignal import MAX_JOB_ID, SIGNAL_SCHEMA_VERSION, clean_job_id

log = logging.getLogger("gpudiag.agent")

MAX_SIGNAL_BYTES = 16 * 1024
MAX_JOBS = 512  # label cardinality bound: jobs beyond this are refused until others expire
MAX_COLLECTIVES = 16
SILENT_TTL_S = 600.0  # a job that has not reported for this long is gone
ENDED_GRACE_S = 60.0  # an ended job's last values stay this long, so scrapes see them
MAX_FILES_PER_SCRAPE = 2000  # a flood of files is drained over several scrapes
LABELS = {"compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound",
          "unknown"}


class BadSignal(ValueError):
    """``reason`` is a short fixed code (a metric label), the message is for the log."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class JobSignal:
    job_id: str
    ts: float
    step_seconds: float | None = None
    mfu_ratio: float | None = None
    bottleneck: str | None = None
    input_wait_ratio: float | None = None
    collective_seconds_total: dict[str, float] = field(default_factory=dict)
    ended: bool = False


def _opt_float(d: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise BadSignal(f"{key} must be a number in [{lo}, {hi}]", "bad_value")
    return float(v)


def parse_signal(raw: bytes) -> JobSignal:
    """Validate one signal file. Raises BadSignal with the reason."""
    if len(raw) > MAX_SIGNAL_BYTES:
        raise BadSignal(f"larger than {MAX_SIGNAL_BYTES} bytes", "too_large")
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadSignal("not JSON", "not_json") from None
    if not isinstance(d, dict):
        raise BadSignal("not a JSON object", "not_json")
    if d.get("schema_version") != SIGNAL_SCHEMA_VERSION:
        raise BadSignal(f"schema_version must be {SIGNAL_SCHEMA_VERSION}", "schema")
    job = d.get("job_id")
    if not isinstance(job, str) or not job.strip() or len(job) > MAX_JOB_ID:
        raise BadSignal("job_id must be a non-empty string of at most 128 characters", "job_id")
    ts = _opt_float(d, "ts", 0, 1e11)
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
        step_seconds=_opt_float(d, "step_seconds", 0, 1e6),
        mfu_ratio=_opt_float(d, "mfu_ratio", 0, 1.0),
        bottleneck=label, input_wait_ratio=_opt_float(d, "input_wait_ratio", 0, 1.0),
        collective_seconds_total=clean_colls, ended=ended,
    )


def prepare_spool(state_dir: Path) -> Path:
    """state_dir/spool: anyone may drop a file, only the agent may list or delete others'.

    Mode 1733 (like /tmp without read): jobs of every user can write signals, no job can
    read or remove another job's.
    """
    spool = state_dir / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o755)
    os.chmod(spool, 0o1733)
    return spool


class JobTable(Collector):
    """The current jobs; ingests the spool at each scrape and exports per-job metrics."""

    def __init__(self, state_dir: Path, ttl: float = SILENT_TTL_S, max_jobs: int = MAX_JOBS) -> None:
        self.state_dir = state_dir
        self.spool = prepare_spool(state_dir)
        self.state_file = state_dir / "jobs.json"
        self.ttl = ttl
        self.max_jobs = max_jobs
        self.jobs: dict[str, JobSignal] = {}
        self.rejected: dict[str, int] = {}
        self._load()

    # -- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            data = json.loads(self.state_file.read_text())
            for j in data.get("jobs", []):
                sig = JobSignal(**j)
                self.jobs[sig.job_id] = sig
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as e:
            log.warning("state file %s unreadable (%s): starting with no jobs", self.state_file, e)

    def _save(self) -> None:
        tmp = self.state_file.with_suffix(".partial")
        tmp.write_text(json.dumps({"schema_version": SIGNAL_SCHEMA_VERSION,
                                   "jobs": [asdict(j) for j in self.jobs.values()]}))
        os.replace(tmp, self.state_file)

    # -- intake -----------------------------------------------------------------------------
    def _reject(self, reason: str, name: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.warning("rejected signal %s: %s", name, reason)

    def ingest(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        changed = False
        try:
            entries = sorted(os.scandir(self.spool), key=lambda e: e.name)[:MAX_FILES_PER_SCRAPE]
        except OSError as e:
            log.warning("cannot read spool %s: %s", self.spool, e)
            entries = []
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(".json"):
                continue  # a job's temporary file, not yet renamed into place
            path = Path(entry.path)
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    raise BadSignal("not a regular file", "not_regular_file")
                if st.st_size > MAX_SIGNAL_BYTES:
                    raise BadSignal(f"larger than {MAX_SIGNAL_BYTES} bytes", "too_large")
                with open(path, "rb") as f:
                    sig = parse_signal(f.read(MAX_SIGNAL_BYTES + 1))
                changed |= self._apply(sig)
            except BadSignal as e:
                self._reject(e.reason, f"{entry.name}: {e}")
            except OSError as e:
                self._reject("unreadable", f"{entry.name}: {e}")
            finally:
                try:
                    path.unlink()
                except OSError:
                    pass
        for job_id, sig in list(self.jobs.items()):
            if now - sig.ts > (ENDED_GRACE_S if sig.ended else self.ttl):
                del self.jobs[job_id]
                changed = True
        if changed:
            try:
                self._save()
            except OSError as e:
                log.warning("cannot persist job state: %s", e)

    def _apply(self, sig: JobSignal) -> bool:
        old = self.jobs.get(sig.job_id)
        if old is None and len(self.jobs) >= self.max_jobs:
            # ended jobs only linger so scrapes see their last values: make room with them
            ended = sorted((j for j in self.jobs.values() if j.ended), key=lambda j: j.ts)
            if not ended:
                self._reject("too_many_jobs", sig.job_id)
                return False
            del self.jobs[ended[0].job_id]
        if old is not None and old.ts > sig.ts:
            return False  # an older signal arriving late
        if old is not None:
            # counters only grow: keep the larger total per collective
            for k, v in old.collective_seconds_total.items():
                sig.collective_seconds_total[k] = max(v, sig.collective_seconds_total.get(k, 0.0))
            for attr in ("step_seconds", "mfu_ratio", "bottleneck", "input_wait_ratio"):
                if getattr(sig, attr) is None:
                    setattr(sig, attr, getattr(old, attr))
        self.jobs[sig.job_id] = sig
        return True

    # -- export -----------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        self.ingest()
        mfu = GaugeMetricFamily("gpudiag_job_mfu_ratio", "Model FLOPs utilisation of the job.",
                                labels=["job_id"])
        step = GaugeMetricFamily("gpudiag_job_step_seconds", "Recent training step time.",
                                 labels=["job_id"])
        wait = GaugeMetricFamily("gpudiag_job_input_wait_ratio",
                                 "Fraction of step time waiting for input.", labels=["job_id"])
        label = GaugeMetricFamily("gpudiag_job_bottleneck",
                                  "1 for the job's current bottleneck label.", labels=["job_id", "label"])
        coll = CounterMetricFamily("gpudiag_job_collective_seconds",
                                   "Time in collectives since the job started.",
                                   labels=["job_id", "collective"])
        seen = GaugeMetricFamily("gpudiag_job_last_signal_timestamp_seconds",
                                 "When the job last reported.", labels=["job_id"])
        for j in self.jobs.values():
            seen.add_metric([j.job_id], j.ts)
            if j.mfu_ratio is not None:
                mfu.add_metric([j.job_id], j.mfu_ratio)
            if j.step_seconds is not None:
                step.add_metric([j.job_id], j.step_seconds)
            if j.input_wait_ratio is not None:
                wait.add_metric([j.job_id], j.input_wait_ratio)
            if j.bottleneck is not None:
                label.add_metric([j.job_id, j.bottleneck], 1.0)
            for name, secs in j.collective_seconds_total.items():
                coll.add_metric([j.job_id, name], secs)
        jobs = GaugeMetricFamily("gpudiag_agent_jobs", "Jobs currently reporting to this agent.")
        jobs.add_metric([], float(len(self.jobs)))
        rej = CounterMetricFamily("gpudiag_agent_signals_rejected", "Job signals refused, by reason.",
                                  labels=["reason"])
        for reason, n in sorted(self.rejected.items()):
            rej.add_metric([reason], float(n))
        yield from (mfu, step, wait, label, coll, seen, jobs, rej)
