"""The agent's table of jobs: ingests the spool at each scrape, binds each job to its owner,
exports per-job metrics and persists itself.

Concurrency: prometheus_client serves each scrape on its own thread and calls ``collect()``
outside any lock (two Prometheus replicas, a person with curl). Everything here — reading and
deleting spool files, the table, the counters, ``jobs.json`` — happens under one lock per
table, so any number of concurrent scrapes is safe and each spool file is consumed by exactly
one of them. Scrapes wait for each other only for the (sub-millisecond) table work.

How a signal is applied — exactly once, or not at all:

1. Its file is opened (never following a link), read, validated and unlinked by one scrape.
2. Its writer is the file's owner. The job is bound to the uid running its processes (what
   the GPU scrape's attribution saw), else to the owner its entry already has (the first
   non-root writer's). A signal from anyone but that uid or root is rejected (``owner``);
   when the processes turn out to run as someone else than the entry's owner, the entry is
   dropped, so the exported series carry no one else's signals.
3. A signal older (by its ``ts``) than the job's entry is dropped (``stale``). Otherwise it
   becomes the entry: fields it omits keep their previous values, collective totals keep the
   larger of old and new (counters never go down), ``signals_applied`` grows by one.

Every consumed file is thus counted once, in ``gpudiag_agent_signals_applied_total`` or in
``gpudiag_agent_signals_rejected_total{reason}``. The table is bounded (label values cannot
explode) and jobs expire when they say they ended or go silent.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudiag.agent.attribution import ROOT_UID, JobOwners
from gpudiag.agent.signals import (
    MAX_SIGNAL_BYTES,
    OPTIONAL_FIELDS,
    BadSignal,
    JobSignal,
    JobTableError,
    parse_signal,
    prepare_spool,
    read_job_table,
    write_job_table,
)

log = logging.getLogger("gpudiag.agent")

MAX_JOBS = 512  # label cardinality bound: jobs beyond this are refused until others expire
SILENT_TTL_S = 600.0  # a job that has not reported for this long is gone
ENDED_GRACE_S = 60.0  # an ended job's last values stay this long, so scrapes see them
MAX_FILES_PER_SCRAPE = 2000  # a flood of files is drained over several scrapes


class JobTable(Collector):
    """The current jobs; ingests the spool at each scrape and exports per-job metrics."""

    def __init__(self, state_dir: Path, owners: JobOwners | None = None, ttl: float = SILENT_TTL_S,
                 max_jobs: int = MAX_JOBS) -> None:
        self.state_dir = state_dir
        self.spool = prepare_spool(state_dir)
        self.state_file = state_dir / "jobs.json"
        self.owners = owners
        self.ttl = ttl
        self.max_jobs = max_jobs
        self.jobs: dict[str, JobSignal] = {}
        self.rejected: dict[str, int] = {}
        self.applied = 0
        self._lock = threading.Lock()
        self._load()

    # -- persistence ------------------------------------------------------------------------
    def _load(self) -> None:
        try:
            self.jobs = read_job_table(self.state_file)
        except FileNotFoundError:
            pass
        except (OSError, JobTableError) as e:
            log.warning("state file %s unreadable (%s): starting with no jobs", self.state_file, e)

    def _save(self, now: float) -> None:
        try:
            write_job_table(self.state_file, list(self.jobs.values()), now)
        except OSError as e:
            log.warning("cannot persist job state: %s", e)

    # -- intake -----------------------------------------------------------------------------
    def _reject(self, reason: str, name: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        log.warning("rejected signal %s: %s", name, reason)

    def ingest(self, now: float | None = None) -> None:
        """Consume the spool, reconcile owners, expire jobs, persist on change."""
        with self._lock:
            self._ingest(time.time() if now is None else now)

    def _ingest(self, now: float) -> None:
        changed = self._reconcile_owners(now)
        try:
            names = sorted(os.listdir(self.spool))
        except OSError as e:
            log.warning("cannot read spool %s: %s", self.spool, e)
            names = []
        names = [n for n in names if not n.startswith(".") and n.endswith(".json")]
        for name in names[:MAX_FILES_PER_SCRAPE]:  # dot files: a job's temp file, not yet renamed
            path = self.spool / name
            try:
                sig, uid = _read_spool_file(path)
                changed |= self._apply(sig, uid, now)
            except BadSignal as e:
                self._reject(e.reason, f"{name}: {e}")
            except OSError as e:
                self._reject("unreadable", f"{name}: {e}")
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
            self._save(now)

    def _process_owner(self, job_id: str, now: float) -> int | None:
        return self.owners.uid_of(job_id, now) if self.owners is not None else None

    def _reconcile_owners(self, now: float) -> bool:
        """Bind entries to the uid their processes run as; drop those someone else wrote."""
        changed = False
        for job_id, j in list(self.jobs.items()):
            uid = self._process_owner(job_id, now)
            if uid is None or uid == j.owner_uid:
                continue
            if j.owner_uid is not None:
                log.warning("job %s runs as uid %s but its signals came from uid %s: dropped them",
                            job_id, uid, j.owner_uid)
                del self.jobs[job_id]
            else:
                j.owner_uid = uid
            changed = True
        return changed

    def _owner_for(self, sig: JobSignal, writer: int, now: float) -> int | None:
        """The uid the job is bound to after this signal (None: only root so far), or
        BadSignal("owner") when ``writer`` may not report for it."""
        old = self.jobs.get(sig.job_id)
        bound = self._process_owner(sig.job_id, now)
        if bound is None and old is not None:
            bound = old.owner_uid
        if bound is None:
            return None if writer == ROOT_UID else writer
        if writer not in (bound, ROOT_UID):
            raise BadSignal(f"job {sig.job_id} belongs to uid {bound}, the file to uid {writer}", "owner")
        return bound

    def _apply(self, sig: JobSignal, writer: int, now: float) -> bool:
        sig.owner_uid = self._owner_for(sig, writer, now)
        old = self.jobs.get(sig.job_id)
        if old is None and len(self.jobs) >= self.max_jobs:
            # ended jobs only linger so scrapes see their last values: make room with them
            ended = sorted((j for j in self.jobs.values() if j.ended), key=lambda j: j.ts)
            if not ended:
                raise BadSignal(f"already {self.max_jobs} jobs", "too_many_jobs")
            del self.jobs[ended[0].job_id]
        if old is not None and old.ts > sig.ts:
            raise BadSignal(f"older than the last signal of {sig.job_id}", "stale")
        if old is not None:
            for k, v in old.collective_seconds_total.items():
                sig.collective_seconds_total[k] = max(v, sig.collective_seconds_total.get(k, 0.0))
            for attr in OPTIONAL_FIELDS:
                if getattr(sig, attr) is None:
                    setattr(sig, attr, getattr(old, attr))
            sig.signals_applied = old.signals_applied
        sig.signals_applied += 1
        sig.received_at = now
        self.jobs[sig.job_id] = sig
        self.applied += 1
        return True

    # -- export -----------------------------------------------------------------------------
    def collect(self) -> list[Metric]:
        """One scrape: ingest, then a snapshot of the table, all under the table's lock."""
        with self._lock:
            now = time.time()
            self._ingest(now)
            return self._families(now)

    def _families(self, now: float) -> list[Metric]:
        def gauge(name: str, help_: str, labels: tuple[str, ...] = ("job_id",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_, labels=list(labels))

        mfu = gauge("gpudiag_job_mfu_ratio", "Model FLOPs utilisation at the job's live untraced step time.")
        step = gauge("gpudiag_job_step_seconds", "Median recent untraced training step time.")
        wait = gauge("gpudiag_job_input_wait_ratio", "Fraction of step time waiting for input.")
        label = gauge("gpudiag_job_bottleneck", "1 for the job's current bottleneck label.",
                      ("job_id", "label"))
        conf = gauge("gpudiag_job_signal_confidence", "Confidence (0-1) of the job's bottleneck label.")
        age = gauge("gpudiag_job_signal_age_seconds",
                    "Time since the trace behind the job's label and FLOPs was taken.")
        dil = gauge("gpudiag_job_profiler_dilation_ratio",
                    "Traced over untraced step time: how much profiling slowed the traced steps.")
        traced = gauge("gpudiag_job_signal_traced_steps", "Steps in the trace behind the job's label.")
        coll = CounterMetricFamily("gpudiag_job_collective_seconds",
                                   "Time in collectives since the job started.",
                                   labels=["job_id", "collective"])
        seen = gauge("gpudiag_job_last_signal_timestamp_seconds", "When the job last reported.")
        run = gauge("gpudiag_job_run_info", "1, labelled with the job's run directory (its report.html).",
                    ("job_id", "run_dir"))
        for j in self.jobs.values():
            lv = [j.job_id]
            seen.add_metric(lv, j.ts)
            for fam, v in ((mfu, j.mfu_ratio), (step, j.step_seconds), (wait, j.input_wait_ratio),
                           (conf, j.confidence), (dil, j.dilation), (traced, j.traced_steps)):
                if v is not None:
                    fam.add_metric(lv, float(v))
            if j.traced_at is not None:
                age.add_metric(lv, max(0.0, now - j.traced_at))
            if j.bottleneck is not None:
                label.add_metric([j.job_id, j.bottleneck], 1.0)
            if j.run_dir is not None:
                run.add_metric([j.job_id, j.run_dir], 1.0)
            for name, secs in j.collective_seconds_total.items():
                coll.add_metric([j.job_id, name], secs)
        jobs = GaugeMetricFamily("gpudiag_agent_jobs", "Jobs currently reporting to this agent.")
        jobs.add_metric([], float(len(self.jobs)))
        applied = CounterMetricFamily("gpudiag_agent_signals_applied",
                                      "Job signals applied to the job table.")
        applied.add_metric([], float(self.applied))
        rej = CounterMetricFamily("gpudiag_agent_signals_rejected", "Job signals refused, by reason.",
                                  labels=["reason"])
        for reason, n in sorted(self.rejected.items()):
            rej.add_metric([reason], float(n))
        return [mfu, step, wait, label, conf, age, dil, traced, coll, seen, run, jobs, applied, rej]


def _read_spool_file(path: Path) -> tuple[JobSignal, int]:
    """(the signal, its file's owner). Opened without following links and checked on the
    open descriptor, so what is read is what was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BadSignal("a symbolic link, not a regular file", "not_regular_file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadSignal("not a regular file", "not_regular_file")
        if st.st_size > MAX_SIGNAL_BYTES:
            raise BadSignal(f"larger than {MAX_SIGNAL_BYTES} bytes", "too_large")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_SIGNAL_BYTES + 1)
    finally:
        os.close(fd)
    return parse_signal(raw), st.st_uid
