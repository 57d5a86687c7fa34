"""``gpudiag cancel ID``: a pending job leaves the queue; a running one gets SIGTERM, its grace, SIGKILL."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("job_id", type=click.IntRange(1))
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="The scheduler's state folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def cancel(job_id: int, state_dir: Path | None, as_json: bool) -> None:
    """Cancel job JOB_ID (yours; root may cancel any)."""
    from gpudiag.scheduler.local.client import ask

    answer = ask(state_dir, {"op": "cancel", "id": job_id})
    click.echo(json.dumps({"id": answer["id"], "state": answer["state"]}) if as_json
               else f"job {answer['id']}: {answer['state']}")
