"""``gpudiag profile -- CMD``: observe an unmodified job, then diagnose it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gpudiag.commands.log import mlflow_option
from gpudiag.commands.profile_signals import final_signal, signal_reporter
from gpudiag.diagnosis import Diagnosis
from gpudiag.durations import parse_duration, parse_interval
from gpudiag.errors import BadInput, GpudiagError
from gpudiag.rundir import RunInfo, diagnosis_path, rank_traces, report_path

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.01, 3600.0  # NVML sampling period


def _interval(text: str) -> float:
    return parse_interval(text, "--interval", MIN_INTERVAL_S, MAX_INTERVAL_S)


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "ignore_unknown_options": False})
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Run directory to create (default: runs/<time>-<command>).")
@click.option("--interval", default="100ms", show_default=True,
              help="GPU sampling interval (e.g. 100ms, 1s).")
@click.option("--steps", type=click.IntRange(1, 1000), default=None,
              help="Training steps traced with the torch profiler  [default: 5; 2 with --monitor].")
@click.option("--skip", type=click.IntRange(0, 10**9), default=10, show_default=True,
              help="Steps run untraced first (warm-up, compilation, caches).")
@click.option("--backend", default="nvml", show_default=True, metavar="nvml|none|replay:FILE",
              help="Where GPU counters come from: NVML; none (do not sample GPUs); replay:FILE "
                   "plays back recorded samples.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the Diagnosis as JSON (after the job's own output).")
@click.option("--monitor", is_flag=True,
              help="Always-on mode for jobs watched all the time: trace a short window (2 steps: "
                   "one traced step can read host-bound), again every --retrace, and in between "
                   "only step timing, sampling and periodic signals to the node agent.")
@click.option("--retrace", default=None, metavar="DURATION",
              help="Open a new trace window this often (e.g. 10m, 600s; 0 = once), so a job that "
                   "changes phase gets a fresh label  [default: 10m with --monitor, else 0].")
@click.option("--cupti-teardown", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="Release CUPTI after each trace window so the job runs as fast after it as "
                   "before (Kineto leaves it attached otherwise: 10-20% slower for the job's "
                   "life on a GPU). auto: unless the job uses CUDA graphs, with which teardown "
                   "crashed before CUDA 12.6; on: always; off: leave it attached. A "
                   "TEARDOWN_CUPTI set in the environment wins.")
@click.option("--stall-watch/--no-stall-watch", default=True, show_default=True,
              help="Notice a job that stops finishing steps, gather every rank's stacks and "
                   "collectives at that moment without stopping it, and name what holds it "
                   "(incidents/N/incident.html; docs/stall.md).")
@click.option("--stall-after", default=None, metavar="DURATION",
              help="No step for this long is a stall (e.g. 20s, 5m)  [default: max(10 x the "
                   "rank's median step, 60s); 10m before the first step].")
@mlflow_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile(out: Path | None, interval: str, steps: int | None, skip: int, backend: str,
            as_json: bool, monitor: bool, retrace: str | None, cupti_teardown: str,
            stall_watch: bool, stall_after: str | None,
            mlflow_uri: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND unchanged while sampling GPUs and tracing a few steps, then diagnose it.

    The job keeps its arguments, stdin/stdout/stderr, environment and exit code; gpudiag
    exits with the job's exit code (128+N when a signal N killed it). Every rank started by
    the job (torchrun included) is traced for --steps steps after --skip steps, counted by
    optimizer steps (or gpudiag.step() in loops without an optimizer). Everything lands in
    the run directory, even when the job crashes or is killed.

    \b
    Examples:
      gpudiag profile -- python train.py --lr 3e-4
      gpudiag profile --steps 3 --skip 20 -- torchrun --nproc_per_node 8 train.py
      gpudiag profile --out runs/slow-job --json -- python train.py > out.txt
      gpudiag profile --mlflow http://mlflow:5000 -- python train.py
    """
    if steps is None:
        steps = MONITOR_STEPS if monitor else DEFAULT_STEPS
    elif monitor and steps < MONITOR_STEPS:
        raise click.BadParameter(f"--monitor traces at least {MONITOR_STEPS} steps (one traced step "
                                 "cannot tell a slow step from a slow job)", param_hint="--steps")
    retrace_s = parse_duration(retrace, "--retrace") if retrace is not None else (
        MONITOR_RETRACE_S if monitor else 0.0)
    stall_after_s = parse_duration(stall_after, "--stall-after") if stall_after is not None else None
    if stall_after_s is not None and stall_after_s <= 0:
        raise click.BadParameter("must be longer than 0 (--no-stall-watch turns the watch off)",
                                 param_hint="--stall-after")
    if mlflow_uri is not None:
        from gpudiag.tracking import require_mlflow

        require_mlflow()  # before the job runs, not after hours of it
    opts = ProfileOptions(out=out or _default_out(command), interval=_interval(interval),
                          steps=steps, skip=skip, backend=backend, as_json=as_json,
                          retrace_s=retrace_s, mlflow_uri=mlflow_uri,
                          cupti_teardown=cupti_teardown, stall_watch=stall_watch,
                          stall_after_s=stall_after_s)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BadInput("no command to profile: gpudiag profile -- python train.py")
    code = profile_job(list(command), opts)
    raise click.exceptions.Exit(code)


