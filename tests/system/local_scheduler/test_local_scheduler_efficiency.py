"""Efficiency with a real agent and real torch CPU jobs under ``gpudiag profile --monitor``.

Earlier jobs of two keys report their MFU to a real ``gpudiag agent`` (the scheduler scrapes
it); the daemon keeps what they reached in SQLite. Then two jobs of one tier wait: the one whose
key used the machine well starts first, ``gpudiag queue`` says why the other waits, and that
other still starts within its aging bound, ahead of a well-used key's job submitted after it.
"""

from __future__ import annotations

import re
import sys
import time

from tests.system.agent.test_agent import Agent
from tests.system.local_scheduler.test_local_scheduler import ROOT, WAIT_S, Sched, job_block, state_of

WORKLOADS = ROOT / "benchmarks" / "workloads"
DELAY_S = 6.0   # --efficiency-delay: the bound on how long a low MFU may delay a job


def test_the_efficient_key_goes_first_and_the_other_within_its_aging_bound(tmp_path):
    agent = Agent(tmp_path / "agent", backend="none")
    # 6 slots: the three history jobs run at once (each keeps its slots through its analysis)
    s = Sched(tmp_path, "--slots", "6", "--min-runtime", "0", "--agent-url", agent.url,
              "--efficiency-delay", f"{DELAY_S}s",
              env={"GPUDIAG_AGENT_DIR": str(tmp_path / "agent"), "GPUDIAG_SIGNAL_INTERVAL": "1"})
    try:
        run = [sys.executable]
        slow = s.submit("--gpus", "2", "--name", "slow", "--", *run, str(WORKLOADS / "input_bound.py"),
                        "--steps", "16")
        fast = [s.submit("--gpus", "2", "--name", "fast", "--", *run, str(WORKLOADS / "compute_bound.py"),
                         "--steps", "16") for _ in range(2)]
        jobs = s.wait("history jobs", lambda j: all(state_of(j, i) == "done" for i in (slow, *fast)),
                      timeout=WAIT_S * 3)
        assert jobs[slow]["sig_mfu"] < 0.01 < jobs[fast[0]]["sig_mfu"], (jobs[slow], jobs[fast[0]])

        gate = tmp_path / "gate"
        block = s.submit("--gpus", "6", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done")
        s.wait("blocker running", lambda j: state_of(j, block) == "running")
        low = s.submit("--gpus", "4", "--name", "slow", "--", "sleep", "1")
        t_low = time.time()
        high = s.submit("--gpus", "4", "--name", "fast", "--", "sleep", "10")
        q = s.cli("queue").stdout
        line = job_block(q, low)
        # a sub-1% MFU is shown with the digits that tell it apart ("0.12%"), never as "0%"
        assert re.search(r"priority lowered: MFU 0\.\d\d% vs", line), q
        assert "earlier jobs of key root/slow" in line, q
        assert "node agent" in q.splitlines()[0], q
        gate.touch()
        s.wait("high running", lambda j: state_of(j, high) == "running")
        assert state_of(s.jobs(), low) == "pending"   # submitted first, still behind the efficient key
        time.sleep(max(0.0, t_low + DELAY_S + 0.5 - time.time()))
        assert state_of(s.jobs(), high) == "running"
        late = s.submit("--gpus", "4", "--name", "fast", "--", "true")   # past low's aging bound
        jobs = s.wait("all done", lambda j: all(state_of(j, i) == "done" for i in (low, high, late)))
        rows = {r["id"]: r for r in s.db()}
        assert rows[high]["started_t"] < rows[low]["started_t"] < rows[late]["started_t"]
    finally:
        s.stop()
        agent.stop()


def test_jobs_report_to_the_agent_whose_job_table_the_daemon_reads(tmp_path):
    """With --agent-dir, the daemon reads the agent's jobs.json, and the jobs it runs report to
    that same agent whatever their submitter's environment says (seen on an H200: a job
    submitted without GPUDIAG_AGENT_DIR reported nowhere the daemon could see). Nothing scrapes
    the agent: it takes in its spool on its own (issue 15, item 9)."""
    agent = Agent(tmp_path / "agent", backend="none")
    s = Sched(tmp_path, "--slots", "2", "--min-runtime", "0", "--agent-dir", str(tmp_path / "agent"),
              env={"GPUDIAG_SIGNAL_INTERVAL": "1", "GPUDIAG_AGENT_DIR": str(tmp_path / "elsewhere")})
    try:
        # short: its MFU may arrive only with its final signal, after it exited
        job = s.submit("--gpus", "1", "--name", "fast", "--", sys.executable,
                       str(WORKLOADS / "compute_bound.py"), "--steps", "16")
        deadline = time.monotonic() + WAIT_S * 3
        while time.monotonic() < deadline:   # nothing scrapes the agent: it keeps jobs.json fresh itself
            jobs = s.jobs()
            if state_of(jobs, job) == "done" and jobs[job].get("sig_mfu"):
                break
            time.sleep(0.5)
        assert jobs[job].get("sig_mfu") and jobs[job]["sig_mfu"] > 0.01, jobs[job]
        assert not (tmp_path / "elsewhere").exists()
    finally:
        s.stop()
        agent.stop()
