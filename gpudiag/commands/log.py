"""``gpudiag log RUN_DIR --mlflow [URI]``: a finished run's diagnosis into an experiment tracker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from gpudiag.diagnosis import Diagnosis
from gpudiag.errors import BadInput
from gpudiag.rundir import diagnosis_path, report_path

MLFLOW_HELP = ("Log to MLflow: the verdict, confidence, MFU, breakdown shares and step-time quantiles "
               "as params and metrics, report.html and diagnosis.json as artifacts, into $MLFLOW_RUN_ID "
               "or a new run. URI: the tracking server (default: $MLFLOW_TRACKING_URI).")


F = TypeVar("F", bound=Callable[..., Any])


def mlflow_option(f: F) -> F:  # a click decorator, shared with gpudiag profile
    return click.option("--mlflow", "mlflow_uri", is_flag=False, flag_value="", default=None,
                        metavar="[URI]", help=MLFLOW_HELP)(f)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run_dir", type=click.Path(path_type=Path))
@mlflow_option
def log(run_dir: Path, mlflow_uri: str | None) -> None:
    """Log the diagnosis of RUN_DIR (a gpudiag profile run directory) to an experiment tracker
    and print the tracker's run id.

    \b
    Examples:
      gpudiag log runs/20250101-120000-train --mlflow http://mlflow:5000
      MLFLOW_RUN_ID=0f3e... gpudiag log runs/my-run --mlflow   # into the training's own run
    """
    from gpudiag.commands.report import load_diagnosis
    from gpudiag.rundir import is_run_dir
    from gpudiag.tracking import log_run_dir, require_mlflow

    if mlflow_uri is None:
        raise BadInput("say where to log: --mlflow [URI] (MLflow is the tracker gpudiag logs to)")
    require_mlflow()
    if not run_dir.is_dir() or not is_run_dir(run_dir):
        raise BadInput(f"{run_dir}: not a gpudiag run directory (no run.json); gpudiag profile makes one")
    d = load_diagnosis(run_dir)
    _complete(run_dir, d)
    run_id, where = log_run_dir(d, run_dir, mlflow_uri or None)
    click.echo(f"gpudiag: logged {run_dir} to MLflow run {run_id}: {where}", err=True)
    click.echo(run_id)


def _complete(run_dir: Path, d: Diagnosis) -> None:
    """Write diagnosis.json and report.html where the run lacks them, so both can be attached."""
    from gpudiag.reports.html import render_report

    try:
        if not diagnosis_path(run_dir).is_file():
            diagnosis_path(run_dir).write_text(d.to_json())
        if not report_path(run_dir).is_file():
            report_path(run_dir).write_text(render_report(d), encoding="utf-8")
    except OSError as e:
        raise BadInput(f"cannot write into {run_dir}: {e.strerror or e}") from None
