"""``gpudiag queue``: pending, running and recent jobs, each waiting job with the policy's reason.

The table fits 80 columns (a terminal's width where it is wider): one row per job, its reason
on the lines under it, wrapped, since a reason ("next to start: needs 4 GPUs, 2 free; waits for
job 12 to end ...; no quota reclaim: team vision holds 4 of its 4-GPU quota (job 9 of bob)") is
the one thing a user reads in full. ``--json`` carries every field unwrapped.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import textwrap
import time
from pathlib import Path

import click

from gpudiag.durations import short_age
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import TIER_NAMES, Tier

MIN_WIDTH = 80
INDENT = " " * 7           # a reason starts under USER
# ID USER TEAM TIER GPUS STATE TIME: the fixed part of a row, before COMMAND
_ROW = "{id:>6} {user:<8} {team:<8} {tier:<9} {gpus:>5} {state:<9} {time:>6} {cmd}"
FIXED = len(_ROW.format(id="", user="", team="", tier="", gpus="", state="", time="", cmd=""))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _width() -> int:
    """The terminal's width ($COLUMNS first), never under 80: a pipe gets 80."""
    return max(MIN_WIDTH, shutil.get_terminal_size((MIN_WIDTH, 24)).columns)


def _wrap(text: str, width: int, indent: str = INDENT) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=True) or [indent.rstrip()]


def render(answer: dict, now: float, width: int = MIN_WIDTH) -> list[str]:
    """The listing as lines of at most ``width`` characters. Text a user chose (the command, user
    and team names, a reason that quotes them) is shown with bytes that are not UTF-8 as \\xNN."""
    from gpudiag.scheduler.local.protocol import printable

    sig = answer["signals"]
    head = (f"{answer['free']} of {answer['total']} {answer['unit']} free; signals: "
            + (f"node agent ({sig['jobs']} jobs reporting)" if sig["available"]
               else f"none ({sig['why']}): scheduling without the efficiency factor"))
    out = _wrap(head, width, "")
    order = {"running": 0, "stopping": 0, "starting": 0, "pending": 1}
    rows = sorted(answer["jobs"], key=lambda j: order.get(j["state"], 2))
    cmd_width = width - FIXED
    out.append(_ROW.format(id="ID", user="USER", team="TEAM", tier="TIER", gpus=answer["unit"].upper()[:5],
                           state="STATE", time="TIME", cmd="COMMAND"))
    for j in rows:
        start = j["started_t"] or j["submit_t"]
        t = (now if j["ended_t"] is None else j["ended_t"]) - start
        out.append(_ROW.format(id=j["id"], user=_cut(printable(j["user"]), 8),
                               team=_cut(printable(j.get("team", "")), 8), tier=TIER_NAMES[Tier(j["tier"])],
                               gpus=j["gpus"], state=j["state"], time=short_age(t),
                               cmd=_cut(shlex.join(map(printable, j["cmd"])), cmd_width)))
        ended = j["ended_t"] is not None
        why = printable(j["why"])
        if ended and j["exit_code"] is not None and "exit" not in why:
            why += f"; exit {j['exit_code']}"
        if j["slot_ids"]:
            why += f" on {','.join(j['slot_ids'])}"
        out += _wrap(why, width)
        if not ended and j["exit_code"] is not None:   # an earlier launch's, never this one's
            last = j["attempt"] - (j["state"] != "pending")
            out += _wrap(f"attempt {last} ended with exit code {j['exit_code']}", width)
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--all", "everything", is_flag=True, help="Every finished job too (default: the 20 latest).")
@click.option("--user", "user", default=None, metavar="NAME", help="Only NAME's jobs.")
@click.option("--mine", is_flag=True, help="Only your own jobs (--user with your name).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
def queue(everything: bool, user: str | None, mine: bool, state_dir: Path | None, as_json: bool) -> None:
    """List jobs: running, then pending in the order they will start (and why they wait), then ended.

    \b
    Columns: ID, USER, TEAM (whose quota the job uses), TIER, GPUS (or SLOTS),
    STATE, TIME (running or waiting so far), COMMAND; under each job, why it
    waits or how it ended.
    """
    from gpudiag.scheduler.local.client import ask

    if mine:
        if user is not None:
            raise BadInput("give --user NAME or --mine, not both")
        user = pwd.getpwuid(os.getuid()).pw_name
    req: dict = {"op": "queue", "all": everything}
    if user is not None:
        req["user"] = user
    answer = ask(state_dir, req)
    if user is not None and not answer["jobs"] and not mine:
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise BadInput(f"--user {user}: no such user on this machine, and no jobs of that name") from None
    if as_json:
        for j in answer["jobs"]:   # an older daemon did not name the tier
            j.setdefault("tier_name", TIER_NAMES[Tier(j["tier"])])
        out = {k: answer[k] for k in ("jobs", "unit", "total", "free", "signals")}
        out.update({k: answer[k] for k in ("teams", "quota") if k in answer})   # where teams come from
        click.echo(json.dumps(out, indent=1))
        return
    for line in render(answer, time.time(), _width()):
        click.echo(line)
