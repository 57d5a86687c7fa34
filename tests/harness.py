"""Real services and real users for tests, started once here and stopped whatever happens.

Several test files need the same two things that are costly to get right: a real Prometheus
server scraping a target, and real unprivileged Unix users (the agent's owner binding, the
local scheduler's per-user jobs). One home for each, so a fix to either reaches every test;
and a job run under ``gpudiag profile`` to its diagnosis (``profiled``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.jobs._timer import GO, READY


def profiled(run: Path, job: list[str], timeout: float = 600):  # -> gpudiag's Diagnosis
    """``job`` (a script and its arguments) run under ``gpudiag profile --out run`` with its
    defaults; the diagnosis it wrote. The run's stderr is in the failure where it exits non-zero."""
    from gpudiag.diagnosis import Diagnosis

    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--",
                           sys.executable, *job], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Diagnosis.from_json((run / "diagnosis.json").read_text())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    """``torch.distributed.run`` on ``nproc`` local ranks, its rendezvous on a port it binds itself.

    ``--standalone`` lets the launcher's store bind port 0: a port picked here and passed as
    ``--master_port`` could be taken by another test's connection before torchrun binds it (the
    suite has seen it), and the job failed with "address already in use"."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]


def needs_torch() -> None:
    """Skip the calling module where torch is not installed (as ``pytest.importorskip("torch")``),
    without importing it: a module's import is its collection, which every worker of `make test`'s
    first pass does for every module (torch's import: ~2 CPU-s apiece, where these modules' tests
    only start jobs that import it themselves)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("could not import 'torch': not installed", allow_module_level=True)


# Where the condition of a ``skipif`` mark (a string, evaluated when the test is set up, not when
# its module is collected: see ``needs_torch``): torch built without gloo.
NO_GLOO = ("not __import__('torch').distributed.is_available() "
           "or not __import__('torch').distributed.is_gloo_available()")


# torch 2.13's gloo can abort a rank as its process exits, after the job's steps and gpudiag's
# records are written ("terminate called without an active exception", SIGABRT), though the job
# waits at a barrier and destroys its group first: seen unobserved, with no gpudiag in the
# process, and in CI clones under `gpudiag profile` (2026-11-29, the straggler job at its step 30
# of 30). Such a run's numbers stand; any other failure still fails the test.
TEARDOWN_ABORT = "terminate called"


def torchrun_ran(proc: subprocess.CompletedProcess[str], *, steps: int | None = None,
                 wrote: Path | None = None) -> bool:
    """Whether a torchrun job (under ``gpudiag profile`` or alone) ran to its end: exit 0, or a
    rank aborted by gloo's teardown (SIGABRT, exit code -6) once the work was done: the job's
    ``steps`` all counted by gpudiag, or the job's own report ``wrote``."""
    if proc.returncode == 0:
        return True
    err = proc.stderr
    # torchrun's summary names the signal even where the rank's own line was lost to its buffer
    aborted = TEARDOWN_ABORT in err or "exitcode: -6" in err.replace("exitcode  :", "exitcode:")
    done = ((steps is None or f"at step {steps};" in err) and (wrote is None or wrote.exists())
            and (steps is not None or wrote is not None))
    return aborted and done


def torchrun_failure(proc: subprocess.CompletedProcess[str]) -> str:
    """The lines that say why a torchrun job failed: each rank's own abort or error first (torchrun's
    traceback, which comes last, would push them out of a plain tail), then the tail."""
    keys = ("terminate", "what()", "Fatal Python", "Error", "exitcode", "gpudiag:")
    lines = [ln for ln in proc.stderr.splitlines() if any(k in ln for k in keys)]
    return "\n".join(lines[-40:]) + "\n--- tail ---\n" + proc.stderr[-1500:]


def wait_http(url: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError as e:
            last = e
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready in {timeout} s: {last}")


@contextlib.contextmanager
def prometheus_server(folder: Path, target_port: int | list[int], web_config: Path | None = None,
                      scheme: str = "http") -> Iterator[str]:
    """A real Prometheus scraping 127.0.0.1:``target_port`` (or each of several) every second;
    yields its base URL. ``web_config``: Prometheus' ``--web.config.file`` (TLS, basic auth);
    with ``scheme="https"`` the server speaks TLS. Ready once it answers at all (a 401 too)."""
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not installed (.ci/run installs Debian's prometheus)"
    port = free_port()
    ports = target_port if isinstance(target_port, list) else [target_port]
    targets = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
    cfg = folder / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                   "  - job_name: gpudiag\n    static_configs:\n"
                   f"      - targets: [{targets}]\n")
    args = [exe, f"--config.file={cfg}", f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    if web_config is not None:
        args.append(f"--web.config.file={web_config}")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"{scheme}://127.0.0.1:{port}"
    try:
        if web_config is None:
            wait_http(f"{base}/-/ready", timeout=60)
        else:
            _wait_answering(f"{base}/-/ready", timeout=60)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_answering(url: str, timeout: float) -> None:
    """Until the server answers HTTP at all (its TLS certificate unchecked, a 401 counts)."""
    import ssl
    import urllib.error

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=2, context=ctx):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not answering in {timeout} s")


def _useradd(name: str) -> None:
    for _ in range(20):  # /etc/passwd may be locked by another useradd for a moment
        r = subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"useradd {name}: {r.stderr}")


@contextlib.contextmanager
def unix_users(prefix: str, count: int = 2) -> Iterator[list[pwd.struct_passwd]]:
    """``count`` real unprivileged users with unique names, their processes killed and the
    users removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.fail("these tests create users: run them as root with useradd (CI does)")
    tag = uuid.uuid4().hex[:8]
    made: list[str] = []
    try:
        for i in range(count):
            name = f"{prefix}{i}{tag}"
            _useradd(name)
            made.append(name)
        yield [pwd.getpwnam(n) for n in made]
    finally:
        for n in made:
            subprocess.run(["pkill", "-KILL", "-u", n], capture_output=True)
            subprocess.run(["userdel", "-f", n], capture_output=True)


def start_when_ready(run: Path, job: subprocess.Popen, start: Callable[[], list[subprocess.Popen]]
                     ) -> list[subprocess.Popen]:
    """Start the processes that crowd a job once it is ready to step (``tests/jobs/_timer.start_gate``:
    it touched ``gate_env(run)``'s READY file, or ended), then let it step; what ``start`` started."""
    gate = gate_env(run)
    while not Path(gate[READY]).exists() and job.poll() is None:
        time.sleep(0.005)
    procs = start()
    Path(gate[GO]).touch()
    return procs


def gate_env(run: Path) -> dict[str, str]:
    """The environment that makes a test job wait at its start gate, its files beside ``run``."""
    return {READY: str(run.with_name(run.name + ".ready")), GO: str(run.with_name(run.name + ".go"))}
