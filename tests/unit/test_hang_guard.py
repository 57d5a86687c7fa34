"""A test that hangs fails alone, with the stacks of every thread, and the run goes on: the
suite's own settings (pyproject.toml's ``timeout``) hold, not a CI's kill at its time limit,
which left a run of this suite without a stack to read (2026-12-01)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

HANGS = '''
import threading

def test_waits_for_ever():
    threading.Event().wait()

def test_after_it():
    pass
'''


def test_a_hung_test_fails_with_its_stack_and_the_next_one_runs(tmp_path: Path):
    set_to = re.search(r"^timeout = (\d+)$", (REPO / "pyproject.toml").read_text(), re.M)
    # well inside the CI's 5,400 s, with time for the rest of the run after a hang
    assert set_to and 0 < int(set_to.group(1)) <= 900
    (tmp_path / "test_hung.py").write_text(HANGS)
    # the suite's ini file, its timeout overridden to 2 s so this test is quick
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
                           "-o", "timeout=2", "-o", "addopts=", str(tmp_path / "test_hung.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "Timeout" in out and "test_waits_for_ever" in out, out
