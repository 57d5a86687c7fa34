"""Trace replay: the policy core driven by simulated time (FIFO, EASY and gpudiag; Tiresias: tiresias.py).

Event semantics (those of published simulators, so numbers compare): at one instant all
completions are handled before all arrivals, then one scheduling pass. Durations are the
trace's, except that a job of at most one node's GPUs that gpudiag spreads over several nodes
runs longer by the ``slowdown`` model - the one placement the baselines never make. A job
of more GPUs than a node replays its recorded duration under every policy (as the baselines'
semantics require); what spanning more racks than needed would cost it under the model is
recorded for every policy in ``rack_cost_gpu_s`` and printed by the benchmark, not applied.

The queue order is the policy core's (``gpudiag.scheduler.ordering``), the one the local
daemon and the Slurm controller use. The policy sees a job's MFU and label only once it has run
``LEARN_AFTER_S`` (the agent's first estimate needs a traced step; ten minutes is a
conservative stand-in), through earlier jobs of its key, or - a requeued job - through its own
last report for ``Policy.max_signal_age_s`` after it stopped, as a runtime would
(``Policy.order == "mfu"``, the calibration prototype's oracle, orders by each job's own MFU
known at submission instead). Sort keys are recomputed every ``PRIORITY_CALC_PERIOD_S``
(Slurm's PriorityCalcPeriod default) and for each arrival; the per-team interleave before
every pass.

Preemption (tiers from an sacct export; Philly and Tiresias traces have one tier) and quota
reclaim (``Policy.reclaim``, quotas from ``quotas_from_load``): a victim gets SIGTERM and its
grace period, then its GPUs are free; work since its last periodic checkpoint (every
``CHECKPOINT_INTERVAL_S`` of run time) is lost and it is requeued with the rest. The waste charge
(``Policy.waste_charge``) of a running job comes from its own signal once learned (its agent
reports while it runs), else its key's history; recomputed each priority period.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import (
    Cluster,
    Job,
    Placement,
    Policy,
    Running,
    Signal,
    TeamShare,
)
from gpudiag.scheduler.ordering import Ordering
from gpudiag.scheduler.pending import PendingQueue
from gpudiag.scheduler.policy import plan_pass
from gpudiag.scheduler.priority import (
    MfuBook,
    job_class,
)
from gpudiag.scheduler.sim.slowdown import slowdown
from gpudiag.scheduler.sim.traces import TraceJob

LEARN_AFTER_S = 600.0
PRIORITY_CALC_PERIOD_S = 300.0
CHECKPOINT_INTERVAL_S = 1800.0


@dataclass(slots=True)
class SimJob:
    """A trace job's life in the simulation."""

    job: Job
    duration: float
    mfu: float
    label: str
    remaining: float = 0.0                   # work left, in seconds of undisturbed run time
    first_start: float = math.nan
    end: float = math.nan
    segments: list = field(default_factory=list)   # (start, end, progress seconds)
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    slow_gpu_s: float = 0.0
    learned: bool = False
    seen_mfu: float = math.nan   # the MFU the policy learned (its agent's signal)
    trace_id: int = -1
    rack_cost_gpu_s: float = 0.0   # what spanning extra racks would cost under the model (not applied)


@dataclass
class SimResult:
    policy: str
    jobs: list[SimJob]
    rejected: int
    total_gpus: int
    quotas: dict[str, float]
    wall_s: float


def admissible(trace_jobs: list[TraceJob], total_gpus: int) -> tuple[list[TraceJob], int]:
    """The jobs a cluster of ``total_gpus`` can ever run, and how many it rejects: a job larger
    than the cluster (it would take whole nodes: all of them at most) never fits."""
    fit = [t for t in trace_jobs if t.gpus <= total_gpus]
    return fit, len(trace_jobs) - len(fit)


def quotas_from_load(jobs: list[TraceJob], total_gpus: int) -> dict[str, float]:
    """Each team's quota: its share of the offered load (sum of GPUs x duration) times the cluster."""
    load: dict[str, float] = {}
    for j in jobs:
        load[j.team] = load.get(j.team, 0.0) + j.gpus * j.duration
    tot = sum(load.values()) or 1.0
    return {t: total_gpus * v / tot for t, v in load.items()}


