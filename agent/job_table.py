"""The agent's table of jobs: ingests the spool, keys each job by its owner, exports per-job
metrics and persists itself.

Concurrency: the agent's intake timer (agent/server.py) and prometheus_client, which serves
each scrape on its own thread (two Prometheus replicas, a person with curl), call ``ingest()``
and ``collect()`` outside any lock. Everything here — reading and deleting spool files, the
table, the counters, ``jobs.json`` — happens under one lock per table, so any number of
concurrent callers is safe and each spool file is consumed by exactly one of them. They wait
for each other only for the (sub-millisecond) table work.

How a signal is applied — exactly once, or not at all:

1. Its file is opened (never following a link), checked on the open descriptor (a regular
   file with one link), read, validated and unlinked by one caller.
2. Its writer is the file's owner (``fstat``), never a claim in the JSON. A job's identity is
   (job id, writer): a job id is per owner, so a file only ever lands in its writer's own job,
   running or finished, for as long as the table remembers it; once forgotten, a writer's next
   signal starts a new job of that writer, which inherits nothing. Every per-job series carries
   ``owner_uid``, so a consumer (the schedulers) attributes a signal only to a job of that uid.
3. A signal naming a job whose processes the GPU scrape saw running as another uid is rejected
   (``owner``): that job is not the writer's; and an entry whose processes turn out to run as
   another uid than its writer is dropped.
4. A signal dated more than ``MAX_FUTURE_S`` ahead of the agent's clock is refused
   (``future``); one dated less ahead is taken as written now (its ``ts`` clamped to the
   agent's clock), so no signal can make the job's next honest one look stale.
5. A signal older (by its ``ts``) than its job's entry is dropped (``stale``). Otherwise it
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
from collections.abc import Callable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpudiag import contract as c
from gpudiag.agent.attribution import JobOwners
from gpudiag.agent.signals import (
    MAX_FUTURE_S,
    MAX_SIGNAL_BYTES,
    OPTIONAL_FIELDS,
    BadSignal,
    JobKey,
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
# every per-job series: the job is (job_id, owner_uid), owner_uid the uid that wrote its
# signals ("" only for jobs of a schema-1 table, whose writers nobody recorded)
JOB_LABELS = ("job_id", "owner_uid")
Family = GaugeMetricFamily | CounterMetricFamily


class JobTable(Collector):
    """The current jobs; ingests the spool at each scrape and exports per-job metrics."""

    def __init__(self, state_dir: Path, owners: JobOwners | None = None, ttl: float = SILENT_TTL_S,
                 max_jobs: int = MAX_JOBS, names: Callable[[int], str | None] | None = None) -> None:
        self.state_dir = state_dir
        self.names = names    # uid -> login name on this node (collectors/users.py), for owner_info
        self.spool = prepare_spool(state_dir)
        self.state_file = state_dir / "jobs.json"
        self.owners = owners
        self.ttl = ttl
        self.max_jobs = max_jobs
        self.jobs: dict[JobKey, JobSignal] = {}
        self.rejected: dict[str, int] = {}
        self.applied = 0
        self._saved = False   # jobs.json is written at the first ingest, jobs or not
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
        now = time.time()
        for sig in self.jobs.values():   # written by an agent that took future-dated signals
            if sig.ts > now + MAX_FUTURE_S:
                log.warning("job %s in %s is dated %.0f s ahead of this clock: taken as of now",
                            sig.job_id, self.state_file, sig.ts - now)
                sig.ts = now

    def _save(self, now: float) -> None:
        try:
            write_job_table(self.state_file, list(self.jobs.values()), now)
            self._saved = True
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
        changed = self._reconcile_owners(now) or not self._saved
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
        for key, sig in list(self.jobs.items()):
            if now - sig.ts > (ENDED_GRACE_S if sig.ended else self.ttl):
                del self.jobs[key]
                changed = True
        if changed:
            self._save(now)

    def _process_owner(self, job_id: str, now: float) -> int | None:
        return self.owners.uid_of(job_id, now) if self.owners is not None else None

    def _reconcile_owners(self, now: float) -> bool:
        """Drop entries written by another uid than the one running their job's processes."""
        changed = False
        for (job_id, owner), _ in list(self.jobs.items()):
            uid = self._process_owner(job_id, now)
            if uid is not None and uid != owner:
                log.warning("job %s runs as uid %s but signals for it came from uid %s: dropped them",
                            job_id, uid, owner)
                del self.jobs[(job_id, owner)]
                changed = True
        return changed

    def _apply(self, sig: JobSignal, writer: int, now: float) -> bool:
        runs_as = self._process_owner(sig.job_id, now)
        if runs_as is not None and runs_as != writer:
            raise BadSignal(f"job {sig.job_id} runs as uid {runs_as}, the file is uid {writer}'s", "owner")
        if sig.ts > now + MAX_FUTURE_S:
            raise BadSignal(f"dated {sig.ts - now:.0f} s ahead of the agent's clock", "future")
        sig.ts = min(sig.ts, now)
        sig.owner_uid = writer
        key = (sig.job_id, writer)
        old = self.jobs.get(key)
        if old is None and len(self.jobs) >= self.max_jobs:
            # ended jobs only linger so scrapes see their last values: make room with them
            ended = sorted((k for k, j in self.jobs.items() if j.ended), key=lambda k: self.jobs[k].ts)
            if not ended:
                raise BadSignal(f"already {self.max_jobs} jobs", "too_many_jobs")
            del self.jobs[ended[0]]
        if old is not None and old.ts > sig.ts:
            raise BadSignal(f"older than the last signal of {sig.job_id}", "stale")
        if old is not None:
            for k, v in old.collective_seconds_total.items():
                sig.collective_seconds_total[k] = max(v, sig.collective_seconds_total.get(k, 0.0))
            same_stall = sig.last_step_at is None or sig.last_step_at == old.last_step_at
            for attr in OPTIONAL_FIELDS:
                if getattr(sig, attr) is None:
                    setattr(sig, attr, getattr(old, attr))
            if sig.stall_cause is None and same_stall:   # still the stall the cause was given for
                sig.stall_cause = old.stall_cause
            sig.signals_applied = old.signals_applied
        sig.signals_applied += 1
        sig.received_at = now
        self.jobs[key] = sig
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
        fams = _job_families()
        for j in self.jobs.values():
            self._add_job(fams, j, now)
        return [*fams.values(), *self._agent_families()]

    def _add_job(self, fams: dict[str, Family], j: JobSignal, now: float) -> None:
        """One job's series in each family it has a value for."""
        lv = [j.job_id, "" if j.owner_uid is None else str(j.owner_uid)]
        # one action, one team and one user per job: these add at most 3 series per job
        if j.action is not None:
            fams["rec"].add_metric([*lv, j.action], 1.0)
        if j.predicted_step_seconds is not None:
            fams["pred"].add_metric(lv, j.predicted_step_seconds)
        if j.team is not None:
            fams["team"].add_metric([*lv, j.team], 1.0)
        name = self.names(j.owner_uid) if self.names is not None and j.owner_uid is not None else None
        if name is not None:
            fams["user"].add_metric([*lv, name], 1.0)
        # the agent's receive time, not the job's claim: a multi-node job's freshest report is
        # the one a node took last, whatever clock the job's writer read
        fams["seen"].add_metric(lv, j.received_at if j.received_at is not None else j.ts)
        if j.ended:
            fams["ended"].add_metric(lv, j.ts)
        idle = j.stalled_for(now)
        if idle is not None:
            fams["stalled"].add_metric([*lv, j.stall_cause or "no-steps"], idle)
        if j.last_step_at is not None:
            fams["last_step"].add_metric(lv, j.last_step_at)
        for key, v in (("mfu", j.mfu_at(now)), ("step", j.step_seconds), ("wait", j.input_wait_ratio),
                       ("conf", j.confidence), ("mfu_conf", j.mfu_confidence), ("dil", j.dilation),
                       ("traced", j.traced_steps)):
            if v is not None:
                fams[key].add_metric(lv, float(v))
        if j.traced_at is not None:
            fams["age"].add_metric(lv, max(0.0, now - j.traced_at))
        if j.bottleneck is not None:
            fams["label"].add_metric([*lv, j.bottleneck], 1.0)
        if j.run_dir is not None:
            fams["run"].add_metric([*lv, j.run_dir], 1.0)
        for coll, secs in j.collective_seconds_total.items():
            fams["coll"].add_metric([*lv, coll], secs)

    def _agent_families(self) -> list[Metric]:
        """The agent's own: jobs reporting, signals applied and refused, its state folder."""
        jobs = GaugeMetricFamily(c.AGENT_JOBS, "Jobs currently reporting to this agent.")
        jobs.add_metric([], float(len(self.jobs)))
        applied = CounterMetricFamily(c.AGENT_SIGNALS_APPLIED,
                                      "Job signals applied to the job table.")
        applied.add_metric([], float(self.applied))
        rej = CounterMetricFamily(c.AGENT_SIGNALS_REJECTED, "Job signals refused, by reason.",
                                  labels=["reason"])
        for reason, n in sorted(self.rejected.items()):
            rej.add_metric([reason], float(n))
        info = GaugeMetricFamily(c.AGENT_INFO,
                                 "1; state_dir: the folder whose spool/ jobs report into and whose "
                                 "jobs.json a scheduler reads.", labels=["state_dir"])
        info.add_metric([os.path.abspath(self.state_dir)], 1.0)
        return [jobs, applied, rej, info]

