"""One scheduling pass, and the entry points the runtimes call: ``schedule`` and ``explain``.

The pass (Volcano's allocate + backfill actions, Slurm's main and backfill schedulers in one):
walk the ordered queue and start every job that fits (gang: all GPUs or none); the first job
that does not fit is the head. FIFO stops there. Otherwise the head may preempt lower tiers
(``preempt.choose_victims``) and gets a reservation (``placement.reserve``); the jobs behind it
start only where they cannot delay that reservation: they end before it (by their estimate), or
they use GPUs it does not need. Decisions are data with a readable reason and their numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import (
    TIER_NAMES,
    Cluster,
    Decision,
    Job,
    Placement,
    Policy,
    Running,
    Signal,
    TeamShare,
)
from gpudiag.scheduler.ordering import Ordering
from gpudiag.scheduler.pending import SPREAD, WHOLE, PendingQueue
from gpudiag.scheduler.placement import Reservation, Rule, place, reserve
from gpudiag.scheduler.preempt import choose_victims
from gpudiag.scheduler.priority import MfuBook, job_class, signal_usable


def rule_at(q: PendingQueue, i: int, policy: Policy) -> Rule:
    k = int(q.kind[i])
    return Rule(int(q.gpus[i]), k == WHOLE, policy.label_aware_placement, k == SPREAD)


def _fmt_t(t: float) -> str:
    return f"t={t:.0f}s"


def _limits(state: ClusterState, res: Reservation | None) -> tuple[np.ndarray, np.ndarray]:
    """Largest request per kind (GPUs; whole nodes for WHOLE) that could start now: (short, long).

    "Long" jobs would still run at the head's reserved start, so they must leave its GPUs
    alone. These are necessary conditions; candidates passing them are checked exactly.
    """
    short = np.array([state.max_free_on_a_node(), state.total_free, len(state.whole)])
    if res is None:
        return short, short
    best = 0
    for k in range(state.max_gpus, 0, -1):
        if any(n not in res.nodes for n in state.buckets[k]):
            best = k
            break
    caps = {n: res.cap(n, state.free[n]) for n in res.nodes}
    best = max([best, *caps.values()])
    inside = sum(caps.values())
    outside = state.total_free - sum(state.free[n] for n in res.nodes)
    whole = len(state.whole) - sum(1 for n in res.nodes if state.free[n] == state.size[n]) \
        + sum(1 for n, c in caps.items() if c == state.size[n])
    return short, np.array([best, outside + inside, whole])


def plan_pass(state: ClusterState, queue: PendingQueue, by_end: Sequence[tuple[float, int, Placement]],
              now: float, policy: Policy,
              running: Callable[[], Sequence[Running]] | None = None,
              mfu_of: Callable[[Running], float] | None = None) -> list[Decision]:
    """Decide starts (allocating them in ``state``), preemptions and the head's hold.

    ``by_end``: running jobs' (expected end, job id, placement), sorted by end; a job in its
    grace period appears with its kill deadline. ``running``/``mfu_of`` enable preemption.
    """
    out: list[Decision] = []
    n = len(queue)
    i = 0
    while i < n:   # in order, until one does not fit: that one is the head
        job, rule = queue.jobs[i], rule_at(queue, i, policy)
        plan = place(state, rule)
        if plan is None:
            break
        why = queue.why.get(job.id, "")
        out.append(Decision("start", job.id, "next in order" + (f" ({why})" if why else ""),
                            state.allocate(plan), numbers={"position": i}))
        i += 1
    if i == n:
        return out
    head, rule = queue.jobs[i], rule_at(queue, i, policy)
    if out:   # what started in order ahead of the head ends (by its estimate) before it can start
        started = [(now + queue.jobs[d.numbers["position"]].estimate_s, d.job_id, d.placement) for d in out]
        by_end = sorted([*by_end, *started], key=lambda x: x[0])
    if policy.preemption and running is not None and mfu_of is not None:
        victims = choose_victims(state, head, rule, running(), now, policy, mfu_of)
        if victims:
            out.extend(victims)
            deadline = {d.job_id: now + d.grace_s for d in victims}
            by_end = sorted(((deadline.get(j, e), j, pl) for e, j, pl in by_end), key=lambda x: x[0])
    res = reserve(state, rule, by_end, now) if policy.backfill and policy.reservation else None
    need = f"needs {head.gpus} GPUs" + ("" if rule.may_spread else
                                        " on whole nodes" if rule.whole else " on one node")
    out.append(Decision("hold", head.id,
                        f"head of the queue: {need}, {state.total_free} free, at most "
                        f"{state.max_free_on_a_node()} on one node"
                        + (f"; reserved from {_fmt_t(res.shadow)}" if res else ""),
                        numbers={"free": state.total_free, "shadow": res.shadow if res else None}))
    if not policy.backfill:
        return out
    per = state.max_gpus
    rest = np.arange(i + 1, n)
    gpus, kinds, est = queue.gpus[i + 1:], queue.kind[i + 1:], queue.est[i + 1:]
    need_units = np.where(kinds == WHOLE, -(-gpus // per), gpus)
    short_mask = (now + est <= res.shadow) if res is not None else np.ones(len(rest), bool)
    while state.total_free > 0 and len(rest):
        lim_s, lim_l = _limits(state, res)
        ok = np.where(short_mask, need_units <= lim_s[kinds], need_units <= lim_l[kinds])
        cand = np.flatnonzero(ok)
        if not len(cand):
            break
        c = int(cand[0])
        j = int(rest[c])
        job, rule, short = queue.jobs[j], rule_at(queue, j, policy), bool(short_mask[c])
        if short:
            plan = place(state, rule)
        else:
            plan = place(state, rule, spare=res.spare or None,
                         banned=res.nodes if (rule.whole or rule.may_spread) else frozenset())
            if plan is not None and not res.allows(plan):
                plan = None
        keep = np.ones(len(rest), bool)
        keep[: c + 1] = False
        rest, need_units, short_mask, kinds = rest[keep], need_units[keep], short_mask[keep], kinds[keep]
        if plan is None:
            continue
        if not short:
            res.charge(plan)
        why = (f"backfilled: ends by {_fmt_t(now + job.estimate_s)}, before job {head.id}'s reservation "
               f"at {_fmt_t(res.shadow)}" if short and res is not None else
               f"backfilled on GPUs job {head.id}'s reservation does not need")
        out.append(Decision("start", job.id, why, state.allocate(plan),
                            numbers={"position": j, "shadow": res.shadow if res else None}))
    return out


def order_queue(pending: Sequence[Job], running: Sequence[Running], signals: Mapping[int, Signal],
                history: MfuBook, now: float, policy: Policy, per_node: int,
                teams: Mapping[str, TeamShare] | None = None, total_gpus: int | None = None) -> PendingQueue:
    """The pending jobs in the order the pass walks them, each with its placement kind and why.

    A fresh ``ordering.Ordering`` for this pass (the simulator keeps one across passes; both
    order alike). ``signals``: each job's own latest signal (a requeued job's); ``teams``: each
    team's quota and decayed use (fair share). With ``Policy.uses_team_queues`` the teams are
    interleaved by quota (``team_queues``): a team's use is the GPUs its running jobs hold now;
    ``total_gpus`` sizes the equal share of a team without a quota.
    """
    o = Ordering(policy, history, per_node)
    jobs = sorted(pending, key=lambda j: j.id)
    rows = o.add(jobs)
    for r, j in zip(rows.tolist(), jobs, strict=True):
        sig = signals.get(j.id)
        if sig is not None:
            o.hear(r, sig.mfu, sig.label, sig.confidence, now - sig.age_s)
    o.set_teams(teams or {}, now)
    q = o.queue(rows, now, why=True)
    if policy.uses_team_queues and len(q):
        q.permute(o.team_order(q, o.use_of(running), {t: s.quota_gpus for t, s in (teams or {}).items()},
                               total_gpus, now))
    return q


def schedule(cluster: Cluster, pending: Sequence[Job], running: Sequence[Running],
             signals: Mapping[int, Signal], history: MfuBook, now: float, policy: Policy,
             teams: Mapping[str, TeamShare] | None = None) -> list[Decision]:
    """One stateless round: what to start, whom to preempt, and why the head waits.

    ``signals`` maps job id -> the agent's latest signal (running jobs, and pending jobs that
    ran before); ``history`` holds what earlier jobs of each key reached.
    """
    state = ClusterState(cluster)
    for r in running:
        state.occupy(r.placement)
    queue = order_queue(pending, running, signals, history, now, policy, state.max_gpus, teams,
                        state.total_gpus)
    by_end = sorted(((r.expected_end, r.job.id, r.placement) for r in running), key=lambda x: x[0])

    def mfu_of(r: Running) -> float:
        sig = signals.get(r.job.id)
        if signal_usable(sig, policy):
            return sig.mfu
        h = history.lookup(r.job.key, now) if r.job.key else None
        if h is not None and h.weight >= policy.min_history_weight:
            return h.mfu
        return history.class_median(job_class(r.job.gpus)) or 1.0

    return plan_pass(state, queue, by_end, now, policy, lambda: running, mfu_of)


def wait_reasons(state: ClusterState, queue: PendingQueue, decisions: Mapping[int, Decision],
                 policy: Policy) -> dict[int, tuple[bool, str]]:
    """For every job of an ordered queue: (starts in this pass?, why, in words): its position,
    what blocks it, what lowered its priority. One wording for ``explain``, the local daemon's
    ``queue`` and the Slurm controller."""
    out: dict[int, tuple[bool, str]] = {}
    for pos, job in enumerate(queue.jobs):
        d = decisions.get(job.id)
        if d is not None and d.kind == "start":
            out[job.id] = (True, d.reason)
            continue
        parts = []
        if d is not None and d.kind == "hold":
            parts.append(d.reason)
        else:
            rule = rule_at(queue, pos, policy)
            if rule.may_spread:
                parts.append(f"needs {job.gpus} GPUs, {state.total_free} free")
            elif rule.whole:
                parts.append(f"needs {job.gpus} GPUs on whole nodes, {len(state.whole)} nodes wholly free")
            else:
                most = state.max_free_on_a_node()
                parts.append(f"needs {job.gpus} GPUs on one node, at most {most} free on one")
            if pos > 0:
                ahead = queue.jobs[pos - 1]
                parts.append(f"behind job {ahead.id} ({TIER_NAMES[ahead.tier]})")
        if queue.why.get(job.id):
            parts.append(queue.why[job.id])
        out[job.id] = (False, "; ".join(parts))
    return out


def explain(job_id: int, cluster: Cluster, pending: Sequence[Job], running: Sequence[Running],
            signals: Mapping[int, Signal], history: MfuBook, now: float, policy: Policy,
            teams: Mapping[str, TeamShare] | None = None) -> str:
    """Why a pending job waits, in words: its position, what blocks it, what lowered it."""
    state = ClusterState(cluster)
    for r in running:
        state.occupy(r.placement)
    queue = order_queue(pending, running, signals, history, now, policy, state.max_gpus, teams,
                        state.total_gpus)
    decisions = {d.job_id: d for d in plan_pass(state, queue, sorted(
        ((r.expected_end, r.job.id, r.placement) for r in running), key=lambda x: x[0]), now, policy)}
    why = wait_reasons(state, queue, decisions, policy).get(job_id)
    if why is None:
        return f"job {job_id} is not pending"
    starts, text = why
    return f"job {job_id} starts now: {text}" if starts else f"job {job_id} waits: {text}"
