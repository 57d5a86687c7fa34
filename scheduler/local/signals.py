"""Signal sources for the node agent: its persisted job table, or its ``/metrics``.

Both implement ``gpudiag.scheduler.signals.SignalSource`` (the Slurm controller reuses them
through that interface) and never raise: an agent that is not running, a table that cannot be
parsed, a scrape that fails all come back as ``SignalRead(available=False, why=...)``.

Which one: the job table (``STATE_DIR/jobs.json``) costs one file read, but the agent only
ingests its spool when scraped, so it is only as fresh as the last Prometheus scrape. The
``/metrics`` source scrapes the agent itself, which also makes it ingest: use it where no
Prometheus scrapes the node often, or where the agent's state folder is not readable.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from gpudiag.agent.signals import JobTableError, read_job_table
from gpudiag.scheduler.model import Signal
from gpudiag.scheduler.signals import SignalRead, parse_metrics

SCRAPE_TIMEOUT_S = 2.0          # a scheduling tick must not hang on a wedged agent
MAX_SCRAPE_BYTES = 32 * 1024 * 1024


class JobTableSource:
    """Signals from the agent's ``jobs.json`` (read with ``read_job_table``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, now: float) -> SignalRead:
        try:
            table = read_job_table(self.path)
        except FileNotFoundError:
            return SignalRead(available=False, why=f"no agent job table at {self.path} (is `gpudiag agent` "
                                                   "running on this machine?)")
        except (OSError, JobTableError) as e:
            return SignalRead(available=False, why=f"agent job table unreadable: {e}")
        out = {}
        for job_id, s in table.items():
            if s.mfu_ratio is None:
                continue
            heard = s.received_at if s.received_at is not None else s.ts
            out[job_id] = Signal(mfu=s.mfu_ratio, label=s.bottleneck or "unknown",
                                 confidence=s.confidence if s.confidence is not None else 0.0,
                                 age_s=max(0.0, now - heard))
        return SignalRead(out)


class MetricsSource:
    """Signals scraped from the agent's ``/metrics`` (``gpudiag_job_mfu_ratio``, ``_bottleneck``,
    ``_signal_confidence``, ``_last_signal_timestamp_seconds``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def read(self, now: float) -> SignalRead:
        try:
            with urllib.request.urlopen(self.url, timeout=SCRAPE_TIMEOUT_S) as r:  # noqa: S310 - operator's URL
                text = r.read(MAX_SCRAPE_BYTES).decode("utf-8", "replace")
        except (OSError, urllib.error.URLError, ValueError) as e:
            return SignalRead(available=False, why=f"agent at {self.url} not reachable: {e}")
        try:
            return SignalRead(parse_metrics(text, now))
        except ValueError as e:
            return SignalRead(available=False, why=f"agent at {self.url}: unparseable metrics: {e}")
