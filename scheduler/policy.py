"""One scheduling pass, and the entry points the runtimes call: ``plan``/``schedule`` and ``explain``.

Walk the ordered queue and start every job that fits (gang); the first that does not is the head.
Then, as one plan: promise it the GPUs of jobs in their grace period, else preempt or reclaim for
it, else give it EASY's reservation; backfill only where it cannot delay the head. The rules and
why: docs/scheduler.md, "Preemption and backfill as one plan".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext

import numpy as np

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import (
    Cluster,
    Decision,
    Job,
    Placement,
    Policy,
    Running,
    Signal,
    n_gpus,
)
from gpudiag.scheduler.ordering import Ordering, RunningCols
from gpudiag.scheduler.pending import SPREAD, WHOLE, PendingQueue
from gpudiag.scheduler.placement import Reservation, Rule, place, promise, rack_room, reserve
from gpudiag.scheduler.preempt import MfuOf, choose_victims, reclaim_victims
from gpudiag.scheduler.priority import MfuBook
from gpudiag.scheduler.reasons import Pass, Why, wait_reasons

__all__ = ["Pass", "Why", "decide", "explain", "order_queue", "plan", "plan_pass", "schedule", "wait_reasons"]


def rule_at(q: PendingQueue, i: int, policy: Policy) -> Rule:
    gpus, k = q.request(i)
    return Rule(gpus, k == WHOLE, policy.label_aware_placement, k == SPREAD)


def _fmt_t(t: float, now: float, unknown_after: float = math.inf) -> str:
    """A time relative to the pass: every runtime's clock reads the same way (the Slurm
    controller's is the epoch, where "t=1827233385s" said nothing). ``unknown_after``: a time
    this far ahead comes from a job without a time limit (``Policy.default_estimate_s``), whose
    end nobody knows: "in 365.0 days" would be a number made up."""
    d = t - now
    if d >= unknown_after:
        return "when a job without a time limit ends"
    if d < 1:
        return "now"
    if d < 90:
        return f"in {d:.0f} s"
    if d < 90 * 60:
        return f"in {d / 60:.0f} min"
    return f"in {d / 3600:.1f} h" if d < 48 * 3600 else f"in {d / 86400:.1f} days"


def _limits(state: ClusterState, res: Reservation | None) -> tuple[np.ndarray, np.ndarray]:
    """Largest request per kind (GPUs; whole nodes for WHOLE) that could start now: (short, long).
    A job that may spread fits on one node or inside one rack (``placement.spread``), so no
    more than the most free GPUs of a rack (the reserved nodes left out for a long one).

    "Long" jobs would still run at the head's reserved start, so they must leave its GPUs
    alone. These are necessary conditions; candidates passing them are checked exactly.
    """
    # a job that may spread goes on one node or inside one rack: no more than a rack's free GPUs
    short = np.array([state.max_free_on_a_node(), max(state.rack_free), len(state.whole)])
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
    return short, np.array([best, min(outside + inside, max(best, *rack_room(state, res.nodes))), whole])


def _team_use(running: Sequence[Running], started: Sequence[Job],
              held: Mapping[str, float] | None) -> dict[str, float]:
    """GPUs each team holds for reclaim: jobs in their grace period are leaving, jobs started
    earlier in this pass hold theirs. ``held``: the runtime's count of the first kind (else
    counted from ``running``)."""
    if held is None:
        use: dict[str, float] = {}
        for r in running:
            if not r.terminating:
                use[r.job.team] = use.get(r.job.team, 0.0) + r.job.gpus
    else:
        use = dict(held)
    for j in started:
        use[j.team] = use.get(j.team, 0.0) + j.gpus
    return use


def _head(state: ClusterState, head: Job, rule: Rule, by_end: Sequence[tuple[float, int, Placement]],
          now: float, policy: Policy, running: Sequence[Running] | None,
          mfu_of: MfuOf | None, quotas: Mapping[str, float] | None = None,
          started: Sequence[Job] = (), held: Mapping[str, float] | None = None,
          queue: PendingQueue | None = None,
          stopping: Sequence[tuple[float, int, Placement]] | None = None
          ) -> tuple[list[Decision], Reservation | None]:
    """Preemptions for the head, and its reservation: steps 1-3 of the module docstring.
    ``stopping``: the jobs of ``running`` in their grace period as (kill deadline, id,
    placement), in ``running``'s order, where the caller knows them (else found here)."""
    stopping = list(stopping) if stopping is not None else \
        [(r.expected_end, r.job.id, r.placement) for r in running or () if r.terminating]
    res = promise(state, rule, stopping, now) if stopping else None
    victims: list[Decision] = []
    reclaim = policy.reclaim and bool(quotas) and quotas.get(head.team, 0.0) > 0
    if res is None and (policy.preemption or reclaim) and running is not None and mfu_of is not None:
        with state.released(p for _, _, p in stopping) if stopping else nullcontext():
            if policy.preemption:
                victims = choose_victims(state, head, rule, running, now, policy, mfu_of)
            if not victims and reclaim:
                use = _team_use(running, started, held)
                share = queue.share_of(head.team) if queue is not None else None   # (use, quota, charged)
                charged = share[2] + sum(j.gpus for j in started if j.team == head.team) if share else None
                victims = reclaim_victims(state, head, rule, running, now, policy, mfu_of, quotas, use,
                                          charged, queue.overdue_s if queue is not None else None)
        if victims:
            stopping += [(now + d.grace_s, d.job_id, d.placement) for d in victims]
            res = promise(state, rule, stopping, now)
    if res is None and policy.backfill and policy.reservation:
        if victims:   # (a promise always follows victims; this keeps the reservation honest if not)
            deadline = {d.job_id: now + d.grace_s for d in victims}
            by_end = sorted(((deadline.get(j, e), j, pl) for e, j, pl in by_end), key=lambda x: x[0])
        res = reserve(state, rule, by_end, now)
    return victims, res


