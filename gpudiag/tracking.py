"""A run's diagnosis in an experiment tracker (MLflow): the verdict, its confidence, MFU, the
step's breakdown shares and step-time quantiles as params and metrics of an MLflow run, with
``report.html`` and ``diagnosis.json`` attached.

Teams compare runs in their tracker; a diagnosis that lives only in a run directory is lost
to them. MLflow is optional (``pip install 'gpudiag[mlflow]'``): without it, ``--mlflow`` is
refused in one line before anything runs.

Which run: ``MLFLOW_RUN_ID`` (set by ``mlflow run`` and by jobs that share their run with child
processes) names an existing run, which gets the values and is left running; otherwise a new
run is made in ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME`` (else the default
experiment), named after the run directory, and ended. The server is ``--mlflow URI``, else
``MLFLOW_TRACKING_URI``, else MLflow's own default.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.diagnosis import Diagnosis, summary_figures
from gpudiag.errors import BadInput
from gpudiag.rundir import DIAGNOSIS_JSON, REPORT_HTML

INSTALL_HINT = "--mlflow needs MLflow: pip install 'gpudiag[mlflow]'"
PREFIX = "gpudiag/"  # every key we write, so none collides with the job's own params
ARTIFACT_DIR = "gpudiag"
ARTIFACTS = (REPORT_HTML, DIAGNOSIS_JSON)
# MLflow retries a failing HTTP call 7 times with exponential backoff (minutes): after a job
# has run, one unreachable tracker should cost seconds, not minutes. The user's own settings win.
# MLflow also writes "View run ... at URL" to stdout, which is a script's (gpudiag log prints the
# run id there, gpudiag profile --json the Diagnosis): gpudiag says where the run is on stderr.
MLFLOW_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
                       "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
STEP_QUANTILES = (0.1, 0.5, 0.9)


@dataclass
class TrackerRecord:
    """What goes into the tracker: params (strings, set once per run), metrics, tags, files."""

    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)


def require_mlflow() -> None:
    """BadInput (exit 2) with the install line when MLflow is not importable."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise BadInput(INSTALL_HINT) from None


def step_quantiles(untraced_s: list[float]) -> dict[str, float]:
    """p10/p50/p90 of the untraced step times (seconds); only the median below 10 steps."""
    if not untraced_s:
        return {}
    if len(untraced_s) < 10:
        return {"p50": statistics.median(untraced_s)}
    deciles = statistics.quantiles(untraced_s, n=10)
    return {"p10": deciles[0], "p50": statistics.median(untraced_s), "p90": deciles[8]}


def tracker_record(d: Diagnosis, untraced_s: list[float], run_dir: Path | None) -> TrackerRecord:
    fig = summary_figures(d)
    rec = TrackerRecord()
    for key in ("label", "secondary", "basis", "device"):
        if fig[key] is not None:
            rec.params[PREFIX + ("verdict" if key == "label" else key)] = str(fig[key])
    rec.params[PREFIX + "version"] = d.gpudiag_version
    for key, value in fig.items():
        if isinstance(value, float) and value == value and key not in ("step_time_us",):
            name = key.replace("share_", "share/")
            rec.metrics[PREFIX + name] = value
    for q, v in step_quantiles(untraced_s).items():
        rec.metrics[f"{PREFIX}step_seconds/{q}"] = v
    if not untraced_s and fig["step_time_us"]:
        rec.metrics[f"{PREFIX}step_seconds/mean_traced"] = float(fig["step_time_us"]) / 1e6
    rec.tags[PREFIX + "verdict"] = str(fig["label"])
    if run_dir is not None:
        rec.tags[PREFIX + "run_dir"] = str(run_dir.resolve())
        rec.artifacts = [run_dir / a for a in ARTIFACTS if (run_dir / a).is_file()]
    return rec


def _experiment_id(client: Any) -> str:  # an mlflow.MlflowClient (mlflow is optional)
    exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
    if exp_id:
        return exp_id
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return "0"  # MLflow's default experiment
    exp = client.get_experiment_by_name(name)
    return str(exp.experiment_id if exp is not None else client.create_experiment(name))


def log_record(rec: TrackerRecord, uri: str | None, run_name: str) -> tuple[str, str]:
    """Log ``rec``; returns (run id, where to see it: the run's page on an HTTP tracker, else the
    tracking URI). BadInput with MLflow's reason in one line when the tracker refuses or cannot
    be reached."""
    for k, v in MLFLOW_ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    require_mlflow()
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri or None)
        run_id = os.environ.get("MLFLOW_RUN_ID", "")
        made = not run_id
        if made:
            run_id = client.create_run(_experiment_id(client), run_name=run_name).info.run_id
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in rec.metrics.items()],
                         params=[Param(k, v) for k, v in rec.params.items()],
                         tags=[RunTag(k, v) for k, v in rec.tags.items()])
        for path in rec.artifacts:
            client.log_artifact(run_id, str(path), ARTIFACT_DIR)
        if made:
            client.set_terminated(run_id)
        where = client.tracking_uri
        if where.startswith(("http://", "https://")):
            exp = client.get_run(run_id).info.experiment_id
            where = f"{where.rstrip('/')}/#/experiments/{exp}/runs/{run_id}"
        return run_id, where
    except (MlflowException, OSError) as e:
        raise BadInput(f"MLflow: {' '.join(str(e).split())[:400]}") from None
    except Exception as e:  # noqa: BLE001 - requests/urllib3 errors of a down tracker, as one line
        raise BadInput(f"MLflow: {type(e).__name__}: {' '.join(str(e).split())[:400]}") from None


def log_run_dir(d: Diagnosis, run_dir: Path, uri: str | None) -> tuple[str, str]:
    """Log a run directory's diagnosis (its step timer's quantiles, its files)."""
    from gpudiag.steps import step_times

    st = step_times(run_dir)
    return log_record(tracker_record(d, st.untraced if st else [], run_dir), uri, run_dir.name)
