"""Quota reclaim on Slurm without a cluster: which partitions a reclaim may requeue in, the Nice
that puts the reclaiming job first in Slurm's order, the ledger's record of that lift (which the
efficiency Nice leaves alone and which ends once the job starts). A real slurmctld runs the same
code in tests/system/slurm_faults/test_slurm_safety.py (``test_quota_reclaim_...``)."""

from __future__ import annotations

from dataclasses import replace

from gpudiag.scheduler.model import Policy, Signal
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.slurm.actions import Action, confirm, record_intents
from gpudiag.scheduler.slurm.adapter import model_of
from gpudiag.scheduler.slurm.efficiency import nice_actions
from gpudiag.scheduler.slurm.ledger import JobRef, Ledger
from gpudiag.scheduler.slurm.reclaim import lift, lift_ends, lifted_jobs, quiet_partitions
from gpudiag.scheduler.slurm.serve_jobs import Serving, serve_waiting
from gpudiag.scheduler.slurm.slurmconf import Partition, SlurmNode
from gpudiag.scheduler.slurm.takeover import PARTITION_PRIO, ModeView


def job(jid: int, prio: int, part: str = "top", state: str = "PENDING", nice: int = 0, account: str = "b",
        nodes: tuple[str, ...] = (), cpus: int = 1):  # a SlurmJob
    from gpudiag.scheduler.slurm.squeue import SlurmJob

    running = state == "RUNNING"
    return SlurmJob(jid, f"j{jid}", "u", account, part, state, "Priority" if state == "PENDING" else "None",
                    nice, prio, 100.0, 100.0 if running else 0.0, None, 1,
                    nodes=nodes or (("n1",) if running else ()), gpu_index=((jid - 1,),) if running else (),
                    cpus=cpus)


PARTS = {"spot": Partition("spot", 1, "REQUEUE", 10.0, ("n1",)),
         "top": Partition("top", 3, "REQUEUE", 0.0, ("n1",)),
         "vip": Partition("vip", 3, "OFF", 0.0, ("n1",)),
         "cpu": Partition("cpu", 1, "REQUEUE", 0.0, ("c1",))}
NODES = {"n1": SlurmNode("n1", 4, 8, 0, 1000.0, 0.0, "MIXED"),
         "c1": SlurmNode("c1", 0, 8, 0, 1000.0, 0.0, "IDLE")}


def test_reclaim_requeues_only_where_slurm_never_preempts_or_gpudiag_holds():
    modes = ModeView({n: p.preempt_mode for n, p in PARTS.items()}, set())
    # spot has a higher tier on its node (Slurm preempts there: takeover's), vip was promised no
    # preemption (OFF in slurm.conf), cpu has no GPUs: only the top tier at REQUEUE is quiet
    assert quiet_partitions(PARTS, modes, NODES, PARTITION_PRIO) == {"top"}
    assert quiet_partitions(PARTS, modes, NODES, "preempt/qos") == set()   # QOS preemption: not modelled


def test_the_reclaiming_job_is_lifted_above_every_rival_for_the_freed_nodes_and_the_victim():
    head = job(9, prio=100, account="a")
    victim = job(3, prio=130, state="RUNNING")
    backlog = job(5, prio=120)                       # team b's waiting job, submitted before the head
    elsewhere = job(6, prio=500, nodes=("x9",), part="cpu")   # a partition on other nodes: no rival
    nice, why = lift(head, [victim], [head, victim, backlog, elsewhere], PARTS)
    assert why == "" and nice == -31                 # 100 + 31 > 130, the victim's own priority
    assert lift(job(9, prio=200, account="a"), [victim], [backlog], PARTS) == (None, "")   # first already
    vip = job(7, prio=1, part="vip")                 # a higher tier waits for the same node
    nice, why = lift(job(9, prio=100, part="spot", account="a"), [victim], [vip], PARTS)
    assert nice is None and "higher-tier partition vip" in why


