"""``gpudiag top``: the live view of one node or many — each GPU's activity beside each job's MFU,
bottleneck and step time, the jobs that waste the most GPU-time first."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpudiag.contract import AGENT_LISTEN
from gpudiag.errors import BadInput, GpudiagError

if TYPE_CHECKING:
    from collections.abc import Callable

    from gpudiag.live.snapshot import Snapshot
    from gpudiag.live.sources import QueueRead

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.2, 3600.0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--agent", "agents", multiple=True, metavar="URL",
              help="An agent to read (HOST:PORT or its /metrics URL); repeat for several nodes  "
                   f"[default: this node's, {AGENT_LISTEN}].")
@click.option("--prometheus", metavar="URL",
              help="Read every node's agent through this Prometheus server instead (e.g. "
                   "http://prometheus:9090).")
@click.option("--interval", default="2s", show_default=True, help="Refresh period (e.g. 2s, 500ms, 1m).")
@click.option("--once", is_flag=True, help="Print one snapshot and exit (for scripts and logs).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one snapshot as JSON (implies --once): flat records, so "
                   "pandas.DataFrame(doc['jobs']) is a table.")
def top(agents: tuple[str, ...], prometheus: str | None, interval: str, once: bool, as_json: bool) -> None:
    """Watch GPUs and jobs live: SM, tensor and DRAM activity, NVLink/PCIe, memory and power per
    GPU, and per job its owner, GPUs, step time, unprofiled MFU, bottleneck with confidence,
    profiler dilation, signal age and (when this machine's gpudiag scheduler runs it) tier and
    reason, sorted by wasted GPU-time = GPUs x (1 - MFU / median MFU of its size class).

    Metrics a GPU does not have read n/a (a GPU without GPM has no SM activity). Keys: s next
    sort column, r reverse, o filter by owner, Enter shows the selected job's report path, q quits.

    \b
    Examples:
      gpudiag top                                     # this node's agent
      gpudiag top --agent gpu01:9835 --agent gpu02:9835
      gpudiag top --prometheus http://prometheus:9090
      gpudiag top --once --json > fleet.json
    """
    from gpudiag.durations import parse_duration
    from gpudiag.live.sources import DEFAULT_AGENT, agent_url

    try:
        period = parse_duration(interval, "--interval")
    except click.BadParameter:
        period = -1.0
    if not MIN_INTERVAL_S <= period <= MAX_INTERVAL_S:
        raise BadInput(f"--interval {interval!r}: use a period from {MIN_INTERVAL_S:g}s to "
                       f"{MAX_INTERVAL_S:g}s, e.g. 2s, 500ms or 1m")
    if agents and prometheus:
        raise BadInput("give --agent or --prometheus, not both (Prometheus already scrapes the agents)")
    try:
        urls = [agent_url(a) for a in agents] or ([] if prometheus else [DEFAULT_AGENT])
    except ValueError as e:
        raise BadInput(f"--agent {e}") from None
    fetch = _fetcher(urls, prometheus)
    if once or as_json:
        snap = fetch()
        if as_json:
            click.echo(json.dumps(snap.to_dict(), indent=1))
        else:
            from gpudiag.reports.top_view import render_text

            click.echo(render_text(snap), nl=False)
        _fail_if_nothing_read(snap, urls, prometheus)
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise BadInput("gpudiag top needs a terminal; use --once (or --once --json) for one snapshot")
    from gpudiag.reports.top_app import TopApp

    TopApp(fetch, period).run()


def _fetcher(urls: list[str], prometheus: str | None) -> Callable[[], Snapshot]:
    """The function each refresh calls: read every source, build the snapshot."""
    from concurrent.futures import ThreadPoolExecutor

    from gpudiag.live.snapshot import build_snapshot
    from gpudiag.live.sources import read_agent, read_prometheus

    def fetch() -> Snapshot:
        errors: list[dict[str, str | None]] = []
        if prometheus:
            reads, why = read_prometheus(prometheus)
            if why:
                errors.append({"source": prometheus, "error": why})
        else:
            with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:  # one slow agent at a time
                reads = list(pool.map(read_agent, urls))
        return build_snapshot(reads, read_queue(), time.time(), errors)

    return fetch


def read_queue(state_dir: Path | None = None) -> QueueRead:
    """The local scheduler's queue through its client (as ``gpudiag queue``), or why not: no
    daemon on this machine is the common case, and a line, not an error. Here, in the command,
    because the live model (``gpudiag/live``) reads no scheduler runtime."""
    from gpudiag.live.sources import QueueRead
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.config import default_state_dir

    where = state_dir or default_state_dir(for_client=True)
    try:
        answer = ask(where, {"op": "queue", "all": False})
    except (GpudiagError, OSError, ValueError) as e:
        return QueueRead(state_dir=where, error=str(e))
    return QueueRead(jobs=list(answer.get("jobs", [])), prefix=str(answer.get("prefix", "")),
                     state_dir=where)


def _fail_if_nothing_read(snap: Snapshot, urls: list[str], prometheus: str | None) -> None:
    """--once for scripts: exit 1 (after printing what there is) when no source answered."""
    if any(not s.get("error") for s in snap.sources):
        return
    where = prometheus or ", ".join(urls)
    hint = "" if prometheus or len(urls) > 1 or AGENT_LISTEN not in where else \
        " (is `gpudiag agent` running on this node?)"
    raise GpudiagError(f"nothing could be read from {where}{hint}")
