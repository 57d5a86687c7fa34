"""Signals for Slurm jobs: from Prometheus' HTTP API, or straight from the agents' ``/metrics``.

Both implement ``gpudiag.scheduler.signals.SignalSource`` and return agent job ids
(``slurm:<id>``) -> ``Signal``. A job's signal is its MFU, its current label (the one
``gpudiag_job_bottleneck{label}`` series at 1), the label's confidence and how long ago the
agent last took a signal from the job (``gpudiag_job_last_signal_timestamp_seconds``: the
agent's receive time, never the job's own claim; the policy's ``Signal.age_s``). A job without
that series, or with one dated ahead of this clock, gets an infinite age and a job without a
confidence 0, so the policy ignores it (stale or weak signals are never acted on). A job
reported by several agents (a multi-node job) keeps the report a node received last.

Sources key signals by (job id, ``owner_uid``: the uid that wrote them, as the agent read it
from the kernel); ``slurm_signals`` keeps for each Slurm job only the one its own user wrote
(``squeue``'s ``user_id``), so no user can speak for another's job.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from gpudiag.contract import (
    JOB_BOTTLENECK,
    JOB_CONFIDENCE,
    JOB_LAST_SIGNAL,
    JOB_MFU,
    JOB_MFU_CONFIDENCE,
    JOB_STALLED,
    METRICS_PATH,
)
from gpudiag.scheduler.model import LABELS, Signal
from gpudiag.scheduler.signals import JobKey, SignalRead, age_of, owner_of, parse_metrics
from gpudiag.scheduler.slurm.squeue import SlurmJob
from gpudiag.scrape import fetch, fetch_text

JOB_PREFIX = "slurm:"
HTTP_TIMEOUT_S = 5.0
# The whole read of a round, however many sources: the agents are asked at once, and one that has
# not answered by then is named and left out (its jobs have no signal this round). Slurm goes on
# meanwhile; the round re-reads Slurm before it writes (``fresh``), but a short read keeps its
# decisions close to what it read.
ROUND_DEADLINE_S = HTTP_TIMEOUT_S
MAX_PARALLEL = 64        # agents read at once (threads); more wait for a free one within the deadline
# one selector per series, all Slurm jobs at once: six HTTP queries per round, whatever the load
_SEL = f'{{job_id=~"{JOB_PREFIX}[0-9]+"}}'
QUERIES = {
    "mfu": f"{JOB_MFU}{_SEL}",
    "label": f"{JOB_BOTTLENECK}{_SEL} == 1",
    "confidence": f"{JOB_CONFIDENCE}{_SEL}",
    "mfu_confidence": f"{JOB_MFU_CONFIDENCE}{_SEL}",
    "seen": f"{JOB_LAST_SIGNAL}{_SEL}",
    "stalled": f"{JOB_STALLED}{_SEL}",
}


@dataclass
class _Partial:
    mfu: float | None = None
    label: str = "unknown"
    confidence: float = 0.0
    mfu_confidence: float | None = None
    age: float = math.inf
    stalled: float | None = None
    cause: str | None = None


def _combine(rows: dict[tuple[JobKey, str], _Partial]) -> dict[JobKey, Signal]:
    """((job, owner), instance) partials -> one Signal per job and owner: the freshest instance wins."""
    best: dict[JobKey, Signal] = {}
    for (job, _inst), p in rows.items():
        if p.mfu is None or not math.isfinite(p.mfu):
            continue
        s = Signal(mfu=min(1.0, max(0.0, p.mfu)), label=p.label if p.label in LABELS else "unknown",
                   confidence=p.confidence, age_s=p.age, stalled_s=p.stalled, stall_cause=p.cause,
                   mfu_confidence=p.mfu_confidence)
        if job not in best or s.age_s < best[job].age_s:
            best[job] = s
    return best


def parse_prometheus_answers(answers: dict[str, dict], now: float) -> dict[JobKey, Signal]:
    """The /api/v1/query answers (JSON, keyed as QUERIES) -> signals.

    Raises ValueError on an answer that is not a Prometheus vector result.
    """
    rows: dict[tuple[JobKey, str], _Partial] = {}
    for what, doc in answers.items():
        if not isinstance(doc, dict) or doc.get("status") != "success":
            raise ValueError(f"query {what}: status {doc.get('status') if isinstance(doc, dict) else doc!r}")
        data = doc.get("data") or {}
        if data.get("resultType") != "vector":
            raise ValueError(f"query {what}: result type {data.get('resultType')!r}, expected vector")
        for r in data.get("result", []):
            metric, (_ts, val) = r["metric"], r["value"]
            job = (metric.get("job_id", ""), owner_of(metric.get("owner_uid")))
            p = rows.setdefault((job, metric.get("instance", "")), _Partial())
            v = float(val)
            if what == "mfu":
                p.mfu = v
            elif what == "label":
                p.label = metric.get("label", "unknown")
            elif what == "confidence":
                p.confidence = v
            elif what == "mfu_confidence":
                p.mfu_confidence = v
            elif what == "seen":  # when the agent last heard from the job, by the agent's clock
                p.age = age_of(v, now)
            elif what == "stalled":  # no step for this long, past its limit (its MFU is exported as 0)
                p.stalled, p.cause = v, metric.get("cause") or None
    return _combine(rows)


class PrometheusSource:
    """Reads the agents' series from a Prometheus server's HTTP API (``/api/v1/query``)."""

    def __init__(self, base_url: str, timeout: float = HTTP_TIMEOUT_S) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def read(self, now: float) -> SignalRead:
        answers = {}
        end = time.monotonic() + ROUND_DEADLINE_S
        try:
            for what, expr in QUERIES.items():
                url = f"{self.base}/api/v1/query?query={urllib.parse.quote(expr)}&time={now:.3f}"
                left = min(self.timeout, end - time.monotonic())
                if left <= 0:
                    raise TimeoutError(f"no answer within the round's {ROUND_DEADLINE_S:.0f} s")
                answers[what] = json.loads(fetch(url, left))
            return SignalRead(parse_prometheus_answers(answers, now))
        except (OSError, urllib.error.URLError) as e:
            return SignalRead(available=False, why=f"Prometheus at {self.base} unreachable: {e}",
                              down={f"Prometheus at {self.base}": str(e)})
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return SignalRead(available=False, why=f"Prometheus at {self.base}: unexpected answer: {e}")


class AgentsSource:
    """Scrapes each agent's ``/metrics`` (``HOST:PORT``) itself: no Prometheus needed.

    Agents that do not answer are named in ``why``; the read is unavailable only when none did.
    """

    def __init__(self, agents: list[str], timeout: float = HTTP_TIMEOUT_S) -> None:
        self.urls = [a if "://" in a else f"http://{a}{METRICS_PATH}" for a in agents]
        self.timeout = timeout

    def _scrape(self, url: str, now: float) -> dict[JobKey, Signal]:
        return parse_metrics(fetch_text(url, min(self.timeout, ROUND_DEADLINE_S)), now, JOB_PREFIX)

    def read(self, now: float) -> SignalRead:
        """All agents at once, within ``ROUND_DEADLINE_S``: a dead agent costs the round that much
        once, not its timeout per agent."""
        best: dict[JobKey, Signal] = {}
        down, gone = [], {}
        pool = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(self.urls)) or 1,
                                  thread_name_prefix="gpudiag-agent-read")
        try:
            futures = {url: pool.submit(self._scrape, url, now) for url in self.urls}
            wait(futures.values(), timeout=ROUND_DEADLINE_S)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)   # a hung agent's thread ends at its timeout
        for url, fut in futures.items():
            if not fut.done():
                why = f"no answer within the round's {ROUND_DEADLINE_S:.0f} s"
                down.append(f"{url}: {why}")
                gone[f"agent {url}"] = why
                continue
            try:
                found = fut.result()
            except (OSError, ValueError) as e:
                down.append(f"{url}: {e}")
                gone[f"agent {url}"] = str(e)
                continue
            for job, sig in found.items():  # a multi-node job: the freshest report wins
                if job not in best or sig.age_s < best[job].age_s:
                    best[job] = sig
        if down and len(down) == len(self.urls):
            return SignalRead(available=False, why="no agent answered: " + "; ".join(down), down=gone)
        return SignalRead(best, why="; ".join(f"unreachable {d}" for d in down), down=gone)


def slurm_signals(read: SignalRead, jobs: Iterable[SlurmJob]) -> dict[int, Signal]:
    """Slurm job id -> the signal that job's own user wrote for ``slurm:<id>``. A signal from
    any other uid (a user naming someone else's job, running or finished) is left out, and so
    is every signal of a job whose user id squeue did not give."""
    owners = {f"{JOB_PREFIX}{j.id}": j.user_id for j in jobs if j.user_id is not None}
    return {int(k[len(JOB_PREFIX):]): s for k, s in read.attributed(owners).items()}
