"""The scheduler's runtimes as state machines, checked against the invariants after every pass.

Why: unit and per-decision property tests passed while a preemption was followed by a backfill
onto the GPUs it freed, and a second pass preempted again for GPUs already on their way to
being free (DESIGN.md, "Interplay is where schedulers break"). Those bugs live between passes,
so here hypothesis drives a runtime through arrivals, ends, early exits, cancels, time limits,
preemptions with slow checkpoints (a victim that takes several passes to stop), restarts and
drained nodes, and after every pass ``Checker`` asserts:

1. no GPU (slot) in two jobs, every start a whole gang on free GPUs of usable nodes;
2. never more victims than the preemptor needs: no victim when the GPUs already on their way to
   being free suffice, and no victim whose GPUs the preemptor could do without;
3. GPUs freed by a victim reach its preemptor, or a job ahead of it in that pass's order, first;
   and quota reclaim (both teams have quotas here) never takes a team below its quota, nor
   gives the reclaimer more than its own; no victim is younger than the minimum runtime;
4. the head's reservation, computed by the written rule from the truth (a stopping job ends by
   its kill deadline), is never delayed by a job backfilled in the same pass;
5. the queue order keeps ``Policy.aging_bound_s``.

The processes are modelled (real ones are too slow for a property test); the code under test is
the real one: the local daemon's ``Engine`` fed the rows the daemon holds (a restart rebuilds it
from them), the policy core run statelessly on a cluster of mixed node sizes with drained nodes
(as the Slurm controller runs it), and the simulator's event loop, whose every pass is checked
as it happens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import gpudiag.scheduler.sim.simulator as simulator
from gpudiag.scheduler.local.engine import Engine, Machine
from gpudiag.scheduler.local.store import PENDING as ROW_PENDING
from gpudiag.scheduler.local.store import RUNNING as ROW_RUNNING
from gpudiag.scheduler.local.store import STOPPING as ROW_STOPPING
from gpudiag.scheduler.local.store import JobRow
from gpudiag.scheduler.model import Cluster, Job, Node, Placement, Policy, Running, Tier
from gpudiag.scheduler.pending import ONE_NODE, WHOLE
from gpudiag.scheduler.policy import plan
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.sim.traces import TraceJob
from tests.scheduler_invariants import EPS, Checker, Held, Waiting, gpus_of

POLICY = Policy(min_runtime_s=0.0)   # as `serve --min-runtime 0s`: preemption at once
LOCAL_QUOTA = {"a": 2, "b": 2}       # of the local runtime's 4 slots: reclaim can fire
CLUSTER_QUOTA = {"a": 9.0, "b": 9.0}   # of the mixed cluster's 18 GPUs


# --- the local daemon and the Slurm-style stateless runtime, driven by a model of processes -------

@dataclass
class MJob:
    """One job as the test models its processes: how long it runs, how long it takes to stop."""

    id: int
    gpus: int
    tier: Tier
    team: str
    submit: float
    limit: float | None      # --time-limit (what backfill plans with), None: the default estimate
    grace: float
    run_s: float             # undisturbed run time from a start
    stop_s: float            # SIGTERM to exit (a slow checkpoint when > grace: killed at the deadline)
    state: str = "pending"   # pending | running | stopping | ended
    placement: Placement | None = None
    start: float = math.nan
    deadline: float = math.nan
    exits_at: float = math.inf
    stop_kind: str = ""


class Runtime:
    cluster: Cluster
    quotas: dict[str, float]

    def estimate(self, j: MJob) -> float:
        raise NotImplementedError

    def plan(self, jobs: dict[int, MJob], now: float):
        raise NotImplementedError

    def restart(self) -> None:
        pass


class LocalRuntime(Runtime):
    """The local daemon's engine over the rows it holds (``--slots N``: one node)."""

    def __init__(self, slots: int) -> None:
        self.machine = Machine(tuple(str(i) for i in range(slots)), gpus=False)
        self.cluster = self.machine.cluster
        self.quotas = {t: float(q) for t, q in LOCAL_QUOTA.items()}
        self.restart()

    def restart(self) -> None:
        self.engine = Engine(self.machine, POLICY, MfuBook(POLICY.history_half_life_s), LOCAL_QUOTA)
        self.rows: dict[int, JobRow] = {}   # a fresh read of the database: nothing cached survives

    def estimate(self, j: MJob) -> float:
        return j.limit or Policy.default_estimate_s

    def row(self, j: MJob) -> JobRow:
        r = self.rows.get(j.id)
        if r is None:
            r = self.rows[j.id] = JobRow(
                id=j.id, uid=0, user=j.team, team=j.team, name="", key="", tier=int(j.tier), gpus=j.gpus,
                grace_s=j.grace, time_limit_s=j.limit, cmd=["true"], env={}, cwd="/", submit_t=j.submit,
                state=ROW_PENDING)
        r.state = {"pending": ROW_PENDING, "running": ROW_RUNNING, "stopping": ROW_STOPPING}[j.state]
        # a row holds its slots' ids (here "0".."n-1", the machine's own)
        r.slots = ([str(i) for i in sorted(i for _, idx in j.placement.slots for i in idx)] if j.placement
                   else None)
        r.started_t = None if math.isnan(j.start) else j.start
        r.stop_kind = j.stop_kind or None
        r.stop_deadline = None if math.isnan(j.deadline) else j.deadline
        return r

    def plan(self, jobs, now):
        pending = [self.row(j) for j in jobs.values() if j.state == "pending"]
        active = [self.row(j) for j in jobs.values() if j.state in ("running", "stopping")]
        return self.engine.plan(pending, active, {}, {r.id: None for r in active}, now, False)


