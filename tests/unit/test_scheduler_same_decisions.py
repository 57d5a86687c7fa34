"""The replay decides as the runtimes do: the same decision function on the same inputs, pass by pass.

The local daemon and the Slurm controller call ``policy.plan`` (a fresh ``Ordering`` per pass);
the simulator keeps one ``Ordering`` and calls ``policy.decide`` over a simulated clock. Here:

1. every pass of generated replays (tiers, preemptions, requeues, quota reclaim, expiring
   signals and key histories, every policy) is run again statelessly with ``plan`` on the inputs
   the replay had just before it - the same queue order and the same decisions, exactly;
2. a window of the Philly trace is replayed through the simulator and through the local
   daemon's ``Engine`` driven by a fake daemon (job rows, a fake clock, an agent that reports a
   run's MFU ``LEARN_AFTER_S`` after it starts, no processes), written here from the rules
   docs/scheduler-modelling.md (Between passes) states, and every instant's starts (with their
   GPUs) and preemptions are the same - including the instants where the replay decided that no pass was worth
   running (the daemon's engine then decides nothing either).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.scheduler.local.engine import Engine, Layout, Machine
from gpudiag.scheduler.local.store import PENDING, RUNNING, STOPPING, JobRow
from gpudiag.scheduler.model import Cluster, Policy, Signal, Tier
from gpudiag.scheduler.policy import plan
from gpudiag.scheduler.priority import MfuBook, job_class
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.simulator import CHECKPOINT_INTERVAL_S, LEARN_AFTER_S, SimPass, simulate
from gpudiag.scheduler.sim.traces import TraceJob, read_trace
from tests.conftest import SHARED as SHARED_DATA

SHARED = SHARED_DATA / "clusters"

LABELS = ["compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound", "unknown"]


def _actions(decisions) -> list[tuple]:
    return [(d.kind, d.job_id, d.placement, d.grace_s) for d in decisions if d.kind in ("start", "preempt")]


def _replay_agrees(jobs, mfu, cluster, policy) -> tuple[int, int, int]:
    """Replay; every pass is run again by ``plan`` on its inputs: (passes, with a signal, preemptions)."""
    checked = heard = preempted = 0

    def check(p: SimPass) -> None:
        nonlocal checked, heard, preempted
        again = plan(cluster, p.order, p.running, p.signals, p.book, p.now, policy, p.quotas)
        assert [j.id for j in again.queue.jobs] == [j.id for j in p.order], p.now
        assert [int(k) for k in again.queue.kind] == p.kinds, p.now
        assert _actions(again.decisions) == _actions(p.decisions), p.now
        checked += 1
        heard += bool(p.signals)
        preempted += any(d.kind == "preempt" for d in p.decisions)

    res = simulate(jobs, mfu, cluster, policy, on_pass=check)
    assert res.aging_violations == 0   # the aging bound, checked on every pass's order
    return checked, heard, preempted


@st.composite
def replays(draw):
    per = draw(st.sampled_from([2, 4, 8]))
    cluster = Cluster.uniform(draw(st.integers(1, 4)), per, draw(st.integers(1, 2)))
    jobs, mfu, t = [], {}, 0.0
    for i in range(draw(st.integers(2, 40))):
        t += draw(st.integers(0, 900))   # whole seconds: signal ages compare exactly both ways
        jobs.append(TraceJob(i, t, float(draw(st.integers(60, 6000))),
                             draw(st.integers(1, min(per * 2, cluster.total_gpus))),
                             draw(st.sampled_from(["a", "b", "c"])), f"k{draw(st.integers(0, 4))}",
                             tier=Tier(draw(st.integers(0, 2)))))
        mfu[i] = (draw(st.floats(0.01, 0.6)), draw(st.sampled_from(LABELS)))
    base = draw(st.sampled_from([Policy(), Policy(team_queues=False), Policy(spread_unknown=True),
                                 Policy(label_aware_placement=False), Policy(reclaim=False), Policy.easy(),
                                 Policy.fifo()]))
    # short history, signal life and runtime floor: keys expire, reports go stale, victims exist
    policy = dataclasses.replace(base, min_runtime_s=float(draw(st.sampled_from([0, 600]))),
                                 history_half_life_s=float(draw(st.sampled_from([3600, 7 * 86400]))),
                                 max_signal_age_s=float(draw(st.sampled_from([300, 3000]))))
    return jobs, mfu, cluster, policy


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replays())
def test_every_replay_pass_decides_as_the_stateless_pass_on_its_inputs(replay):
    _replay_agrees(*replay)


def test_a_tiered_replay_with_preemptions_decides_as_the_stateless_pass():
    """Requeued victims carry their own last report for a while, then their key's history."""
    jobs = [TraceJob(i, 200.0 * i, 2400.0 + 97 * (i % 7), 1 + i % 4, "ab"[i % 2], f"k{i % 3}",
                     tier=Tier((i * 7) % 3)) for i in range(60)]
    mfu = {j.id: (0.05 + 0.1 * (j.id % 5), LABELS[j.id % 5]) for j in jobs}
    checked, heard, preempted = _replay_agrees(jobs, mfu, Cluster.uniform(2, 4, 1), Policy(min_runtime_s=0.0))
    assert checked > 10 and heard > 0 and preempted > 0


