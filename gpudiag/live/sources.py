"""Where ``gpudiag top`` reads the present: agents' ``/metrics`` and a Prometheus server; the
local scheduler's queue is read by the command, as the scheduler's client, and handed in as a
``QueueRead`` (``gpudiag/live`` imports no runtime of the scheduler).

A live view is a client, as ``gpudiag queue`` is of the scheduler: it reads what the agents
export and never talks to hardware or to jobs. Every read says whether it worked; a source
that is down is one line in the view, never an exception and never a row of zeros.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.contract import AGENT_URL, GPU_PREFIX, JOB_PREFIX, SCRAPE_TIMEOUT_S
from gpudiag.scrape import fetch, fetch_text

HTTP_TIMEOUT_S = SCRAPE_TIMEOUT_S  # a refresh must not hang on one wedged agent
# every per-GPU and per-job series of every agent, in one Prometheus query
PROMETHEUS_QUERY = f'{{__name__=~"({GPU_PREFIX}|{JOB_PREFIX}).+"}}'
DEFAULT_AGENT = AGENT_URL  # `gpudiag agent`'s default --listen


@dataclass
class Sample:
    """One series' value, as an agent exported it (counters under their ``_total`` name)."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class NodeRead:
    """What one node's agent exported (``node`` is the agent's address or Prometheus'
    ``instance``), or why it could not be read."""

    node: str
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None


@dataclass
class QueueRead:
    """The local scheduler's queue (``gpudiag queue --json``'s jobs), or why there is none."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    prefix: str = ""  # a job's agent id is "<prefix>:<id>"
    state_dir: Path | None = None
    error: str | None = None


def agent_url(spec: str) -> str:
    """``HOST:PORT``, ``http://HOST:PORT`` or a full ``.../metrics`` URL -> the /metrics URL."""
    url = spec if "://" in spec else f"http://{spec}"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{spec!r}: use HOST:PORT or http://HOST:PORT/metrics")
    return url if parts.path not in ("", "/") else f"{parts.scheme}://{parts.netloc}/metrics"


def parse_exposition(text: str) -> list[Sample]:
    """Prometheus text exposition -> samples (prometheus_client's own parser). ValueError on
    text that is not an exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return [Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def read_agent(url: str, timeout: float = HTTP_TIMEOUT_S) -> NodeRead:
    node = urllib.parse.urlsplit(url).netloc
    try:
        text = fetch_text(url, timeout)
    except (OSError, urllib.error.URLError, ValueError) as e:
        return NodeRead(node, error=f"not reachable: {getattr(e, 'reason', None) or e}")
    try:
        return NodeRead(node, parse_exposition(text))
    except ValueError as e:
        return NodeRead(node, error=f"not a Prometheus exposition: {e}")


def prometheus_nodes(doc: object) -> list[NodeRead]:
    """One ``/api/v1/query`` answer (a vector) -> one NodeRead per ``instance``. ValueError on
    anything else."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"status {doc.get('status') if isinstance(doc, dict) else doc!r}: "
                         f"{doc.get('error', '') if isinstance(doc, dict) else ''}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"result type {data.get('resultType')!r}, expected vector")
    nodes: dict[str, NodeRead] = {}
    for r in data.get("result", []):
        labels = {k: str(v) for k, v in r["metric"].items()}
        name = labels.pop("__name__", "")
        node = labels.pop("instance", "") or "?"
        labels.pop("job", None)  # Prometheus' scrape job, not ours (ours is job_id)
        nodes.setdefault(node, NodeRead(node)).samples.append(Sample(name, labels, float(r["value"][1])))
    return [nodes[n] for n in sorted(nodes)]


def read_prometheus(base: str, timeout: float = HTTP_TIMEOUT_S * 2) -> tuple[list[NodeRead], str | None]:
    """Every node's gpudiag series from Prometheus, and why not (None when it answered)."""
    url = f"{base.rstrip('/')}/api/v1/query?query={urllib.parse.quote(PROMETHEUS_QUERY)}"
    try:
        body = fetch(url, timeout)
    except (OSError, urllib.error.URLError) as e:
        return [], f"Prometheus at {base} not reachable: {getattr(e, 'reason', None) or e}"
    except ValueError as e:
        return [], f"Prometheus at {base}: {e}"
    try:
        doc = json.loads(body)
    except ValueError as e:
        return [], f"Prometheus at {base}: not JSON: {e}"
    try:
        return prometheus_nodes(doc), None
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return [], f"Prometheus at {base}: unexpected answer: {e}"