class ClusterRuntime(Runtime):
    """The policy core run statelessly on a whole cluster, as the Slurm controller runs it:
    a stopping (requeued) job is marked terminating with its kill deadline as its end."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.quotas = CLUSTER_QUOTA

    def estimate(self, j: MJob) -> float:
        return j.limit or 365 * 86400.0

    def job(self, j: MJob) -> Job:
        return Job(j.id, j.gpus, j.submit, self.estimate(j), team=j.team, tier=j.tier, grace_s=j.grace)

    def plan(self, jobs, now):
        pending = [self.job(j) for j in jobs.values() if j.state == "pending"]
        running = [Running(self.job(j), j.placement, j.start,
                           j.deadline if j.state == "stopping" else j.start + self.estimate(j), j.start,
                           terminating=j.state == "stopping")
                   for j in jobs.values() if j.state in ("running", "stopping")]
        return plan(self.cluster, pending, running, {}, MfuBook(POLICY.history_half_life_s), now, POLICY,
                    CLUSTER_QUOTA)   # as the controller's --quota


class SchedulerMachine(RuleBasedStateMachine):
    runtime: Runtime

    def __init__(self, runtime: Runtime) -> None:
        super().__init__()
        self.runtime = runtime
        self.checker = Checker(runtime.cluster, POLICY.aging_bound_s, runtime.quotas, POLICY.min_runtime_s)
        self.jobs: dict[int, MJob] = {}
        self.now = 1000.0
        self.next_id = 1

    def active(self) -> list[MJob]:
        return [j for j in self.jobs.values() if j.state in ("running", "stopping")]

    def end(self, j: MJob) -> None:
        """The job's processes are gone: its GPUs are free; a preempted job is requeued."""
        self.checker.ended(j.id, {i for i, x in self.jobs.items() if x.state == "pending"})
        j.placement, j.deadline, j.exits_at = None, math.nan, math.inf
        if j.stop_kind == "preempt":
            j.state, j.start, j.stop_kind = "pending", math.nan, ""
        else:
            j.state = "ended"

    def stop(self, j: MJob, kind: str) -> None:
        j.state, j.stop_kind, j.deadline = "stopping", kind, self.now + j.grace
        j.exits_at = min(self.now + j.stop_s, j.deadline)

    def run_pass(self) -> None:
        """What the daemon does on every wakeup: settle exits, enforce time limits, one pass."""
        for j in list(self.active()):
            if j.exits_at <= self.now + EPS:
                self.end(j)
        for j in self.active():
            if j.state == "running" and j.limit is not None and self.now - j.start > j.limit:
                self.stop(j, "timeout")
        if not any(j.state == "pending" for j in self.jobs.values()):
            return
        p = self.runtime.plan(self.jobs, self.now)
        largest = max((n.gpus for n in self.runtime.cluster.nodes if n.available), default=0)
        est = self.runtime.estimate
        held = [Held(j.id, j.tier, j.placement, j.deadline if j.state == "stopping" else j.start + est(j),
                     j.state == "stopping", j.team, j.start) for j in self.active()]
        waiting = {j.id: Waiting(j.id, j.gpus, j.tier, j.submit, est(j),
                                 WHOLE if j.gpus > largest else ONE_NODE, j.team)
                   for j in self.jobs.values() if j.state == "pending"}
        self.checker.check(self.now, held, waiting, p.order, p.decisions)
        for d in p.decisions:   # as the daemon applies them
            if d.kind == "preempt":
                self.stop(self.jobs[d.job_id], "preempt")
            elif d.kind == "start":
                j = self.jobs[d.job_id]
                j.state, j.placement, j.start = "running", d.placement, self.now
                j.exits_at = self.now + j.run_s
        for j in self.jobs.values():   # every pending job has the pass's reason
            if j.state == "pending" and j.id not in {d.job_id for d in p.decisions if d.kind == "start"}:
                assert j.id in p.why and p.why[j.id].text, f"job {j.id} has no reason"

    # -- the rules: what users, processes and operators do ----------------------------------------
    def largest_request(self) -> int:
        return sum(n.gpus for n in self.runtime.cluster.nodes)

    @rule(data=st.data(), tier=st.sampled_from([Tier.SPOT, Tier.ON_DEMAND, Tier.RESERVED]),
          team=st.sampled_from("ab"), limit=st.one_of(st.none(), st.sampled_from([10.0, 60.0, 3600.0])),
          grace=st.sampled_from([30.0, 2.0, 10.0]), run_s=st.sampled_from([200.0, 5000.0, 20.0, 3.0]),
          stop_s=st.sampled_from([8.0, 0.5, 100.0]))
    def submit(self, data, tier, team, limit, grace, run_s, stop_s):
        gpus = data.draw(st.integers(1, self.largest_request()), label="gpus")
        self.jobs[self.next_id] = MJob(self.next_id, gpus, tier, team, self.now, limit, grace, run_s, stop_s)
        self.next_id += 1
        self.run_pass()

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 10.0, 40.0, 400.0]))
    def advance(self, dt):
        """Time passes: every exit and time limit on the way gets its own pass (SIGCHLD)."""
        until = self.now + dt
        for _ in range(50):
            due = [j.exits_at for j in self.active()]
            due += [j.start + j.limit + EPS for j in self.active()
                    if j.state == "running" and j.limit is not None]
            nxt = min(due, default=math.inf)
            if nxt > until:
                break
            self.now = max(self.now, nxt)
            self.run_pass()
        self.now = until
        self.run_pass()

    @precondition(lambda self: any(j.state == "running" for j in self.jobs.values()))
    @rule(data=st.data())
    def early_exit(self, data):
        j = data.draw(st.sampled_from([j for j in self.jobs.values() if j.state == "running"]))
        j.stop_kind = ""
        self.end(j)
        self.run_pass()

    @precondition(lambda self: any(j.state in ("pending", "running") for j in self.jobs.values()))
    @rule(data=st.data())
    def cancel(self, data):
        j = data.draw(st.sampled_from([j for j in self.jobs.values() if j.state in ("pending", "running")]))
        if j.state == "pending":
            j.state = "ended"
        else:
            self.stop(j, "cancel")
        self.run_pass()

    @rule()
    def restart(self):
        self.runtime.restart()
        self.run_pass()

    @invariant()
    def no_gpu_in_two_jobs(self):
        seen: set[tuple[int, int]] = set()
        for j in self.active():
            got = gpus_of(j.placement)
            assert not got & seen, f"GPUs {sorted(got & seen)} in two jobs"
            seen |= got