def test_a_lift_is_recorded_kept_from_the_efficiency_nice_and_ends_when_the_job_starts():
    led = Ledger()
    head = job(9, prio=100, account="a")
    record_intents(led, [Action("lift", "9", "0", "-31", "reclaim", ref=JobRef.of(head))], 1.0)
    assert led.nice[9].lifted and led.nice[9].original == 0
    a = Action("lift", "9", "0", "-31", "reclaim", applied=True)
    confirm(led, [a])
    assert (led.nice[9].set, led.nice[9].want, led.nice[9].lifted) == (-31, None, True)
    lifted = job(9, prio=131, nice=-31, account="a")
    # the efficiency Nice would put a job without evidence back to its original: not a lifted one
    def efficiency(theirs: set[int]) -> list[Action]:
        book = MfuBook(Policy().history_half_life_s)
        return nice_actions([lifted], PARTS, led.nice, theirs, {}, book, 10.0, Policy(), 10_000, 0.0, 200)

    assert [a.new for a in efficiency(set())] == ["0"]   # what it would do to any other job
    assert efficiency(lifted_jobs(led.nice)) == []
    assert lift_ends({9: lifted}, led.nice) == []    # still waiting: the lift stays
    started = job(9, prio=131, nice=-31, state="RUNNING", account="a")
    (back,) = lift_ends({9: started}, led.nice)
    assert (back.kind, back.new) == ("restore", "0")
    record_intents(led, [back], 2.0)
    back.applied = True
    confirm(led, [back])
    assert 9 not in led.nice
    # a lift Slurm refused on a job whose efficiency Nice gpudiag set earlier: the efficiency's again
    record_intents(led, [Action("nice", "9", "0", "500", "low", ref=JobRef.of(head))], 3.0)
    confirm(led, [Action("nice", "9", "0", "500", "low", applied=True)])
    record_intents(led, [Action("lift", "9", "500", "-31", "reclaim", ref=JobRef.of(head))], 4.0)
    confirm(led, [Action("lift", "9", "500", "-31", "reclaim", error="denied")])
    assert (led.nice[9].set, led.nice[9].lifted) == (500, False)


NOW = 4000.0
QUOTAS = {"a": 1.0, "b": 3.0}


def serve(jobs: list, evidence: set[int], nodes: dict | None = None) -> tuple[list[Action], Serving]:
    """One round's reclaim decisions (the policy core's pass) mapped to Slurm actions."""
    nodes = nodes or NODES
    modes = ModeView({n: p.preempt_mode for n, p in PARTS.items()}, set())
    quiet = quiet_partitions(PARTS, modes, nodes, PARTITION_PRIO)
    model = model_of(jobs, nodes, PARTS, quiet, 5.0, NOW)
    signals = {j.id: Signal(m, "compute-bound", 0.9, 10.0) for j, m in zip(jobs[:4], (0.4, 0.05, 0.4, 0.3),
                                                                                 strict=True)}
    policy = replace(Policy(), min_runtime_s=600.0)
    book = MfuBook(policy.history_half_life_s)
    decisions = schedule(model.cluster, model.pending, model.running, signals, book, NOW, policy,
                         dict(QUOTAS))
    by_id = {j.id: j for j in jobs}
    s = Serving(jobs, by_id, model, modes, PARTS, nodes, decisions, set(), lambda j: j.id in evidence, {},
                set(), {}, False, policy.min_runtime_s, NOW, quiet, QUOTAS)
    out, handed, _ = serve_waiting(s, allow_victims=True)
    assert handed == {}    # Slurm cannot reclaim: it is never asked to
    return out, s


def test_reclaim_decisions_become_a_lift_and_requeues_or_one_line_why_not():
    b = [job(i, prio=130 - i, state="RUNNING") for i in range(1, 5)]   # team b fills the 4-GPU node
    backlog, a1 = job(5, prio=120), job(7, prio=100, account="a")
    out, _ = serve([*b, backlog, a1], evidence={1, 2, 3, 4})
    assert [(a.kind, a.target, a.new) for a in out] == [("lift", "7", "-29"), ("requeue", "2", "PENDING")]
    # -29: a1's 100 above the victim's own 128 (a requeued job keeps its priority), not only b5's 120
    assert out[1].reclaim and out[1].for_job == 7 and out[1].reason.startswith("reclaim: team a holds 0")
    # a candidate without evidence was valued at an assumed MFU: nothing is done, and why
    out, s = serve([*b, backlog, a1], evidence={1, 2, 4})
    assert out == [] and "job 3 could be its reclaim victim and has no usable MFU" in s.not_reclaimed[7]
    # the node's CPUs are all held: the victim's one CPU would not seat a1's two
    full = {**NODES, "n1": SlurmNode("n1", 4, 8, 8, 1000.0, 0.0, "ALLOCATED")}
    out, s = serve([*b, backlog, job(7, prio=100, account="a", cpus=2)], evidence={1, 2, 3, 4}, nodes=full)
    assert out == [] and "needs 2 CPUs on n1, 1 would be free" in s.not_reclaimed[7]
    # a2 would take team a above its quota of 1: no reclaim decided, nothing to enact
    out, s = serve([*b, backlog, replace(a1, gpus=2)], evidence={1, 2, 3, 4})
    assert out == [] and s.not_reclaimed == {}
