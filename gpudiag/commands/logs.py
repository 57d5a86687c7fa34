"""``gpudiag logs ID [-f]``: a job's output, through the daemon (it checks that the job is yours)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from gpudiag.commands.oneline import OneLine

FOLLOW_POLL_S = 0.5


@click.command(cls=OneLine, context_settings={"help_option_names": ["-h", "--help"],
                                             "ignore_unknown_options": True})   # -5: a bad id, in one line
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing output until the job ends.")
@click.option("--stderr", is_flag=True, help="The job's stderr (gpudiag profile's notes are there too).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
def logs(job_id: str, follow: bool, stderr: bool, state_dir: Path | None) -> None:
    """Print job JOB_ID's stdout (or --stderr); for a job that could not start, why (on stderr)."""
    from gpudiag.commands.oneline import job_ids
    from gpudiag.scheduler.local.client import ask
    from gpudiag.scheduler.local.protocol import from_wire, printable

    (job,) = job_ids((job_id,), "logs")

    raw = getattr(sys.stdout, "buffer", None)   # the job's bytes as written; text where only text goes
    offset = 0
    while True:
        answer = ask(state_dir, {"op": "logs", "id": job, "stream": "stderr" if stderr else "stdout",
                                 "offset": offset})
        if raw is not None:
            sys.stdout.flush()
            raw.write(from_wire(answer["data"], "the job's output"))
            raw.flush()
        else:
            sys.stdout.write(printable(answer["data"]))
        sys.stdout.flush()
        offset = answer["next"]
        if answer["data"]:
            continue   # more may be waiting: read until caught up
        if not follow or answer["ended"]:
            if answer.get("note"):   # it never ran: say why (also in `gpudiag queue`)
                click.echo(f"gpudiag: {answer['note']}", err=True)
            return
        time.sleep(FOLLOW_POLL_S)
