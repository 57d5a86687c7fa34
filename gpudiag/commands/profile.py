"""``gpudiag profile -- CMD``: observe an unmodified job, then diagnose it."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import click

from gpudiag.errors import BadInput

_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


def parse_interval(text: str) -> float:
    m = _INTERVAL.match(text)
    if not m:
        raise click.BadParameter(f"{text!r}: use e.g. 100ms, 0.5s or 1", param_hint="--interval")
    value = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    if not 0.01 <= value <= 3600:
        raise click.BadParameter("must be between 10ms and 3600s", param_hint="--interval")
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"],
                                 "ignore_unknown_options": False})
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Run directory to create (default: runs/<time>-<command>).")
@click.option("--interval", default="100ms", show_default=True,
              help="GPU sampling interval (e.g. 100ms, 1s).")
@click.option("--steps", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Training steps traced with the torch profiler.")
@click.option("--skip", type=click.IntRange(0, 10**9), default=10, show_default=True,
              help="Steps run untraced first (warm-up, compilation, caches).")
@click.option("--backend", default="nvml", show_default=True, metavar="nvml|replay:FILE",
              help="Where GPU counters come from; replay:FILE plays back recorded samples.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the Diagnosis as JSON (after the job's own output).")
@click.option("--monitor", is_flag=True,
              help="Always-on mode for jobs watched all the time: trace one step only (for MFU "
                   "and the label), then just step timing, sampling and periodic signals to the "
                   "node agent.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def profile(out: Path | None, interval: str, steps: int, skip: int, backend: str, as_json: bool,
            monitor: bool, command: tuple[str, ...]) -> None:
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
    """
    if monitor:
        steps = 1
    opts = ProfileOptions(out=out or _default_out(command), interval=parse_interval(interval),
                          steps=steps, skip=skip, backend=backend, as_json=as_json)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BadInput("no command to profile: gpudiag profile -- python train.py")
    code = profile_job(list(command), opts)
    raise click.exceptions.Exit(code)


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


def _say(msg: str) -> None:
    click.echo(f"gpudiag: {msg}", err=True)


def profile_job(command: list[str], opts: ProfileOptions) -> int:
    """Run, observe, save, diagnose. Returns the job's exit code; collector failures never
    change it (they are reported)."""
    import platform
    import socket

    from gpudiag import __version__
    from gpudiag.collectors.host import HostSampler
    from gpudiag.collectors.job import job_env, run_job
    from gpudiag.collectors.nvml import NvmlUnavailable, Sampler, open_backend
    from gpudiag.rundir import RunInfo, prepare_run_dir, write_run

    run_dir = prepare_run_dir(opts.out)
    info = RunInfo(command=command, cwd=str(Path.cwd()), host=socket.gethostname(),
                   start=time.time(), versions={"gpudiag": __version__,
                                                "python": platform.python_version()},
                   options={"interval_s": opts.interval, "steps": opts.steps, "skip": opts.skip,
                            "backend": opts.backend})
    sampler = None
    try:
        backend = open_backend(opts.backend)
        info.gpus = backend.describe()
        info.gpu_counters = opts.backend
        sampler = Sampler(backend, run_dir / "samples" / "gpu.jsonl", opts.interval,
                          on_error=lambda m: info.notes.append(m)).start()
    except NvmlUnavailable as e:
        info.gpu_counters = f"not sampled: {e}"
        _say(f"GPU counters are not sampled: {e}")
    except ValueError as e:
        raise BadInput(str(e)) from None
    write_run(run_dir, info)
    host: list[HostSampler] = []

    def started(pid: int) -> None:
        info.pid = pid
        write_run(run_dir, info)
        host.append(HostSampler(pid, run_dir / "samples" / "host.jsonl").start())

    reporter = _signal_reporter(run_dir, info)
    try:
        result = run_job(command, job_env(run_dir, opts.skip, opts.steps), on_start=started)
    except BadInput:
        info.status, info.end = "failed", time.time()
        info.notes.append("the command could not be started")
        _stop(sampler, host, info)
        write_run(run_dir, info)
        raise
    _stop(sampler, host, info)
    info.end = time.time()
    info.exit_code = result.exit_code
    info.signal = result.signal
    if result.signal:
        info.status = "interrupted" if result.signal in ("SIGINT", "SIGTERM", "SIGHUP") else "killed"
    else:
        info.status = "completed" if result.exit_code == 0 else "failed"
    if result.forwarded:
        info.notes.append(f"forwarded to the job: {', '.join(result.forwarded)}")
    steps = _step_summary(run_dir)
    info.last_step = steps.get("last_step")
    if steps.get("torch"):
        info.versions["torch"] = steps["torch"]
    info.notes.extend(steps.get("notes", []))
    write_run(run_dir, info)
    how = f"killed by {result.signal}" if result.signal else f"exited with {result.exit_code}"
    at = f" at step {info.last_step}" if info.last_step else ""
    _say(f"job {how}{at}; run directory: {run_dir}")
    d = None
    try:
        d = _diagnose(run_dir, opts, info)
    except Exception as e:  # noqa: BLE001 - the job's outcome must not change
        _say(f"analysis failed: {type(e).__name__}: {e} (the run directory is complete)")
    if reporter is not None:
        _final_signal(reporter, d)
    return result.exit_code


