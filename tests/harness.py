"""Real services and real users for tests, started once here and stopped whatever happens.

Several test files need the same two things that are costly to get right: a real Prometheus
server scraping a target, and real unprivileged Unix users (the agent's owner binding, the
local scheduler's per-user jobs). One home for each, so a fix to either reaches every test.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def prometheus_server(folder: Path, target_port: int) -> Iterator[str]:
    """A real Prometheus scraping 127.0.0.1:``target_port`` every second; yields its base URL."""
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not installed (.ci/run installs Debian's prometheus)"
    port = free_port()
    cfg = folder / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                   "  - job_name: gpudiag\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{target_port}']\n")
    proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.tsdb.path={folder / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{base}/-/ready", timeout=60)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
