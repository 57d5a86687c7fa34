"""Preemption and backfill as one plan, on a real daemon with real jobs that are slow to stop.

Issue 15's reproduced cases: with ``--slots 4 --min-runtime 0s``, (1) four 1-slot spot jobs
that take seconds to checkpoint and an on-demand job needing 2 slots: every spot job got
SIGTERM, because the next pass did not count the slots of jobs in their grace period as on
their way to being free; (2) a reserved job arriving during a victim's grace started on the
free slots the preemptor also needed, so the preemptor waited behind it. Each job here is
``tests/jobs/slow_stop.py``, whose SIGTERM handler sleeps (a checkpoint); the tests wait on the
daemon's state, never on fixed sleeps, and read what ``gpudiag queue`` says meanwhile.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.system.local_scheduler.test_local_scheduler import JOBS, Sched, job_block, state_of

SLOW = [sys.executable, str(JOBS / "slow_stop.py"), "--stop-s", "5"]   # several passes while it stops


@pytest.fixture
def sched(tmp_path):
    """The issue's daemon: 4 slots, no minimum runtime before preemption, jobs run bare."""
    s = Sched(tmp_path, "--slots", "4", "--min-runtime", "0s", "--no-monitor",
              "--agent-dir", str(tmp_path / "none"))
    yield s
    s.stop()


def _line(queue_out: str, job: int) -> str:
    return job_block(queue_out, job)


def _sigterms(s: Sched, jobs: list[int]) -> list[int]:
    return sorted(i for i in jobs if "SIGTERM" in s.cli("logs", str(i)).stdout)


def _ready(s: Sched, jobs: list[int]) -> None:
    """Wait until each job printed ``started``: its checkpoint handler is in place.

    The daemon marks a job running when it spawns it; a SIGTERM during the interpreter's start-up
    would kill it at once, with no checkpoint, and the test would see one victim, not two.
    """
    s.wait("checkpoint handlers installed",
           lambda j: all("started" in s.cli("logs", str(i)).stdout for i in jobs))


def test_a_preemptor_gets_only_the_victims_it_needs_while_they_checkpoint(sched, tmp_path):
    s = sched
    spots = [s.submit("--gpus", "1", "--tier", "spot", "--grace", "30s", "--", *SLOW) for _ in range(4)]
    s.wait("four spot jobs running", lambda j: all(state_of(j, i) == "running" for i in spots))
    _ready(s, spots)
    gate = tmp_path / "gate"
    od = s.submit("--gpus", "2", "--tier", "on-demand", "--", "sh", "-c",
                  f"while [ ! -e {gate} ]; do sleep 0.05; done")
    jobs = s.wait("two victims stopping", lambda j: any(state_of(j, i) == "stopping" for i in spots))
    victims = sorted(i for i in spots if state_of(jobs, i) == "stopping")
    # the queue shows the reason of the pass that preempted, not a re-planning without preemption
    line = _line(s.cli("queue").stdout, od)
    assert "will start when job" in line and "(preempted, grace ends " in line, line
    assert all(f"job {v} (preempted" in line for v in victims) and "in 1440 min" not in line, line
    for v in victims:   # no MFU is measured here (no agent): the reason does not invent one
        assert "MFU not measured" in jobs[v]["why"] and "MFU 100%" not in jobs[v]["why"], jobs[v]["why"]
    jobs = s.wait("on-demand running", lambda j: state_of(j, od) == "running")
    # every pass during the checkpoints counted the victims' slots as on their way: two SIGTERMs
    assert len(victims) == 2 and _sigterms(s, spots) == victims, (victims, _sigterms(s, spots))
    assert all(state_of(jobs, i) == "running" and jobs[i]["restarts"] == 0 for i in spots if i not in victims)
    q = s.cli("queue").stdout
    first, second = sorted(victims, key=lambda v: jobs[v]["why_numbers"]["position"])
    assert "next to start: needs 1 slot, 0 free" in _line(q, first), q
    assert "no start time to estimate" in _line(q, first) and "1440" not in q, q   # no --time-limit anywhere
    assert f"behind job {first} (spot)" in _line(q, second), q
    listed = {j["id"]: j for j in json.loads(s.cli("queue", "--json").stdout)["jobs"]}
    assert listed[od]["tier_name"] == "on-demand" and listed[first]["tier_name"] == "spot"
    gate.touch()   # the on-demand job ends: the victims run again, their first attempt's exit code apart
    s.wait("victims running again", lambda j: all(state_of(j, v) == "running" for v in victims))
    q = s.cli("queue").stdout
    for v in victims:
        assert "; exit" not in _line(q, v), q   # its own row: no exit code (the attempt line has one)
    assert q.count("attempt 1 ended with exit code 143") == 2, q


def test_a_backfill_never_takes_the_slots_promised_to_a_preemptor(sched):
    s = sched
    a = s.submit("--gpus", "2", "--tier", "spot", "--grace", "30s", "--", *SLOW)
    s.wait("A running", lambda j: state_of(j, a) == "running")
    _ready(s, [a])
    b = s.submit("--gpus", "4", "--tier", "on-demand", "--", "sh", "-c", "echo B")
    s.wait("A stopping", lambda j: state_of(j, a) == "stopping")
    # during A's grace a reserved job with a time limit arrives; 2 slots are free all along
    c = s.submit("--gpus", "2", "--time-limit", "1h", "--", "sh", "-c", "echo C")
    jobs = s.wait("a pass saw C", lambda j: "behind job" in j[c]["why"] or state_of(j, c) != "pending")
    assert state_of(jobs, c) == "pending", jobs[c]
    held = f"2 free (held for job {b}, the head); behind job {b} (on-demand)"
    assert held in jobs[c]["why"], jobs[c]["why"]
    assert f"will start when job {a} (preempted, grace ends" in jobs[b]["why"], jobs[b]["why"]
    s.wait("B and C done", lambda j: state_of(j, b) == "done" and state_of(j, c) == "done")
    rows = {r["id"]: r for r in s.db()}
    assert rows[b]["started_t"] < rows[c]["started_t"]
    assert rows[c]["started_t"] >= rows[b]["ended_t"]   # B took all 4 slots: C came after it


def test_queue_names_fair_share_when_a_later_job_of_another_team_goes_first(sched, tmp_path):
    s = sched
    gate = tmp_path / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    busy = s.submit("--gpus", "4", "--team", "a", "--", "sh", "-c", hold)
    s.wait("team a holds the machine", lambda j: state_of(j, busy) == "running")
    first = s.submit("--gpus", "1", "--team", "a", "--", "true")
    later = s.submit("--gpus", "1", "--team", "b", "--", "true")
    # no --quota: each team's share is the machine's 4 slots over the 2 teams seen
    jobs = s.wait("a pass ordered both", lambda j: "behind job" in j[first]["why"])
    assert jobs[later]["why_numbers"]["position"] == 0 and jobs[first]["why_numbers"]["fair_share"]
    assert (f"behind job {later} of team b: fair share (team a uses 4 of its 2-slot quota, team b 0 of 2)"
            in jobs[first]["why"]), jobs[first]["why"]
    gate.touch()
    s.wait("all done", lambda j: all(state_of(j, i) == "done" for i in (busy, first, later)))
