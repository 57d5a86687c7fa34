"""One observed run of a job: the run directory created, GPU and host sampling around the job,
the job run with the bootstrap on its path, and ``run.json`` kept true from start to end.

Why here and not in the command: ``gpudiag profile`` parses options and decides what to do
with a finished run (diagnose it, report, log to MLflow); running and observing the job is
collection, which touches hardware and a live process, the job of ``collectors/``. What this
module must not know (the stall rule's analysis, the agent's signal reporter) comes in as
callables, so the layers stay one way (docs/layout.md).

Collector failures never change the job's outcome: a GPU that cannot be sampled is a note in
``run.json`` and a line to the caller's ``say``.
"""

from __future__ import annotations

import platform
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.collectors.host import HostSampler
from gpudiag.collectors.job import JobResult, job_env, run_job
from gpudiag.collectors.nvml import NvmlUnavailable, Sampler, open_backend
from gpudiag.contract import ENV_CUPTI_TEARDOWN
from gpudiag.errors import BadInput
from gpudiag.rundir import (
    RunInfo,
    gpu_samples_path,
    host_samples_path,
    last_step,
    prepare_run_dir,
    read_bootstrap,
    write_run,
)

INTERRUPTS = ("SIGINT", "SIGTERM", "SIGHUP")  # the job was asked to stop, not killed


@dataclass
class RunOptions:
    """How to observe the job (``gpudiag profile``'s options, parsed)."""

    out: Path
    interval: float
    steps: int
    skip: int
    backend: str
    retrace_s: float = 0.0
    cupti_teardown: str = "auto"  # collectors.torch_cupti.MODES
    stall_watch: bool = True
    stall_after_s: float | None = None  # None: the rule's default (analyzers/stall.py)


@dataclass
class Watchers:
    """What the caller runs beside the job, built when it can be: ``reporter(run_dir, info,
    current_stall)`` before the job starts (the job's signals to the agent), ``monitor(run_dir,
    pid, reporter)`` once its pid is known (the stall watch; started here, stopped with the
    samplers). Either may be None."""

    reporter: Callable[[Path, RunInfo, Callable[[], Any]], Any] | None = None
    monitor: Callable[[Path, int, Callable[[], Any]], Any] | None = None


@dataclass
class Collected:
    """A finished run: its folder (complete), what ``run.json`` says, and the job's result."""

    run_dir: Path
    info: RunInfo
    result: JobResult
    reporter: Any = None
    monitors: list[Any] = field(default_factory=list)

    @property
    def how(self) -> str:
        r = self.result
        return f"killed by {r.signal}" if r.signal else f"exited with {r.exit_code}"


def collect_run(command: list[str], opts: RunOptions, watchers: Watchers,
                say: Callable[[str], None], version: str) -> Collected:
    """Run ``command`` observed into ``opts.out``. BadInput when the folder cannot be used or the
    command cannot be started (what was collected is kept); otherwise the job's result, whatever
    it was."""
    run_dir = prepare_run_dir(opts.out)
    info = RunInfo(command=command, cwd=str(Path.cwd()), host=socket.gethostname(),
                   start=time.time(), versions={"gpudiag": version, "python": platform.python_version()},
                   options={"interval_s": opts.interval, "steps": opts.steps, "skip": opts.skip,
                            "backend": opts.backend, "retrace_s": opts.retrace_s,
                            "cupti_teardown": opts.cupti_teardown, "stall_watch": opts.stall_watch,
                            "stall_after_s": opts.stall_after_s})
    sampler = _gpu_sampler(run_dir, opts, info, say)
    write_run(run_dir, info)
    host: list[HostSampler] = []
    monitors: list[Any] = []
    reporter = None

    def started(pid: int) -> None:
        info.pid = pid
        write_run(run_dir, info)
        host.append(HostSampler(pid, host_samples_path(run_dir)).start())
        if opts.stall_watch and watchers.monitor is not None:
            monitors.append(watchers.monitor(run_dir, pid, lambda: reporter).start())

    if watchers.reporter is not None:
        reporter = watchers.reporter(run_dir, info, lambda: monitors[0].current() if monitors else None)
    env = job_env(run_dir, opts.skip, opts.steps, opts.retrace_s, opts.cupti_teardown, opts.stall_watch)
    info.cupti_teardown = {"asked": opts.cupti_teardown, "TEARDOWN_CUPTI": env.get("TEARDOWN_CUPTI"),
                           "set_by": "the job's environment" if env.get(ENV_CUPTI_TEARDOWN)
                           == "user" else "gpudiag"}
    try:
        result = run_job(command, env, on_start=started)
    except BadInput:
        info.status, info.end = "failed", time.time()
        info.notes.append("the command could not be started")
        _stop(sampler, host, info, monitors)
        write_run(run_dir, info)
        raise
    _stop(sampler, host, info, monitors)
    _record_end(run_dir, info, result)
    return Collected(run_dir, info, result, reporter, monitors)