class _Teams:
    """Per team: GPUs held (``gpus``; ``live``: less the jobs in their grace period, what reclaim
    counts), the same with the waste charge (``charged``), and the decayed average of the GPUs
    held (exponential, half-life from the policy), to which fair share adds the charge."""

    def __init__(self, quotas: dict[str, float], half_life_s: float) -> None:
        self.quota = quotas
        self.lam = math.log(2.0) / half_life_s
        self.avg = dict.fromkeys(quotas, 0.0)
        self.gpus = dict.fromkeys(quotas, 0)
        self.live = dict.fromkeys(quotas, 0.0)
        self.charged = dict.fromkeys(quotas, 0.0)
        self.at = dict.fromkeys(quotas, 0.0)

    def _roll(self, team: str, now: float) -> None:
        a = math.exp(-self.lam * max(0.0, now - self.at[team]))
        self.avg[team] = self.avg[team] * a + self.gpus[team] * (1.0 - a)
        self.at[team] = now

    def change(self, team: str, delta: int, now: float, charged: float) -> None:
        """``delta`` GPUs held (``charged``: as the waste charge counts them) from ``now``."""
        self._roll(team, now)
        self.gpus[team] += delta
        self.charged[team] += charged

    def share(self, team: str, now: float) -> TeamShare:
        self._roll(team, now)
        return TeamShare(self.quota.get(team, 0.0), self.avg[team])


@dataclass(frozen=True)
class SimPass:
    """What one pass of a replay saw, for a watcher (``simulate(on_pass=...)``): the queue in the
    order the pass walks, and the inputs a stateless runtime would hand ``policy.order_queue``
    for the same jobs. ``current``: every sort key and kind is as of now (recomputed for this
    pass, or constant in time: arrival order); otherwise they may be up to
    ``PRIORITY_CALC_PERIOD_S`` old, as Slurm's priorities are."""

    now: float
    queue: PendingQueue
    running: list[Running]
    signals: dict[int, Signal]
    book: MfuBook
    teams: dict[str, TeamShare]
    total_gpus: int
    per_node: int
    current: bool