def _job_families() -> dict[str, Family]:
    """The per-job families, empty, in the order ``/metrics`` lists them."""
    def gauge(name: str, help_: str, labels: tuple[str, ...] = JOB_LABELS) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, help_, labels=list(labels))

    mfu = gauge(c.JOB_MFU, "Model FLOPs utilisation at the job's live untraced step time.")
    step = gauge(c.JOB_STEP_SECONDS, "Median recent untraced training step time.")
    wait = gauge(c.JOB_INPUT_WAIT, "Fraction of step time waiting for input.")
    label = gauge(c.JOB_BOTTLENECK, "1 for the job's current bottleneck label.",
                  (*JOB_LABELS, "label"))
    conf = gauge(c.JOB_CONFIDENCE, "Confidence (0-1) of the job's bottleneck label.")
    mfu_conf = gauge(c.JOB_MFU_CONFIDENCE, "Confidence (0-1) of the job's MFU: of the step it divides "
                     "by, which a busy machine does not lower as it lowers the label's.")
    age = gauge(c.JOB_SIGNAL_AGE,
                "Time since the trace behind the job's label and FLOPs was taken.")
    dil = gauge(c.JOB_DILATION,
                "Traced over untraced step time: how much profiling slowed the traced steps.")
    traced = gauge(c.JOB_TRACED_STEPS, "Steps in the trace behind the job's label.")
    coll = CounterMetricFamily(c.JOB_COLLECTIVE_SECONDS,
                               "Time in collectives since the job started.",
                               labels=[*JOB_LABELS, "collective"])
    seen = gauge(c.JOB_LAST_SIGNAL,
                 "When the agent last took a signal from the job, by the agent's clock.")
    run = gauge(c.JOB_RUN_INFO, "1, labelled with the job's run directory (its report.html).",
                (*JOB_LABELS, "run_dir"))
    ended = gauge(c.JOB_ENDED,
                  "When the job reported that it ended (only jobs that have: their last values "
                  "stay exported a grace period, so scrapes see them, then they are dropped).")
    rec = gauge(c.JOB_RECOMMENDATION,
                "1, labelled with the job's top recommendation (its action id).", (*JOB_LABELS, "action"))
    pred = gauge(c.JOB_PREDICTED_STEP,
                 "Step time the job's top recommendation predicts if it worked fully.")
    team = gauge(c.JOB_TEAM, "1, labelled with the job's team (Slurm account or "
                 "the local scheduler's team), where the job knows it.", (*JOB_LABELS, "team"))
    user = gauge(c.JOB_OWNER, "1, labelled with the login name of the job's owner_uid "
                 "on this node, where the node has an account for it.", (*JOB_LABELS, "user"))
    stalled = gauge(c.JOB_STALLED,
                    "Seconds since the job last finished a step, only while that exceeds its stall "
                    "limit (its MFU is then exported as 0); cause: hung, desync, mismatch, deadlock, "
                    "idle, busy, exited, unknown, or no-steps while it is being judged.",
                    (*JOB_LABELS, "cause"))
    last_step = gauge(c.JOB_LAST_STEP, "When the job last finished a step.")
    return {"mfu": mfu, "step": step, "wait": wait, "label": label, "conf": conf, "mfu_conf": mfu_conf,
            "age": age, "dil": dil,
            "traced": traced, "coll": coll, "seen": seen, "run": run, "ended": ended, "rec": rec,
            "pred": pred, "team": team, "user": user, "stalled": stalled, "last_step": last_step}


def _read_spool_file(path: Path) -> tuple[JobSignal, int]:
    """(the signal, its file's owner). Opened without following links and checked on the
    open descriptor, so what is read is what was checked, and its owner is the kernel's word.
    A file with several links is refused: a link made to someone else's file would carry that
    someone's uid."""
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
        if st.st_nlink != 1:
            raise BadSignal(f"{st.st_nlink} hard links: not a file its owner wrote here", "hard_link")
        if st.st_size > MAX_SIGNAL_BYTES:
            raise BadSignal(f"larger than {MAX_SIGNAL_BYTES} bytes", "too_large")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_SIGNAL_BYTES + 1)
    finally:
        os.close(fd)
    return parse_signal(raw), st.st_uid