class LocalDaemonMachine(SchedulerMachine):
    def __init__(self) -> None:
        super().__init__(LocalRuntime(4))


class MixedClusterMachine(SchedulerMachine):
    """8-, 4- and 2-GPU nodes over two racks (the shapes a real cluster's sinfo shows); the
    operator drains and resumes nodes: jobs there keep running, nothing new goes there."""

    def __init__(self) -> None:
        nodes = (Node(0, 8, 0), Node(1, 4, 0), Node(2, 4, 1), Node(3, 2, 1))
        super().__init__(ClusterRuntime(Cluster(nodes)))

    @rule(node=st.integers(0, 3))
    def drain_or_resume(self, node):
        nodes = list(self.runtime.cluster.nodes)
        nodes[node] = replace(nodes[node], available=not nodes[node].available)
        self.runtime.cluster = self.checker.cluster = Cluster(tuple(nodes))
        # the machines changed under the plan: a preemptor may now be better placed elsewhere, so
        # what earlier victims free (or will free) is no longer promised to it
        self.checker.promised.clear()
        self.checker.victims.clear()
        self.run_pass()


SETTINGS = settings(stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestLocalDaemon = LocalDaemonMachine.TestCase
TestLocalDaemon.settings = SETTINGS
TestMixedCluster = MixedClusterMachine.TestCase
TestMixedCluster.settings = SETTINGS


# --- the simulator's event loop: every pass it makes, checked as it happens ------------------------

@st.composite
def sim_cases(draw):
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=5))
    rack = draw(st.integers(1, 3))
    cluster = Cluster(tuple(Node(i, g, i // rack) for i, g in enumerate(sizes)))
    jobs, t = [], 0.0
    for i in range(draw(st.integers(1, 25))):
        t += draw(st.sampled_from([0.0, 5.0, 60.0, 900.0, 4000.0]))
        duration = draw(st.sampled_from([30.0, 700.0, 3000.0, 20_000.0]))
        estimate = draw(st.one_of(st.none(), st.just(duration), st.just(duration * 3)))
        jobs.append(TraceJob(i, t, duration, draw(st.integers(1, sum(sizes))), draw(st.sampled_from("ab")),
                             f"k{draw(st.integers(0, 3))}", tier=draw(st.sampled_from(list(Tier))),
                             estimate=estimate))
    mfu = {j.id: (draw(st.floats(0.01, 0.6)), draw(st.sampled_from(["compute-bound", "communication-bound",
                                                                      "input-bound"]))) for j in jobs}
    policy = draw(st.sampled_from([Policy(min_runtime_s=0.0), Policy(), Policy.easy()]))
    return cluster, jobs, mfu, policy


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_cases())
def test_simulator_passes_keep_the_invariants(case):
    """The simulator's own loop (arrivals, ends, preemptions whose victims stop at their deadline,
    requeues), on mixed node sizes: each pass it makes is checked as it happens, on the inputs
    it had just before it (``simulate(on_pass=...)``)."""
    cluster, jobs, mfu, policy = case
    checker = Checker(cluster, policy.aging_bound_s, simulator.quotas_from_load(jobs, cluster.total_gpus),
                      policy.min_runtime_s)
    seen: dict[int, None] = {}
    passes = []

    def checked(p: simulator.SimPass) -> None:
        held_ids = {j for _, j, _ in p.by_end}
        rs = {r.job.id: r for r in p.running}
        waiting = {j.id: Waiting(j.id, j.gpus, j.tier, j.submit, j.estimate_s, k, j.team)
                   for j, k in zip(p.order, p.kinds, strict=True)}
        for j in list(seen):
            if j not in held_ids:
                del seen[j]
                checker.ended(j, set(waiting))
        seen.update(dict.fromkeys(held_ids))
        held = [Held(j, rs[j].job.tier, pl, end, rs[j].terminating, rs[j].job.team, rs[j].start)
                for end, j, pl in p.by_end]
        checker.check(p.now, held, waiting, [j.id for j in p.order], p.decisions)
        passes.append(p.now)

    res = simulator.simulate(jobs, mfu, cluster, policy, on_pass=checked)
    assert passes or not res.jobs
    for s in res.jobs:   # every job that fits the cluster ran to its end
        assert s.remaining == 0.0 and s.end >= s.job.submit
