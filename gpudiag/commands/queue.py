"""``gpudiag queue``: pending, running and recent jobs, each waiting job with the policy's reason."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click

from gpudiag.scheduler.model import TIER_NAMES, Tier

CMD_WIDTH = 40


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--all", "everything", is_flag=True, help="Every finished job too (default: the 20 latest).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def queue(everything: bool, state_dir: Path | None, as_json: bool) -> None:
    """List jobs: running, then pending in the order they will start (and why they wait), then ended."""
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.protocol import printable

    answer = ask(state_dir, {"op": "queue", "all": everything})
    if as_json:
        for j in answer["jobs"]:   # an older daemon did not name the tier
            j.setdefault("tier_name", TIER_NAMES[Tier(j["tier"])])
        click.echo(json.dumps({k: answer[k] for k in ("jobs", "unit", "total", "free", "signals")}, indent=1))
        return
    sig = answer["signals"]
    click.echo(f"{answer['free']} of {answer['total']} {answer['unit']} free; signals: "
               + (f"node agent ({sig['jobs']} jobs reporting)" if sig["available"]
                  else f"none ({sig['why']}): scheduling without the efficiency factor"))
    now = time.time()
    order = {"running": 0, "stopping": 0, "starting": 0, "pending": 1}
    rows = sorted(answer["jobs"], key=lambda j: order.get(j["state"], 2))
    click.echo(f"{'ID':>5} {'USER':<10} {'TIER':<9} {answer['unit'].upper():>5} {'STATE':<9} {'TIME':>7}  "
               f"{'COMMAND':<{CMD_WIDTH}}  WHY")
    for j in rows:
        t = now - (j["started_t"] or j["submit_t"]) if j["ended_t"] is None else j["ended_t"] - (
            j["started_t"] or j["submit_t"])
        cmd = shlex.join(map(printable, j["cmd"]))   # bytes that are not UTF-8 as \xNN
        cmd = cmd if len(cmd) <= CMD_WIDTH else cmd[:CMD_WIDTH - 1] + "…"
        where = f" on {','.join(j['slot_ids'])}" if j["slot_ids"] else ""
        ended = j["ended_t"] is not None
        why = j["why"]
        if ended and j["exit_code"] is not None and "exit" not in why:
            why += f"; exit {j['exit_code']}"
        click.echo(f"{j['id']:>5} {j['user'][:10]:<10} {TIER_NAMES[Tier(j['tier'])]:<9} {j['gpus']:>5} "
                   f"{j['state']:<9} {_age(t):>7}  {cmd:<{CMD_WIDTH}}  {why}{where}")
        if not ended and j["exit_code"] is not None:   # an earlier launch's, never this one's
            last = j["attempt"] - (j["state"] != "pending")
            click.echo(f"{'':>5} {'':<10} attempt {last} ended with exit code {j['exit_code']}")
