"""Trace replay: the policy core driven by simulated time (FIFO, EASY and gpudiag; Tiresias: tiresias.py).

Event semantics (those of published simulators, so numbers compare): at one instant all
completions are handled before all arrivals, then one scheduling pass. Durations are the
trace's, except that a job of at most one node's GPUs that gpudiag spreads over several nodes
runs longer by the ``slowdown`` model - the one placement the baselines never make. A job
of more GPUs than a node replays its recorded duration under every policy (as the baselines'
semantics require); what spanning more racks than needed would cost it under the model is
recorded for every policy in ``rack_cost_gpu_s`` and printed by the benchmark, not applied.

The policy sees a job's MFU and label only once it has run ``LEARN_AFTER_S`` (the agent's
first estimate needs a traced step; ten minutes is a conservative stand-in), or through
earlier jobs of its key (``Policy.order == "mfu"``, the calibration prototype's oracle, orders
by each job's own MFU known at submission instead). Priorities
are recomputed every ``PRIORITY_CALC_PERIOD_S`` (Slurm's PriorityCalcPeriod default) and for each
arrival.

Preemption (tiers from an sacct export; Philly and Tiresias traces have one tier): a victim gets
SIGTERM and its grace period, then its GPUs are free; work since its last periodic checkpoint
(every ``CHECKPOINT_INTERVAL_S`` of run time) is lost and it is requeued with the rest.
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left, insort
from dataclasses import dataclass, field

import numpy as np

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import (
    COMM_LABEL,
    Cluster,
    Job,
    KeyHistory,
    Placement,
    Policy,
    Running,
    TeamShare,
)
from gpudiag.scheduler.pending import ONE_NODE, SPREAD, WHOLE, PendingQueue
from gpudiag.scheduler.policy import kind_for, plan_pass
from gpudiag.scheduler.priority import (
    MfuBook,
    efficiency_factor,
    fair_share_delay,
    job_class,
)
from gpudiag.scheduler.sim.slowdown import slowdown
from gpudiag.scheduler.sim.traces import TraceJob
from gpudiag.scheduler.team_queues import interleave, team_quotas

LEARN_AFTER_S = 600.0
PRIORITY_CALC_PERIOD_S = 300.0
CHECKPOINT_INTERVAL_S = 1800.0
ORACLE_SPAN_S = 1e11   # MFU-first order: 1e-4 of MFU outweighs any submit-time difference (< 1e7 s)


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


def quotas_from_load(jobs: list[TraceJob], total_gpus: int) -> dict[str, float]:
    """Each team's quota: its share of the offered load (sum of GPUs x duration) times the cluster."""
    load: dict[str, float] = {}
    for j in jobs:
        load[j.team] = load.get(j.team, 0.0) + j.gpus * j.duration
    tot = sum(load.values()) or 1.0
    return {t: total_gpus * v / tot for t, v in load.items()}


class _Teams:
    """Decayed average GPUs each team used (exponential, half-life from the policy)."""

    def __init__(self, quotas: dict[str, float], half_life_s: float) -> None:
        self.quota = quotas
        self.lam = math.log(2.0) / half_life_s
        self.avg = dict.fromkeys(quotas, 0.0)
        self.gpus = dict.fromkeys(quotas, 0)
        self.at = dict.fromkeys(quotas, 0.0)

    def _roll(self, team: str, now: float) -> None:
        a = math.exp(-self.lam * max(0.0, now - self.at[team]))
        self.avg[team] = self.avg[team] * a + self.gpus[team] * (1.0 - a)
        self.at[team] = now

    def change(self, team: str, delta: int, now: float) -> None:
        self._roll(team, now)
        self.gpus[team] += delta

    def share(self, team: str, now: float) -> TeamShare:
        self._roll(team, now)
        return TeamShare(self.quota.get(team, 0.0), self.avg[team])


