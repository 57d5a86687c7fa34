"""``gpudiag hang-report DIR``: the verdict on a stuck job, from a run directory's incidents or
from Flight Recorder dumps PyTorch wrote on its own (a job not run under gpudiag)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gpudiag.errors import BadInput


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--prefix", default=None, metavar="PREFIX",
              help="Dump files are PREFIX<rank> (TORCH_FR_DUMP_TEMP_FILE's file part)  "
                   "[default: the one prefix the folder's files share].")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the incident page here (HTML). A run directory's pages are "
                   "incidents/N/incident.html already.")
@click.option("--json", "as_json", is_flag=True, help="Print the incidents (evidence and verdict) as JSON.")
def hang_report(folder: Path, prefix: str | None, output: Path | None, as_json: bool) -> None:
    """Say what holds a stuck job: which rank never entered which collective, where it is and for
    how long; or that the ranks called different collectives (desync), or shapes (mismatch).

    FOLDER is a `gpudiag profile` run directory (its incidents, judged again by this gpudiag),
    or a folder of Flight Recorder dumps, one file per rank named PREFIX<rank> (pickled, as
    torch writes them with TORCH_FR_DUMP_TEMP_FILE, or JSON). A dump holds each rank's
    collectives, not its stacks: the verdict names the rank and the collective, and where that
    rank last called one.

    \b
    Examples:
      gpudiag hang-report runs/my-run
      gpudiag hang-report /tmp/fr-dumps --prefix nccl_trace_rank_ --json
    """
    from gpudiag.analyzers.hang import verdict
    from gpudiag.incident import Incident, list_incidents, read_incident
    from gpudiag.reports.incident import render_html, render_text
    from gpudiag.rundir import is_run_dir

    if not folder.is_dir():
        raise BadInput(f"{folder}: not a folder (give a run directory or a folder of Flight Recorder dumps)")
    if is_run_dir(folder):
        incidents = []
        for path in list_incidents(folder):
            inc = read_incident(path)
            if inc.evidence.source != "steps":   # a straggler's verdict is the step timer's, kept as is
                inc.verdict = verdict(inc.evidence)
            incidents.append((inc, path.with_name("incident.html")))
        if not incidents:
            click.echo(f"gpudiag: {folder}: no stall, crash in a collective or straggler was recorded "
                       "in this run", err=True)
            if as_json:
                click.echo("[]")
            return
    else:
        from gpudiag.collectors.fr_dumps import dump_evidence

        ev = dump_evidence(folder, prefix)
        incidents = [(Incident(evidence=ev, verdict=verdict(ev)), None)]
    if output is not None:
        try:
            output.write_text(render_html(incidents[-1][0]), encoding="utf-8")
        except OSError as e:
            raise BadInput(f"cannot write {output}: {e.strerror or e}") from None
    if as_json:
        click.echo(json.dumps([inc.to_dict() for inc, _ in incidents], indent=1))
        return
    for inc, page in incidents:
        click.echo(render_text(inc, where=str(output or page) if (output or page) else None))
