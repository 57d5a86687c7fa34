"""Signal sources for the node agent: its persisted job table, or its ``/metrics``.

Both implement ``gpudiag.scheduler.signals.SignalSource`` (the Slurm controller reuses them
through that interface) and never raise: an agent that is not running, a table that cannot be
parsed, a scrape that fails all come back as ``SignalRead(available=False, why=...)``.

Which one: the job table (``STATE_DIR/jobs.json``) costs one file read, and the agent keeps it
within a second of its spool with or without a scraper. The ``/metrics`` source scrapes the
agent itself: use it where the agent's state folder is not readable.

Both return signals keyed by (job id, writer's uid); the daemon takes for a job only the one its
own user wrote (``SignalRead.of``).
"""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

from gpudiag.agent.signals import JobTableError, closed_to_others, read_job_table
from gpudiag.contract import AGENT_INFO
from gpudiag.scheduler.model import Signal
from gpudiag.scheduler.signals import SignalRead, SignalSource, parse_metrics
from gpudiag.scrape import fetch_text


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
        for key, s in table.items():
            if s.mfu_ratio is None:
                continue
            heard = s.received_at if s.received_at is not None else s.ts
            stalled = s.stalled_for(now)
            out[key] = Signal(mfu=s.mfu_at(now), label=s.bottleneck or "unknown",
                              confidence=s.confidence if s.confidence is not None else 0.0,
                              age_s=max(0.0, now - heard), stalled_s=stalled,
                              stall_cause=(s.stall_cause or "no-steps") if stalled is not None else None,
                              mfu_confidence=s.mfu_confidence)
        return SignalRead(out)


class MetricsSource:
    """Signals scraped from the agent's ``/metrics`` (its MFU, bottleneck, confidence and
    last-signal series: ``parse_metrics``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def fetch(self) -> str:
        """The agent's exposition; OSError (URLError included) or ValueError when unreachable."""
        return fetch_text(self.url)

    def read(self, now: float) -> SignalRead:
        try:
            text = self.fetch()
        except (OSError, urllib.error.URLError, ValueError) as e:
            return SignalRead(available=False, why=f"agent at {self.url} not reachable: {e}")
        try:
            return SignalRead(parse_metrics(text, now))
        except ValueError as e:
            return SignalRead(available=False, why=f"agent at {self.url}: unparseable metrics: {e}")


class AgentChoiceError(ValueError):
    """The ``--agent-*`` options cannot be honoured; the message is one line for the operator."""


def agent_state_dir(text: str) -> Path | None:
    """The state folder an agent's exposition names (``gpudiag_agent_info{state_dir}``)."""
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        if fam.name == AGENT_INFO:
            for s in fam.samples:
                if s.labels.get("state_dir"):
                    return Path(s.labels["state_dir"])
    return None


def choose_agent(agent_dir: Path | None, agent_url: str | None, default: Path
                 ) -> tuple[Path, SignalSource, list[str]]:
    """(the agent folder every job is told to report to, the source the daemon reads, warnings).

    Jobs must report where the daemon reads, whichever option named the agent: with
    ``--agent-url`` alone the agent is asked for its folder (it must be running); beside
    ``--agent-dir`` the two must name the same agent. Raises AgentChoiceError otherwise.
    """
    notes: list[str] = []
    if agent_url is None:
        folder = agent_dir or default
        source: SignalSource = JobTableSource(folder / "jobs.json")
    else:
        source = MetricsSource(agent_url)
        try:
            said = agent_state_dir(source.fetch())
        except (OSError, urllib.error.URLError, ValueError) as e:
            if agent_dir is None:
                raise AgentChoiceError(
                    f"--agent-url {agent_url}: not reachable ({e}), so the folder jobs must report to is "
                    "unknown: start `gpudiag agent` first, or give its --agent-dir as well") from None
            notes.append(f"agent at {agent_url} not reachable now ({e}): jobs report to --agent-dir "
                         f"{agent_dir}, unchecked against it")
            said = None
        else:
            if said is None:
                raise AgentChoiceError(f"--agent-url {agent_url}: no {AGENT_INFO} there (not a gpudiag "
                                       "agent, or an older one): give --agent-dir instead")
        same = said is None or agent_dir is None or os.path.realpath(said) == os.path.realpath(agent_dir)
        if not same:
            raise AgentChoiceError(f"--agent-dir {agent_dir} and --agent-url {agent_url} name different "
                                   f"agents (that one keeps its state in {said}): give one of them")
        folder = agent_dir or said  # type: ignore[assignment]
    spool = folder / "spool"
    if spool.is_dir():
        closed = closed_to_others(spool)
        if closed:
            notes.append(f"only the agent's own user's jobs can report to {spool}: {closed}")
    return folder, source, notes
