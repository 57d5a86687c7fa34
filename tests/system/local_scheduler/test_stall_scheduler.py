"""The local scheduler acts on a stalled job only where the admin asked: a real daemon, a real
agent, and a running job whose signal says it last finished a step long ago (its limit 1 s).
With ``--stalled requeue --stalled-after 2s`` the daemon requeues it, with one line that says
how long it stalled, why and the limit; with the default (off) it leaves it running."""

from __future__ import annotations

import time

from gpudiag.jobsignal import write_signal
from tests.system.agent.test_agent import Agent
from tests.system.local_scheduler.test_local_scheduler import Sched, state_of


def stalled_signal(agent_dir, job_id: str, last_step_at: float) -> None:  # a Path
    """What a job under gpudiag profile sends once it has finished no step since ``last_step_at``
    for its limit (1 s here)."""
    write_signal(agent_dir / "spool", {"job_id": job_id, "ts": time.time(), "mfu_ratio": 0.4,
                                       "confidence": 0.9, "bottleneck": "compute-bound",
                                       "last_step_at": last_step_at,
                                       "stall_after_s": 1.0, "stall_cause": "hung"})


def test_a_stalled_job_is_requeued_with_one_line_only_where_the_admin_enabled_it(tmp_path):
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    common = ("--slots", "2", "--no-monitor", "--agent-dir", str(tmp_path / "agent"))
    with Agent(tmp_path / "agent", backend="none"):
        on = Sched(tmp_path / "on", *common, "--stalled", "requeue", "--stalled-after", "2s")
        try:
            off = Sched(tmp_path / "off", *common)
            try:
                stuck = on.submit("--gpus", "1", "--", "sleep", "600")
                left = off.submit("--gpus", "1", "--", "sleep", "600")
                started = on.wait("running", lambda j: state_of(j, stuck) == "running")[stuck]["started_t"]
                other = off.wait("running", lambda j: state_of(j, left) == "running")[left]["started_t"]
                # each stalled just after it started: a stall of this run of the job, not an earlier one's
                stalled_signal(tmp_path / "agent", f"{on.prefix()}:{stuck}", started + 0.1)
                stalled_signal(tmp_path / "agent", f"{off.prefix()}:{left}", other + 0.1)
                on.wait("requeued", lambda j: j[stuck]["restarts"] >= 1, timeout=60)
                line = next(x for x in on.log.read_text().splitlines() if "stalled: no step for" in x)
                assert f"job {stuck}" in line and "(hung)" in line
                assert "the limit is 2s (--stalled-after): requeue" in line
                time.sleep(6)   # a signal read (every 5 s) later: the other daemon still runs its job, and
                assert state_of(off.jobs(), left) == "running"   # the restarted one is not requeued again
                assert on.jobs()[stuck]["restarts"] == 1
            finally:
                off.stop()
        finally:
            on.stop()
