"""A test run stopped by SIGTERM (a CI's timeout, `kill`) stops the daemons its fixtures started.

Why: the Slurm, munge, Prometheus and agent fixtures stop their daemons in their teardown; a
pytest killed by SIGTERM ran none, and left slurmctld, slurmd, munged and the jobs' sleeps
running on the machine (seen on this project's VM, 2026-11-30). ``tests/conftest.py`` turns
SIGTERM into Ctrl-C, on which pytest tears every fixture down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.paths import REPO

INNER = '''
import pathlib, subprocess, time, pytest

@pytest.fixture
def daemon():
    proc = subprocess.Popen(["sleep", "300"])
    pathlib.Path({up!r}).write_text(str(proc.pid))
    yield proc
    proc.terminate()
    proc.wait()
    pathlib.Path({down!r}).write_text("torn down")

def test_runs_until_stopped(daemon):
    time.sleep(300)
'''


def test_sigterm_to_pytest_tears_its_fixtures_down_and_stops_their_daemons(tmp_path: Path) -> None:
    up, down = tmp_path / "up", tmp_path / "down"
    (tmp_path / "test_inner.py").write_text(INNER.format(up=str(up), down=str(down)))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not up.exists():  # the fixture's daemon is up: the event to stop the run at
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        time.sleep(0.2)  # the pid is written before the yield: let the test body start
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    pid = int(up.read_text())
    proc = Path(f"/proc/{pid}")
    left = proc.exists() and "zombie" not in (proc / "status").read_text().lower()
    if left:
        os.kill(pid, signal.SIGKILL)  # what the old conftest left behind: not this test's to keep
    assert not left and down.read_text() == "torn down", out
