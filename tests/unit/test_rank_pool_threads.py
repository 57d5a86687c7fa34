"""A process that runs other threads never forks a rank pool: a fork taken while another thread
held a lock leaves the child waiting on it for ever (the project's CI hung 78 min in such a
fork, 2026-12-01). gpudiag's own command line has one thread there and keeps its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from gpudiag.analyzers.rank_pool import RankFile, run_ranks
from tests.conftest import REPO


def _pid(path: Path, on_bytes: object = None) -> int:
    return os.getpid()


def _files(tmp_path: Path) -> list[RankFile]:
    return [RankFile(path=tmp_path / f"rank-{r}.json", rank=r, hint=r, size=1, has_device=False)
            for r in range(2)]


def test_ranks_are_read_in_this_process_while_another_thread_runs(tmp_path):
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        pids = run_ranks(_pid, _files(tmp_path), lambda f: (f.path,), jobs=2)
    finally:
        stop.set()
        other.join()
    assert pids == [os.getpid(), os.getpid()]


def test_a_single_threaded_process_still_reads_its_ranks_in_worker_processes(tmp_path):
    # in a fresh interpreter: this one (a pytest-xdist worker) always runs execnet's thread
    code = ("import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]);"
            "from tests.unit.test_rank_pool_threads import _files, _pid;"
            "from gpudiag.analyzers.rank_pool import run_ranks;"
            "pids = run_ranks(_pid, _files(Path(sys.argv[2])), lambda f: (f.path,), jobs=2);"
            "print(os.getpid() not in pids)")
    out = subprocess.run([sys.executable, "-c", code, str(REPO), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "True", out.stderr
