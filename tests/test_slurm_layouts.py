"""Partition layouts in which holding preemption would make Slurm pick a worse victim, against a
real Slurm (tests/slurm_cluster.py) with a CANCEL partition beside spot on the same node:
gpudiag must not hold spot there, say so once, and leave the choice to Slurm, which requeues
the spot job and keeps the CANCEL partition's job running (issue 31's first finding: with spot
held at OFF, Slurm killed the CANCEL job instead)."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import GPUS, NODE, report, slurm_running, wait_for
from tests.test_agent import Agent
from tests.test_slurm_safety import controller, restarts, running, starts_within

# Of two candidates of the same tier, Slurm 22.05 alone preempted the one submitted first (seen
# here): the spot job goes first, so that Slurm alone requeues it and keeps the CANCEL job.
SAID = "spot: not held: a job of ondemand would make Slurm preempt partition canc's jobs (PreemptMode=CANCEL)"
CANC = f"PartitionName=canc Nodes={NODE} PriorityTier=1 MaxTime=INFINITE State=UP PreemptMode=CANCEL"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_running(tmp_path_factory.mktemp("slurm"), extra_conf=CANC) as c:
        yield c


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with Agent(tmp_path_factory.mktemp("agent"), backend="none") as a:
        yield a


def test_a_cancel_partition_beside_spot_keeps_its_job_and_slurm_requeues_the_low_mfu_spot_job(
        cluster, agent, tmp_path):
    spot = cluster.sbatch("spot", "spot", GPUS // 2)
    canc = cluster.sbatch("canc", "canc", GPUS // 2)
    running(cluster, canc, spot)
    report(agent, spot, 0.05, "input-bound")
    report(agent, canc, 0.6)
    ctl = controller(cluster, agent, tmp_path / "ledger.json", "--restore")
    try:
        wait_for("the controller's decision on spot", lambda: SAID in ctl.text()
                 or cluster.preempt_mode("spot") == "OFF", 30)
        od = cluster.sbatch("od", "ondemand", GPUS // 2)
        starts_within(cluster, od)
    finally:
        assert ctl.stop() == 0, ctl.text()
    assert cluster.job(canc)["JobState"] == "RUNNING" and restarts(cluster, canc) == 0
    assert restarts(cluster, spot) == 1 and cluster.job(spot)["JobState"] == "PENDING"   # requeued
    assert cluster.preempt_mode("spot") == cluster.preempt_mode("reserved") == "REQUEUE"
    assert ctl.text().count(SAID) == 1, ctl.text()       # once, not every round
    assert "preempt_mode spot" not in ctl.text()         # never taken
