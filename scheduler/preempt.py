"""Victims for a blocked head: the least useful work lost, then the fewest jobs.

Useful work lost = MFU x GPUs x seconds since the last checkpoint. ``choose_victims``: for a
strictly higher tier, preemptible jobs past ``Policy.min_runtime_s``, never one in its grace
period, only for what stopping jobs' GPUs do not cover; a greedy cover per node (or node by node
for a whole-node head), then every victim the others cover dropped. ``reclaim_victims``: the same
cover for a head whose team stays within its quota, from teams that stay at or over theirs. Two
rules keep a victim from coming straight back ahead of its reclaimer (without them one job was
reclaimed 381 times in a 12,000-job Philly prefix): the reclaimer's use counts with its waste
charge (``head_use``), and an overdue job is never reclaimed by its tier.
docs/scheduler.md, "Preemption" and "Preemption and backfill as one plan".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import TIER_NAMES, Decision, Job, Policy, Running, n_gpus
from gpudiag.scheduler.placement import Rule
from gpudiag.scheduler.priority import fmt_mfu

# mfu_of(r) -> MFU, or (MFU, measured?): a bare number is taken as measured
MfuOf = Callable[[Running], "float | tuple[float, bool]"]


def lost_work(r: Running, mfu: float, now: float) -> float:
    """GPU-seconds of useful (MFU-weighted) work since the job's last checkpoint."""
    return mfu * r.job.gpus * max(0.0, now - r.last_checkpoint)


def _mfu(mfu_of: MfuOf, r: Running) -> tuple[float, bool]:
    v = mfu_of(r)
    return v if isinstance(v, tuple) else (v, True)


_cost_then_id = itemgetter(0, 1)


def _on(r: Running, node: int) -> int:
    return sum(len(idx) for n, idx in r.placement.slots if n == node)


def _one_node(state: ClusterState, rule: Rule, eligible: Sequence[Running],
              cost: dict[int, float]) -> list[Running]:
    # per node: (cost, job id, its GPUs there, the job), so that the sorts below compare tuples
    # (a replay reclaims thousands of times over hundreds of running jobs)
    on_node: dict[int, list[tuple[float, int, int, Running]]] = {}
    for r in eligible:
        for n in r.placement.nodes:
            on_node.setdefault(n, []).append((cost[r.job.id], r.job.id, _on(r, n), r))
    best: tuple[float, int, int] | None = None
    chosen: list[Running] = []
    for n, rs in on_node.items():
        need = rule.gpus - state.free[n]
        if need <= 0 or not state.usable[n] or state.size[n] < rule.gpus:
            continue
        got, picked = 0, []
        for e in sorted(rs, key=_cost_then_id):
            got += e[2]
            picked.append(e)
            if got >= need:
                break
        if got < need:
            continue
        for e in picked[::-1]:   # drop the redundant, the costliest first
            if got - e[2] >= need:
                got -= e[2]
                picked.remove(e)
        total = sum(e[0] for e in picked)
        if best is None or (total, len(picked), n) < best:
            best, chosen = (total, len(picked), n), [e[3] for e in picked]
    return chosen


def _whole_nodes(state: ClusterState, rule: Rule, running: Sequence[Running],
                 cost: dict[int, float]) -> list[Running]:
    """Victims until wholly free nodes cover the head: a greedy in the cheapest extra work lost
    (a victim spanning several nodes frees all of them at its one cost), then every victim the
    others already cover dropped, the costliest first."""
    users: dict[int, list[Running]] = {}
    for r in running:
        if not r.terminating:
            for n in r.placement.nodes:
                users.setdefault(n, []).append(r)
    nodes = []   # nodes that become wholly free once their (eligible) jobs go
    for n in range(len(state.size)):
        us = users.get(n, [])
        # jobs started in this pass are not in ``running``: the free count says whether any is there
        if state.usable[n] and all(u.job.id in cost for u in us) \
                and state.free[n] + sum(_on(u, n) for u in us) == state.size[n]:
            nodes.append((n, {u.job.id for u in us}))
    by_id = {r.job.id: r for r in running if r.job.id in cost}

    def covered(victims: set[int]) -> int:
        return sum(state.size[n] for n, us in nodes if us <= victims)

    chosen: set[int] = set()
    while covered(chosen) < rule.gpus:
        todo = [(sum(cost[j] for j in us - chosen), len(us - chosen), n, us) for n, us in nodes
                if not us <= chosen]
        if not todo:
            return []
        chosen |= min(todo, key=lambda o: o[:3])[3]
    for j in sorted(chosen, key=lambda j: (-cost[j], -j)):
        if covered(chosen - {j}) >= rule.gpus:
            chosen.discard(j)
    return [by_id[j] for j in sorted(chosen)]


def _eligible(r: Running, head: Job, now: float, policy: Policy) -> bool:
    return r.job.preemptible and not r.terminating and now - r.start >= policy.min_runtime_s


def _cover(state: ClusterState, rule: Rule, running: Sequence[Running], eligible: Sequence[Running],
           cost: dict[int, float]) -> list[Running]:
    return _whole_nodes(state, rule, running, cost) if rule.whole else _one_node(state, rule, eligible, cost)


