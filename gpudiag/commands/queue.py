"""``gpudiag queue``: pending, running and recent jobs, each waiting job with the policy's reason.

The table fits 80 columns (a terminal's width where it is wider): one row per job, its reason
on the lines under it, wrapped, since a reason ("next to start: needs 4 GPUs, 2 free; waits for
job 12 to end ...; no quota reclaim: team vision holds 4 of its 4-GPU quota (job 9 of bob)") is
the one thing a user reads in full. USER and TEAM are as wide as the longest name shown (a
Linux user name is at most 32 characters), narrowed only to leave the command 16 columns, and
then never below the prefix that tells each name from every other shown: names once cut to 8
read ``vision_…`` for both ``vision_alice`` and ``vision_bob``. ``--json`` carries every field
unwrapped.
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

from gpudiag.commands.oneline import OneLine
from gpudiag.durations import short_age
from gpudiag.errors import BadInput
from gpudiag.scheduler.model import TIER_NAMES, Tier

MIN_WIDTH = 80
INDENT = " " * 7           # a reason starts under USER
NAME_CAP = 32              # USER and TEAM columns at most (useradd's longest name)
MIN_COMMAND = 16           # columns the command keeps before the names are narrowed
# ID USER TEAM TIER GPUS STATE TIME: the fixed part of a row, before COMMAND
_ROW = "{id:>6} {user:<{uw}} {team:<{tw}} {tier:<9} {gpus:>5} {state:<9} {time:>6} {cmd}"


def _fixed(uw: int, tw: int) -> int:
    return len(_ROW.format(id="", user="", team="", tier="", gpus="", state="", time="", cmd="",
                           uw=uw, tw=tw))


def unique_width(names: set[str], header: str) -> int:
    """The narrowest column in which every name is in full or a prefix (and "…") that no other
    name shares."""
    need = len(header)
    for n in names:
        k = 1
        while k < len(n) and any(o != n and o.startswith(n[:k]) for o in names):
            k += 1
        need = max(need, len(n) if k >= len(n) else k + 1)
    return need


def name_columns(users: list[str], teams: list[str], room: int) -> tuple[int, int, dict[str, str]]:
    """(USER width, TEAM width, each name as shown): every name in full up to ``NAME_CAP``
    where the two fit in ``room`` columns; else the wider is narrowed first, never below what
    keeps each name unlike every other (``unique_width``); a cut name ends in "…"."""
    uset, tset = set(users), set(teams)
    uw = max([len("USER"), *(min(len(n), NAME_CAP) for n in uset)])
    tw = max([len("TEAM"), *(min(len(n), NAME_CAP) for n in tset)])
    un, tn = unique_width(uset, "USER"), unique_width(tset, "TEAM")
    uw, tw = max(uw, un), max(tw, tn)
    while uw + tw > room and (uw > un or tw > tn):
        if (uw >= tw and uw > un) or tw <= tn:
            uw -= 1
        else:
            tw -= 1
    shown = {}
    for names, w in ((uset, uw), (tset, tw)):
        for n in names:
            shown[n] = n if len(n) <= w else n[:w - 1] + "…"
    return uw, tw, shown


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
    for gpu, job in sorted((answer.get("undeclared") or {}).items()):
        out += _wrap(f"{answer['unit'].rstrip('s')} {gpu} is not declared any more: job {job} keeps it "
                     "until it ends, then no job is given it", width, "")
    order = {"running": 0, "finishing": 0, "stopping": 0, "starting": 0, "pending": 1}
    rows = sorted(answer["jobs"], key=lambda j: order.get(j["state"], 2))
    users = [printable(j["user"]) for j in rows]
    teams = [printable(j.get("team", "")) for j in rows]
    uw, tw, shown = name_columns(users, teams, width - MIN_COMMAND - _fixed(0, 0))
    cmd_width = max(MIN_COMMAND, width - _fixed(uw, tw))
    out.append(_ROW.format(id="ID", user="USER", team="TEAM", tier="TIER", gpus=answer["unit"].upper()[:5],
                           state="STATE", time="TIME", cmd="COMMAND", uw=uw, tw=tw))
    for j in rows:
        start = j["started_t"] or j["submit_t"]
        t = (now if j["ended_t"] is None else j["ended_t"]) - start
        out.append(_ROW.format(id=j["id"], user=shown[printable(j["user"])],
                               team=shown[printable(j.get("team", ""))], tier=TIER_NAMES[Tier(j["tier"])],
                               gpus=j["gpus"], state=j["state"], time=short_age(t),
                               cmd=_cut(shlex.join(map(printable, j["cmd"])), cmd_width), uw=uw, tw=tw))
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


@click.command(cls=OneLine, context_settings={"help_option_names": ["-h", "--help"]})
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
