"""Quota reclaim and the waste charge, on cases computed by hand.

Reclaim: a blocked job of a team under its quota takes GPUs back from a team over its quota -
least useful work lost, no victim younger than the minimum runtime, never a team taken below
its own quota. The waste charge: a team's GPUs count more in the order across teams when its
jobs use them poorly, so its next job goes behind another team's. (The invariants with reclaim
on, over generated runtimes, are in tests/unit/test_scheduler_statemachine.py.)
"""

from __future__ import annotations

import dataclasses

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.local.engine import Engine, Machine
from gpudiag.scheduler.local.store import PENDING, RUNNING, JobRow
from gpudiag.scheduler.model import Cluster, Job, Policy, Running, Signal
from gpudiag.scheduler.policy import explain, order_queue, schedule
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.sim.simulator import simulate
from gpudiag.scheduler.sim.traces import TraceJob

NOW = 100_000.0


def _run(state: ClusterState, jid: int, node: int, gpus: int, team: str, start: float = 0.0) -> Running:
    return Running(Job(jid, gpus, start, 1e6, team=team), state.allocate([(node, gpus)]), start, start + 1e6,
                   start)


def _two_nodes_of_team_b():
    """16 GPUs, quotas 8 and 8; team b holds all of them: job 1 (MFU 50%) and job 2 (MFU 10%)."""
    cluster = Cluster.uniform(2, 8, 2)
    state = ClusterState(cluster)
    running = [_run(state, 1, 0, 8, "b"), _run(state, 2, 1, 8, "b")]
    signals = {1: Signal(0.5, "compute-bound", 0.9, 1.0), 2: Signal(0.1, "compute-bound", 0.9, 1.0)}
    return cluster, running, signals


def _preempts(decisions):
    return [d for d in decisions if d.kind == "preempt"]


def test_reclaim_takes_the_least_useful_work_back_from_the_team_over_its_quota():
    cluster, running, signals = _two_nodes_of_team_b()
    head = Job(3, 8, NOW - 10, 100.0, team="a")
    teams = {"a": 8.0, "b": 8.0}
    args = (cluster, [head], running, signals, MfuBook(1e6), NOW, Policy(), teams)
    pre = _preempts(schedule(*args))
    # lost work: job 1 0.5 x 8 x NOW, job 2 0.1 x 8 x NOW: job 2 goes; b keeps 8 of its 8
    assert [d.job_id for d in pre] == [2] and pre[0].numbers["reclaim"]
    assert "reclaim: team a holds 0 of its 8-GPU quota; team b keeps 8 of its 8" in pre[0].reason
    assert "reclaimed for team a's quota" in explain(3, *args)
    off = dataclasses.replace(Policy(), reclaim=False)
    assert not _preempts(schedule(cluster, [head], running, signals, MfuBook(1e6), NOW, off, teams))


def test_reclaim_never_takes_a_team_below_its_quota_nor_past_the_reclaimers_nor_a_young_job():
    cluster, running, signals = _two_nodes_of_team_b()
    book = MfuBook(1e6)

    def victims(head, quotas, run=running, policy=None):
        return _preempts(schedule(cluster, [head], run, signals, book, NOW, policy or Policy(), quotas))

    a8, a4 = Job(3, 8, NOW - 10, 100.0, team="a"), Job(3, 4, NOW - 10, 100.0, team="a")
    assert victims(a8, {"a": 8.0, "b": 8.0})                 # the case above fires ...
    assert not victims(a4, {"a": 4.0, "b": 12.0})            # ... but an 8-GPU victim would leave b 8 < 12
    assert not victims(a8, {"a": 4.0, "b": 12.0})            # a would hold 8 of its 4
    assert not victims(a8, {"a": 8.0, "b": 16.0})            # b is not over its quota
    # b's jobs overdue (submitted over team_overdue_s ago): requeued, they would go straight ahead of a's
    assert not victims(a8, {"a": 8.0, "b": 8.0}, policy=Policy(team_overdue_s=NOW - 1))
    assert not victims(a8, {"b": 8.0})                       # a has no quota to reclaim
    young = [dataclasses.replace(r, start=NOW - 60) for r in running]
    assert not victims(a8, {"a": 8.0, "b": 8.0}, young)      # younger than Policy.min_runtime_s


def _trace(b_jobs: list[tuple[int, float]], a_submit: float) -> list[TraceJob]:
    """Team b's jobs (GPUs, duration) at t=0, then team a's 4-GPU job of 10,000 s."""
    jobs = [TraceJob(i, 0.0, d, g, "b", f"b{i}") for i, (g, d) in enumerate(b_jobs)]
    return jobs + [TraceJob(len(jobs), a_submit, 10_000.0, 4, "a", "a")]


def _replay(trace, policy):
    mfu = {j.id: (0.5 if j.id == 0 else 0.1, "compute-bound") for j in trace}
    res = simulate(trace, mfu, Cluster.uniform(1, 8, 1), policy)
    return {s.trace_id: s for s in res.jobs}, res.quotas


