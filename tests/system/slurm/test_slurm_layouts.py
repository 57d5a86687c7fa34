"""Partition layouts in which holding preemption would make Slurm pick a worse victim, against a
real Slurm (tests/slurm_cluster.py) with a CANCEL partition beside spot on the same node:
gpudiag must not hold spot there, say so once, and leave the choice to Slurm, which requeues
the spot job and keeps the CANCEL partition's job running (issue 31's first finding: with spot
held at OFF, Slurm killed the CANCEL job instead). The same where the CANCEL partition sits on a
CPU-only node that spot also covers (issue 41's first finding), each run beside Slurm alone."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import GPUS, GRACE_S, NODE, report, slurm_running, wait_for
from tests.system.agent.test_agent import Agent
from tests.system.slurm_faults.test_slurm_safety import controller, restarts, running, starts_within

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


# spot covers a 4-GPU node and a CPU-only node; a CANCEL partition and a top-tier CPU partition sit
# on the CPU node, on-demand covers both (issue 41's layout)
CPU_NODES = {"n1": GPUS, "c1": 0}
CPU_LAYOUT = "".join(f"PartitionName={line} MaxTime=INFINITE State=UP\n" for line in (
    f"spot Nodes=n1,c1 PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_S} Default=YES",
    "canc Nodes=c1 PriorityTier=1 PreemptMode=CANCEL",
    "ondemand Nodes=n1,c1 PriorityTier=3 PreemptMode=OFF",
    "cpuod Nodes=c1 PriorityTier=3 PreemptMode=OFF"))
CPU_SAID = ("spot: not held: a job of cpuod would make Slurm preempt partition canc's jobs "
            "(PreemptMode=CANCEL) on c1 (no GPUs)")


@pytest.fixture(scope="module")
def cpu_cluster(tmp_path_factory):
    with slurm_running(tmp_path_factory.mktemp("slurm"), nodes=CPU_NODES, partitions=CPU_LAYOUT) as c:
        yield c


def _cpu_node_preemption(cluster, before=None) -> dict[str, tuple[str, int]]:  # cluster, hook
    """The older spot job and a CANCEL job fill c1's CPUs; a top-tier CPU job arrives on c1: each
    job's (state, restarts) once the top-tier job runs. ``before`` runs ahead of the arrival."""
    spot_cpu = cluster.sbatch("spot-cpu", "spot", 0, "-w", "c1", cpus=4)
    canc = cluster.sbatch("canc", "canc", 0, cpus=4)
    running(cluster, spot_cpu, canc)
    if before is not None:
        before()
    od = cluster.sbatch("od-cpu", "cpuod", 0, cpus=4)
    starts_within(cluster, od)
    fate = {name: (cluster.job(j)["JobState"], restarts(cluster, j))
            for name, j in (("spot", spot_cpu), ("canc", canc))}
    cluster.cancel_all()
    return fate


def test_a_cancel_partition_on_a_cpu_only_node_keeps_its_job_as_with_slurm_alone(
        cpu_cluster, agent, tmp_path):
    alone = _cpu_node_preemption(cpu_cluster)
    assert alone["canc"] == ("RUNNING", 0) and alone["spot"][1] == 1, alone     # Slurm alone: spot requeued
    gpu = cpu_cluster.sbatch("gpu", "spot", 2)           # a spot GPU job reporting: gpudiag has evidence
    running(cpu_cluster, gpu)
    report(agent, gpu, 0.4)
    ctl = controller(cpu_cluster, agent, tmp_path / "ledger.json", "--restore")
    try:
        def decided() -> None:
            wait_for("the controller's decision on spot", lambda: CPU_SAID in ctl.text()
                     or cpu_cluster.preempt_mode("spot") == "OFF", 30)
            report(agent, gpu, 0.4)
        with_ctl = _cpu_node_preemption(cpu_cluster, decided)
    finally:
        assert ctl.stop() == 0, ctl.text()
    assert with_ctl == alone, (with_ctl, alone)          # no job killed that Slurm alone would keep
    assert ctl.text().count(CPU_SAID) == 1, ctl.text()   # said once, not after every preemption
    assert "preempt_mode spot" not in ctl.text() and cpu_cluster.preempt_mode("spot") == "REQUEUE"
