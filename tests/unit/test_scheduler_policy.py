"""Policy invariants on generated clusters and queues, and the policy's pieces on hand-made cases.

Invariants (hypothesis): no partial gang, no GPU given twice or given while in use, nothing new
on a drained node, no preemption by an equal or lower tier (but quota reclaim, within the
quotas), no victim younger than the minimum runtime, a reason on every decision, the
aging bound on the queue order, and EASY backfill never moving the head's reservation later.
Generated clusters mix node sizes and drain some nodes (jobs already there keep running).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag.scheduler import team_queues
from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import Cluster, Job, Node, Placement, Policy, Running, Signal, Tier
from gpudiag.scheduler.pending import KEY_COL, KIND_COL, PendingQueue
from gpudiag.scheduler.placement import Rule, place, reserve, whole_nodes
from gpudiag.scheduler.policy import _ordering, explain, order_queue, plan_pass, schedule
from gpudiag.scheduler.priority import MfuBook, efficiency_factor, job_class

NOW = 100_000.0
LABELS = ["compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound", "unknown"]


@st.composite
def worlds(draw):
    """A cluster (uniform or of mixed node sizes, some nodes drained after jobs were placed
    there), running jobs placed through the real state, pending jobs, signals, a policy."""
    if draw(st.booleans()):
        per = draw(st.sampled_from([2, 4, 8]))
        cluster = Cluster.uniform(draw(st.integers(1, 10)), per, draw(st.integers(1, 4)))
    else:
        sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=10))
        rack = draw(st.integers(1, 4))
        cluster = Cluster(tuple(Node(i, g, i // rack) for i, g in enumerate(sizes)))
        per = max(sizes)
    state = ClusterState(cluster)
    running, signals, book = [], {}, MfuBook(7 * 86400.0)
    jid = 0
    for _ in range(draw(st.integers(0, 25))):
        g = draw(st.integers(1, per))
        n = state.best_fit_node(g)
        if n is None:
            continue
        start = NOW - draw(st.floats(0, 20_000))
        job = Job(jid, g, start - 10, draw(st.floats(60, 40_000)), team=draw(st.sampled_from("ab")),
                  key=f"k{draw(st.integers(0, 5))}", tier=Tier(draw(st.integers(0, 2))),
                  preemptible=draw(st.booleans()), grace_s=draw(st.floats(0, 120)))
        pl = state.allocate([(n, g)])
        running.append(Running(job, pl, start, start + job.estimate_s, start + draw(st.floats(0, 1000))))
        jid += 1
    pending = []
    for _ in range(draw(st.integers(0, 30))):
        g = draw(st.integers(1, cluster.total_gpus))
        pending.append(Job(jid, g, NOW - draw(st.floats(0, 50_000)), draw(st.floats(10, 50_000)),
                           team=draw(st.sampled_from("abc")), key=f"k{draw(st.integers(0, 5))}",
                           tier=Tier(draw(st.integers(0, 2)))))
        jid += 1
    for j in [r.job for r in running] + pending:
        if draw(st.booleans()):
            signals[j.id] = Signal(draw(st.floats(0, 1)), draw(st.sampled_from(LABELS)),
                                   draw(st.floats(0, 1)), draw(st.floats(0, 1000)))
    for k in range(draw(st.integers(0, 6))):
        book.observe(f"k{k}", "1 GPU", draw(st.floats(0, 0.8)), draw(st.sampled_from(LABELS)), NOW - 100)
    drained = draw(st.sets(st.sampled_from(range(len(cluster.nodes))), max_size=len(cluster.nodes) - 1))
    cluster = Cluster(tuple(dataclasses.replace(n, available=n.index not in drained) for n in cluster.nodes))
    base = draw(st.sampled_from([Policy(), Policy.easy(), Policy.fifo()]))
    policy = dataclasses.replace(base, spread_small=draw(st.booleans()) and base.name == "gpudiag")
    teams = {"a": 4.0, "b": 4.0}   # quotas in GPUs
    return cluster, running, pending, signals, book, policy, teams


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_decisions_respect_gangs_gpus_tiers_and_reasons(world):
    cluster, running, pending, signals, book, policy, teams = world
    decisions = schedule(cluster, pending, running, signals, book, NOW, policy, teams)
    size = {n.index: n.gpus for n in cluster.nodes}
    largest = max(n.gpus for n in cluster.nodes if n.available)
    used = {(n, i) for r in running for n, idx in r.placement.slots for i in idx}
    by_id = {j.id: j for j in pending}
    run_by_id = {r.job.id: r for r in running}
    starts = [d for d in decisions if d.kind == "start"]
    for d in decisions:
        assert d.reason.strip(), d
    for d in starts:
        job = by_id[d.job_id]
        assert d.placement.gpus == job.gpus                      # the whole gang, never part of it
        for n, idx in d.placement.slots:
            assert cluster.nodes[n].available                    # nothing new on a drained node
            for i in idx:
                assert 0 <= i < size[n]
                assert (n, i) not in used                        # never a GPU in use or given twice
                used.add((n, i))
        if job.gpus <= largest and not policy.spread_small:
            assert len(d.placement.slots) == 1                    # a one-node job stays on one node
        if job.gpus > largest:                                    # whole nodes, all but one fully used
            assert sum(1 for n, idx in d.placement.slots if len(idx) < size[n]) <= 1, d
    assert len({d.job_id for d in starts}) == len(starts)
    head_at = next((d.numbers["position"] for d in decisions if d.kind == "hold"), len(pending))
    held: dict[str, int] = {}   # what reclaim counts: running jobs, and the jobs started ahead of the head
    for j in [r.job for r in running] + [by_id[d.job_id] for d in starts if d.numbers["position"] < head_at]:
        held[j.team] = held.get(j.team, 0) + j.gpus
    taken: dict[str, int] = {}
    for d in decisions:
        if d.kind == "preempt":
            victim, head = run_by_id[d.job_id].job, by_id[d.numbers["for_job"]]
            assert victim.preemptible and NOW - run_by_id[d.job_id].start >= policy.min_runtime_s
            if d.numbers["reclaim"]:   # quota reclaim: the head's team stays within its quota
                assert policy.reclaim and victim.tier <= head.tier and victim.team != head.team
                assert held.get(head.team, 0) + head.gpus <= teams[head.team]
                taken[victim.team] = taken.get(victim.team, 0) + victim.gpus
            else:
                assert victim.tier < head.tier
    for t, g in taken.items():   # ... and no victim's team falls below its own
        assert held[t] - g >= teams[t]
    if policy.name == "fifo":   # strict order: a start never skips a waiting job
        q = order_queue(pending, running, signals, book, NOW, policy, max(size.values()), teams)
        started = {d.job_id for d in starts}
        order = [j.id for j in q.jobs]
        assert order[: len(started)] == [i for i in order if i in started]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_queue_order_respects_the_aging_bound(world):
    cluster, running, pending, signals, book, policy, teams = world
    q = order_queue(pending, running, signals, book, NOW, policy, 8, teams)
    bound = policy.aging_bound_s
    jobs = list(q.jobs)
    for i, later in enumerate(jobs):
        for earlier in jobs[:i]:
            if earlier.tier == later.tier:
                # ``earlier`` is ahead: it cannot have been submitted more than the bound after ``later``
                assert earlier.submit <= later.submit + bound + 1e-3
            else:
                assert earlier.tier > later.tier


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_backfill_never_delays_the_heads_reservation(world):
    cluster, running, pending, signals, book, policy, teams = world
    if not policy.backfill:
        return
    policy = dataclasses.replace(policy, preemption=False)
    state = ClusterState(cluster)
    for r in running:
        state.occupy(r.placement)
    q = order_queue(pending, running, signals, book, NOW, policy, state.max_gpus, teams)
    by_end = sorted(((r.expected_end, r.job.id, r.placement) for r in running), key=lambda x: x[0])
    decisions = plan_pass(state, q, by_end, NOW, policy)
    hold = [d for d in decisions if d.kind == "hold"]
    if not hold or hold[0].numbers["shadow"] is None:
        return
    head = next(j for j in q.jobs if j.id == hold[0].job_id)
    pos = [j.id for j in q.jobs].index(head.id)
    rule = Rule(head.gpus, head.gpus > state.max_gpus, policy.label_aware_placement,
                bool(q.kind[pos] == 1))
    by_id = {j.id: j for j in pending}
    ends = by_end + [(NOW + by_id[d.job_id].estimate_s, d.job_id, d.placement)
                     for d in decisions if d.kind == "start"]
    res = reserve(state, rule, sorted(ends, key=lambda x: x[0]), NOW)
    assert res is not None and res.shadow <= hold[0].numbers["shadow"] + 1e-6


def _cluster_with(free_per_node: list[int], per: int = 8, rack: int = 2) -> ClusterState:
    state = ClusterState(Cluster.uniform(len(free_per_node), per, rack))
    for n, f in enumerate(free_per_node):
        if per - f:
            state.allocate([(n, per - f)])
    return state


def test_best_fit_takes_the_fullest_node_that_fits_lowest_index_on_ties():
    state = _cluster_with([8, 3, 5, 3])
    assert place(state, Rule(3, False, False, False)) == [(1, 3)]
    assert place(state, Rule(4, False, False, False)) == [(2, 4)]
    assert place(state, Rule(6, False, False, False)) == [(0, 6)]
    assert place(state, Rule(9, False, False, False)) is None


def test_whole_node_jobs_take_the_fewest_racks():
    # racks of 2: nodes 0,1 | 2,3 | 4,5; nodes 0 and 3 busy
    state = _cluster_with([0, 8, 8, 0, 8, 8])
    assert whole_nodes(state, 16, fewest_racks=False) == [(1, 8), (2, 8)]   # lowest index: two racks
    assert whole_nodes(state, 16, fewest_racks=True) == [(4, 8), (5, 8)]    # one rack
    assert whole_nodes(state, 12, fewest_racks=True) == [(4, 8), (5, 4)]    # the remainder stays free


def _mixed(sizes: list[int], rack: int, busy: tuple[int, ...] = (), drained: tuple[int, ...] = ()):
    cluster = Cluster(tuple(Node(i, g, i // rack, available=i not in drained) for i, g in enumerate(sizes)))
    state = ClusterState(cluster)
    for n in busy:
        state.allocate([(n, 1)])
    return cluster, state


def test_on_mixed_sizes_a_job_larger_than_any_node_takes_the_fewest_whole_nodes_of_the_fewest_racks():
    # racks of 3: nodes 0..2 hold 8, 4, 4 GPUs | nodes 3..5 hold 4, 4, 4
    _, state = _mixed([8, 4, 4, 4, 4, 4], 3)
    assert whole_nodes(state, 12, fewest_racks=True) == [(0, 8), (1, 4)]    # two nodes, not three 4s
    assert whole_nodes(state, 10, fewest_racks=True) == [(0, 8), (1, 2)]    # the smallest keeps the rest
    assert whole_nodes(state, 10, fewest_racks=False) == [(0, 8), (1, 2)]   # baseline: by index
    _, busy = _mixed([8, 4, 4, 4, 4, 4], 3, busy=(0,))
    assert whole_nodes(busy, 12, fewest_racks=True) == [(3, 4), (4, 4), (5, 4)]   # one rack
    assert whole_nodes(busy, 12, fewest_racks=False) == [(1, 4), (2, 4), (3, 4)]
    assert whole_nodes(busy, 21, fewest_racks=True) is None                 # 20 wholly free
    _, small_first = _mixed([1, 1, 1, 8], 1)   # the baselines fill by index: no node left empty
    assert whole_nodes(small_first, 9, fewest_racks=False) == [(0, 1), (1, 1), (2, 1), (3, 6)]
    assert whole_nodes(small_first, 9, fewest_racks=True) == [(0, 1), (3, 8)]
    # reserved like that too: when node 0 frees, the 12-GPU head is reserved 8 + 4, not three 4s
    _, st2 = _mixed([8, 4, 4, 4, 4, 4], 3, busy=(0, 1, 3, 4))
    occupant = Placement(((0, (0,)),))
    res = reserve(st2, Rule(12, True, True, False), [(NOW + 500, 7, occupant)], NOW)
    assert res.shadow == NOW + 500
    assert res.nodes == frozenset({0, 2}) and res.waits_for == (7,) and res.spare == {0: 0, 2: 0}


def test_a_drained_node_keeps_its_jobs_and_gets_no_new_ones():
    cluster = Cluster((Node(0, 8, 0, available=False), Node(1, 4, 0)))
    state = ClusterState(cluster)
    busy = Running(Job(1, 2, 0.0, 1e6), state.allocate([(1, 2)]), 0.0, 1e6, 0.0)
    assert state.total_free == 2 and state.max_gpus == 4   # node 0's 8 free GPUs are not offered
    on_drained = Running(Job(2, 2, 0.0, 1e6), Placement(((0, (0, 1)),)), 0.0, 1e6, 0.0)
    small, big = Job(3, 2, NOW - 10, 100.0), Job(4, 6, NOW - 20, 100.0)
    decisions = schedule(cluster, [small, big], [busy, on_drained], {}, MfuBook(1e6), NOW, Policy.easy())
    starts = {d.job_id: d.placement for d in decisions if d.kind == "start"}
    assert starts == {3: Placement(((1, (2, 3)),))}   # big (6 GPUs) waits: only node 1 (4) is usable
    assert not [d for d in decisions if d.kind == "preempt"]


@settings(deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=7), st.integers(1, 3), st.data())
def test_whole_node_placement_uses_the_fewest_nodes_and_one_rack_when_one_can(sizes, rack, data):
    busy = tuple(data.draw(st.sets(st.sampled_from(range(len(sizes))), max_size=len(sizes) - 1)))
    _, state = _mixed(sizes, rack, busy=busy)
    largest = max(sizes)
    free_nodes = [n for n in range(len(sizes)) if n not in busy]
    gpus = data.draw(st.integers(largest + 1, largest + sum(sizes)))
    plan = whole_nodes(state, gpus, fewest_racks=True)
    fits = [c for k in range(1, len(free_nodes) + 1) for c in itertools.combinations(free_nodes, k)
            if sum(sizes[n] for n in c) >= gpus]
    if not fits:
        assert plan is None
        return
    fewest = min(len(c) for c in fits)
    assert plan is not None and sum(g for _, g in plan) == gpus and len(plan) == fewest
    assert all(n in free_nodes and 0 < g <= sizes[n] for n, g in plan)
    assert sum(1 for n, g in plan if g < sizes[n]) <= 1
    if any(len(c) == fewest and len({n // rack for n in c}) == 1 for c in fits):
        assert len({n // rack for n, _ in plan}) == 1, plan
    base = whole_nodes(state, gpus, fewest_racks=False)   # the baselines: a prefix by index
    assert [n for n, _ in base] == free_nodes[: len(base)] and sum(g for _, g in base) == gpus
    assert all(g == sizes[n] for n, g in base[:-1]) and 0 < base[-1][1] <= sizes[base[-1][0]]


def test_a_communication_bound_job_waits_for_one_node_others_spread():
    state = _cluster_with([4, 4, 0, 0])
    assert place(state, Rule(6, False, True, may_spread=False)) is None
    plan = place(state, Rule(6, False, True, may_spread=True))
    assert sorted(g for _, g in plan) == [2, 4] and {n for n, _ in plan} == {0, 1}


def test_efficiency_factor_neutral_weak_stale_low_and_idle():
    p = Policy()
    job = Job(1, 1, 0.0, 100.0, key="k")
    assert efficiency_factor(job, None, None, p, 0.31)[0] == 1.0
    weak = Signal(0.04, "compute-bound", p.min_signal_confidence - 0.01, 5.0)
    stale = Signal(0.04, "compute-bound", 0.9, p.max_signal_age_s + 1)
    assert efficiency_factor(job, weak, None, p, 0.31)[0] == 1.0
    assert efficiency_factor(job, stale, None, p, 0.31)[0] == 1.0
    f, why = efficiency_factor(job, Signal(0.04, "compute-bound", 0.9, 5.0), None, p, 0.31)
    assert abs(f - 0.04 / 0.31) < 1e-9 and "MFU 4.0% vs 31% median of its class" in why
    f, why = efficiency_factor(job, Signal(0.40, "input-bound", 0.9, 5.0), None, p, 0.31)
    assert f == p.idle_label_factor and "input-bound" in why
    assert efficiency_factor(job, Signal(0.40, "compute-bound", 0.9, 5.0), None, p, 0.31)[0] == 1.0


def _running(jid, node, gpus, tier, start, ckpt, state, preemptible=True):
    pl = state.allocate([(node, gpus)])
    return Running(Job(jid, gpus, start, 10_000.0, tier=tier, preemptible=preemptible), pl, start,
                   start + 10_000.0, ckpt)


def test_preemption_picks_the_least_useful_work_lost_and_only_lower_tiers():
    cluster = Cluster.uniform(2, 8, 2)
    state = ClusterState(cluster)
    # node 0: a spot job with high MFU and long since its checkpoint; node 1: a spot job with low MFU
    r0 = _running(1, 0, 8, Tier.SPOT, 0.0, 0.0, state)
    r1 = _running(2, 1, 8, Tier.SPOT, 0.0, 0.0, state)
    signals = {1: Signal(0.5, "compute-bound", 0.9, 1.0), 2: Signal(0.05, "input-bound", 0.9, 1.0)}
    head = Job(3, 8, NOW, 100.0, tier=Tier.ON_DEMAND)
    d = schedule(cluster, [head], [r0, r1], signals, MfuBook(1e6), NOW, Policy())
    pre = [x for x in d if x.kind == "preempt"]
    assert [x.job_id for x in pre] == [2] and "lowest useful work lost" in pre[0].reason
    assert pre[0].grace_s == r1.job.grace_s
    same = Job(4, 8, NOW, 100.0, tier=Tier.SPOT)
    assert not [x for x in schedule(cluster, [same], [r0, r1], signals, MfuBook(1e6), NOW, Policy())
                if x.kind == "preempt"]


def test_no_preemption_of_young_or_non_preemptible_jobs():
    cluster = Cluster.uniform(1, 8, 1)
    state = ClusterState(cluster)
    young = _running(1, 0, 4, Tier.SPOT, NOW - 60, NOW - 60, state)
    pinned = _running(2, 0, 4, Tier.SPOT, 0.0, 0.0, state, preemptible=False)
    head = Job(3, 8, NOW, 100.0, tier=Tier.ON_DEMAND)
    d = schedule(cluster, [head], [young, pinned], {}, MfuBook(1e6), NOW, Policy())
    assert [x.kind for x in d] == ["hold"]


def test_explain_names_what_blocks_and_what_lowered():
    cluster = Cluster.uniform(1, 8, 1)
    state = ClusterState(cluster)
    r = _running(1, 0, 6, Tier.RESERVED, 0.0, 0.0, state)
    head = Job(12, 4, NOW - 500, 50_000.0, tier=Tier.ON_DEMAND)
    low = Job(13, 4, NOW - 1000, 50_000.0, key="slow")
    book = MfuBook(1e6)
    for k, m in (("a", 0.31), ("b", 0.31), ("slow", 0.04)):
        book.observe(k, "2-8 GPUs", m, "compute-bound", NOW - 10)
    text = explain(13, cluster, [head, low], [r], {}, book, NOW, Policy())
    assert "behind job 12 (on-demand)" in text
    assert "priority lowered: MFU 4.0% vs 31% median of its class" in text
    assert "needs 4 GPUs" in text and "2 free" in text
    assert "head of the queue" in explain(12, cluster, [head, low], [r], {}, book, NOW, Policy())


def test_explain_gives_the_reason_of_the_pass_that_preempts():
    # one 4-GPU node: a spot job holds 2, an on-demand job needs 4: the pass preempts for it,
    # and explain says so instead of re-planning without preemption ("reserved in a year")
    cluster = Cluster.uniform(1, 4, 1)
    state = ClusterState(cluster)
    spot = _running(1, 0, 2, Tier.SPOT, 0.0, 0.0, state)
    od = Job(2, 4, NOW - 5, 100.0, tier=Tier.ON_DEMAND)
    args = (cluster, [od], [spot], {}, MfuBook(1e6), NOW, Policy())
    assert [d.kind for d in schedule(*args)] == ["preempt", "hold"]
    text = explain(2, *args)
    assert text.startswith("job 2 waits: head of the queue: needs 4 GPUs on one node, 2 free")
    assert f"starts when job 1 stops (grace ends in {spot.job.grace_s:.0f} s)" in text, text
    # the next pass, with job 1 in its grace period: no new victim, the same promise
    stopping = dataclasses.replace(spot, terminating=True, expected_end=NOW + spot.job.grace_s)
    later = (cluster, [od], [stopping], {}, MfuBook(1e6), NOW + 1, Policy())
    assert [d.kind for d in schedule(*later)] == ["hold"]
    assert "starts when job 1 stops" in explain(2, *later)


def test_pending_queue_keeps_tier_key_tag_order_on_insert_and_remove():
    q = PendingQueue()
    q.insert(3.0, Job(1, 1, 3.0, 1.0), 0, tag=1)
    q.insert(1.0, Job(2, 1, 1.0, 1.0), 0, tag=2)
    q.insert(2.0, Job(3, 2, 2.0, 1.0), 0, tag=3)
    q.insert(1.0, Job(4, 1, 1.0, 1.0), 0, tag=4)   # a tie in key goes after a lower tag ...
    q.insert(1.0, Job(0, 1, 1.0, 1.0), 0, tag=0)   # ... and before a higher one
    q.insert(9.0, Job(5, 1, 9.0, 1.0, tier=Tier.ON_DEMAND), 0, tag=5)   # a higher tier goes first
    assert [j.id for j in q.jobs] == [5, 0, 2, 4, 3, 1]
    q.remove([0, 1, 3])
    assert [j.id for j in q.jobs] == [2, 3, 1] and list(q.gpus) == [1, 2, 1]


def test_cluster_state_refuses_double_use():
    state = ClusterState(Cluster.uniform(1, 4, 1))
    pl = state.allocate([(0, 2)])
    try:
        state.occupy(Placement(((0, (pl.slots[0][1][0],)),)))
    except ValueError:
        pass
    else:
        raise AssertionError("a GPU in use was occupied again")
    state.release(pl)
    assert state.total_free == 4 and state.whole == [0]


def _charge(job, signals, book, policy, now):
    """The waste charge by its written rule: 1 + weight x (1 - the job's efficiency factor)."""
    if not policy.waste_charge:
        return 1.0
    h = book.lookup(job.key, now) if job.key else None
    f, _ = efficiency_factor(job, signals.get(job.id), h, policy, book.class_median(job_class(job.gpus)))
    return 1.0 + policy.waste_weight * (1.0 - f)


def _greedy_team_order(q0, running, quota, now, overdue_s, charge=lambda j: 1.0):
    """Per-team queues by their written rule, in plain Python: per tier, the overdue jobs in
    queue order, then repeatedly the head of the team whose (use + given) / quota is lowest
    (ties: lower key, then earlier in the queue); every job's GPUs counted at ``charge``."""
    given = dict.fromkeys(quota, 0.0)
    for r in running:
        given[r.job.team] += r.job.gpus * charge(r.job)
    rows = [(j, float(k), pos) for pos, (j, k) in enumerate(zip(q0.jobs, q0.key, strict=True))]
    out = []
    for tier in sorted({j.tier for j, _, _ in rows}, reverse=True):
        mine = [r for r in rows if r[0].tier == tier]
        fresh = [r for r in mine if now - r[0].submit < overdue_s]
        for j, _, _ in (r for r in mine if now - r[0].submit >= overdue_s):
            out.append(j)
            given[j.team] += j.gpus * charge(j)
        while fresh:
            heads = {}
            for r in fresh:
                heads.setdefault(r[0].team, r)
            j, k, pos = min(heads.values(), key=lambda r: (given[r[0].team] / quota[r[0].team], r[1], r[2]))
            fresh.remove((j, k, pos))
            out.append(j)
            given[j.team] += j.gpus * charge(j)
    return [j.id for j in out]


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.sampled_from([1.0, 1.5, 2.0])),
                max_size=40),
       st.lists(st.integers(0, 6), min_size=4, max_size=4),
       st.lists(st.sampled_from([1.0, 2.0, 4.0, 3.0]), min_size=4, max_size=4))
