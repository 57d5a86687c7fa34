"""``gpudiag cancel ID [ID ...]`` or ``--user NAME``: a pending job leaves the queue; a running one
gets SIGTERM, its grace, SIGKILL."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpudiag.commands.oneline import OneLine
from gpudiag.errors import BadInput


@click.command(cls=OneLine, context_settings={"help_option_names": ["-h", "--help"],
                                             "ignore_unknown_options": True})   # -5: a bad id, in one line
@click.argument("job_ids", nargs=-1)
@click.option("--user", "user", default=None, metavar="NAME",
              help="Every pending and running job of NAME (your own; root: anyone's).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def cancel(job_ids: tuple[str, ...], user: str | None, state_dir: Path | None, as_json: bool) -> None:
    """Cancel jobs JOB_IDS, or all of one user's (yours; root may cancel any).

    Each id is cancelled or refused on its own: the others go ahead, every refusal is one line
    on stderr, and the exit code is 2 if any was refused.

    \b
    Examples:
      gpudiag cancel 12 13 14
      gpudiag cancel --user alice        # all of alice's pending and running jobs
    """
    from gpudiag.commands.oneline import job_ids as parse_ids
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.protocol import printable

    ids = parse_ids(job_ids, "cancel")
    if bool(ids) == (user is not None):
        raise BadInput("give job ids (gpudiag cancel 12 13) or --user NAME, one of the two")
    req: dict = {"op": "cancel", **({"user": user} if user is not None else {"ids": ids})}
    answer = ask(state_dir, req)
    jobs = answer["jobs"]
    refused = [j for j in jobs if "error" in j]
    if as_json:
        click.echo(json.dumps({"jobs": jobs}))
    elif user is not None:
        states: dict[str, int] = {}
        for j in jobs:
            states[j["state"]] = states.get(j["state"], 0) + 1
        click.echo(f"{printable(user)}: {len(jobs)} job{'s' if len(jobs) != 1 else ''} cancelled"
                   + (f" ({', '.join(f'{n} {s}' for s, n in sorted(states.items()))})" if jobs else
                      " (none pending or running)"))
    else:
        for j in jobs:
            if "error" not in j:
                click.echo(f"job {j['id']}: {j['state']}")
    for j in refused:
        click.echo(f"gpudiag: error: {j['error']}", err=True)
    if refused:
        raise SystemExit(2)
