"""Efficiency signals on one box, out of the box: a root scheduler daemon and a root agent, no
Prometheus, and a second user's job under ``gpudiag profile --monitor`` whose MFU reaches the
daemon, while a third party's forged signal for that job does not (issue 15, items 9 and 11).
Then the ``--agent-*`` options: whichever names the agent, jobs report where the daemon reads,
and two options naming different agents are refused.

The second user runs gpudiag and torch from an environment they can read (tests/user_env.py):
the test venv may live where only root can reach it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpudiag.agent.signals import read_job_table
from gpudiag.collectors.cpu_peak import cache_path, cpu_peak
from tests import user_env
from tests.harness import free_port, unix_users
from tests.paths import REPO
from tests.system.agent.test_agent import Agent, full_signal
from tests.system.agent.test_agent_signals import write_as
from tests.system.local_scheduler.test_local_scheduler import WAIT_S, Sched, one_line_refusal, state_of

# a folder every user can reach for the module, and a venv in it every user can run
module_base, user_python = user_env.module_base, user_env.user_python

ROOT = REPO
WORKLOADS = ROOT / "benchmarks" / "workloads"


@pytest.fixture
def users():
    with unix_users("gpob") as made:
        yield made


def home_of(user: pwd.struct_passwd, base: Path) -> Path:
    home = base / f"home-{user.pw_name}"
    home.mkdir(mode=0o755)
    os.chown(home, user.pw_uid, user.pw_gid)
    return home


def run_as(user: pwd.struct_passwd, argv: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], cwd=home,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **env},
                          capture_output=True, text=True, timeout=WAIT_S)


def job_output(s: Sched, job: int) -> str:
    folder = s.state / "jobs" / str(job)
    return "\n".join(f"{n}: {(folder / n).read_text()[-3000:]}" for n in ("stdout", "stderr")
                     if (folder / n).is_file())


def test_a_second_users_monitored_job_reports_to_the_daemon_and_a_forgery_does_not(module_base, user_python,
                                                                                    users):
    alice, mallory = users
    base = Path(tempfile.mkdtemp(prefix="run-", dir=module_base))
    os.chmod(base, 0o755)
    agent = Agent(base / "agent", backend="none")   # root's agent; nothing scrapes it
    # root's daemon, run by an interpreter alice can run: it starts her job with its own (and
    # outside the checkout, whose gpudiag/ folder would shadow the environment's)
    daemon = Sched(base, "--slots", "1", "--min-runtime", "0", "--agent-dir", str(base / "agent"),
                   python=str(user_python), cwd=Path("/"))
    home = home_of(alice, base)
    for name in ("compute_bound.py", "_common.py"):   # the job's script, where alice can read it
        shutil.copy(WORKLOADS / name, home / name)
    cpu_peak()   # measured once per session, not again (20 s at load) by alice's job
    (home / "cache").mkdir()
    shutil.copy(cache_path(), home / "cache" / cache_path().name)
    for p in (home / "cache", home / "cache" / cache_path().name):
        os.chown(p, alice.pw_uid, alice.pw_gid)
    try:
        # alice's environment names no agent: the daemon tells her job where it reads
        r = run_as(alice, [str(user_python), "-m", "gpudiag", "submit", "--state-dir", str(daemon.state),
                           "--gpus", "1", "--name", "train", "--json", "--", str(user_python),
                           str(home / "compute_bound.py"), "--steps", "16"],
                   home, GPUDIAG_SIGNAL_INTERVAL="1", GPUDIAG_CACHE_DIR=str(home / "cache"))
        assert r.returncode == 0, r.stderr
        job, agent_job = json.loads(r.stdout)["id"], json.loads(r.stdout)["agent_job_id"]
        jobs = daemon.wait("alice's job started", lambda j: state_of(j, job) not in ("pending", "starting"))
        assert state_of(jobs, job) in ("running", "done"), job_output(daemon, job)
        # mallory names alice's job while it runs, dated ahead of any of alice's signals by as much as
        # the agent takes (a claim further ahead is refused as future-dated: test_agent_signals)
        write_as(mallory, agent.state / "spool", full_signal(agent_job, mfu_ratio=0.001, confidence=1.0,
                                                             bottleneck="input-bound", ts=time.time() + 3))
        jobs = daemon.wait("alice's MFU at the daemon",
                           lambda j: state_of(j, job) not in ("running", "finishing")  # ended: analysis too
                           and j[job].get("sig_mfu") is not None or state_of(j, job) == "failed",
                           timeout=WAIT_S * 3)
        assert state_of(jobs, job) == "done", job_output(daemon, job)
        table = read_job_table(agent.state / "jobs.json")
        mine, forged = table[(agent_job, alice.pw_uid)], table.get((agent_job, mallory.pw_uid))
        assert forged is not None and forged.mfu_ratio == 0.001   # it reached the agent, as mallory's
        # the daemon took alice's (a live one, or her last), never mallory's
        assert mine.mfu_ratio > 0.01 and jobs[job]["sig_mfu"] > 0.01, (jobs[job], mine)
        assert "input-bound" not in (jobs[job]["sig_label"], mine.bottleneck), (jobs[job], mine)
        q = run_as(alice, [str(user_python), "-m", "gpudiag", "queue", "--all", "--json", "--state-dir",
                           str(daemon.state)], home)
        assert q.returncode == 0, q.stderr
        shown = json.loads(q.stdout)
        assert shown["signals"]["available"] is True, shown["signals"]
        assert next(j for j in shown["jobs"] if j["id"] == job)["sig_mfu"] == jobs[job]["sig_mfu"]
        assert not (home / ".local").exists()   # nothing went to a per-user spool nobody reads
    finally:
        daemon.stop()
        agent.stop()


def test_with_agent_url_jobs_report_to_the_agent_it_names(tmp_path):
    agent = Agent(tmp_path / "agent", backend="none")
    env = {k: v for k, v in os.environ.items() if k != "GPUDIAG_AGENT_DIR"}
    s = Sched(tmp_path, "--slots", "1", "--no-monitor", "--agent-url", agent.url, env=env)
    try:
        job = s.submit("--gpus", "1", "--", "sh", "-c", 'echo "$GPUDIAG_AGENT_DIR"')
        s.wait("done", lambda j: state_of(j, job) == "done")
        assert s.cli("logs", str(job)).stdout.strip() == str(tmp_path / "agent")
    finally:
        s.stop()
        agent.stop()


def test_agent_options_that_cannot_be_honoured_are_one_line_exit_2(tmp_path):
    agent = Agent(tmp_path / "agent", backend="none")
    serve = [sys.executable, "-m", "gpudiag", "scheduler", "serve", "--state-dir", str(tmp_path / "s"),
             "--slots", "1"]
    try:
        r = subprocess.run([*serve, "--agent-dir", str(tmp_path / "other"), "--agent-url", agent.url],
                           capture_output=True, text=True, timeout=WAIT_S)
        one_line_refusal(r, "name different agents")
        dead = f"http://127.0.0.1:{free_port()}/metrics"   # nothing listens there
        r = subprocess.run([*serve, "--agent-url", dead], capture_output=True, text=True, timeout=WAIT_S)
        one_line_refusal(r, "not reachable")
        assert not (tmp_path / "s").exists()   # refused before anything was made
    finally:
        agent.stop()
