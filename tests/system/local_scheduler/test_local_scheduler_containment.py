"""A job's slot is free only when every process it started is gone, and as soon as they are.

Real jobs that leave processes behind (``setsid``, an emptied environment), and a real torch
job under ``gpudiag profile --monitor`` whose analysis after its command ended keeps its slot
(its processes are the job's) while ``queue`` shows it finishing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpudiag.scheduler.local.runner import find_launches, proc_info
from tests.harness import needs_torch
from tests.system.agent.test_agent import Agent
from tests.system.local_scheduler.test_local_scheduler import JOBS, WAIT_S, Sched, state_of
from tests.system.local_scheduler.test_local_scheduler_crash import job_cgroups, prefix_of

needs_torch()


def leaver(folder: Path) -> list[str]:
    """A job that starts two children in sessions of their own, one keeping its environment
    (and so the launch marker) and one starting from an empty one, and exits once both run."""
    a, b = folder / "kept.pid", folder / "cleared.pid"
    return ["sh", "-c", f'setsid sh -c "echo \\$\\$ > {a}; exec sleep 600" & '
                        f'setsid env -i sh -c "echo \\$\\$ > {b}; exec sleep 600" & '
                        f'while [ ! -s {a} ] || [ ! -s {b} ]; do sleep 0.01; done']


@pytest.mark.parametrize("cgroups", [True, False], ids=["cgroup", "marker-only"])
def test_a_child_that_left_the_session_holds_the_slot_until_settling_kills_it(sched_factory, tmp_path,
                                                                             cgroups):
    s = sched_factory("--slots", "1", "--no-monitor", "--min-runtime", "0",
                      *(() if cgroups else ("--no-cgroups",)))
    how = s.ask({"op": "ping"})["containment"]
    if cgroups and "cgroup v2" not in how:
        pytest.skip(f"this host gives the daemon no cgroups: {how}")
    first = s.submit("--gpus", "1", "--", *leaver(tmp_path))
    kept, cleared = (tmp_path / "kept.pid", tmp_path / "cleared.pid")
    # the next job looks for them from inside the slot they would hold (a zombie has ended)
    probe = s.submit("--gpus", "1", "--", "sh", "-c", f"for f in {kept} {cleared}; do "
                     'case "$(ps -o stat= -p $(cat $f))" in ""|Z*) echo gone;; *) echo alive;; esac; done')
    try:
        s.wait("both ran", lambda j: state_of(j, first) == "done" and state_of(j, probe) == "done")
        seen = s.cli("logs", str(probe)).stdout.split()
        # a child that kept the marker dies at settling either way; one that cleared its
        # environment only in a cgroup (docs/scheduler-daemon.md: the fallback's limit)
        assert seen == (["gone", "gone"] if cgroups else ["gone", "alive"]), seen
        rows = {r["id"]: r for r in s.db()}
        assert rows[probe]["started_t"] >= rows[first]["ended_t"]
        assert proc_info(int(kept.read_text())) is None or proc_info(int(kept.read_text())).state == "Z"
        assert job_cgroups(prefix_of(s)) == []
    finally:
        for f in (kept, cleared):
            with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
                os.kill(int(f.read_text()), signal.SIGKILL)


def until(what: str, pred: Callable[[], object], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_under_monitor_a_job_keeps_its_slot_while_its_analysis_runs_and_shows_as_finishing(tmp_path):
    """The job exits 3 under gpudiag profile --monitor, whose analysis then runs for seconds: the
    job shows as finishing, keeps its slot until its last process (the analysis) ends, and the
    next job starts only then; the first keeps the exit code waitpid gave, and its final signal
    (its only one: the job is shorter than the reporter's 15 s period)."""
    agent = Agent(tmp_path / "agent", backend="none")
    s = Sched(tmp_path, "--slots", "1", "--min-runtime", "0", "--agent-dir", str(tmp_path / "agent"))
    try:
        # an empty peak cache: the analysis measures this CPU's peaks first, seconds of work
        # during which the job is finishing
        s.env["GPUDIAG_CACHE_DIR"] = str(tmp_path / "empty-cache")
        first = s.submit("--gpus", "1", "--name", "k", "--", sys.executable, str(JOBS / "loop_job.py"),
                         "--steps", "16", "--exit-code", "3")
        del s.env["GPUDIAG_CACHE_DIR"]
        second = s.submit("--gpus", "1", "--", "true")
        jobs = s.wait("the first finishing", lambda j: state_of(j, first) in ("finishing", "failed"),
                      timeout=WAIT_S * 3)
        assert state_of(jobs, first) == "finishing", jobs[first]
        assert state_of(jobs, second) == "pending" and jobs[first]["slot_ids"] == ["0"], jobs
        assert jobs[first]["why"].startswith("finishing: its command ended (exit 3, says run-1/run.json)"), \
            jobs[first]["why"]
        jobs = s.wait("both ended", lambda j: (state_of(j, first), state_of(j, second)) == ("failed", "done"),
                      timeout=WAIT_S * 3)
        assert jobs[first]["exit_code"] == 3 and jobs[first]["why"] == "exit code 3", jobs[first]
        jdir = s.state / "jobs" / str(first)
        analysed = (jdir / "exit-1").stat().st_mtime   # the wrapper writes it as the analysis ends
        command_ended = json.loads((jdir / "run-1" / "run.json").read_text())["end"]
        rows = {r["id"]: r for r in s.db()}
        assert command_ended < analysed <= rows[first]["ended_t"] <= rows[second]["started_t"], (
            command_ended, analysed, rows[first]["ended_t"], rows[second]["started_t"])
        assert (jdir / "exit-1").read_text().split() == ["3"]
        # its final signal, sent by the analysis, reaches the job's row
        until("its final signal", lambda: agent.metrics() and s.jobs()[first]["sig_mfu"] is not None)
        row = next(r for r in s.db() if r["id"] == first)
        assert row["sig_mfu"] > 0, dict(row)
        until("nothing left of it", lambda: not find_launches(prefix_of(s)) and not job_cgroups(prefix_of(s)))
    finally:
        s.stop()
        agent.stop()