def _gpu_sampler(run_dir: Path, opts: RunOptions, info: RunInfo,
                 say: Callable[[str], None]) -> Sampler | None:
    """The NVML (or replay) sampler, started; None where GPUs cannot be sampled (said, noted)."""
    try:
        backend = open_backend(opts.backend)
        info.gpus = backend.describe()
        info.gpu_counters = opts.backend
        return Sampler(backend, gpu_samples_path(run_dir), opts.interval,
                       on_error=lambda m: info.notes.append(m)).start()
    except NvmlUnavailable as e:
        info.gpu_counters = f"not sampled: {e}"
        say(f"GPU counters are not sampled: {e}")
        return None
    except ValueError as e:
        raise BadInput(str(e)) from None


def _record_end(run_dir: Path, info: RunInfo, result: JobResult) -> None:
    """How the job ended, and what its bootstrap recorded, into ``run.json``."""
    info.end = time.time()
    info.exit_code = result.exit_code
    info.signal = result.signal
    if result.signal:
        info.status = "interrupted" if result.signal in INTERRUPTS else "killed"
    else:
        info.status = "completed" if result.exit_code == 0 else "failed"
    if result.forwarded:
        info.notes.append(f"forwarded to the job: {', '.join(result.forwarded)}")
    steps = _step_summary(run_dir)
    info.last_step = steps["last_step"]
    if steps["torch"]:
        info.versions["torch"] = steps["torch"]
    info.notes.extend(steps["notes"])
    if steps["cupti"]:
        info.cupti_teardown["ranks"] = steps["cupti"]
    write_run(run_dir, info)


def _stop(sampler: Sampler | None, host: list[HostSampler], info: RunInfo, monitors: list[Any]) -> None:
    for w in monitors:
        w.stop()
    if sampler is not None:
        st = sampler.stop()
        info.sampler = {"samples": st.samples, "cpu_seconds": round(st.cpu_seconds, 4),
                        "wall_seconds": round(st.wall_seconds, 3), "errors": st.errors}
    for h in host:
        h.stop()


def _step_summary(run_dir: Path) -> dict[str, Any]:
    notes: list[str] = []
    torch_version = None
    cupti: dict[str, dict[str, Any]] = {}
    for rank, meta in sorted(read_bootstrap(run_dir).items()):
        notes.extend(f"rank {rank}: {n}" for n in meta.notes)
        torch_version = torch_version or meta.torch
        if meta.cupti_teardown:
            cupti[str(rank)] = meta.cupti_teardown
            if meta.cupti_teardown.get("skipped"):
                notes.append(f"rank {rank}: CUPTI not torn down after the trace window: "
                             f"{meta.cupti_teardown['skipped']}")
    return {"last_step": last_step(run_dir), "notes": notes, "torch": torch_version,
            "cupti": cupti}
