"""Where a scheduler runtime gets its jobs' efficiency signals: one interface, several sources.

The policy core takes ``{job id: Signal}``; the runtimes get those from the node agent (its
persisted job table or its ``/metrics``) on one machine, or from Prometheus' HTTP API beside a
Slurm cluster. Each source says, besides the signals, whether it could be read at all: "no
agent running" and "no signals yet" are different facts, and ``gpudiag queue`` / the Slurm
controller say which one holds (with no source the policy runs without its efficiency factor;
it never treats a missing source as "every job is efficient" or as "every job is idle").

A signal's identity includes its writer: the agent keys every job by (job id, owner uid), the
uid that wrote its signals as the kernel reported it (``owner_uid`` on every per-job series).
Job ids are the agent's, which anyone can name, so a runtime attributes a signal to one of its
jobs only when the writer is that job's user (``SignalRead.of``/``attributed``): a user's
signal for another user's job, running or long finished, never reaches that job or its key's
history.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gpudiag.contract import (
    JOB_BOTTLENECK,
    JOB_CONFIDENCE,
    JOB_LAST_SIGNAL,
    JOB_MFU,
    JOB_MFU_CONFIDENCE,
    JOB_STALLED,
)
from gpudiag.scheduler.model import LABELS, Signal

# A report dated further ahead of this clock than this comes from a clock that cannot be trusted
# (a node's clock running ahead, an agent that took a forged time): its age is unknown, so it is
# treated as stale rather than as fresh for as long as it stays ahead. NTP keeps hosts within
# milliseconds of each other; ten seconds leaves room for a slow scrape.
MAX_CLOCK_AHEAD_S = 10.0

# (agent job id, uid that wrote its signals); the uid is None only where an old agent did not
# say, and such a signal is attributed to no job
JobKey = tuple[str, int | None]


@dataclass
class SignalRead:
    """One read of a source: (agent job id, e.g. ``"gpudiag:17"`` or ``"slurm:4242"``, writer's
    uid) -> Signal."""

    signals: dict[JobKey, Signal] = field(default_factory=dict)
    available: bool = True  # False: the source could not be read (then ``why`` says why)
    why: str = ""
    down: dict[str, str] = field(default_factory=dict)   # address of a part that did not answer -> why

    def of(self, job_id: str, uid: int) -> Signal | None:
        """The signal ``uid`` wrote for ``job_id``: the only one that may speak for a job of that user."""
        return self.signals.get((job_id, uid))

    def attributed(self, owners: Mapping[str, int]) -> dict[str, Signal]:
        """Per job id in ``owners`` (job id -> its user's uid), the signal its user wrote;
        the others' signals for those ids are left out."""
        return {j: s for j, uid in owners.items() if (s := self.signals.get((j, uid))) is not None}


def owner_of(label: str | None) -> int | None:
    """An ``owner_uid`` label value as a uid (None: absent, empty or not a uid)."""
    return int(label) if label and label.isdigit() and len(label) <= 10 else None


class SignalSource(Protocol):
    """Anything that can be asked for the current signals. Must not raise on a source that is
    down, empty or malformed: it returns ``SignalRead(available=False, why=...)`` instead."""

    def read(self, now: float) -> SignalRead: ...


def parse_metrics(text: str, now: float, prefix: str = "") -> dict[JobKey, Signal]:
    """Per (job_id, owner_uid) (job ids starting with ``prefix``), a Signal from one agent's
    ``/metrics``: only jobs that exported an MFU. The age is the model's: seconds since the agent
    last heard from the job (``gpudiag_job_last_signal_timestamp_seconds``), not the age of the
    trace behind the label, which a ``--monitor`` job renews only every re-trace. Every runtime
    reads an agent's exposition through this one function."""
    from prometheus_client.parser import text_string_to_metric_families

    mfu: dict[JobKey, float] = {}
    stalled: dict[JobKey, tuple[float, str]] = {}
    conf: dict[JobKey, float] = {}
    mfu_conf: dict[JobKey, float] = {}
    last: dict[JobKey, float] = {}
    label: dict[JobKey, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            job = s.labels.get("job_id")
            if not job or not job.startswith(prefix):
                continue
            key = (job, owner_of(s.labels.get("owner_uid")))
            if s.name == JOB_MFU:
                mfu[key] = float(s.value)
            elif s.name == JOB_STALLED:
                stalled[key] = (float(s.value), s.labels.get("cause", ""))
            elif s.name == JOB_CONFIDENCE:
                conf[key] = float(s.value)
            elif s.name == JOB_MFU_CONFIDENCE:
                mfu_conf[key] = float(s.value)
            elif s.name == JOB_LAST_SIGNAL:
                last[key] = float(s.value)
            elif s.name == JOB_BOTTLENECK and s.value == 1 and s.labels.get("label") in LABELS:
                label[key] = s.labels["label"]
    return {k: Signal(mfu=min(1.0, max(0.0, m)), label=label.get(k, "unknown"), confidence=conf.get(k, 0.0),
                      age_s=age_of(last.get(k), now), stalled_s=stalled[k][0] if k in stalled else None,
                      stall_cause=(stalled[k][1] or None) if k in stalled else None,
                      mfu_confidence=mfu_conf.get(k))
            for k, m in mfu.items() if math.isfinite(m)}


def age_of(seen: float | None, now: float) -> float:
    """Seconds since a report's receive time; infinite (never fresh) when there is none or it
    is dated more than ``MAX_CLOCK_AHEAD_S`` ahead of ``now``."""
    if seen is None or not math.isfinite(seen) or seen > now + MAX_CLOCK_AHEAD_S:
        return math.inf
    return max(0.0, now - seen)
