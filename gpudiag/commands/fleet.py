"""``gpudiag fleet``: a range's GPU-hours — where they went and what would win them back — from
the Prometheus that scrapes the agents, as one self-contained page, a terminal summary, JSON."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from gpudiag.errors import BadInput, GpudiagError

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_RANGE_S = 400 * 86400   # beyond a year a step of hours hides every job


class NoData(GpudiagError):
    """Prometheus answered, but holds no gpudiag GPU series in the range."""

    exit_code = 1


def parse_since(text: str) -> float:
    m = _SINCE.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise BadInput(f"--since {text!r}: use a duration such as 7d, 24h, 90m or 2w")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


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
    if since and (t_from or t_to):
        raise BadInput("give --since, or --from/--to, not both")
    end = parse_time(t_to, "--to") if t_to else now
    start = parse_time(t_from, "--from") if t_from else end - parse_since(since or "7d")
    if start >= end:
        raise BadInput(f"the range is empty: --from is not before --to ({start:.0f} >= {end:.0f})")
    if end - start > MAX_RANGE_S:
        raise BadInput(f"a range of {(end - start) / 86400:.0f} days: at most {MAX_RANGE_S // 86400} days")
    return start, end


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prometheus", "base", required=True, metavar="URL",
              help="The Prometheus server that scrapes the agents, e.g. http://prometheus:9090.")
@click.option("--since", metavar="DURATION", help="The range: the last 7d, 24h, 90m, ...  [default: 7d]")
@click.option("--from", "t_from", metavar="TIME", help="Range start: unix seconds or ISO 8601 (UTC).")
@click.option("--to", "t_to", metavar="TIME", help="Range end  [default: now].")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=Path("fleet.html"),
              show_default=True, help="The page to write (self-contained HTML).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead (no page).")
def fleet(base: str, since: str | None, t_from: str | None, t_to: str | None, out: Path,
          as_json: bool) -> None:
    """Where a range's GPU-hours went: per team, user and job, GPU-hours and useful GPU-hours
    (x MFU), the 20 jobs that lost the most against their size class's median MFU with their
    bottleneck and top recommendation, GPU-hours held while idle, the label mix over time and the
    scheduler's actions where one exports them. Read from Prometheus' range API at a step sized
    to the range (at most 1,000 points a series), each query cut into spans of 48 steps so that
    Prometheus walks only the series alive in each (a month of 1,000 GPUs: about 7 s on 2 cores);
    every number names its query.

    A job without signals shows its GPU-hours as "no signal", never a guessed MFU; their share is
    on the first screen. An agent restart is a gap in the series, never counted twice.

    \b
    Examples:
      gpudiag fleet --prometheus http://prometheus:9090              # last 7 days, ./fleet.html
      gpudiag fleet --prometheus http://prometheus:9090 --since 24h --out day.html
      gpudiag fleet --prometheus http://prom:9090 --from 2026-11-20T00:00Z --to 2026-11-27T00:00Z
      gpudiag fleet --prometheus http://prometheus:9090 --json > fleet.json

    Exit codes: 0 ok, 1 Prometheus did not answer or holds no gpudiag data in the range, 2 bad input.
    """
    from gpudiag.live.fleet import summarise
    from gpudiag.live.fleet_query import read_fleet
    from gpudiag.reports.fleet_page import render_page, terminal, utc

    if "://" not in base:
        base = f"http://{base}"
    start, end = resolve_range(since, t_from, t_to, time.time())
    data = read_fleet(base, start, end)
    if not data.series.get("gpus"):
        raise NoData(f"Prometheus at {data.base} holds no gpudiag GPU series (gpudiag_gpu_up) from "
                     f"{utc(start)} to {utc(end)}: is it scraping `gpudiag agent`? Try a wider --since.")
    summary = summarise(data)
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=1, allow_nan=False))
        return
    try:
        out.write_text(render_page(summary))
    except OSError as e:
        raise BadInput(f"--out {out}: cannot write: {e.strerror or e}") from None
    click.echo(terminal(summary, str(out)), nl=False)
