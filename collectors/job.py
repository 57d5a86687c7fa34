"""Run the user's job as a child process, unchanged, and hand signals on to it.

The job gets gpudiag's stdin/stdout/stderr, its arguments and environment (plus the few
``GPUDIAG_*`` variables and the bootstrap on ``PYTHONPATH``). It runs in its own process
group so gpudiag can forward Ctrl-C/SIGTERM/SIGHUP to all of it (torchrun and its workers,
DataLoader workers) and still outlive it to save what was collected. On a terminal, the
job's group is made the foreground group so it reads the terminal and receives Ctrl-C
exactly as it would without gpudiag.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpudiag.collectors.torch_cupti import job_env_settings
from gpudiag.contract import (
    ENV_FR_BUFFER_SIZE,
    ENV_RETRACE_S,
    ENV_RUN_DIR,
    ENV_SKIP,
    ENV_STALL_WATCH,
    ENV_STEPS,
)
from gpudiag.errors import BadInput

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Kineto's severities: VERBOSE 0, INFO 1, WARNING 2, STAGE 3, ERROR 4, USDT 5; 6 prints none
KINETO_QUIET = "6"


@dataclass
class JobResult:
    exit_code: int  # what gpudiag exits with: the job's code, or 128 + signal number
    signal: str | None  # "SIGKILL" when the job was killed by a signal
    forwarded: list[str]  # signals gpudiag received and passed on


def job_env(run_dir: Path, skip: int, steps: int, retrace_s: float = 0.0,
            cupti_teardown: str = "auto", stall_watch: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + old if old else "")
    env[ENV_RUN_DIR] = str(run_dir.resolve())
    env[ENV_SKIP] = str(skip)
    env[ENV_STEPS] = str(steps)
    env[ENV_RETRACE_S] = str(retrace_s)
    # the stall watch inside the job (collectors/stall_watch.py): black box, stacks on a signal
    env[ENV_STALL_WATCH] = "1" if stall_watch else "0"
    # NCCL collectives are timed by PyTorch's flight recorder (CUDA events per collective);
    # a job's own settings win. The buffer's variable is named for the job's torch, which only
    # the bootstrap sees (torch_collectives.set_flight_recorder_env): torch >= 2.8 reads
    # TORCH_FR_BUFFER_SIZE and warns on every rank when the older name is set.
    env.setdefault(ENV_FR_BUFFER_SIZE, "2000")
    env.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    # Kineto logs "USDT: ... profiler_start/stop" at every trace window, at a severity above
    # ERROR that torch's own default (ERROR) lets through: noise in the job's output that the
    # job never asked for. A job that sets KINETO_LOG_LEVEL itself keeps its choice.
    env.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    # CUPTI released after each trace window (Kineto reads TEARDOWN_CUPTI; set before the job
    # starts, so it holds from libkineto's initialisation on): see torch_cupti.
    env.update(job_env_settings(env, cupti_teardown))
    return env


@contextlib.contextmanager
def _foreground(pgid: int) -> Iterator[None]:
    """Give the terminal to the job's process group for its lifetime, as a shell would."""
    fd = None
    try:
        if sys.stdin.isatty() and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp():
            fd = sys.stdin.fileno()
    except (OSError, ValueError, AttributeError):
        fd = None
    if fd is None:
        yield
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, os.getpgrp())
        signal.signal(signal.SIGTTOU, old)


def run_job(cmd: list[str], env: dict[str, str],
            on_start: Callable[[int], object] | None = None) -> JobResult:
    forwarded: list[str] = []
    try:
        if sys.version_info >= (3, 11):
            child = subprocess.Popen(cmd, env=env, process_group=0)
        else:  # process_group came in 3.11 (pyproject supports 3.10): the same setpgid(0, 0) in the child
            child = subprocess.Popen(cmd, env=env, preexec_fn=os.setpgrp)
    except FileNotFoundError:
        raise BadInput(f"command not found: {cmd[0]}") from None
    except PermissionError:
        raise BadInput(f"command not executable: {cmd[0]}") from None
    except OSError as e:
        raise BadInput(f"cannot start {cmd[0]}: {e.strerror or e}") from None

    def forward(signum: int, frame: object) -> None:
        forwarded.append(signal.Signals(signum).name)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

    # a signal gpudiag was started ignoring (SIGINT in a script's background, SIGHUP under
    # nohup) the job inherited ignored too: left so, as the shell meant, not forwarded to a job
    # that would ignore it while gpudiag waited on
    previous = {s: signal.signal(s, forward) for s in FORWARDED if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        if on_start is not None:
            on_start(child.pid)
        with _foreground(child.pid):
            while True:
                try:
                    code = child.wait()
                    break
                except InterruptedError:
                    continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if code < 0:
        sig = signal.Signals(-code)
        return JobResult(exit_code=128 - code, signal=sig.name, forwarded=forwarded)
    return JobResult(exit_code=code, signal=None, forwarded=forwarded)