DEFAULT_STEPS = 5
# One traced step read host-bound on a GPT job whose truth is memory-bound: one step cannot
# tell a slow step from a slow job, two can (and the analysis flags a lone step's confidence).
MONITOR_STEPS = 2
# How often --monitor re-traces: often enough that a job that changes phase (eval, a new
# curriculum stage) is relabelled within minutes, rare enough that a window's cost (a few
# dilated steps and an export) stays well under 1% of the run.
MONITOR_RETRACE_S = 600.0
def _default_out(command: tuple[str, ...]) -> Path:
    words = [c for c in command if c != "--"]
    script = next((w for w in words if w.endswith(".py")), words[0] if words else "job")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem)[:40] or "job"
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"


@dataclass
class ProfileOptions:
    out: Path
    interval: float
    steps: int
    skip: int
    backend: str
    as_json: bool
    retrace_s: float = 0.0
    mlflow_uri: str | None = None  # None: no MLflow; "": $MLFLOW_TRACKING_URI or MLflow's default
    cupti_teardown: str = "auto"  # collectors.torch_cupti.MODES
    stall_watch: bool = True
    stall_after_s: float | None = None  # None: the rule's default (analyzers/stall.py)


def _say(msg: str) -> None:
    click.echo(f"gpudiag: {msg}", err=True)


def profile_job(command: list[str], opts: ProfileOptions) -> int:
    """Run and observe (``collectors/run.py``), then diagnose. Returns the job's exit code;
    collector and analysis failures never change it (they are reported)."""
    from gpudiag import __version__
    from gpudiag.collectors.run import RunOptions, Watchers, collect_run

    how = RunOptions(out=opts.out, interval=opts.interval, steps=opts.steps, skip=opts.skip,
                     backend=opts.backend, retrace_s=opts.retrace_s, cupti_teardown=opts.cupti_teardown,
                     stall_watch=opts.stall_watch, stall_after_s=opts.stall_after_s)

    def monitor(run_dir: Path, pid: int, reporter: Callable[[], object]) -> object:
        return _stall_monitor(run_dir, pid, opts, reporter)

    run = collect_run(command, how, Watchers(reporter=signal_reporter, monitor=monitor), _say, __version__)
    run_dir, info, result = run.run_dir, run.info, run.result
    _leave_analysis_on_term(result.exit_code)
    at = f" at step {info.last_step}" if info.last_step else ""
    _say(f"job {run.how}{at}; run directory: {run_dir}")
    if opts.stall_watch:
        from gpudiag.commands.profile_stall import after_job

        try:
            after_job(run_dir, run.monitors[0] if run.monitors else None, info.status, run.how,
                      bool(result.forwarded))
        except Exception as e:  # noqa: BLE001 - the job's outcome must not change
            _say(f"stall report failed: {type(e).__name__}: {e}")
    d = None
    try:
        d = _diagnose(run_dir, opts, info)
    except Exception as e:  # noqa: BLE001 - the job's outcome must not change
        _say(f"analysis failed: {type(e).__name__}: {e} (the run directory is complete)")
    if run.reporter is not None:
        final_signal(run.reporter, d, run_dir)
    if d is not None and opts.mlflow_uri is not None:
        _log_mlflow(d, run_dir, opts.mlflow_uri)
    _exit_past_busy_threads(result.exit_code)
    return result.exit_code