def choose_victims(state: ClusterState, head: Job, rule: Rule, running: Sequence[Running], now: float,
                   policy: Policy, mfu_of: MfuOf) -> list[Decision]:
    """Preempt decisions that let ``head`` start once the victims are gone; [] if none can.

    ``state``: the cluster once the jobs in their grace period are gone (``ClusterState.released``).
    """
    eligible = [r for r in running if r.job.tier < head.tier and _eligible(r, head, now, policy)]
    if not eligible:
        return []
    mfu = {r.job.id: _mfu(mfu_of, r) for r in eligible}
    cost = {r.job.id: lost_work(r, mfu[r.job.id][0], now) for r in eligible}
    chosen = _cover(state, rule, running, eligible, cost)
    return _decisions(chosen, head, mfu, cost, now, "")


def reclaim_victims(state: ClusterState, head: Job, rule: Rule, running: Sequence[Running], now: float,
                    policy: Policy, mfu_of: MfuOf, quotas: Mapping[str, float],
                    use: Mapping[str, float], head_use: float | None = None,
                    overdue_s: float | None = None) -> list[Decision]:
    """Quota reclaim for ``head`` (module docstring); [] if its team may not or no cover exists.

    ``quotas``: each team's quota in GPUs (teams without one neither reclaim nor lose to a
    reclaim); ``use``: the GPUs each team holds now, jobs in their grace period left out (their
    GPUs are leaving) and jobs started earlier in this pass counted; ``head_use``: the head's
    team's use as the order counts it (with the waste charge), when more than ``use``'s.
    """
    mine = quotas.get(head.team, 0.0)
    held = use.get(head.team, 0.0)
    if mine <= 0 or max(held, head_use or 0.0) + head.gpus > mine + 1e-9:
        return []
    overdue = (policy.team_overdue_s if overdue_s is None else overdue_s) if policy.uses_team_queues else None

    def spare(team: str) -> float:   # GPUs a team holds above its quota
        q = quotas.get(team, 0.0)
        return use.get(team, 0.0) - q if q > 0 else -1.0

    # the test that rules out most running jobs first: few teams hold GPUs above their quota
    above = {t: spare(t) + 1e-9 for t in quotas if t != head.team}
    eligible = [r for r in running if r.job.gpus <= above.get(r.job.team, -1.0) and r.job.tier <= head.tier
                and _eligible(r, head, now, policy)
                and not (overdue is not None and r.job.tier == head.tier and now - r.job.submit >= overdue)]
    mfu = {r.job.id: _mfu(mfu_of, r) for r in eligible}
    cost = {r.job.id: lost_work(r, mfu[r.job.id][0], now) for r in eligible}
    while eligible:
        chosen = _cover(state, rule, running, eligible, cost)
        if not chosen:
            return []
        taken: dict[str, int] = {}
        for r in chosen:
            taken[r.job.team] = taken.get(r.job.team, 0) + r.job.gpus
        over = [t for t, g in taken.items() if g > spare(t) + 1e-9]
        if not over:
            note = (f"reclaim: team {head.team} holds {held:.3g} of its {mine:.3g}-GPU quota; "
                    + ", ".join(f"team {t} keeps {use.get(t, 0.0) - g:.3g} of its {quotas[t]:.3g}"
                                for t, g in sorted(taken.items())) + "; ")
            return _decisions(chosen, head, mfu, cost, now, note)
        # together they would take a team below its quota: drop that team's costliest and retry
        drop = max((r for r in chosen if r.job.team in over), key=lambda r: (cost[r.job.id], r.job.id))
        eligible = [r for r in eligible if r is not drop]
        del cost[drop.job.id]
    return []


def _span(seconds: float) -> str:
    """A time since checkpoint in the unit that keeps it readable: a job that ran 25 s is not
    "0 min" (issue 41)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _gpu_time(gpu_s: float) -> str:
    """Useful GPU time lost, in the unit that keeps its digits: 2.5 GPU-s, not 0.0 GPU-h."""
    if gpu_s < 120:
        return f"{gpu_s:.3g} GPU-s"
    return f"{gpu_s / 60:.3g} GPU-min" if gpu_s < 7200 else f"{gpu_s / 3600:.3g} GPU-h"


def _decisions(chosen: Sequence[Running], head: Job, mfu: dict[int, tuple[float, bool]],
               cost: dict[int, float], now: float, note: str) -> list[Decision]:
    out = []
    for r in chosen:
        grace = r.job.grace_s
        value, measured = mfu[r.job.id]
        since = max(0.0, now - r.last_checkpoint)
        work = (f"MFU {fmt_mfu(value)} x {n_gpus(r.job.gpus)} x {_span(since)} since checkpoint "
                f"= {_gpu_time(cost[r.job.id])}" if measured else
                f"{n_gpus(r.job.gpus)} x {_span(since)} since checkpoint, MFU not measured")
        out.append(Decision(
            "preempt", r.job.id,
            f"{note}victim: lowest useful work lost ({work}) so that job {head.id} "
            f"({TIER_NAMES[head.tier]}) can start; SIGTERM, {grace:.0f} s grace",
            placement=r.placement, grace_s=grace,
            numbers={"lost_gpu_s": cost[r.job.id], "mfu": value, "mfu_measured": measured,
                     "for_job": head.id, "victim_tier": int(r.job.tier), "head_tier": int(head.tier),
                     "reclaim": bool(note)}))
    return out
