"""Where a scheduler runtime gets its jobs' efficiency signals: one interface, several sources.

The policy core takes ``{job id: Signal}``; the runtimes get those from the node agent (its
persisted job table or its ``/metrics``) on one machine, or from Prometheus' HTTP API beside a
Slurm cluster. Each source says, besides the signals, whether it could be read at all: "no
agent running" and "no signals yet" are different facts, and ``gpudiag queue`` / the Slurm
controller say which one holds (with no source the policy runs without its efficiency factor;
it never treats a missing source as "every job is efficient" or as "every job is idle").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from gpudiag.scheduler.model import LABELS, Signal


@dataclass
class SignalRead:
    """One read of a source: agent job id (e.g. ``"gpudiag:17"``, ``"slurm:4242"``) -> Signal."""

    signals: dict[str, Signal] = field(default_factory=dict)
    available: bool = True  # False: the source could not be read (then ``why`` says why)
    why: str = ""


class SignalSource(Protocol):
    """Anything that can be asked for the current signals. Must not raise on a source that is
    down, empty or malformed: it returns ``SignalRead(available=False, why=...)`` instead."""

    def read(self, now: float) -> SignalRead: ...


def parse_metrics(text: str, now: float, prefix: str = "") -> dict[str, Signal]:
    """Per job_id (those starting with ``prefix``), a Signal from one agent's ``/metrics``: only
    jobs that exported an MFU. The age is the model's: seconds since the agent last heard from
    the job (``gpudiag_job_last_signal_timestamp_seconds``), not the age of the trace behind the
    label, which a ``--monitor`` job renews only every re-trace. Every runtime reads an agent's
    exposition through this one function."""
    from prometheus_client.parser import text_string_to_metric_families

    mfu: dict[str, float] = {}
    conf: dict[str, float] = {}
    last: dict[str, float] = {}
    label: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            job = s.labels.get("job_id")
            if not job or not job.startswith(prefix):
                continue
            if s.name == "gpudiag_job_mfu_ratio":
                mfu[job] = float(s.value)
            elif s.name == "gpudiag_job_signal_confidence":
                conf[job] = float(s.value)
            elif s.name == "gpudiag_job_last_signal_timestamp_seconds":
                last[job] = float(s.value)
            elif s.name == "gpudiag_job_bottleneck" and s.value == 1 and s.labels.get("label") in LABELS:
                label[job] = s.labels["label"]
    return {j: Signal(mfu=min(1.0, max(0.0, m)), label=label.get(j, "unknown"), confidence=conf.get(j, 0.0),
                      age_s=max(0.0, now - last[j]) if j in last else math.inf)
            for j, m in mfu.items() if math.isfinite(m)}