class FakeDaemon:
    """The local daemon's engine over the rows the daemon keeps, on a fake clock, without
    processes: a run ends after its remaining work; a victim stops at its kill deadline, loses
    the work since its last checkpoint (every ``CHECKPOINT_INTERVAL_S`` of run time) and is
    requeued; the agent's first report of a job comes ``LEARN_AFTER_S`` into its run (and is
    heard at the next instant anything happens), after which its signal is live whenever it
    runs, its last one kept while it waits, and its key learns it."""

    def __init__(self, jobs: list[TraceJob], mfu: dict, gpus: int, policy: Policy, quotas: dict) -> None:
        self.engine = Engine(Machine(tuple(str(i) for i in range(gpus)), gpus=True), policy,
                             MfuBook(policy.history_half_life_s), quotas)
        self.jobs = [j for j in jobs if j.gpus <= gpus]
        self.mfu = mfu
        self.rows: dict[int, JobRow] = {}
        self.left: dict[int, float] = {}          # work left, s
        self.learned: set[int] = set()
        self.ends: list[tuple[float, int, int]] = []      # (time, 0 finish / 1 kill, job)
        self.reports: list[tuple[float, int, float]] = []  # (time, job, run start)

    def instants(self):
        """Every instant something happens: (time, the engine's starts and preemptions)."""
        ai = 0
        while ai < len(self.jobs) or self.ends:
            now = min(self.jobs[ai].submit if ai < len(self.jobs) else math.inf,
                      self.ends[0][0] if self.ends else math.inf)
            self._reports(now)
            self._ends(now)
            while ai < len(self.jobs) and self.jobs[ai].submit <= now:
                self._submit(ai, self.jobs[ai])
                ai += 1
            yield now, self._pass(now)

    def _submit(self, i: int, t: TraceJob) -> None:
        self.rows[i] = JobRow(id=i, uid=0, user=t.team, team=t.team, name="", key=t.key, tier=int(t.tier),
                              gpus=t.gpus, grace_s=Policy.default_grace_s, time_limit_s=t.duration,
                              cmd=["true"], env={}, cwd="/", submit_t=t.submit, state=PENDING)
        self.left[i] = t.duration

    def _reports(self, now: float) -> None:
        while self.reports and self.reports[0][0] <= now:
            _, i, start = heapq.heappop(self.reports)
            row = self.rows[i]
            if row.state not in (RUNNING, STOPPING) or row.started_t != start:
                continue
            self.learned.add(i)
            m, label = self.mfu[self.jobs[i].id]
            self.engine.book.observe(row.key, job_class(row.gpus), m, label, now)

    def _ends(self, now: float) -> None:
        while self.ends and self.ends[0][0] <= now:
            _, kind, i = heapq.heappop(self.ends)
            row = self.rows[i]
            ran = now - (row.started_t or now)
            if row.state == PENDING or (kind == 0 and abs(ran - self.left[i]) > 1e-6):
                continue   # a stale event: the run it was for is over
            if kind == 0:
                row.state, row.slots = "done", None
                continue
            kept = math.floor(ran / CHECKPOINT_INTERVAL_S) * CHECKPOINT_INTERVAL_S
            self.left[i] -= kept
            m, label = self.mfu[self.jobs[i].id]
            if i in self.learned:   # the last report, kept in the row while it waits
                row.sig_mfu, row.sig_label, row.sig_conf, row.sig_t = m, label, 1.0, now
            row.state, row.slots, row.started_t = PENDING, None, None
            row.stop_kind = row.stop_deadline = None

    def _signals(self, now: float) -> dict[int, Signal]:
        out = {}
        for i, row in self.rows.items():
            m, label = self.mfu[self.jobs[i].id]
            if row.state in (RUNNING, STOPPING) and i in self.learned:
                out[i] = Signal(m, label, 1.0, 0.0)
            elif row.state == PENDING and row.sig_t is not None:
                out[i] = Signal(row.sig_mfu, row.sig_label, row.sig_conf, now - row.sig_t)
        return out

    def _pass(self, now: float) -> list[tuple]:
        pending = [r for r in self.rows.values() if r.state == PENDING]
        if not pending:
            return []
        active = [r for r in self.rows.values() if r.state in (RUNNING, STOPPING)]
        p = self.engine.plan(pending, active, self._signals(now), {r.id: None for r in active}, now, True)
        for d in p.decisions:
            row = self.rows[d.job_id]
            if d.kind == "start":
                row.state, row.started_t = RUNNING, now
                row.slots = Layout.of(self.engine.machine, active).ids(d.placement)   # ids, as kept
                heapq.heappush(self.ends, (now + self.left[row.id], 0, row.id))
                if row.id not in self.learned:
                    heapq.heappush(self.reports, (now + LEARN_AFTER_S, row.id, now))
            elif d.kind == "preempt":
                row.state, row.stop_kind, row.stop_deadline = STOPPING, "preempt", now + d.grace_s
                heapq.heappush(self.ends, (now + d.grace_s, 1, row.id))
        return _actions(p.decisions)