def test_interleave_is_the_greedy_merge_with_ties_to_the_earlier_row(jobs, use, quota):
    """``team_queues.interleave`` (one tier, nothing overdue) is the greedy merge its docstring
    states: the next job comes from the team whose (GPUs in use + GPUs given earlier) / quota is
    lowest, ties to the earlier row. GPUs and quotas are exact binary fractions, so ratios tie
    often and exactly: the merge of the teams' runs must fall back to the rows' order there."""
    team = np.array([t for t, _, _ in jobs], dtype=np.int64)
    gpus = np.array([g * c for _, g, c in jobs])
    use_a, quota_a = np.array(use, float), np.array(quota)
    n = len(jobs)
    got = team_queues.interleave(np.ones(n, dtype=np.int64), team, gpus, np.zeros(n), use_a, quota_a,
                                 0.0, 1e9).tolist()
    given_ = use_a.copy()
    todo = {t: [i for i in range(n) if team[i] == t] for t in range(4)}
    want = []
    while len(want) < n:
        t = min((t for t in todo if todo[t]), key=lambda t: (given_[t] / quota_a[t], todo[t][0]))
        i = todo[t].pop(0)
        want.append(i)
        given_[t] += gpus[i]
    assert got == want


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.floats(0, 60_000), st.sampled_from([0.0, 1.0, 3.0]))
def test_team_queues_interleave_by_charged_quota_and_keep_the_starvation_bound(world, overdue_s, weight):
    cluster, running, pending, signals, book, _, teams = world
    policy = dataclasses.replace(Policy(), team_overdue_s=overdue_s, waste_weight=weight)
    total = cluster.total_gpus
    q = order_queue(pending, running, signals, book, NOW, policy, 8, teams, total)
    q0 = order_queue(pending, running, signals, book, NOW, dataclasses.replace(policy, team_queues=False),
                     8, teams, total)
    seen = {"a", "b"} | {j.team for j in pending} | {r.job.team for r in running}
    quota = {t: teams[t] if t in teams else total / len(seen) for t in seen}
    # the overdue time by its written rule (docs/scheduler.md): the cluster's drain time (GPU
    # seconds held and waiting over its GPUs), capped at team_overdue_s. (The reference once used
    # the cap alone: a job waiting 53 s of a 53 s drain under a 54 s cap was read as not overdue.)
    drain = (sum(j.gpus * j.estimate_s for j in pending)
             + sum(r.job.gpus * max(r.expected_end - NOW, 0.0) for r in running)) / total
    overdue_s = min(overdue_s, drain)
    assert [j.id for j in q.jobs] == _greedy_team_order(
        q0, running, quota, NOW, overdue_s, lambda j: _charge(j, signals, book, policy, NOW))
    jobs = list(q.jobs)
    for i, later in enumerate(jobs):
        for earlier in jobs[:i]:
            if earlier.tier == later.tier:
                assert earlier.submit <= later.submit + policy.aging_bound_s + 1e-3
                if NOW - later.submit >= overdue_s:   # overdue: only other overdue jobs are ahead
                    assert NOW - earlier.submit >= overdue_s


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.floats(0, 60_000), st.sampled_from([0.0, 1.0, 3.0]), st.booleans())
def test_the_head_found_alone_is_the_job_the_order_puts_first(world, overdue_s, weight, quotas):
    """``Ordering.head`` (a replay skips a reclaim-only pass on it) names the job ``queue``
    puts first, overdue or not, with and without quotas, tiers and waste charges mixed."""
    cluster, running, pending, signals, book, _, teams = world
    policy = dataclasses.replace(Policy(), team_overdue_s=overdue_s, waste_weight=weight)
    o, rows = _ordering(pending, running, signals, book, NOW, policy, 8)
    if not len(rows):
        return
    teams = teams if quotas else None
    q = o.queue(rows, NOW, running, teams, cluster.total_gpus)[0]
    assert o.jobs[o.head(rows, NOW, o.running_cols(running), teams, cluster.total_gpus)] is q.jobs[0]


