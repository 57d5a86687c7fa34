"""``gpudiag submit --gpus N -- CMD``: queue a job on this machine's scheduler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from gpudiag.commands.profile import format_duration
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Policy


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", type=int, required=True, help="GPUs (CPU slots on a --slots scheduler), all at once.")
@click.option("--tier", default="reserved", show_default=True, metavar="spot|reserved|on-demand",
              help="Higher tiers go first; only a higher tier preempts, or a team under its --quota "
                   "reclaiming it (spot is preemptible capacity).")
@click.option("--team", default="", help="Team for fair share (default: your user name).")
@click.option("--name", default="", help="The recurring job's key: what earlier runs taught us applies.")
@click.option("--grace", default=format_duration(Policy().default_grace_s), show_default=True,
              help="Time between SIGTERM and SIGKILL when preempted or cancelled: checkpoint in it "
                   "(Policy.default_grace_s).")
@click.option("--time-limit", default=None,
              help="Stop the job after this long (e.g. 2h); backfill trusts it. Without it backfill "
                   f"assumes {format_duration(Policy().default_estimate_s)} (Policy.default_estimate_s): "
                   "the job never starts ahead of a reservation.")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(gpus: int, tier: str, team: str, name: str, grace: str, time_limit: str | None,
           state_dir: Path | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Queue COMMAND; prints the job id. It runs with your environment, in this folder, as you.

    \b
    Examples:
      gpudiag submit --gpus 4 -- python train.py --lr 3e-4
      gpudiag submit --gpus 1 --tier spot --name sweep-lr --grace 2m -- python sweep.py
    """
    from gpudiag.commands.profile import parse_duration
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.protocol import TIERS, to_wire

    cmd = list(command[1:] if command and command[0] == "--" else command)
    if not cmd:
        raise BadInput("empty command: gpudiag submit --gpus N -- python train.py")
    if tier not in TIERS:
        raise BadInput(f"unknown tier {tier!r}: one of {', '.join(TIERS)}")
    if gpus < 1:
        raise BadInput("--gpus must be at least 1")
    req = {"op": "submit", "gpus": gpus, "tier": tier, "team": team, "name": name,
           "grace_s": parse_duration(grace, "--grace"),
           "time_limit_s": parse_duration(time_limit, "--time-limit") if time_limit else None,
           # the bytes the kernel gave us, not their decoding by this locale (docs/scheduler-daemon.md)
           "cmd": [to_wire(os.fsencode(a)) for a in cmd],
           "env": {to_wire(k): to_wire(v) for k, v in os.environb.items()}, "cwd": to_wire(os.getcwdb())}
    answer = ask(state_dir, req)
    click.echo(json.dumps({"id": answer["id"], "agent_job_id": answer["agent_job_id"]}) if as_json
               else str(answer["id"]))