def _start_in_order(state: ClusterState, queue: PendingQueue, policy: Policy) -> list[Decision]:
    """Start jobs in queue order while each fits (gang: all its GPUs or none)."""
    out: list[Decision] = []
    for i in range(len(queue)):
        job, rule = queue.jobs[i], rule_at(queue, i, policy)
        plan = place(state, rule)
        if plan is None:
            break
        why = queue.why.get(job.id, "")
        out.append(Decision("start", job.id, "next in order" + (f" ({why})" if why else ""),
                            state.allocate(plan), numbers={"position": i}))
    return out


def _hold(state: ClusterState, head: Job, rule: Rule, i: int, victims: list[Decision],
          res: Reservation | None, now: float, policy: Policy) -> Decision:
    """The head's hold: what it needs, and when and why it will start."""
    where = "" if rule.may_spread else " on whole nodes" if rule.whole else " on one node"
    reclaimed = (f"reclaimed for team {head.team}'s quota from teams over theirs"
                 if any(d.numbers.get("reclaim") for d in victims) else "")
    if res is not None and res.firm:
        s = "s" if len(res.waits_for) > 1 else ""
        when = (f"; starts when job{s} {', '.join(str(j) for j in res.waits_for)} "
                f"stop{'' if s else 's'} (grace ends {_fmt_t(res.shadow, now)})")
        if reclaimed:
            when += f" - {reclaimed}"
    else:
        when = f"; GPUs reserved for it, starting {_fmt_t(res.shadow, now, policy.default_estimate_s / 2)}" \
            if res else ""
    blocked = (f"needs {n_gpus(head.gpus)}{where}, {state.total_free} free, "
               f"at most {state.max_free_on_a_node()} on one node")
    return Decision("hold", head.id, f"head of the queue: {blocked}{when}",
                    numbers={"free": state.total_free, "shadow": res.shadow if res else None,
                             "reservation": res, "firm": bool(res and res.firm), "position": i,
                             "need": blocked, "reclaim": reclaimed})


