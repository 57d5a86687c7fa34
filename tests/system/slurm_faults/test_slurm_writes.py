"""A round's Nice writes in batches, against a real Slurm (tests/slurm_cluster.py, the session's
cluster) and a real agent: issue 41 measured 3-4.6 s a round for 100-200 Nice writes, one
``scontrol`` process each. Here every job that gets the same Nice is written by one ``scontrol
update JobId=a,b,c Nice=V`` (Slurm 22.05's scontrol takes the list and updates each job), a job
Slurm refuses in the batch fails alone (named in scontrol's words), and restore is batched too.
The time a round takes is ``benchmarks/slurm_controller.py``'s to measure, as a ratio to a round
without writes; this test counts the calls and checks every value in Slurm.
"""

from __future__ import annotations

import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpudiag.scheduler.slurm.actions import restore
from gpudiag.scheduler.slurm.controller import Controller, Options
from gpudiag.scheduler.slurm.fresh import AFTER_TAKE_READS, Fresh
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO
from gpudiag.scheduler.slurm.sources import AgentsSource
from tests import slurm_fixtures
from tests.slurm_cluster import SlurmCluster, report, wait_for
from tests.system.slurm_faults.test_slurm_safety import running

# the session cluster reset for this module, an agent beside it, tidied after each test
cluster, agent, tidy = slurm_fixtures.cluster, slurm_fixtures.agent, slurm_fixtures.tidy

WAITING = 60
MFUS = (0.02, 0.05, 0.08, 0.12, 0.16, 0.2)       # six efficiency factors: six Nice values


class CountingIO(SlurmIO):
    """Slurm's real commands, each counted; ``before_update`` runs ahead of every Nice write. The
    controller makes several Nice calls at once (``actions.NICE_CALLS_AT_ONCE``): the others wait
    for the hook, else one of them could reach Slurm first (a clean-clone CI run wrote the
    cancelled job's Nice 10 ms before the hook's scancel)."""

    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env=env)
        self.argv: list[tuple[str, ...]] = []
        self.before_update = None
        self.hook_lock = threading.Lock()

    def _spawn(self, argv):  # SlurmIO's
        if argv[:2] == ("scontrol", "update") and argv[2].startswith("JobId="):
            with self.hook_lock:
                if self.before_update:
                    hook, self.before_update = self.before_update, None
                    hook()
        self.argv.append(tuple(argv))
        return super()._spawn(argv)

    def nice_calls(self) -> list[tuple[str, ...]]:
        return [a for a in self.argv if a[:2] == ("scontrol", "update") and a[2].startswith("JobId=")]


def nices(cluster: SlurmCluster) -> dict[int, int]:
    out = cluster.run("squeue", "-h", "-t", "PD", "-o", "%i %y").stdout.split()
    return {int(j): int(n) for j, n in zip(out[::2], out[1::2], strict=True)}


def test_a_rounds_nice_writes_go_in_one_scontrol_call_per_value_and_a_refused_job_fails_alone(
        cluster, agent, tmp_path: Path):
    blocker, one = cluster.sbatch("blocker", "reserved", 3), cluster.sbatch("one", "reserved", 1)
    running(cluster, blocker, one)
    report(agent, blocker, 0.4)
    report(agent, one, 0.4)               # the 1-GPU class's median MFU: the waiting jobs' yardstick
    with ThreadPoolExecutor(8) as pool:
        waiting = list(pool.map(lambda i: cluster.sbatch(f"w{i}", "reserved", 1), range(WAITING)))
    for i, jid in enumerate(waiting):
        report(agent, jid, MFUS[i % len(MFUS)])
    io = CountingIO(cluster.env)
    gone = waiting[7]

    def cancel() -> None:   # leaves between the read and the write
        cluster.run("scancel", str(gone))
        # scancel returns before slurmctld has ended the job: a write that came first was applied
        # (a CI clone at load 4, 2026-11-29); the write must meet a job that is gone
        wait_for(f"job {gone} cancelled", lambda: cluster.job(gone)["JobState"] == "CANCELLED", 30)

    io.before_update = cancel
    ctl = Controller(io, AgentsSource([f"127.0.0.1:{agent.port}"]), options=Options(min_change_interval_s=0),
                     ledger_path=tmp_path / "ledger.json")
    try:
        res = ctl.round(time.time())
        writes = [a for a in res.actions if a.kind == "nice"]
        values = {a.new for a in writes}
        assert len(writes) == WAITING and 2 <= len(values) <= len(MFUS), [(a.target, a.new) for a in writes]
        assert len(io.nice_calls()) == len(values), io.nice_calls()          # one call per value, not per job
        refused = [a for a in writes if not a.applied]
        assert [a.target for a in refused] == [str(gone)] and refused[0].error, [(a.target, a.error)
                                                                                 for a in refused]
        shown = nices(cluster)
        assert all(shown[int(a.target)] == int(a.new) for a in writes if a.applied), shown
        io.argv.clear()
        res = ctl.round(time.time())                  # every Nice is where it should be: nothing to write
        assert io.nice_calls() == [] and not [a for a in res.actions if a.kind == "nice"], res.actions
        assert gone not in ctl.store.read().nice      # the refused job's intent settled with the job
    finally:
        io.argv.clear()
        r = restore(io, ctl.store)
        ctl.release()
    assert not r.failed and len(io.nice_calls()) == 1, (r.failed, io.nice_calls())   # all back to 0 at once
    assert set(nices(cluster).values()) == {0}


class FailingSqueue(SlurmIO):
    """Slurm's real commands, but the first ``fails`` squeue reads fail as slurmctld's can while it
    applies a partition's new mode on a loaded machine (a clean-clone CI run at load 6-8)."""

    def __init__(self, env: dict[str, str], fails: int) -> None:
        super().__init__(env=env)
        self.fails = fails
        self.json_ok = True   # as a controller's after its first round's read

    def _spawn(self, argv):  # SlurmIO's
        if argv[0] == "squeue" and self.fails > 0:
            self.fails -= 1
            return subprocess.CompletedProcess(list(argv), 1, "", "slurm_load_jobs error: Resource "
                                               "temporarily unavailable")
        return super()._spawn(argv)


def test_a_failed_squeue_right_after_a_take_is_read_again_before_the_partition_goes_back(cluster):
    """One failed read right after taking a partition gave it (and every partition taken with it)
    back to Slurm in a CI run; read again, the partition stays taken. Reads that keep failing
    still give it back, with squeue's own words."""
    once = Fresh(FailingSqueue(cluster.env, fails=1), jobs={}, parts={}, mode_for={})
    assert once.after_take({"spot": "REQUEUE"}) == []
    always = Fresh(FailingSqueue(cluster.env, fails=AFTER_TAKE_READS), jobs={}, parts={}, mode_for={})
    [back] = always.after_take({"spot": "REQUEUE"})
    assert back.target == "spot" and back.new == "REQUEUE", back
    assert "Resource temporarily unavailable" in back.reason, back.reason


def test_a_first_squeue_read_that_fails_does_not_turn_json_off(cluster):
    """A failed first ``squeue --json`` read was taken for a squeue without JSON whenever its
    error text held "json", which the command's own name in it always did: one transient failure
    at a controller's start put it on the fixed-width format for good."""
    io = FailingSqueue(cluster.env, fails=1)
    io.json_ok = None   # a controller's first read
    with pytest.raises(SlurmError, match="Resource temporarily unavailable"):
        io.jobs()
    assert io.json_ok is None
    io.jobs()
    assert io.json_ok is True
