"""One queue order in all three runtimes: the simulator's incremental ordering equals ``order_queue``.

The local daemon and the Slurm controller order their queue with ``policy.order_queue`` (a fresh
``Ordering`` per pass); the simulator keeps one ``Ordering`` across passes and feeds it only
what changed (keys learned, a requeued job's last report, the teams' use). Here a replay is
watched pass by pass and, on every pass whose keys are current, the queue it walks must be
exactly the one ``order_queue`` builds from the same pending and running jobs, signals, key
history and team shares: the same jobs in the same order, with the same placement kinds.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.scheduler.model import Cluster, Policy, Tier
from gpudiag.scheduler.policy import order_queue
from gpudiag.scheduler.sim.mfu_model import synthesise
from gpudiag.scheduler.sim.simulator import SimPass, simulate
from gpudiag.scheduler.sim.traces import TraceJob, read_trace
from tests.test_scheduler_sim import SHARED

LABELS = ["compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound", "unknown"]


def _replay_agrees(jobs, mfu, cluster, policy) -> tuple[int, int]:
    """Replay, checking every pass with current keys against ``order_queue``: (passes checked, of which
    with a requeued job's own report in the queue)."""
    checked = heard = 0

    def check(p: SimPass) -> None:
        nonlocal checked, heard
        if not p.current or len(p.queue) < 2:
            return
        fresh = order_queue(list(p.queue.jobs), p.running, p.signals, p.book, p.now, policy, p.per_node,
                            p.teams, p.total_gpus)
        assert [j.id for j in p.queue.jobs] == [j.id for j in fresh.jobs], p.now
        assert list(p.queue.kind) == list(fresh.kind), p.now
        checked += 1
        heard += bool(p.signals)

    simulate(jobs, mfu, cluster, policy, on_pass=check)
    return checked, heard


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
                                 Policy(label_aware_placement=False), Policy.easy(), Policy.fifo()]))
    # short history, signal life and runtime floor: keys expire, reports go stale, victims exist
    policy = dataclasses.replace(base, min_runtime_s=float(draw(st.sampled_from([0, 600]))),
                                 history_half_life_s=float(draw(st.sampled_from([3600, 7 * 86400]))),
                                 max_signal_age_s=float(draw(st.sampled_from([300, 3000]))))
    return jobs, mfu, cluster, policy


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replays())
def test_the_simulators_queue_order_is_order_queues(replay):
    _replay_agrees(*replay)


def test_a_philly_prefix_replay_orders_as_order_queue_on_every_current_pass():
    """Real arrivals and keys (learned after 10 minutes, class medians moving, fair share)."""
    tr = read_trace(SHARED / "philly.csv")
    jobs = tr.jobs[:1500]
    checked, _ = _replay_agrees(jobs, synthesise(jobs, 0), Cluster.uniform(6, 8, 2), Policy())
    assert checked > 100


def test_a_tiered_replay_with_preemptions_orders_as_order_queue():
    """Requeued victims carry their own last report for a while, then their key's history."""
    jobs = [TraceJob(i, 200.0 * i, 2400.0 + 97 * (i % 7), 1 + i % 4, "ab"[i % 2], f"k{i % 3}",
                     tier=Tier((i * 7) % 3)) for i in range(60)]
    mfu = {j.id: (0.05 + 0.1 * (j.id % 5), LABELS[j.id % 5]) for j in jobs}
    policy = Policy(min_runtime_s=0.0)
    checked, heard = _replay_agrees(jobs, mfu, Cluster.uniform(2, 4, 1), policy)
    res = simulate(jobs, mfu, Cluster.uniform(2, 4, 1), policy)
    assert checked > 10 and heard > 0 and sum(s.preemptions for s in res.jobs) > 0
