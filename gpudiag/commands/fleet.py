"""``gpudiag fleet``: a range's GPU-hours — where they went and what would win them back — from
the Prometheus that scrapes the agents, as one self-contained page with a CSV of its jobs, a
terminal summary, or JSON."""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpudiag import contract as c
from gpudiag.errors import BadInput, GpudiagError

if TYPE_CHECKING:
    from gpudiag.live.fleet import SlurmJob
    from gpudiag.live.fleet_model import FleetSummary
    from gpudiag.live.prom_client import Prometheus

MAX_RANGE_S = 400 * 86400   # beyond a year a step of hours hides every job


class NoData(GpudiagError):
    """Prometheus answered, but holds no gpudiag GPU series in the range."""

    exit_code = 1


def parse_since(text: str) -> float:
    """``--since`` as every duration option reads it (gpudiag/durations.py), and more than 0."""
    from gpudiag.durations import parse_duration

    hint = f"--since {text!r}: use a duration such as 7d, 24h, 90m or 2w"
    try:
        v = parse_duration(text, "--since")
    except click.BadParameter:
        raise BadInput(hint) from None
    if v <= 0:
        raise BadInput(hint)
    return v


def parse_time(text: str, option: str) -> float:
    """Unix seconds or ISO 8601 (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"{option} {text!r}: use unix seconds or ISO 8601, e.g. 2026-11-20T00:00Z") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.timestamp()


def resolve_range(since: str | None, t_from: str | None, t_to: str | None,
                  now: float) -> tuple[float, float]:
    """The range asked for (start, end); ``clip`` cuts it at now."""
    if since and (t_from or t_to):
        raise BadInput("give --since, or --from/--to, not both")
    end = parse_time(t_to, "--to") if t_to else now
    start = parse_time(t_from, "--from") if t_from else end - parse_since(since or "7d")
    if start >= end:
        raise BadInput(f"the range is empty: --from is not before --to ({start:.0f} >= {end:.0f})")
    if end - start > MAX_RANGE_S:
        raise BadInput(f"a range of {(end - start) / 86400:.0f} days: at most {MAX_RANGE_S // 86400} days")
    return start, end


def clip(start: float, end: float, now: float) -> float:
    """The range's end, no later than now: what has not happened holds no GPU-hours (and an
    end in the future would read Prometheus' last samples again). A range wholly in the
    future is bad input."""
    if start >= now:
        from gpudiag.reports.fleet_text import utc

        raise BadInput(f"the range starts at {utc(start)}, after now ({utc(now)}): nothing has run in it "
                       "yet; give a --from in the past, or --since")
    return min(end, now)


def _secs(text: str | None) -> float | None:
    if text is None:
        return None
    from gpudiag.durations import parse_duration

    v = parse_duration(text, "--scrape-interval")
    if v <= 0:
        raise BadInput("--scrape-interval must be more than 0, e.g. 15s")
    return v


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": False})
@click.option("--prometheus", "url", required=True, metavar="URL", envvar=c.ENV_PROMETHEUS, show_envvar=True,
              help="The Prometheus that scrapes the agents, with its route prefix if it has one: "
                   "http://prometheus:9090, https://mon.example.org/prometheus.")
@click.option("--prometheus-user", "user", metavar="NAME", envvar=c.ENV_PROMETHEUS_USER, show_envvar=True,
              help="Basic auth user (with --prometheus-password-file).")
@click.option("--prometheus-password-file", "password_file", metavar="FILE",
              envvar=c.ENV_PROMETHEUS_PASSWORD_FILE, show_envvar=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding the basic auth password (never given as a value: it would be in ps "
                   "and shell history).")
@click.option("--bearer-token-file", "token_file", metavar="FILE", envvar=c.ENV_PROMETHEUS_TOKEN_FILE,
              show_envvar=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding a bearer token (an auth proxy's, or a cloud Prometheus').")
@click.option("--ca-file", metavar="FILE", envvar=c.ENV_PROMETHEUS_CA_FILE, show_envvar=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The CA certificate(s) that signed the https server's certificate.")
@click.option("--insecure", is_flag=True, envvar=c.ENV_PROMETHEUS_INSECURE, show_envvar=True,
              help="https without checking the server's certificate.")
@click.option("--since", metavar="DURATION", help="The range: the last 7d, 24h, 90m, 2w ...  [default: 7d]")
@click.option("--from", "t_from", metavar="TIME", help="Range start: unix seconds or ISO 8601 (UTC).")
@click.option("--to", "t_to", metavar="TIME", help="Range end  [default: now; a later end is cut at now].")
@click.option("--scrape-interval", metavar="DURATION",
              help="Seconds each sample stands for, where Prometheus does not say (no targets API, "
                   "e.g. behind Thanos): 15s.  [default: each target's, from /api/v1/targets]")
@click.option("--no-slurm", is_flag=True,
              help="Do not ask squeue/sacct who ran the jobs that sent no signal.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=Path("fleet.html"),
              show_default=True, help="The page to write (self-contained HTML).")
@click.option("--csv", "csv_out", type=click.Path(dir_okay=False, path_type=Path),
              help="The per-job table as CSV  [default: beside the page, fleet.csv].")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead (no page).")
def fleet(url: str, user: str | None, password_file: Path | None, token_file: Path | None,
          ca_file: Path | None, insecure: bool, since: str | None, t_from: str | None, t_to: str | None,
          scrape_interval: str | None, no_slurm: bool, out: Path, csv_out: Path | None,
          as_json: bool) -> None:
    """Where a range's GPU-hours went and what would win them back: the three fixes that win
    the most GPU-hours a week, useful against held GPU-hours per team, user, node and job, the
    jobs that lost the most (idle, below their peers' MFU, or what their fix would save),
    held GPU-hours by bottleneck label over the days, and the previous period beside it.

    Exact at any range: every GPU-second is a sample Prometheus stored times its scrape
    interval, counted in windows that tile the range (at most 1,000), so a 5-minute job in a
    7-day range counts in full. A range that ends in the future is cut at now.

    Every job is attributed: a job run under gpudiag (`profile`, `--monitor`) by its signals,
    with or without an MFU; a job that sent none ("no signal") by Slurm (squeue, sacct) where
    this host reaches it, else by the uid its node saw running it.

    Credentials as Prometheus' own clients take them, from files: --prometheus-user with
    --prometheus-password-file, or --bearer-token-file; user:password@ in the URL works too.
    They are never printed, nor written into the page, its links or the JSON.

    \b
    Examples:
      gpudiag fleet --prometheus http://prometheus:9090              # last 7 days: fleet.html, fleet.csv
      gpudiag fleet --prometheus http://prometheus:9090 --since 24h --out day.html
      gpudiag fleet --prometheus https://mon.example.org/prometheus --ca-file ca.pem \\
          --prometheus-user lead --prometheus-password-file ~/.prom-pass --since 2w
      gpudiag fleet --prometheus http://prom:9090 --from 2026-11-20T00:00Z --to 2026-11-27T00:00Z
      gpudiag fleet --prometheus http://prometheus:9090 --json > fleet.json

    Exit codes: 0 ok, 1 Prometheus did not answer, refused, or holds no gpudiag data in the
    range, 2 bad input.
    """
    from gpudiag.live.prom_client import Prometheus, resolve_auth

    base, auth = resolve_auth(url, user, password_file, token_file, ca_file, insecure)
    now = time.time()
    start, req_end = resolve_range(since, t_from, t_to, now)
    end = clip(start, req_end, now)
    explicit = _secs(scrape_interval)
    summary = read_and_sum(Prometheus(base, auth), start, end, req_end, explicit, not no_slurm)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, allow_nan=False))
        if csv_out is not None:
            _write(csv_out, "--csv", _csv(summary))
        return
    from gpudiag.reports.fleet_page import render_page
    from gpudiag.reports.fleet_text import terminal

    csv_path = csv_out or out.with_suffix(".csv")
    href = csv_path.name if csv_path.parent == out.parent else str(csv_path)
    _write(out, "--out", render_page(summary, href))
    _write(csv_path, "--csv", _csv(summary))
    click.echo(terminal(summary, str(out), str(csv_path)), nl=False)


def _csv(summary: FleetSummary) -> str:
    from gpudiag.reports.fleet_text import jobs_csv

    return jobs_csv(summary)


def _write(path: Path, option: str, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise BadInput(f"{option} {path}: cannot write: {e.strerror or e}") from None


def read_and_sum(prom: Prometheus, start: float, end: float, req_end: float, explicit: float | None,
                 slurm: bool) -> FleetSummary:
    """Read the range and the one before it, ask Slurm about the silent jobs, sum."""
    with _no_cycle_collection():
        return _read_and_sum(prom, start, end, req_end, explicit, slurm)


@contextlib.contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """Python's cycle collector off while the answers are read and summed: they are millions of
    small tuples and dicts with no cycles (reference counting frees them), and the collector,
    woken by every few hundred allocations, walked them again and again: with it, decoding and
    summing 10,000 jobs took 0.95 + 2.37 s of CPU, without it 0.38 + 1.74 (tests/test_fleet_sums'
    month of 10,000 jobs, 2-core AMD EPYC VM, load 13)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_and_sum(prom: Prometheus, start: float, end: float, req_end: float, explicit: float | None,
                  slurm: bool) -> FleetSummary:
    from gpudiag.live.fleet import slurm_ids, summarise
    from gpudiag.live.fleet_query import QUERY_TIMEOUT_S, grid_for, left_open
    from gpudiag.live.fleet_read import PREVIOUS_QUERIES, read_fleet
    from gpudiag.reports.fleet_text import utc

    version = prom.version(QUERY_TIMEOUT_S)
    grid = grid_for(start, end, left_open(version))
    targets = prom.scrape_intervals(QUERY_TIMEOUT_S)
    # the previous period first, summed and dropped before this one is read: one period's
    # answers in memory at a time (Slurm is asked about each period's silent jobs in turn)
    before, _ = read_fleet(prom, grid.previous(), targets, explicit, names=PREVIOUS_QUERIES)
    before_sum: FleetSummary | None = None
    notes: list[str] = []
    if any(s.points for s in before.series.get("gpu_samples", [])):
        who, notes = _who(slurm_ids(before), slurm)
        before_sum = summarise(before, who)
    del before
    data, read_notes = read_fleet(prom, grid, targets, explicit, requested=(start, req_end))
    if not any(s.points for s in data.series.get("gpu_samples", [])):
        raise NoData(f"Prometheus at {prom.base} holds no gpudiag GPU series ({c.GPUS_HELD}, "
                     f"{c.GPU_UP}) from {utc(grid.start)} to {utc(grid.end)}: is it scraping "
                     "`gpudiag agent`? Try a wider --since.")
    who, slurm_notes = _who(slurm_ids(data), slurm)
    return summarise(data, who, before_sum, read_notes + list(dict.fromkeys(slurm_notes + notes)))


def _who(ids: set[str], slurm: bool) -> tuple[dict[str, SlurmJob], list[str]]:
    from gpudiag.live.fleet_slurm import slurm_jobs

    return slurm_jobs(ids) if slurm else ({}, ["Slurm not asked (--no-slurm)"])