def _signal_reporter(run_dir: Path, info: object) -> object:
    """Signals for the node's agent, when one runs here (its spool exists)."""
    import os

    from gpudiag.collectors.job_signals import SignalReporter
    from gpudiag.jobsignal import default_state_dir, job_id_from_env

    interval = float(os.environ.get("GPUDIAG_SIGNAL_INTERVAL", "15"))
    job_id = job_id_from_env(f"{info.host}:{run_dir.name}")
    reporter = SignalReporter.for_node(default_state_dir(), job_id, run_dir, interval,
                                       _estimator(run_dir))
    if reporter is None:
        return None
    info.notes.append(f"reporting to the node agent as job_id {job_id}")
    return reporter.start()


def _estimator(run_dir: Path):  # noqa: ANN202 - a closure
    """MFU and label while the job runs: the traced steps are analysed once, as soon as rank
    0's trace exists; MFU then follows the measured step time (model FLOPs per step from
    the trace over the recent untraced step time, at the device's peak)."""
    cache: dict[str, object] = {}

    def estimate(step_seconds: float | None) -> dict:
        if "d" not in cache:
            if not (run_dir / "traces" / "rank-0.json.gz").exists():
                return {}
            from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
            from gpudiag.collectors.cpu_peak import cpu_peak

            cache["d"] = diagnose(run_dir / "traces", DeviceChoice(cpu_peak=cpu_peak), jobs=1)
        d = cache["d"]
        b = d.breakdown
        out = {"bottleneck": d.verdict.label.value,
               "input_wait_ratio": b.input_wait / b.step_time if b.step_time > 0 else None}
        if d.mfu.flops_per_step and d.mfu.peak_flops and step_seconds:
            out["mfu_ratio"] = min(1.0, d.mfu.flops_per_step / step_seconds / d.mfu.peak_flops)
        return out

    return estimate


def _final_signal(reporter: object, d: object) -> None:
    fields = {}
    if d is not None:
        b = d.breakdown
        fields = {"mfu_ratio": d.mfu.value, "bottleneck": d.verdict.label.value,
                  "input_wait_ratio": (b.input_wait / b.step_time) if b.step_time > 0 else None}
    reporter.finish(**fields)
    if reporter.error:
        _say(reporter.error)


def _stop(sampler: object, host: list, info: object) -> None:
    if sampler is not None:
        st = sampler.stop()
        info.sampler = {"samples": st.samples, "cpu_seconds": round(st.cpu_seconds, 4),
                        "wall_seconds": round(st.wall_seconds, 3), "errors": st.errors}
    for h in host:
        h.stop()


def _step_summary(run_dir: Path) -> dict:
    import json

    from gpudiag.rundir import read_jsonl

    last = 0
    notes: list[str] = []
    torch_version = None
    for f in sorted((run_dir / "samples").glob("steps-rank-*.jsonl")):
        steps = [r["step"] for r in read_jsonl(f) if isinstance(r.get("step"), int)]
        last = max([last, *steps])
    for f in sorted((run_dir / "samples").glob("bootstrap-rank-*.json")):
        try:
            meta = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        notes.extend(f"rank {meta.get('rank')}: {n}" for n in meta.get("notes", []))
        if meta.get("torch"):
            torch_version = str(meta["torch"])
    return {"last_step": last or None, "notes": notes, "torch": torch_version}


# Traced steps slower than this factor over untraced ones mean the profiler's own per-op cost
# distorts the picture (typical on CPU jobs with many small ops); below it, noise.
PROFILER_INFLATION = 1.5


def _untraced_step_ms(run_dir: Path, opts: ProfileOptions) -> float | None:
    """Median step time of rank 0 outside the profiling window (and its first step)."""
    import statistics

    from gpudiag.rundir import read_jsonl

    window = range(opts.skip, opts.skip + opts.steps + 2)
    dts = [float(r["dt"]) for r in read_jsonl(run_dir / "samples" / "steps-rank-0.jsonl")
           if isinstance(r.get("step"), int) and isinstance(r.get("dt"), (int, float))
           and r["step"] > 1 and r["step"] not in window]
    return statistics.median(dts) * 1e3 if len(dts) >= 3 else None


def _diagnose(run_dir: Path, opts: ProfileOptions, info: object) -> object | None:
    traces = sorted((run_dir / "traces").glob("rank-*.json.gz"))
    if not traces:
        _say(f"no trace was written: the job ran {info.last_step or 0} optimizer steps and the "
             f"profiler window starts after --skip {opts.skip} (lower --skip, or call "
             "gpudiag.step() once per step if the loop has no optimizer)")
        return None
    from gpudiag.analyzers.diagnose import DeviceChoice, diagnose
    from gpudiag.collectors.cpu_peak import cpu_peak
    from gpudiag.reports.terminal import render_terminal

    d = diagnose(run_dir, DeviceChoice(cpu_peak=cpu_peak))
    untraced = _untraced_step_ms(run_dir, opts)
    traced = d.breakdown.step_time / 1e3
    if untraced and traced > PROFILER_INFLATION * untraced:
        d.warnings.append(
            f"traced steps took {traced:.3g} ms against {untraced:.3g} ms untraced (median): the "
            f"profiler slowed them {traced / untraced:.1f}x, mostly per operator, so host/op "
            "overhead is over-represented in this breakdown")
    (run_dir / "diagnosis.json").write_text(d.to_json())
    _write_report(run_dir, d)
    click.echo(d.to_json() if opts.as_json else render_terminal(d))
    return d


def _write_report(run_dir: Path, d: object) -> None:
    """report.html beside diagnosis.json; the report is a convenience, so a failure here is
    one line on stderr and changes nothing else (diagnosis.json is already written)."""
    try:
        from gpudiag.reports.html import render_report

        (run_dir / "report.html").write_text(render_report(d), encoding="utf-8")
    except Exception as e:  # noqa: BLE001 - the job's outcome and the verdict must not change
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        _say(f"report.html not written: {msg}")