def test_replay_reclaims_for_the_team_under_quota_and_only_then():
    # b: two 4-GPU jobs of 5,000 s, a: one of 10,000 s at t=1,000: loads 40,000 GPU-s each, so
    # quotas 4 and 4 of the 8 GPUs. At t=1,000 b holds 8 (4 over), a 0: a takes b's cheaper job
    # (MFU 10%, 1,000 s since its start, no checkpoint yet), which stops after its 30 s grace.
    trace = _trace([(4, 5000.0), (4, 5000.0)], 1000.0)
    got, quotas = _replay(trace, Policy())
    assert quotas == {"b": 4.0, "a": 4.0}
    assert got[1].preemptions == 1 and got[0].preemptions == 0
    assert got[2].first_start == 1030.0 and got[2].end == 11_030.0
    assert got[1].end == 10_000.0   # restarted when job 0 ends at 5,000, all 5,000 s again
    assert got[1].lost_gpu_s == 4 * 1030.0   # it computed through its grace, all lost
    # reclaim off: a waits for b's jobs to end
    got, _ = _replay(trace, dataclasses.replace(Policy(), reclaim=False))
    assert got[2].first_start == 5000.0 and got[1].preemptions == 0
    # b's one 8-GPU job: taking it would leave b 0 of its 4: no reclaim
    got, _ = _replay(_trace([(8, 5000.0)], 1000.0), Policy())
    assert got[1].first_start == 5000.0 and got[0].preemptions == 0
    # a arrives while b's jobs are younger than the minimum runtime (600 s): none taken
    got, _ = _replay(trace[:2] + [dataclasses.replace(trace[2], submit=300.0)], Policy())
    assert got[1].preemptions == 0


def test_waste_charge_puts_the_wasteful_teams_job_behind_another_teams():
    # 16 GPUs, quotas 8 and 8; each team runs 4 GPUs: a's job at MFU 5% (class median 40%:
    # factor 0.125, charged 1 + 1 x 0.875 = 1.875 per GPU: 7.5 GPUs), b's at 40%
    cluster = Cluster.uniform(2, 8, 2)
    state = ClusterState(cluster)
    running = [_run(state, 1, 0, 4, "a"), _run(state, 2, 1, 4, "b")]
    signals = {1: Signal(0.05, "compute-bound", 0.9, 1.0), 2: Signal(0.4, "compute-bound", 0.9, 1.0)}
    book = MfuBook(1e6)
    for k, m in (("x", 0.05), ("y", 0.4), ("z", 0.4)):
        book.observe(k, "2-8 GPUs", m, "compute-bound", NOW - 10)
    a_next, b_next = Job(3, 8, NOW - 2000, 100.0, team="a"), Job(4, 8, NOW - 1000, 100.0, team="b")
    teams = {"a": 8.0, "b": 8.0}

    def order(policy):
        return [j.id for j in order_queue([a_next, b_next], running, signals, book, NOW, policy, 8, teams,
                                          16).jobs]

    assert order(dataclasses.replace(Policy(), waste_charge=False)) == [3, 4]   # 4/8 each: a submitted first
    assert order(Policy()) == [4, 3]                                            # a: 7.5/8 > b: 4/8
    text = explain(3, cluster, [a_next, b_next], running, signals, book, NOW, Policy(), teams)
    assert "behind job 4 of team b: fair share (team a uses 4 (charged as 7.5: 3.5 GPUs for low MFU)" in text


def test_the_local_daemons_engine_reclaims_by_its_quota_and_says_so():
    # 4 slots, --quota a=2,b=2: b holds all 4 in two jobs started long ago; a's 2-slot job waits
    machine = Machine(("0", "1", "2", "3"), gpus=False)
    engine = Engine(machine, Policy(), MfuBook(1e6), {"a": 2, "b": 2})

    def row(jid, team, state, slots=None):
        return JobRow(id=jid, uid=0, user=team, team=team, name="", key="", tier=1, gpus=2, grace_s=30.0,
                      time_limit_s=None, cmd=["true"], env={}, cwd="/", submit_t=0.0, state=state,
                      slots=slots, started_t=0.0 if slots else None)

    active = [row(1, "b", RUNNING, ["0", "1"]), row(2, "b", RUNNING, ["2", "3"])]
    waiting = row(3, "a", PENDING)
    p = engine.plan([waiting], active, {}, {1: None, 2: None}, NOW, False)
    pre = _preempts(p.decisions)
    assert len(pre) == 1
    assert "reclaim: team a holds 0 of its 2-GPU quota; team b keeps 2 of its 2" in pre[0].reason
    said = engine.describe(p.why[3], {r.id: r for r in active}, NOW)
    assert "reclaimed for team a's quota" in said and "slots" in said
