"""Tiresias' discretised two-dimensional LAS (Gu et al., NSDI'19) as a baseline, preemptive.

Configuration: 2 queues, one threshold of ``THRESHOLD_GPU_S`` = 3,600 GPU-seconds of attained
service, starvation promotion off - the configuration of Tiresias' README example and of
Pollux's comparison (OSDI'21). (The Tiresias simulator's own defaults are 3,250 / 7,200 s.)

At every event (arrival, completion, a running job crossing the threshold) all active jobs are
ordered: queue 0 (attained < threshold) before queue 1; inside queue 0 by arrival, inside queue
1 by the time the job entered it. Walking that order, a job is selected while its GPUs fit in
what remains of the cluster (a job that does not fit is skipped, the walk goes on); running jobs
not selected are preempted, selected ones not running are placed (baseline placement: one node
best fit, or whole lowest-indexed nodes) and wait if fragmentation prevents it.

Preemption cost: Tiresias checkpoints a job when preempting it, so no progress is lost, but
resuming costs ``RESTORE_S`` of its GPUs' time (reload the checkpoint, rebuild the job);
reported as lost GPU-seconds. The value is ours, of the order of the restore times Tiresias
reports for its models.
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


def simulate_tiresias(trace_jobs: list[TraceJob], mfu: dict[int, tuple[float, str]],
                      cluster: Cluster) -> SimResult:
    wall0 = time.perf_counter()
    state = ClusterState(cluster)
    per = state.max_gpus
    fit, rejected = admissible(trace_jobs, state.total_gpus)
    sims: list[SimJob] = []
    for t in fit:
        m, label = mfu[t.id]
        sims.append(SimJob(Job(t.id, t.gpus, t.submit, t.duration, t.user, t.team, t.key, t.tier),
                           t.duration, m, label, t.duration, trace_id=t.id))
    by_id = {s.job.id: s for s in sims}
    q0: list[tuple[float, int]] = []     # (arrival, id)
    q1: list[tuple[float, int]] = []     # (entered queue 1, id)
    attained: dict[int, float] = {}      # GPU-seconds before the current segment
    running: dict[int, tuple] = {}       # id -> (placement, segment start, overhead, version)
    events: list[tuple[float, int, int, int]] = []   # (time, kind 0 done / 1 demote, id, version)
    version: dict[int, int] = {}
    resumed: set[int] = set()
    where: dict[int, tuple[int, tuple[float, int]]] = {}   # id -> (queue, its entry)
    ai, n = 0, len(sims)

    def launch(s: SimJob, placement, now: float) -> None:
        jid = s.job.id
        over = RESTORE_S if jid in resumed else 0.0
        v = version[jid] = version.get(jid, 0) + 1
        running[jid] = (placement, now, over, v)
        wall = over + s.remaining
        s.lost_gpu_s += s.job.gpus * over
        if math.isnan(s.first_start):
            s.first_start = now
        s.segments.append([now, now + wall, s.remaining])
        heapq.heappush(events, (now + wall, 0, jid, v))
        a = attained.get(jid, 0.0)
        if a < THRESHOLD_GPU_S:
            heapq.heappush(events, (now + (THRESHOLD_GPU_S - a) / s.job.gpus, 1, jid, v))

    def halt(s: SimJob, now: float, finished: bool) -> None:
        jid = s.job.id
        placement, st, over, _ = running.pop(jid)
        state.release(placement)
        attained[jid] = attained.get(jid, 0.0) + (now - st) * s.job.gpus
        if finished:
            s.end, s.remaining = now, 0.0
            return
        progress = max(0.0, now - st - over)
        s.remaining -= progress
        s.segments[-1][1:] = [now, progress]
        s.preemptions += 1
        resumed.add(jid)

    while ai < n or events:
        now = min(sims[ai].job.submit if ai < n else math.inf, events[0][0] if events else math.inf)
        while events and events[0][0] <= now:
            _, kind, jid, v = heapq.heappop(events)
            if jid not in running or running[jid][3] != v:
                continue
            if kind == 0:
                halt(by_id[jid], now, finished=True)
                _remove(q0, q1, where, jid)
            else:
                _remove(q0, q1, where, jid)
                where[jid] = (1, (now, jid))
                insort(q1, (now, jid))
        while ai < n and sims[ai].job.submit <= now:
            where[sims[ai].job.id] = (0, (sims[ai].job.submit, sims[ai].job.id))
            insort(q0, (sims[ai].job.submit, sims[ai].job.id))
            ai += 1
        budget = state.total_gpus
        chosen: list[int] = []
        for q in (q0, q1):
            for _, jid in q:
                g = by_id[jid].job.gpus
                if g <= budget:
                    chosen.append(jid)
                    budget -= g
                    if budget == 0:
                        break
            if budget == 0:
                break
        keep = set(chosen)
        for jid in [j for j in running if j not in keep]:
            halt(by_id[jid], now, finished=False)
        for jid in chosen:
            if jid in running:
                continue
            s = by_id[jid]
            g = s.job.gpus
            plan = one_node(state, g) if g <= per else whole_nodes(state, g, fewest_racks=False)
            if plan is not None:
                launch(s, state.allocate(plan), now)
    return SimResult("tiresias", sims, rejected, state.total_gpus,
                     quotas_from_load(trace_jobs, state.total_gpus), time.perf_counter() - wall0)


def _remove(q0: list, q1: list, where: dict, jid: int) -> None:
    which, entry = where.pop(jid)
    q = q1 if which else q0
    del q[bisect_left(q, entry)]
