"""Trace replay: the policy core's one decision function driven by simulated time (Tiresias: tiresias.py).

Every pass is ``policy.decide``, the function the local daemon and the Slurm controller call
through ``policy.plan``, on the inputs a runtime holds (tests/unit/test_scheduler_same_decisions.py
compares them). What the replay models between passes (event order, agents' first reports after
``LEARN_AFTER_S``, checkpoints every ``CHECKPOINT_INTERVAL_S``, which instants get a pass, quotas
from load): docs/scheduler-modelling.md, "Between passes".
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import Cluster, Decision, Job, Placement, Policy, Running, Signal
from gpudiag.scheduler.ordering import Ordering, RunningCols
from gpudiag.scheduler.pending import SPREAD, WHOLE, PendingQueue
from gpudiag.scheduler.placement import Rule, promise
from gpudiag.scheduler.policy import decide
from gpudiag.scheduler.priority import MfuBook, job_class
from gpudiag.scheduler.sim.slowdown import slowdown
from gpudiag.scheduler.sim.traces import TraceJob
from gpudiag.scheduler.team_queues import aging_violations

LEARN_AFTER_S = 600.0
CHECKPOINT_INTERVAL_S = 1800.0
# Rows not yet arrived whose terms a replay computes in one batch (``Ordering.current`` keeps them
# until an input changes, as for a pending row: the same values as at their arrival, without a
# numpy evaluation of one new row on nearly every pass).
PREFETCH_ROWS = 256


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
    aging_violations: int = 0   # passes' queue orders that broke the aging bound (``aging_violations``)


@dataclass(frozen=True)
class SimPass:
    """One pass of a replay, for a watcher (``simulate(on_pass=...)``): the inputs as a runtime
    would hold them just before it, and what it decided. ``order``: the queue as the pass
    walked it; ``signals``: each pending or running job's own latest signal (age at ``now``);
    ``book``: the key history (the replay's own: read it before the replay goes on)."""

    now: float
    order: list[Job]
    kinds: list[int]
    running: list[Running]
    by_end: list[tuple[float, int, Placement]]
    signals: dict[int, Signal]
    book: MfuBook
    quotas: dict[str, float]
    decisions: list[Decision]


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


class Replay:
    """One replay's state: the cluster, the jobs' lives, the policy's ``Ordering``, the events."""

    def __init__(self, trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]], cluster: Cluster,
                 policy: Policy, oracle: bool, on_pass: Callable[[SimPass], None] | None) -> None:
        self.policy, self.oracle, self.on_pass = policy, oracle, on_pass
        self.state = ClusterState(cluster)
        self.per, self.rack_size = self.state.max_gpus, max(len(r) for r in self.state.rack_nodes)
        self.quotas = quotas_from_load(trace_jobs, self.state.total_gpus)
        self.book = MfuBook(policy.history_half_life_s)
        fit, self.rejected = admissible(trace_jobs, self.state.total_gpus)
        self.sims: list[SimJob] = []
        for t in fit:
            m, label = mfu[t.id]
            job = Job(len(self.sims), t.gpus, t.submit, t.estimate or t.duration, t.user, t.team, t.key,
                      t.tier, grace_s=policy.default_grace_s)
            self.sims.append(SimJob(job, t.duration, m, label, t.duration, trace_id=t.id))
        medians = None
        if oracle:   # class medians of the whole trace, kept apart from what the policy learns
            medians = MfuBook(policy.history_half_life_s)
            for s in self.sims:
                medians.observe("", job_class(s.job.gpus), s.mfu, s.label, 0.0)
        tiers = {s.job.tier for s in self.sims}
        self.preemptive = policy.preemption and len(tiers) > 1
        # one tier: no job is ever of a lower tier than the head, so tier preemption can choose no
        # victim; the pass skips looking (the same decisions, without a scan of the running jobs)
        decides = policy if self.preemptive else replace(policy, preemption=False)
        self.o = Ordering(decides, self.book, self.per, medians)
        self.o.add([s.job for s in self.sims])   # row i is job i
        if oracle:
            for i, s in enumerate(self.sims):
                self.o.hear(i, s.mfu, s.label, 1.0, math.inf)
        if policy.order == "mfu":   # the calibration's order: every job's own MFU, known at submission
            self.o.know_mfu(np.arange(len(self.sims)), np.array([s.mfu for s in self.sims]))
        # arrival order without spreading: keys and kinds never change, so the queue is kept
        # sorted as jobs come and go instead of ordered before every pass
        self.static = policy.order == "arrival" and not policy.spread_small
        if self.static:
            self.static_keys, self.static_kinds, _ = self.o.keys(np.arange(len(self.sims)), 0.0)
        self.queue = PendingQueue()
        self.pending = np.zeros(0, dtype=np.int64)   # pending rows, ascending (dynamic orders)
        self.arrived: list[int] = []                   # rows come since ``pending`` was last merged
        self.running: dict[int, Running] = {}
        self._run_rows: np.ndarray | None = None   # ``running``'s rows in its order, until it changes
        self.by_end: list[tuple[float, int, Placement]] = []
        self.done: list[tuple[float, int, int]] = []      # (time, 0 finish / 1 kill, job)
        self.learn: list[tuple[float, int, float]] = []   # (time, job, its start)
        self.reclaiming = policy.reclaim and policy.order == "priority"
        self.quota_of = np.array([self.quotas.get(t, 0.0) for t in self.o.team_names])
        self.live = np.zeros(len(self.o.team_names))    # GPUs held by jobs not in their grace period
        self.aging_violations = 0
        n = len(self.sims)   # the running jobs' columns, by row (``ordering.RunningCols``)
        self.r_end, self.r_start, self.r_stop = np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool)

    # --- events --------------------------------------------------------------------------------------
    def arrive(self, i: int) -> None:
        if self.static:
            self.queue.insert(float(self.static_keys[i]), self.sims[i].job, int(self.static_kinds[i]), tag=i)
        else:
            self.arrived.append(i)

    def pending_rows(self) -> np.ndarray:
        """The pending rows, ascending, with those arrived since the last call merged in (each
        row is pending once: inserted at its place, not the whole array sorted again)."""
        if self.arrived:
            new = np.array(sorted(self.arrived), dtype=np.int64)
            self.pending = np.insert(self.pending, np.searchsorted(self.pending, new), new)
            self.arrived.clear()
        return self.pending

    def run_rows(self) -> np.ndarray:
        """The running jobs' rows, in ``running``'s order (kept until a job starts or stops)."""
        if self._run_rows is None:
            self._run_rows = np.fromiter(self.running, np.int64, len(self.running))
        return self._run_rows

    def reported(self, now: float) -> None:
        """Agents' first reports of the runs that have run ``LEARN_AFTER_S``."""
        while self.learn and self.learn[0][0] <= now:
            _, i, st = heapq.heappop(self.learn)
            r = self.running.get(i)
            if r is None or r.start != st:
                continue
            s = self.sims[i]
            s.learned = True
            seg = s.segments[-1]
            s.seen_mfu = s.mfu / max((seg[1] - seg[0]) / max(seg[2], 1e-9), 1.0)   # slowed: lower MFU
            self.book.observe(s.job.key, job_class(s.job.gpus), s.seen_mfu, s.label, now)
            self.o.learned(s.job.key)
            if not self.oracle:   # its agent's signal, while it runs
                self.o.hear(i, s.seen_mfu, s.label, 1.0, math.inf)

    def ended(self, now: float) -> None:
        """Runs that finished, and victims whose grace period is over."""
        while self.done and self.done[0][0] <= now:
            _, kind, i = heapq.heappop(self.done)
            if i not in self.running:
                continue
            s = self.sims[i]
            if kind == 1:
                self.stop(s, now, finished=False)
            elif abs(s.segments[-1][1] - now) < 1e-6:
                self.stop(s, now, finished=True)

    def start(self, s: SimJob, placement: Placement, now: float) -> None:
        job = s.job
        f = slowdown(s.label, job.gpus, list(placement.nodes), self.state.rack, self.per, self.rack_size)
        if job.gpus > self.per:   # whole nodes: the baselines' semantics replay these as recorded
            s.rack_cost_gpu_s += job.gpus * s.remaining * (f - 1.0)
            f = 1.0
        wall = s.remaining * f
        s.slow_gpu_s += job.gpus * (wall - s.remaining)
        if math.isnan(s.first_start):
            s.first_start = now
        end = now + job.estimate_s   # what backfill plans with: a limit holds for each run
        self.running[job.id] = Running(job, placement, now, end, now)
        self._run_rows = None
        self.r_end[job.id], self.r_start[job.id], self.r_stop[job.id] = end, now, False
        insort(self.by_end, (end, job.id, placement))
        heapq.heappush(self.done, (now + wall, 0, job.id))
        if not s.learned:
            heapq.heappush(self.learn, (now + LEARN_AFTER_S, job.id, now))
        elif not self.oracle:   # its agent reports again
            self.o.hear(job.id, s.seen_mfu, s.label, 1.0, math.inf)
        self.live[self.o.team_i[job.id]] += job.gpus
        s.segments.append([now, now + wall, s.remaining])

    def preempt(self, d: Decision, now: float) -> None:
        r = self.running[d.job_id]
        r.terminating = True
        self.live[self.o.team_i[d.job_id]] -= r.job.gpus
        del self.by_end[bisect_left(self.by_end, (r.expected_end, d.job_id))]
        r.expected_end = now + d.grace_s
        self.r_end[d.job_id], self.r_stop[d.job_id] = r.expected_end, True
        insort(self.by_end, (r.expected_end, d.job_id, r.placement))
        heapq.heappush(self.done, (now + d.grace_s, 1, d.job_id))

    def stop(self, s: SimJob, now: float, finished: bool) -> None:
        r = self.running.pop(s.job.id)
        self._run_rows = None
        del self.by_end[bisect_left(self.by_end, (r.expected_end, s.job.id))]
        self.state.release(r.placement)
        if not r.terminating:
            self.live[self.o.team_i[s.job.id]] -= s.job.gpus
        if finished:
            s.end, s.remaining = now, 0.0
            return
        seg = s.segments[-1]
        progress = seg[2] * ((now - seg[0]) / (seg[1] - seg[0]) if seg[1] > seg[0] else 1.0)
        kept = math.floor(progress / CHECKPOINT_INTERVAL_S) * CHECKPOINT_INTERVAL_S
        s.lost_gpu_s += s.job.gpus * (progress - kept)
        seg[1], seg[2] = now, kept
        s.remaining -= kept
        s.preemptions += 1
        if s.learned and not self.oracle:   # its last report: usable for Policy.max_signal_age_s
            self.o.hear(s.job.id, s.seen_mfu, s.label, 1.0, now)
        self.arrive(s.job.id)

    # --- the pass ------------------------------------------------------------------------------------
    def _worth_a_pass(self, rows: np.ndarray, run: np.ndarray, now: float) -> bool:
        """Whether a pass could start or preempt anything: a pending job that fits now, a tier to
        preempt, or a quota reclaim. Necessary for any such decision, so a pass skipped decides
        nothing a pass run would have."""
        if not len(rows):
            return False
        gpus = self.o.gpus[rows]
        if self._one_fits(rows, gpus, now) or self.preemptive:
            return True
        return self._may_reclaim(rows, gpus, run, now)

    def _one_fits(self, rows: np.ndarray, gpus: np.ndarray, now: float) -> bool:
        """A pending job that could be placed now by its kind (``policy._limits``, what a pass's
        backfill asks first): no larger than the most free GPUs of a node, of a rack for a job
        that may spread, whole nodes for a job larger than a node."""
        st, least = self.state, int(gpus.min())
        if not st.total_free or least > st.total_free:
            return False
        if least <= min(st.max_free_on_a_node(), self.per):
            return True
        if self.policy.spread_small and least <= max(st.rack_free):   # a job that may spread?
            self.o.current(rows, now)   # (the terms the pass reads: asking first changes nothing)
            spread = gpus[self.o.c_kind[rows] == SPREAD]
            if len(spread) and int(spread.min()) <= max(st.rack_free):
                return True
        whole = gpus[gpus > self.per]   # (in whole nodes)
        return bool(len(whole) and -(-int(whole.min()) // self.per) <= len(st.whole))

    def _may_reclaim(self, rows: np.ndarray, gpus: np.ndarray, run: np.ndarray, now: float) -> bool:
        """Quota reclaim (``preempt.reclaim_victims``) could act: the head - with per-team queues
        the job the order puts first (``Ordering.head``), else any pending job - stays within its
        team's quota, counted as held and as charged; a running job of another team may be its
        victim (not stopping, past the minimum runtime, its team at or over quota without it, of
        its tier or lower); and the jobs in their grace period are not enough to place it."""
        if not self.reclaiming or not (self.live > self.quota_of + 1e-9).any():
            return False
        o, quota, live = self.o, self.quota_of, self.live
        t = o.team_i[rows]   # the head's team within its quota as held (cheap, and necessary)
        room = (quota[t] > 0) & (live[t] + gpus <= quota[t] + 1e-9)
        if not room.any():
            return False
        head_t, t = t, o.team_i[run]
        victim = (~self.r_stop[run] & (now - self.r_start[run] >= self.policy.min_runtime_s)
                  & (quota[t] > 0) & (o.gpus[run] <= live[t] - quota[t] + 1e-9))
        if not victim.any():
            return False
        # the head's team's use as the order counts it (the waste charge: ``reclaim_victims``'
        # head_use), from the terms the pass will read (``Ordering.current`` keeps them: asking
        # here first changes nothing the pass computes)
        o.current(run, now)
        cols = RunningCols(run, self.r_end[run], self.r_stop[run])
        charged = o.team_use(cols, o.c_charge[run])[1]
        head = room & (np.maximum(live[head_t], charged[head_t]) + gpus <= quota[head_t] + 1e-9)
        if not head.any():
            return False
        if not self.policy.uses_team_queues:
            return bool(o.tier[run[victim]].min() <= o.tier[rows[head]].max())
        # only the job the order puts first may reclaim (nothing else starts in this pass): its
        # team must have room, and a victim of another team, of its tier or lower, be there
        h = o.head(rows, now, cols, self.quotas, self.state.total_gpus)
        victim &= t != o.team_i[h]
        if not (head[np.searchsorted(rows, h)] and victim.any()) or o.tier[run[victim]].min() > o.tier[h]:
            return False
        # nor does it reclaim while the jobs in their grace period will free its place (``_head``'s
        # promise, on the same stopping jobs in the same order)
        stopping = [(r.expected_end, r.job.id, r.placement) for r in self.running.values() if r.terminating]
        kind = int(o.c_kind[h])
        rule = Rule(int(o.gpus[h]), kind == WHOLE, o.policy.label_aware_placement, kind == SPREAD)
        return not stopping or promise(self.state, rule, stopping, now) is None

    def run_pass(self, now: float, rows: np.ndarray) -> None:
        running = list(self.running.values())
        seen = self._inputs(now, running) if self.on_pass is not None else None
        run = self.run_rows()
        p = decide(self.o, self.state, self.queue if self.static else rows, running, self.by_end, now,
                   self.quotas, cols=RunningCols(run, self.r_end[run], self.r_stop[run]))
        started = []
        for d in p.decisions:
            if d.kind == "start":
                self.start(self.sims[d.job_id], d.placement, now)
                started.append(d.job_id)
            elif d.kind == "preempt":
                self.preempt(d, now)
        if seen is not None:
            self.on_pass(SimPass(now, list(p.queue.jobs), [int(k) for k in p.queue.kind], *seen, p.decisions))
        if self.static:
            self.queue.remove([int(d.numbers["position"]) for d in p.decisions if d.kind == "start"])
            return
        q, pol = p.queue, self.policy   # the aging bound, checked on the order this pass walked
        cap = pol.max_efficiency_delay_s if pol.efficiency and pol.order == "priority" else 0.0
        bound = max(cap, q.overdue_s if pol.uses_team_queues else 0.0)
        # (none is broken while the oldest pending job waited no longer: rows are in submit order)
        if pol.order != "mfu" and now - self.o.sub[rows[0]] > bound:
            self.aging_violations += aging_violations(self.o.sub[q.tag], q.neg_tier, bound)
        if started:
            keep = np.ones(len(self.pending), dtype=bool)
            keep[np.searchsorted(self.pending, started)] = False
            self.pending = self.pending[keep]

    def _inputs(self, now: float, running: list[Running]) -> tuple:
        """What a runtime would hold before the pass: copies of the running jobs, their ends,
        and every job's own latest signal with its age (``SimPass``)."""
        ids = [*self.pending.tolist(), *self.queue.tag.tolist(), *self.running]
        sig = {i: Signal(float(self.o.own_mfu[i]), self.o.label_names[int(self.o.own_label[i])],
                         float(self.o.own_conf[i]), max(0.0, now - self.o.own_at[i]))
               for i in ids if i in self.o.own_at}
        return [replace(r) for r in running], list(self.by_end), sig, self.book, self.quotas

    def run(self) -> None:
        ai, n, ahead = 0, len(self.sims), 0
        while ai < n or self.done:
            now = min(self.sims[ai].job.submit if ai < n else math.inf,
                      self.done[0][0] if self.done else math.inf)
            self.reported(now)
            self.ended(now)
            while ai < n and self.sims[ai].job.submit <= now:
                self.arrive(ai)
                ai += 1
            if ai > ahead and not self.static:   # the next arrivals' terms in one batch (PREFETCH_ROWS)
                lo, ahead = ahead, min(n, ai + PREFETCH_ROWS)
                self.o.current(np.arange(lo, ahead), now)
            rows = self.queue.tag if self.static else self.pending_rows()
            if self._worth_a_pass(rows, self.run_rows(), now):
                self.run_pass(now, rows)


def simulate(trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]], cluster: Cluster,
             policy: Policy, oracle: bool = False, on_pass: Callable[[SimPass], None] | None = None
             ) -> SimResult:
    """Replay submit-sorted ``trace_jobs`` under ``policy``; jobs that can never fit are rejected.

    ``oracle``: the policy knows every job's MFU and label at submission (a signal heard at
    every instant, against class medians of the whole trace) instead of learning them - what
    learning costs, for the benchmark. ``on_pass`` sees every pass (tests, tracing).
    """
    wall0 = time.perf_counter()
    r = Replay(trace_jobs, mfu, cluster, policy, oracle, on_pass)
    r.run()
    wall = time.perf_counter() - wall0
    return SimResult(policy.name, r.sims, r.rejected, r.state.total_gpus, r.quotas, wall, r.aging_violations)