def _backfill(state: ClusterState, queue: PendingQueue, i: int, res: Reservation | None, now: float,
              policy: Policy) -> list[Decision]:
    """Jobs behind the head (at ``i``) that start now without delaying it: under an EASY
    reservation those that end before its start or use GPUs it does not need; under a promise
    (``res.firm``) only the latter. Candidates are selected with numpy (``_limits``) and only
    they are placed exactly."""
    out: list[Decision] = []
    head = queue.jobs[i]
    n = len(queue)
    rest = np.arange(i + 1, n)
    gpus, kinds, est = queue.gpus[i + 1:], queue.kind[i + 1:], queue.est[i + 1:]
    need_units = np.where(kinds == WHOLE, -(-gpus // max(state.max_gpus, 1)), gpus)
    if res is None:
        short_mask = np.ones(len(rest), bool)
    elif res.firm:   # the jobs it waits for may stop any moment: no one ends "before" it
        short_mask = np.zeros(len(rest), bool)
    else:
        short_mask = now + est <= res.shadow
    while state.total_free > 0 and len(rest):
        lim_s, lim_l = _limits(state, res)
        cand = np.flatnonzero(np.where(short_mask, need_units <= lim_s[kinds], need_units <= lim_l[kinds]))
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
        c += 1
        rest, need_units, short_mask, kinds = rest[c:], need_units[c:], short_mask[c:], kinds[c:]
        if plan is None:
            continue
        if not short:
            res.charge(plan)
        why = (f"backfilled: ends {_fmt_t(now + job.estimate_s, now)}, before job {head.id}'s reservation "
               f"starts {_fmt_t(res.shadow, now)}" if short and res is not None else
               f"backfilled on GPUs job {head.id}'s reservation does not need")
        out.append(Decision("start", job.id, why, state.allocate(plan),
                            numbers={"position": j, "shadow": res.shadow if res else None}))
    return out


def plan_pass(state: ClusterState, queue: PendingQueue, by_end: Sequence[tuple[float, int, Placement]],
              now: float, policy: Policy,
              running: Callable[[], Sequence[Running]] | None = None,
              mfu_of: MfuOf | None = None, quotas: Mapping[str, float] | None = None,
              held: Mapping[str, float] | None = None,
              stopping: Sequence[tuple[float, int, Placement]] | None = None) -> list[Decision]:
    """Decide starts (allocating them in ``state``), preemptions and the head's hold.

    ``by_end``: running jobs' (expected end, job id, placement), sorted by end; a job in its
    grace period appears with its kill deadline. ``running`` (every running job, those in their
    grace period marked ``terminating``) lets the pass see GPUs on their way to being free;
    with ``mfu_of`` (a job's MFU, or (MFU, measured?)) it may also preempt, and with ``quotas``
    (each team's quota in GPUs) reclaim; ``held``: each team's GPUs in running jobs not in their
    grace period, where the runtime keeps that count (else it is counted from ``running``);
    ``stopping``: ``running``'s jobs in their grace period as (kill deadline, job id, placement),
    in its order, where the runtime knows them (else found by a scan of ``running``).
    """
    out = _start_in_order(state, queue, policy)
    i = len(out)
    if i == len(queue):
        return out
    head, rule = queue.jobs[i], rule_at(queue, i, policy)
    if out:   # what started in order ahead of the head ends (by its estimate) before it can start
        started = [(now + queue.jobs[d.numbers["position"]].estimate_s, d.job_id, d.placement) for d in out]
        by_end = sorted([*by_end, *started], key=lambda x: x[0])
    victims, res = _head(state, head, rule, by_end, now, policy, running() if running is not None else None,
                         mfu_of, quotas, [queue.jobs[d.numbers["position"]] for d in out], held, queue,
                         stopping)
    out.extend(victims)
    out.append(_hold(state, head, rule, i, victims, res, now, policy))
    if policy.backfill:
        out.extend(_backfill(state, queue, i, res, now, policy))
    return out


def order_queue(pending: Sequence[Job], running: Sequence[Running], signals: Mapping[int, Signal],
                history: MfuBook, now: float, policy: Policy, per_node: int,
                quotas: Mapping[str, float] | None = None, total_gpus: int | None = None) -> PendingQueue:
    """The pending jobs in the order the pass walks, each with its placement kind and why
    (``ordering.Ordering.queue``). ``signals``: each job's own latest signal (a running job's;
    a requeued job's last); ``quotas``: each team's quota in GPUs; ``total_gpus`` sizes the
    equal share of a team without one."""
    o, rows = _ordering(pending, running, signals, history, now, policy, per_node)
    return o.queue(rows, now, running, quotas, total_gpus, why=True)[0]


def _ordering(pending: Sequence[Job], running: Sequence[Running], signals: Mapping[int, Signal],
              history: MfuBook, now: float, policy: Policy, per_node: int) -> tuple[Ordering, np.ndarray]:
    """A fresh ``Ordering`` of the pending and running jobs, in job-id order; the pending rows."""
    o = Ordering(policy, history, per_node)
    pend = {j.id for j in pending}
    jobs = sorted([*pending, *(r.job for r in running if r.job.id not in pend)], key=lambda j: j.id)
    rows = o.add(jobs)
    o.hear_all(signals, now)
    return o, rows[np.fromiter((j.id in pend for j in jobs), bool, len(jobs))]


def decide(o: Ordering, state: ClusterState, queue: PendingQueue | np.ndarray, running: Sequence[Running],
           by_end: Sequence[tuple[float, int, Placement]], now: float, quotas: Mapping[str, float] | None,
           why: bool = False, cols: RunningCols | None = None) -> Pass:
    """One pass over the jobs ``o`` knows: the one decision function every runtime calls.

    ``queue``: the pending rows of ``o`` (ascending), ordered here at ``now``
    (``Ordering.queue``); or a queue the caller keeps ordered itself, which only a replay of a
    time-invariant order does (arrival order: FIFO, EASY). ``state``: the cluster with
    ``running`` placed (starts are allocated in it); ``by_end``: ``running``'s (expected end,
    job id, placement) by end; ``quotas``: each team's quota in GPUs (per-team queues, reclaim);
    ``cols``: ``running`` as ``o.running_cols`` gives it, when the caller keeps them.
    """
    policy = o.policy
    live = None
    if not isinstance(queue, PendingQueue):
        queue, live = o.queue(queue, now, running, quotas, state.total_gpus, why, cols)
    reclaim = o.reclaim_quotas(quotas) if policy.reclaim else {}
    held = dict(zip(o.team_names, live.tolist(), strict=True)) if live is not None else None
    stopping = None   # the jobs in their grace period, from the caller's columns (no scan of ``running``)
    if cols is not None:
        stopping = [(running[i].expected_end, running[i].job.id, running[i].placement)
                    for i in np.flatnonzero(cols.stopping).tolist()]
    decisions = plan_pass(state, queue, by_end, now, policy, lambda: running, o.victim_mfu(running, now),
                          reclaim or None, held, stopping)
    return Pass(decisions, state, queue, policy, now)


def plan(cluster: Cluster, pending: Sequence[Job], running: Sequence[Running],
         signals: Mapping[int, Signal], history: MfuBook, now: float, policy: Policy,
         quotas: Mapping[str, float] | None = None) -> Pass:
    """One stateless round, kept whole: its decisions, its order and its reasons (``decide`` on
    a fresh ``Ordering``).

    ``running`` holds every job that holds GPUs, those told to stop marked ``terminating`` with
    their kill deadline as ``expected_end``. ``signals`` maps job id -> the agent's latest signal
    (running jobs, and pending jobs that ran before); ``history`` holds what earlier jobs of each
    key reached; ``quotas`` each team's quota in GPUs.
    """
    state = ClusterState(cluster)
    for r in running:
        state.occupy(r.placement)
    o, rows = _ordering(pending, running, signals, history, now, policy, state.max_gpus)
    by_end = sorted(((r.expected_end, r.job.id, r.placement) for r in running), key=lambda x: x[0])
    return decide(o, state, rows, running, by_end, now, quotas, why=True)


def schedule(cluster: Cluster, pending: Sequence[Job], running: Sequence[Running],
             signals: Mapping[int, Signal], history: MfuBook, now: float, policy: Policy,
             quotas: Mapping[str, float] | None = None) -> list[Decision]:
    """One stateless round: what to start, whom to preempt, and why the head waits (``plan``'s
    decisions)."""
    return plan(cluster, pending, running, signals, history, now, policy, quotas).decisions


def explain(job_id: int, cluster: Cluster, pending: Sequence[Job], running: Sequence[Running],
            signals: Mapping[int, Signal], history: MfuBook, now: float, policy: Policy,
            quotas: Mapping[str, float] | None = None) -> str:
    """Why a pending job waits, in words: the reason of the pass ``schedule`` would run on the
    same inputs (preemption included), not of a second planning."""
    why = plan(cluster, pending, running, signals, history, now, policy, quotas).why.get(job_id)
    if why is None:
        return f"job {job_id} is not pending"
    return f"job {job_id} starts now: {why.text}" if why.starts else f"job {job_id} waits: {why.text}"