def test_team_under_quota_goes_first_until_an_overdue_job_of_any_team():
    cluster = Cluster.uniform(2, 8, 1)
    state = ClusterState(cluster)
    busy = Running(Job(1, 4, 0.0, 1e6, team="a"), state.allocate([(0, 4)]), 0.0, 1e6, 0.0)
    p = Policy()
    old = Job(10, 1, NOW - p.team_overdue_s - 1, 100.0, team="a")
    a1, a2 = Job(11, 2, NOW - 5000, 100.0, team="a"), Job(12, 2, NOW - 4900, 100.0, team="a")
    b = [Job(20 + i, 2, NOW - 100 + i, 100.0, team="b") for i in range(3)]
    teams = {"a": 4.0, "b": 4.0}
    args = ([old, a1, a2, *b], [busy], {}, MfuBook(1e6), NOW)
    off = order_queue(*args, dataclasses.replace(p, team_queues=False), 8, teams, 16)
    assert [j.id for j in off.jobs] == [10, 11, 12, 20, 21, 22]      # by (shifted) submit time
    on = order_queue(*args, p, 8, teams, 16)
    # a holds 4 + 1 (the overdue job) of its 4: b's ratios 0, 0.5, 1.0 come before a's 1.25, 1.75
    assert [j.id for j in on.jobs] == [10, 20, 21, 22, 11, 12]
    # a team without a quota gets an equal share of the 16 GPUs among the 3 teams seen
    c = Job(30, 8, NOW - 10, 100.0, team="c")
    assert [j.id for j in order_queue([a1, c], [busy], {}, MfuBook(1e6), NOW, p, 8, teams, 16).jobs] \
        == [30, 11]   # c: 0 / 5.33 before a: 4 / 4
    assert Policy.easy().aging_bound_s == 0.0 and p.aging_bound_s == p.team_overdue_s


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=60)
@given(worlds(), st.floats(0, 2_000))
def test_rows_brought_current_in_plain_floats_get_the_keys_the_vector_path_computes(world, later):
    """``Ordering.current`` computes a few stale rows in plain floats (``_current_one``, the
    common pass of a replay) and more with numpy (``keys``): both must give every row the same
    key, placement kind and waste charge, bit for bit, or a replay's decisions would depend on
    how many rows happened to be stale together."""
    cluster, running, pending, signals, book, policy, _ = world
    per = max(n.gpus for n in cluster.nodes)
    o, rows = _ordering(pending, running, signals, book, NOW, policy, per)
    if policy.order == "mfu" or not len(rows):
        return
    now = NOW + later   # some signals and histories have expired by then
    o.current(rows, now)   # (brings the class medians up to date)
    vec = o.keys(rows, now)   # the vector path, on all rows at once
    for r in rows.tolist():   # each alone: the plain-float path
        o.c_until[r] = -np.inf
        o.current(np.array([r]), now)
    assert np.array_equal(o.c_key[rows], vec[0]) and np.array_equal(o.c_kind[rows], vec[1])
    assert np.array_equal(o.c_charge[rows], vec[2])
    assert np.array_equal(o.num[rows, KEY_COL], vec[0]) and np.array_equal(o.num[rows, KIND_COL], vec[1])