def simulate(trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]], cluster: Cluster,
             policy: Policy, oracle: bool = False, on_pass: Callable[[SimPass], None] | None = None
             ) -> SimResult:
    """Replay submit-sorted ``trace_jobs`` under ``policy``; jobs that can never fit are rejected.

    The queue order is the policy core's (``ordering.Ordering``, kept across passes and fed what
    changed). ``oracle``: the policy knows every job's MFU and label at submission (a signal
    heard at every instant, against class medians of the whole trace) instead of learning them -
    what learning costs, for the benchmark. ``on_pass`` sees every pass (tests, tracing).
    """
    wall0 = time.perf_counter()
    state = ClusterState(cluster)
    per, rack_size = state.max_gpus, max(len(r) for r in state.rack_nodes)
    quotas = quotas_from_load(trace_jobs, state.total_gpus)
    teams = _Teams(quotas, policy.fair_share_half_life_s)
    book = MfuBook(policy.history_half_life_s)
    fit, rejected = admissible(trace_jobs, state.total_gpus)
    sims: list[SimJob] = []
    for t in fit:
        m, label = mfu[t.id]
        job = Job(len(sims), t.gpus, t.submit, t.estimate or t.duration, t.user, t.team, t.key, t.tier,
                  grace_s=policy.default_grace_s)
        sims.append(SimJob(job, t.duration, m, label, t.duration, trace_id=t.id))
    # victims exist only below the top tier: with one tier in the trace there is nothing to preempt
    preemptive = policy.preemption and len({s.job.tier for s in sims}) > 1
    # reclaim needs quotas, which a replay always has (``quotas_from_load``)
    reclaiming = policy.reclaim and policy.order == "priority"
    victims_possible = preemptive or reclaiming
    # On a full cluster without tiers to preempt a pass can only reclaim, and only for a job
    # whose team is under quota: passes run there on the arrival of such a job (and, as
    # always, when GPUs free up) - not on every arrival, which took a 59-node Philly replay
    # from 2 to 11 minutes.
    charge = np.ones(len(sims))   # a running job's waste charge per GPU
    whole = None
    if oracle:   # class medians of the whole trace, kept apart from what the policy learns
        whole = MfuBook(policy.history_half_life_s)
        for s in sims:
            whole.observe("", job_class(s.job.gpus), s.mfu, s.label, 0.0)
    order = Ordering(policy, book, per, whole)
    order.add([s.job for s in sims])   # row i is job i
    if oracle:
        for i, s in enumerate(sims):
            order.hear(i, s.mfu, s.label, 1.0, math.inf)
    if policy.order == "mfu":   # the calibration's order: every job's own MFU, known at submission
        order.know_mfu(np.arange(len(sims)), np.array([s.mfu for s in sims]))
    # keys change with time only through the priority terms, kinds only through learned labels
    rekeys = policy.order != "arrival" or policy.spread_small
    shares: dict[str, TeamShare] = {}
    queue = PendingQueue()
    running: dict[int, Running] = {}
    by_end: list[tuple[float, int, Placement]] = []
    done: list[tuple[float, int, int]] = []         # (time, kind 0=finish 1=kill, job index)
    learn: list[tuple[float, int, float]] = []      # (time, job index, start)
    ai, n = 0, len(sims)
    next_calc = 0.0

    def read_teams(now: float) -> None:
        nonlocal shares
        shares = {t: teams.share(t, now) for t in order.team_names}
        if order.use_waste:   # as order_queue: the running jobs' waste charge on top of the use
            order.set_teams({t: TeamShare(v.quota_gpus, v.used_gpus + teams.charged[t] - teams.gpus[t])
                             for t, v in shares.items()}, now)
        else:
            order.set_teams(shares, now)

    def recharge(now: float) -> None:
        """Every running job's waste charge afresh (each priority period, as the keys)."""
        if not order.use_waste:
            return
        rows = np.fromiter(running.keys(), np.int64, len(running))
        charge[rows] = order.charge(rows, now)
        per = np.bincount(order.team_i[rows], weights=order.gpus[rows] * charge[rows],
                          minlength=len(order.team_names))
        for t in teams.charged:   # (the incremental sums' rounding goes too)
            teams.charged[t] = 0.0
        for ti, t in enumerate(order.team_names):
            teams.charged[t] = float(per[ti])

    def enqueue(i: int, now: float) -> None:
        if order.use_fair and not now - order.fair_at < PRIORITY_CALC_PERIOD_S:
            read_teams(now)
        k, kind = order.keys(np.array([i]), now)
        queue.insert(float(k[0]), sims[i].job, int(kind[0]), tag=i)

    def start(s: SimJob, placement: Placement, now: float) -> None:
        job = s.job
        f = slowdown(s.label, job.gpus, list(placement.nodes), state.rack, per, rack_size)
        if job.gpus > per:   # whole nodes: the baselines' semantics replay these as recorded
            s.rack_cost_gpu_s += job.gpus * s.remaining * (f - 1.0)
            f = 1.0
        wall = s.remaining * f
        s.slow_gpu_s += job.gpus * (wall - s.remaining)
        if math.isnan(s.first_start):
            s.first_start = now
        est = now + min(job.estimate_s, s.remaining)
        running[job.id] = Running(job, placement, now, est, now)
        insort(by_end, (est, job.id, placement))
        heapq.heappush(done, (now + wall, 0, job.id))
        if not s.learned:
            heapq.heappush(learn, (now + LEARN_AFTER_S, job.id, now))
        if s.learned and order.use_waste and not oracle:   # its agent reports again
            order.hear(job.id, s.seen_mfu, s.label, 1.0, math.inf)
        charge[job.id] = order.charge(np.array([job.id]), now)[0]
        teams.change(job.team, job.gpus, now, job.gpus * float(charge[job.id]))
        teams.live[job.team] += job.gpus
        s.segments.append([now, now + wall, s.remaining])

    def stop(s: SimJob, now: float, finished: bool) -> None:
        r = running.pop(s.job.id)
        del by_end[bisect_left(by_end, (r.expected_end, s.job.id))]
        state.release(r.placement)
        teams.change(s.job.team, -s.job.gpus, now, -s.job.gpus * float(charge[s.job.id]))
        if not teams.gpus[s.job.team]:
            teams.charged[s.job.team] = 0.0
        if not r.terminating:
            teams.live[s.job.team] -= s.job.gpus
        if finished:
            s.end, s.remaining = now, 0.0
            return
        seg = s.segments[-1]
        frac = (now - seg[0]) / (seg[1] - seg[0]) if seg[1] > seg[0] else 1.0
        progress = seg[2] * frac
        kept = math.floor(progress / CHECKPOINT_INTERVAL_S) * CHECKPOINT_INTERVAL_S
        s.lost_gpu_s += s.job.gpus * (progress - kept)
        seg[1], seg[2] = now, kept
        s.remaining -= kept
        s.preemptions += 1
        if s.learned and not oracle:   # its last report: usable for Policy.max_signal_age_s
            order.hear(s.job.id, s.seen_mfu, s.label, 1.0, now)
        enqueue(s.job.id, now)

    def mfu_of(r: Running) -> float:
        s = sims[r.job.id]
        return s.mfu if s.learned else (book.class_median(job_class(r.job.gpus)) or 1.0)

    while ai < n or done:
        now = min(sims[ai].job.submit if ai < n else math.inf, done[0][0] if done else math.inf)
        while learn and learn[0][0] <= now:
            _, i, st = heapq.heappop(learn)
            r = running.get(i)
            if r is not None and r.start == st:
                s = sims[i]
                s.learned = True
                seg = s.segments[-1]
                f = (seg[1] - seg[0]) / max(seg[2], 1e-9)
                s.seen_mfu = s.mfu / max(f, 1.0)   # a spread job's MFU falls with its slowdown
                book.observe(s.job.key, job_class(s.job.gpus), s.seen_mfu, s.label, now)
                order.learned(s.job.key)
                if order.use_waste and not oracle:   # its agent's signal, while it runs
                    order.hear(i, s.seen_mfu, s.label, 1.0, math.inf)
                    c = order.charge(np.array([i]), now)[0]
                    teams.change(s.job.team, 0, now, s.job.gpus * float(c - charge[i]))
                    charge[i] = c
        while done and done[0][0] <= now:
            _, kind, i = heapq.heappop(done)
            if i not in running:
                continue
            s = sims[i]
            if kind == 1:
                stop(s, now, finished=False)
            elif abs(s.segments[-1][1] - now) < 1e-6:
                stop(s, now, finished=True)
        may_reclaim = False   # a full cluster changes for reclaim only by a job that could reclaim
        while ai < n and sims[ai].job.submit <= now:
            enqueue(ai, now)
            j = sims[ai].job
            may_reclaim |= reclaiming and teams.live[j.team] + j.gpus <= quotas[j.team]
            ai += 1
        if not len(queue) or (state.total_free == 0 and not preemptive and not may_reclaim):
            continue
        rekeyed = rekeys and now >= next_calc
        if rekeyed:
            order.refresh()
            recharge(now)
            if order.use_fair:
                read_teams(now)
            k, kinds = order.keys(queue.tag, now)
            queue.reorder(k, kinds, sort=not policy.uses_team_queues)   # the interleave sorts
            next_calc = now + PRIORITY_CALC_PERIOD_S
        if policy.uses_team_queues:   # team use changes with every start and end: before every pass
            use = np.array([teams.gpus[t] for t in order.team_names], float)
            charged = np.array([teams.charged[t] for t in order.team_names], float)
            queue.permute(order.team_order(queue, use, quotas, state.total_gpus, now, charged))
        if on_pass is not None:
            own = {j: order.signal_of(j, now) for j in [*queue.tag.tolist(), *running]}
            on_pass(SimPass(now, queue, list(running.values()), {i: g for i, g in own.items() if g},
                            book, shares, state.total_gpus, per, rekeyed or not rekeys))
        decisions = plan_pass(state, queue, by_end, now, policy,
                              (lambda: list(running.values())) if victims_possible else None, mfu_of,
                              quotas if reclaiming else None, teams.live)
        started = []
        for d in decisions:
            if d.kind == "start":
                start(sims[d.job_id], d.placement, now)
                started.append(d.numbers["position"])
            elif d.kind == "preempt":
                r = running[d.job_id]
                r.terminating = True
                teams.live[r.job.team] -= r.job.gpus
                del by_end[bisect_left(by_end, (r.expected_end, d.job_id))]
                r.expected_end = now + d.grace_s
                insort(by_end, (r.expected_end, d.job_id, r.placement))
                heapq.heappush(done, (now + d.grace_s, 1, d.job_id))
        queue.remove(started)
    return SimResult(policy.name, sims, rejected, state.total_gpus, quotas, time.perf_counter() - wall0)