def test_a_philly_window_decides_the_same_in_the_replay_and_the_local_daemons_engine():
    """400 Philly jobs of up to 8 GPUs on one 8-GPU machine (the trace's own arrivals, 18 busy
    hours of 11 teams): efficiency from learned keys, per-team queues, quota reclaim with its
    preemptions."""
    tr = read_trace(SHARED / "philly.csv")
    jobs = [j for j in tr.jobs[76000:76700] if j.gpus <= 8][:400]
    jobs = [dataclasses.replace(j, id=i) for i, j in enumerate(jobs)]   # row i is job i in both
    mfu = synthesise(jobs, 0)
    policy = Policy()
    cluster = Cluster.uniform(1, 8, 1)
    replayed: dict[float, list[tuple]] = {}

    def seen(p: SimPass) -> None:
        if _actions(p.decisions):
            replayed[p.now] = _actions(p.decisions)

    res = simulate(jobs, mfu, cluster, policy, on_pass=seen)
    daemon = FakeDaemon(jobs, mfu, 8, policy, res.quotas)
    engine = {now: acts for now, acts in daemon.instants() if acts}
    assert sorted(engine) == sorted(replayed)
    for now in sorted(engine):
        assert engine[now] == replayed[now], now
    preemptions = sum(a[0] == "preempt" for acts in engine.values() for a in acts)
    starts = sum(a[0] == "start" for acts in engine.values() for a in acts)
    assert starts >= len(jobs) and preemptions > 0 and daemon.learned