def _exit_past_busy_threads(code: int) -> None:
    """The job's exit code, even where the signal thread is still inside an estimate (its join
    gives up after 5 s; on a loaded machine the estimate measures CPU peaks with torch for
    longer): interpreter shutdown under it aborts in C++ ("terminate called without an active
    exception"), and gpudiag exited 134 for a job that exited 0. Then leave without finalizing:
    the run directory, the report and the final signal are already written."""
    import os
    import sys
    import threading

    if any(t.is_alive() and t.daemon and t.name.startswith("gpudiag-") for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _leave_analysis_on_term(code: int) -> None:
    """From here the run folder is complete and the job has ended: a SIGTERM (the scheduler's
    bound on the analysis, docs/scheduler-daemon.md) ends the analysis, and gpudiag exits with
    the job's own exit code, which its parent reads from waitpid as the job's."""
    import os
    import signal
    import sys

    def leave(*_: object) -> None:
        try:
            sys.stderr.write("gpudiag: analysis stopped (SIGTERM); the run directory is complete\n")
            sys.stderr.flush()
        finally:
            os._exit(code)

    signal.signal(signal.SIGTERM, leave)


def _log_mlflow(d: Diagnosis, run_dir: Path, uri: str) -> None:
    """The diagnosis into MLflow; a tracker that fails is one line, the job's exit code stands."""
    from gpudiag.tracking import log_run_dir

    try:
        run_id, where = log_run_dir(d, run_dir, uri or None)
    except GpudiagError as e:
        _say(f"not logged to MLflow: {e}")
        return
    _say(f"logged to MLflow run {run_id}: {where}")


def _stall_monitor(run_dir: Path, pid: int, opts: ProfileOptions, reporter: Callable[[], Any]) -> object:
    """The stall watch over the job started as ``pid`` (collectors/stall_monitor.py); when a stall
    begins or ends the agent hears at once (``reporter()``: the signal reporter, if any)."""
    from gpudiag.analyzers.stall import StallRule
    from gpudiag.collectors.stall_monitor import StallMonitor
    from gpudiag.commands import profile_stall

    rule = StallRule(after_s=opts.stall_after_s)

    def changed() -> None:
        r = reporter()
        if r is not None:
            r.send()

    return StallMonitor(run_dir, pid, profile_stall.judge(rule), profile_stall.on_incident(run_dir),
                        profile_stall.on_resolved(run_dir), rule.describe(), on_change=changed)


def _diagnose(run_dir: Path, opts: ProfileOptions, info: RunInfo) -> Diagnosis | None:
    traces = rank_traces(run_dir)
    if not traces:
        _say(f"no trace was written: the job ran {info.last_step or 0} optimizer steps and the "
             f"profiler window starts after --skip {opts.skip} (lower --skip, or call "
             "gpudiag.step() once per step if the loop has no optimizer)")
        return None
    from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
    from gpudiag.collectors.cpu_peak import cpu_peak, raise_floor, this_host
    from gpudiag.collectors.gemm_probe import autocast_ratios
    from gpudiag.reports.progress import for_stderr
    from gpudiag.reports.terminal import render_terminal

    choice = DeviceChoice(cpu_peak=cpu_peak, peak_floor=raise_floor, host=this_host(),
                          gemm_probe=autocast_ratios)
    d = diagnose(run_dir, choice, progress=for_stderr())
    diagnosis_path(run_dir).write_text(d.to_json())
    _write_report(run_dir, d)
    click.echo(d.to_json() if opts.as_json else render_terminal(d))
    return d


def _write_report(run_dir: Path, d: Diagnosis) -> None:
    """report.html beside diagnosis.json; the report is a convenience, so a failure here is
    one line on stderr and changes nothing else (diagnosis.json is already written)."""
    try:
        from gpudiag.reports.html import render_report

        report_path(run_dir).write_text(render_report(d), encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - the job's outcome and the verdict must not change
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        _say(f"report.html not written: {msg}")