class _Priorities:
    """gpudiag's order terms as arrays, so re-sorting thousands of pending jobs is a lexsort.

    Per key: the efficiency delay and whether it is known communication-bound, valid until the
    key's decayed history weight drops below ``Policy.min_history_weight``; per job: the same
    from its own MFU once it has run (a requeued job). Key delays are recomputed when the
    class medians they compare with have moved.
    """

    def __init__(self, sims: list[SimJob], policy: Policy, book: MfuBook, teams: _Teams) -> None:
        self.policy, self.book, self.teams = policy, book, teams
        self.key_index: dict[str, int] = {}
        self.key_gpus: list[int] = []   # a key's size class is that of its first job
        for s in sims:
            if s.job.key not in self.key_index:
                self.key_index[s.job.key] = len(self.key_index)
                self.key_gpus.append(s.job.gpus)
        k = len(self.key_index)
        self.team_names = sorted(teams.quota)
        team_i = {t: i for i, t in enumerate(self.team_names)}
        self.sub = np.array([s.job.submit for s in sims])
        self.mfu = np.array([s.mfu for s in sims])
        self.key_i = np.array([self.key_index[s.job.key] for s in sims], dtype=np.int64)
        self.team_i = np.array([team_i[s.job.team] for s in sims], dtype=np.int64)
        self.gpus = np.array([s.job.gpus for s in sims], dtype=np.int64)
        self.learned = np.zeros(len(sims), bool)
        self.own_delay = np.zeros(len(sims))
        self.own_comm = np.zeros(len(sims), bool)
        self.key_delay = np.zeros(k)
        self.key_comm = np.zeros(k, bool)
        self.key_until = np.full(k, -np.inf)
        self.medians: dict[str, float | None] = {}
        self.dirty = False
        self._fair_at, self._fair = math.nan, np.zeros(0)

    def _delay(self, job: Job, mfu: float, label: str) -> float:
        f, _ = efficiency_factor(job, None, KeyHistory(mfu, label, 1.0, 0.0), self.policy,
                                 self.book.class_median(job_class(job.gpus)))
        return (1.0 - f) * self.policy.max_efficiency_delay_s

    def observe(self, i: int, s: SimJob, mfu: float, now: float) -> None:
        """Job ``i`` has run long enough: its MFU is known, and its key learns from it."""
        p, job = self.policy, s.job
        self.book.observe(job.key, job_class(job.gpus), mfu, s.label, now)
        self.learned[i], self.own_comm[i] = True, s.label == COMM_LABEL
        self.own_delay[i] = self._delay(job, mfu, s.label)
        ki = self.key_index[job.key]
        h = self.book.keys[job.key]
        self.key_delay[ki] = self._delay(job, h.mfu, h.label)
        self.key_comm[ki] = h.label == COMM_LABEL
        self.key_until[ki] = now + p.history_half_life_s * math.log2(h.weight / p.min_history_weight)
        cls = job_class(job.gpus)
        if self.book.class_median(cls) != self.medians.get(cls):
            self.dirty = True

    def _refresh(self) -> None:
        for cls in ("1 GPU", "2-8 GPUs", ">8 GPUs"):
            self.medians[cls] = self.book.class_median(cls)
        for key, h in self.book.keys.items():
            ki = self.key_index[key]
            self.key_delay[ki] = self._delay(Job(0, self.key_gpus[ki], 0.0, 0.0), h.mfu, h.label)
        self.dirty = False

    def keys(self, idx: np.ndarray, now: float, per_node: int) -> tuple[np.ndarray, np.ndarray]:
        """Sort keys and placement kinds for jobs ``idx`` (indices into the simulation's jobs)."""
        p = self.policy
        valid = self.key_until[self.key_i[idx]] >= now
        eff = np.zeros(len(idx))
        if p.efficiency:
            eff = np.where(self.learned[idx], self.own_delay[idx],
                           np.where(valid, self.key_delay[self.key_i[idx]], 0.0))
        fair = 0.0
        if p.fair_share:
            # team delays drift slowly: recomputed once per priority period, as Slurm does
            if not now - self._fair_at < PRIORITY_CALC_PERIOD_S:
                self._fair = np.array([fair_share_delay(self.teams.share(t, now), p)[0]
                                       for t in self.team_names])
                self._fair_at = now
            fair = self._fair[self.team_i[idx]]
        if p.order == "mfu":   # the oracle: every job's own MFU, known at submission
            eff = (1.0 - self.mfu[idx]) * ORACLE_SPAN_S
        keys = self.sub[idx] + eff + fair
        comm = np.where(self.learned[idx], self.own_comm[idx], valid & self.key_comm[self.key_i[idx]])
        known = self.learned[idx] | valid
        spread = p.spread_small & np.where(known, ~(comm & p.label_aware_placement), p.spread_unknown)
        kinds = np.where(self.gpus[idx] > per_node, WHOLE, np.where(spread, SPREAD, ONE_NODE))
        return keys, kinds


