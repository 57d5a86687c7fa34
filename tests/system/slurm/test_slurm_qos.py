"""The Slurm controller where Slurm preempts by QOS (``PreemptType=preempt/qos``): it holds no
partition, says so in one honest line ("Nice only, Slurm preempts"), and never penalises the jobs
of the top QOS tier (the highest QOS priority slurmdbd defines). Issue 41 saw "gpudiag takes
preemption over" on such a cluster while it held nothing, and penalties on jobs of the paid QOS.

The real cluster here has no slurmdbd (no QOS can be defined without it): it shows the line, the
partitions left alone and Nice as the only change; the top-QOS exemption is checked on
sacctmgr's own output format, through the controller's functions.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpudiag.scheduler.model import Policy, Signal
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.slurm.efficiency import neutral_jobs, nice_actions
from gpudiag.scheduler.slurm.qos import parse_qos, qos_tiers
from gpudiag.scheduler.slurm.slurmconf import Partition
from gpudiag.scheduler.slurm.squeue import SlurmJob
from tests.slurm_cluster import report, slurm_running
from tests.system.agent.test_agent import Agent
from tests.system.slurm_faults.test_slurm_safety import gpudiag, running

# sacctmgr -nP show qos format=Name,Priority, as slurmdbd 22.05 answers it
SACCTMGR = "normal|0\npremium|100\nscavenger|0\n"
QOS_CFG = {"PreemptType": "preempt/qos", "AccountingStorageType": "accounting_storage/slurmdbd"}


def _waiting(jid: int, qos: str, partition: str = "batch") -> SlurmJob:
    return SlurmJob(jid, f"j{jid}", "u", "a", partition, "PENDING", "Priority", 0, 1, 1.0, 0.0, None, 2,
                    qos=qos)


def test_the_top_qos_tier_is_never_penalised_and_the_line_says_nice_only():
    tiers = qos_tiers(QOS_CFG, lambda: SACCTMGR, squeue_json=True)
    assert parse_qos(SACCTMGR) == {"normal": 0, "premium": 100, "scavenger": 0}
    assert tiers.top == {"premium"} and tiers.nice_ok
    assert "Nice only, Slurm preempts" in tiers.line
    assert "QOS premium (priority 100, the top QOS tier)" in tiers.line
    jobs = [_waiting(1, "premium"), _waiting(2, "normal")]
    parts = {"batch": Partition("batch", 1, "REQUEUE", 0.0, ("n1",))}      # one partition: no tier there
    neutral = neutral_jobs(jobs, parts, None, tiers.top)
    assert neutral == {1: "QOS premium is the top QOS tier: its jobs are never penalised"}
    low = Signal(0.02, "input-bound", 0.9, 1.0)
    acts = nice_actions(jobs, parts, {}, set(), {1: low, 2: low}, MfuBook(Policy().history_half_life_s), 2.0,
                        replace(Policy(), min_runtime_s=0.0), 10_000, 0.0, 200, neutral)
    assert [a.target for a in acts] == ["2"] and int(acts[0].new) > 0       # the normal QOS job only


def test_unreadable_qos_priorities_change_no_nice_and_say_why():
    def down() -> str:
        raise RuntimeError("sacctmgr: Problem talking to the database: Connection refused")

    tiers = qos_tiers(QOS_CFG, down, squeue_json=True)
    assert not tiers.nice_ok and "cannot tell the top QOS tier's jobs and changes no Nice" in tiers.line
    assert qos_tiers({"PreemptType": "preempt/partition_prio"}, down, True) is None   # partitions are tiers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_running(tmp_path_factory.mktemp("slurm"), preempt_type="preempt/qos") as c:
        yield c


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    with Agent(tmp_path_factory.mktemp("agent"), backend="none") as a:
        yield a


def test_a_preempt_qos_cluster_gets_nice_only_and_one_honest_line(cluster, agent, tmp_path):
    blocker = cluster.sbatch("blocker", "reserved", 4)
    running(cluster, blocker)
    report(agent, blocker, 0.4)
    waiting, od = cluster.sbatch("idle", "reserved", 2), cluster.sbatch("od", "ondemand", 2)
    for j in (waiting, od):
        report(agent, j, 0.02, "input-bound")
    ledger = str(tmp_path / "ledger.json")
    p = gpudiag(cluster, "--once", "--json", "--agents", f"127.0.0.1:{agent.port}", "--min-change-interval",
                "0", "--state", ledger)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout.splitlines()[0])
    assert res["held"] == [] and not [a for a in res["actions"] if a["kind"] in ("preempt_mode", "requeue")]
    lines = [ln for ln in p.stderr.splitlines() if "PreemptType=preempt/qos" in ln]
    assert len(lines) == 1 and "Nice only, Slurm preempts" in lines[0], p.stderr
    assert "takes preemption over" not in p.stderr and "chooses the preemption victims" not in p.stderr
    assert all(cluster.preempt_mode(n) == m for n, m in
               (("spot", "REQUEUE"), ("reserved", "REQUEUE"), ("ondemand", "OFF")))   # untouched
    assert int(cluster.job(waiting)["Nice"]) > 0 and cluster.job(od)["Nice"] == "0"   # the top tier: none
    p = gpudiag(cluster, "--restore-only", "--state", ledger)
    assert p.returncode == 0 and cluster.job(waiting)["Nice"] == "0", p.stdout + p.stderr
