"""``gpudiag submit --gpus N -- CMD``: queue a job on this machine's scheduler."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from gpudiag.commands.oneline import OneLine
from gpudiag.durations import format_duration
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import Policy


@click.command(cls=OneLine, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", "gpus_text", required=True, metavar="N",
              help="GPUs (CPU slots on a --slots scheduler), all at once.")
@click.option("--tier", default="reserved", show_default=True, metavar="spot|reserved|on-demand",
              help="Higher tiers go first; only a higher tier preempts, or a team under its --quota "
                   "reclaiming it (spot is preemptible capacity).")
@click.option("--team", default="",
              help="Team for fair share and --quota: one of yours (your Unix groups, or the admin's teams "
                   "file: `gpudiag scheduler serve --teams`); default: your default team (your user name "
                   "unless that file names another).")
@click.option("--name", default="", help="The recurring job's key: what earlier runs taught us applies.")
@click.option("--grace", default=format_duration(Policy().default_grace_s), show_default=True,
              help="Time between SIGTERM and SIGKILL when preempted or cancelled (0s to 1h): checkpoint "
                   "in it (Policy.default_grace_s).")
@click.option("--time-limit", default=None,
              help="Stop the job after this long (e.g. 2h, at most 365d; 0: none); backfill trusts it. "
                   "Without it backfill "
                   f"assumes {format_duration(Policy().default_estimate_s)} (Policy.default_estimate_s): "
                   "the job never starts ahead of a reservation.")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(gpus_text: str, tier: str, team: str, name: str, grace: str, time_limit: str | None,
           state_dir: Path | None, as_json: bool, command: tuple[str, ...]) -> None:
    """Queue COMMAND; prints the job id. It runs with your environment, in this folder, as you.

    \b
    Examples:
      gpudiag submit --gpus 4 -- python train.py --lr 3e-4
      gpudiag submit --gpus 1 --tier spot --name sweep-lr --grace 2m -- python sweep.py
    """
    from gpudiag.commands.oneline import gpu_count
    from gpudiag.durations import parse_duration
    from gpudiag.scheduler.local import fields
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.protocol import TIERS, to_wire

    gpus = gpu_count(gpus_text)
    cmd = list(command[1:] if command and command[0] == "--" else command)
    if not cmd:
        raise BadInput("empty command: gpudiag submit --gpus N -- python train.py")
    try:
        grace_s = parse_duration(grace, "--grace")
        limit_s = parse_duration(time_limit, "--time-limit") if time_limit else 0.0
    except click.BadParameter as e:   # one line, as every other refusal of a submit
        raise BadInput(e.format_message()) from None
    # every field the daemon checks, checked here first in the same words (fields.py)
    why = (fields.gpus_error(gpus) or fields.tier_error(tier, list(TIERS)) or fields.label_error("team", team)
           or fields.label_error("name", name) or fields.duration_error("grace_s", grace_s)
           or (fields.duration_error("time_limit_s", limit_s) if limit_s else None))
    if why:
        raise BadInput(why)
    req = {"op": "submit", "gpus": gpus, "tier": tier, "team": team, "name": name,
           "grace_s": grace_s, "time_limit_s": limit_s or None,
           # the bytes the kernel gave us, not their decoding by this locale (docs/scheduler-daemon.md)
           "cmd": [to_wire(os.fsencode(a)) for a in cmd],
           "env": {to_wire(k): to_wire(v) for k, v in os.environb.items()}, "cwd": to_wire(os.getcwdb())}
    answer = ask(state_dir, req)
    click.echo(json.dumps({"id": answer["id"], "agent_job_id": answer["agent_job_id"]}) if as_json
               else str(answer["id"]))