def simulate(trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]], cluster: Cluster,
             policy: Policy, oracle: bool = False) -> SimResult:
    """Replay submit-sorted ``trace_jobs`` under ``policy``; jobs that can never fit are rejected.

    ``oracle``: the policy knows every job's MFU and label at submission (against class medians
    of the whole trace) instead of learning them - what learning costs, for the benchmark.
    """
    wall0 = time.perf_counter()
    state = ClusterState(cluster)
    per, rack_size = state.max_gpus, max(len(r) for r in state.rack_nodes)
    quotas = quotas_from_load(trace_jobs, state.total_gpus)
    teams = _Teams(quotas, policy.fair_share_half_life_s)
    book = MfuBook(policy.history_half_life_s)
    sims: list[SimJob] = []
    rejected = 0
    for t in trace_jobs:
        if t.gpus > state.total_gpus or (t.gpus > per and -(-t.gpus // per) > len(cluster.nodes)):
            rejected += 1
            continue
        m, label = mfu[t.id]
        job = Job(len(sims), t.gpus, t.submit, t.estimate or t.duration, t.user, t.team, t.key, t.tier)
        sims.append(SimJob(job, t.duration, m, label, t.duration, trace_id=t.id))
    prio = policy.order in ("priority", "mfu")
    # victims exist only below the top tier: with one tier in the trace there is nothing to preempt
    preemptive = policy.preemption and len({s.job.tier for s in sims}) > 1
    pr = _Priorities(sims, policy, book, teams)
    if oracle:   # class medians of the whole trace, kept apart from what the policy learns
        whole = MfuBook(policy.history_half_life_s)
        for s in sims:
            whole.observe("", job_class(s.job.gpus), s.mfu, s.label, 0.0)
        for i, s in enumerate(sims):
            f, _ = efficiency_factor(s.job, None, KeyHistory(s.mfu, s.label, 1.0, 0.0), policy,
                                     whole.class_median(job_class(s.job.gpus)))
            pr.learned[i], pr.own_comm[i] = True, s.label == COMM_LABEL
            pr.own_delay[i] = (1.0 - f) * policy.max_efficiency_delay_s
    fair_teams = policy.uses_team_queues
    q_all = team_quotas(pr.team_names, quotas, state.total_gpus)
    team_quota = np.array([q_all[t] for t in pr.team_names])
    queue = PendingQueue()
    running: dict[int, Running] = {}
    by_end: list[tuple[float, int, Placement]] = []
    done: list[tuple[float, int, int]] = []         # (time, kind 0=finish 1=kill, job index)
    learn: list[tuple[float, int, float]] = []      # (time, job index, start)
    ai, n = 0, len(sims)
    next_calc = 0.0

    def enqueue(i: int, now: float) -> None:
        job = sims[i].job
        if prio:
            k, kind = pr.keys(np.array([i]), now, per)
            queue.insert(float(k[0]), job, int(kind[0]), tag=i)
        else:
            queue.insert(job.submit, job, kind_for(job, per, policy, "unknown"), tag=i)

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
        teams.change(job.team, job.gpus, now)
        s.segments.append([now, now + wall, s.remaining])

    def stop(s: SimJob, now: float, finished: bool) -> None:
        r = running.pop(s.job.id)
        del by_end[bisect_left(by_end, (r.expected_end, s.job.id))]
        state.release(r.placement)
        teams.change(s.job.team, -s.job.gpus, now)
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
                pr.observe(i, s, s.mfu / max(f, 1.0), now)
        while done and done[0][0] <= now:
            _, kind, i = heapq.heappop(done)
            if i not in running:
                continue
            s = sims[i]
            if kind == 1:
                stop(s, now, finished=False)
            elif abs(s.segments[-1][1] - now) < 1e-6:
                stop(s, now, finished=True)
        while ai < n and sims[ai].job.submit <= now:
            enqueue(ai, now)
            ai += 1
        if not len(queue) or (state.total_free == 0 and not preemptive):
            continue
        if prio and now >= next_calc:
            pr._fair_at = -math.inf
            if pr.dirty:
                pr._refresh()
            k, kinds = pr.keys(queue.tag, now, per)
            queue.reorder(k, kinds)
            next_calc = now + PRIORITY_CALC_PERIOD_S
        if fair_teams:   # team use changes with every start and end: interleave before every pass
            use = np.array([teams.gpus[t] for t in pr.team_names], float)
            tags = queue.tag
            queue.permute(interleave(queue.neg_tier, pr.team_i[tags], queue.key, tags, queue.gpus,
                                     pr.sub[tags], use, team_quota, now, policy.team_overdue_s))
        decisions = plan_pass(state, queue, by_end, now, policy,
                              (lambda: list(running.values())) if preemptive else None, mfu_of)
        started = []
        for d in decisions:
            if d.kind == "start":
                start(sims[d.job_id], d.placement, now)
                started.append(d.numbers["position"])
            elif d.kind == "preempt":
                r = running[d.job_id]
                r.terminating = True
                del by_end[bisect_left(by_end, (r.expected_end, d.job_id))]
                r.expected_end = now + d.grace_s
                insort(by_end, (r.expected_end, d.job_id, r.placement))
                heapq.heappush(done, (now + d.grace_s, 1, d.job_id))
        queue.remove(started)
    return SimResult(policy.name, sims, rejected, state.total_gpus, quotas, time.perf_counter() - wall0)
