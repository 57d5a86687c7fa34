"""The ``gpudiag`` command: a click group whose commands are imported only when run.

Lazy loading keeps ``gpudiag --help`` instant and lets an agent node without the analysis
extras still run ``gpudiag agent``. Exit codes are a contract for scripts: 0 ok, 1 the job
(or gpudiag itself) failed, 2 bad input.
"""

from __future__ import annotations

import importlib
import sys

import click

from gpudiag import __version__
from gpudiag.errors import GpudiagError

# command name -> (module, attribute, one-line help shown by `gpudiag --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "analyze": ("gpudiag.commands.analyze", "analyze",
                "Diagnose PyTorch profiler traces: what limits this job, and what to do."),
    "agent": ("gpudiag.commands.agent", "agent",
              "Node daemon: export GPU counters and job signals (MFU, bottleneck) to Prometheus."),
    "profile": ("gpudiag.commands.profile", "profile",
                "Run a training job unchanged, sample GPUs, trace a few steps, diagnose it."),
    "report": ("gpudiag.commands.report", "report",
               "Write a self-contained HTML report of a run directory or of traces."),
    "diff": ("gpudiag.commands.diff", "diff",
             "Compare two runs (before/after) as an HTML page or JSON."),
    "sim": ("gpudiag.commands.sim", "sim",
            "Replay a cluster trace (Philly, Tiresias, sacct) under FIFO, EASY, Tiresias or gpudiag."),
    "scheduler": ("gpudiag.commands.scheduler_cmd", "scheduler",
                  "The embedded gang scheduler for one shared machine: gpudiag scheduler serve."),
    "submit": ("gpudiag.commands.submit", "submit",
               "Queue a job on this machine's scheduler; prints its id."),
    "queue": ("gpudiag.commands.queue", "queue", "List this machine's jobs, and why each pending one waits."),
    "cancel": ("gpudiag.commands.cancel", "cancel", "Cancel jobs by id or --user (yours; root: any)."),
    "logs": ("gpudiag.commands.logs", "logs", "Print a scheduled job's output (-f to follow)."),
    "top": ("gpudiag.commands.top", "top",
            "Live view: per-GPU activity beside each job's MFU, bottleneck and step time."),
    "fleet": ("gpudiag.commands.fleet", "fleet",
              "A range's GPU-hours per team, user and job, and what would win them back (Prometheus)."),
    "log": ("gpudiag.commands.log", "log", "Log a run's diagnosis to an experiment tracker (MLflow)."),
    "hang-report": ("gpudiag.commands.hang_report", "hang_report",
                    "Say what holds a stuck job, from a run's incidents or Flight Recorder dumps."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpudiag")
def main() -> None:
    """GPU performance diagnostics for ML training jobs.

    \b
    Typical use:
      gpudiag profile -- python train.py  # observe a job and diagnose it
      gpudiag analyze ./traces            # verdict for a folder of Kineto traces
      gpudiag analyze rank-0.json.gz --json > diagnosis.json
      gpudiag report runs/my-run          # runs/my-run/report.html
      gpudiag hang-report runs/my-run     # what held a stuck job (or: a folder of FR dumps)
      gpudiag diff runs/before runs/after # ./gpudiag-diff.html
      gpudiag agent                       # node daemon for Prometheus
      gpudiag top                         # live view of this node's GPUs and jobs
      gpudiag fleet --prometheus URL      # the week's GPU-hours: ./fleet.html
      gpudiag submit --gpus 2 -- python train.py   # queue on this machine's scheduler
      gpudiag sim philly.csv --policy gpudiag     # replay a cluster trace

    Exit codes: 0 ok, 1 failure, 2 bad input.
    """


def run() -> None:
    """Console-script entry point: GpudiagError becomes one line and its exit code."""
    try:
        # without standalone mode click returns a command's exit code instead of exiting
        rv = main(standalone_mode=False)
        if isinstance(rv, int):
            sys.exit(rv)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("gpudiag: aborted", err=True)
        sys.exit(130)
    except GpudiagError as e:
        click.echo(f"gpudiag: error: {e}", err=True)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(0)


if __name__ == "__main__":
    run()
