"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19) as a baseline, preemptive.

2 queues, one threshold (``THRESHOLD_GPU_S``), starvation promotion off (Pollux's configuration);
queue 0 by arrival, queue 1 by entry; a job that does not fit is skipped. Preemption loses no
progress but resuming costs ``RESTORE_S`` of the job's GPUs. docs/sim.md, "Traces and semantics".
"""

from __future__ import annotations

import heapq
import math
import time
from bisect import bisect_left, insort

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import Cluster, Job
from gpudiag.scheduler.placement import one_node, whole_nodes
from gpudiag.scheduler.sim.simulator import SimJob, SimResult, admissible, quotas_from_load
from gpudiag.scheduler.sim.traces import TraceJob

THRESHOLD_GPU_S = 3600.0
RESTORE_S = 30.0


class _Las:
    """One replay's state: the two queues, each job's attained service, the running segments."""

    def __init__(self, sims: list[SimJob], state: ClusterState) -> None:
        self.sims, self.state = sims, state
        self.by_id = {s.job.id: s for s in sims}
        self.q0: list[tuple[float, int]] = []     # (arrival, id)
        self.q1: list[tuple[float, int]] = []     # (entered queue 1, id)
        self.where: dict[int, tuple[int, tuple[float, int]]] = {}   # id -> (queue, its entry)
        self.attained: dict[int, float] = {}      # GPU-seconds before the current segment
        self.running: dict[int, tuple] = {}       # id -> (placement, segment start, overhead, version)
        self.events: list[tuple[float, int, int, int]] = []   # (time, kind 0 done / 1 demote, id, version)
        self.version: dict[int, int] = {}
        self.resumed: set[int] = set()

    def enqueue(self, which: int, entry: tuple[float, int]) -> None:
        self.where[entry[1]] = (which, entry)
        insort(self.q1 if which else self.q0, entry)

    def dequeue(self, jid: int) -> None:
        which, entry = self.where.pop(jid)
        q = self.q1 if which else self.q0
        del q[bisect_left(q, entry)]

    def launch(self, s: SimJob, placement, now: float) -> None:
        jid = s.job.id
        over = RESTORE_S if jid in self.resumed else 0.0
        v = self.version[jid] = self.version.get(jid, 0) + 1
        self.running[jid] = (placement, now, over, v)
        wall = over + s.remaining
        s.lost_gpu_s += s.job.gpus * over
        if math.isnan(s.first_start):
            s.first_start = now
        s.segments.append([now, now + wall, s.remaining])
        heapq.heappush(self.events, (now + wall, 0, jid, v))
        a = self.attained.get(jid, 0.0)
        if a < THRESHOLD_GPU_S:
            heapq.heappush(self.events, (now + (THRESHOLD_GPU_S - a) / s.job.gpus, 1, jid, v))

    def halt(self, s: SimJob, now: float, finished: bool) -> None:
        jid = s.job.id
        placement, st, over, _ = self.running.pop(jid)
        self.state.release(placement)
        self.attained[jid] = self.attained.get(jid, 0.0) + (now - st) * s.job.gpus
        if finished:
            s.end, s.remaining = now, 0.0
            return
        progress = max(0.0, now - st - over)
        s.remaining -= progress
        s.segments[-1][1:] = [now, progress]
        s.preemptions += 1
        self.resumed.add(jid)

    def due(self, now: float) -> None:
        """Completions, and running jobs crossing the threshold into queue 1."""
        while self.events and self.events[0][0] <= now:
            _, kind, jid, v = heapq.heappop(self.events)
            if jid not in self.running or self.running[jid][3] != v:
                continue
            self.dequeue(jid)
            if kind == 0:
                self.halt(self.by_id[jid], now, finished=True)
            else:
                self.enqueue(1, (now, jid))

    def select(self) -> list[int]:
        """Walking queue 0 then queue 1, every job whose GPUs fit in what the cluster has left."""
        budget = self.state.total_gpus
        chosen: list[int] = []
        for q in (self.q0, self.q1):
            for _, jid in q:
                g = self.by_id[jid].job.gpus
                if g <= budget:
                    chosen.append(jid)
                    budget -= g
                    if budget == 0:
                        return chosen
        return chosen

    def apply(self, chosen: list[int], now: float) -> None:
        """Preempt the running jobs not chosen; place the chosen ones not running, if they fit."""
        keep = set(chosen)
        for jid in [j for j in self.running if j not in keep]:
            self.halt(self.by_id[jid], now, finished=False)
        per = self.state.max_gpus
        for jid in chosen:
            if jid in self.running:
                continue
            s = self.by_id[jid]
            g = s.job.gpus
            plan = one_node(self.state, g) if g <= per else whole_nodes(self.state, g, fewest_racks=False)
            if plan is not None:
                self.launch(s, self.state.allocate(plan), now)

    def run(self) -> None:
        sims, ai, n = self.sims, 0, len(self.sims)
        while ai < n or self.events:
            now = min(sims[ai].job.submit if ai < n else math.inf,
                      self.events[0][0] if self.events else math.inf)
            self.due(now)
            while ai < n and sims[ai].job.submit <= now:
                self.enqueue(0, (sims[ai].job.submit, sims[ai].job.id))
                ai += 1
            self.apply(self.select(), now)


def simulate_tiresias(trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]],
                      cluster: Cluster) -> SimResult:
    """Replay submit-sorted ``trace_jobs`` under Tiresias' LAS; jobs that can never fit are rejected."""
    wall0 = time.perf_counter()
    state = ClusterState(cluster)
    fit, rejected = admissible(trace_jobs, state.total_gpus)
    sims: list[SimJob] = []
    for t in fit:
        m, label = mfu[t.id]
        sims.append(SimJob(Job(t.id, t.gpus, t.submit, t.duration, t.user, t.team, t.key, t.tier),
                           t.duration, m, label, t.duration, trace_id=t.id))
    _Las(sims, state).run()
    return SimResult("tiresias", sims, rejected, state.total_gpus,
                     quotas_from_load(trace_jobs, state.total_gpus), time.perf_counter() - wall0)
