"""The numbers a replay is judged by (``gpudiag sim --json`` prints exactly these keys).

Definitions (t = 0 at the first submission):
- JCT = completion - submit; queueing delay = JCT - time spent running (a preempted job's
  waits in the queue count too). ``makespan_s`` = last completion.
- ``gpu_utilisation`` = sum(gpus x trace duration) / (cluster GPUs x makespan).
- W = gpus x duration x MFU, a job's useful work; ``useful_work_weighted_jct_s`` = sum(W JCT) /
  sum(W), ``useful_work_weighted_wait_s`` likewise with the queueing delay.
- ``high_mfu_avg_jct_s``: mean JCT of the jobs at or above the median MFU;
  ``max_wait_low_mfu_s``: the longest queueing delay of a job below it.
- Contended = at least one job waiting. ``contended_cluster_mfu``: time-average, over contended
  time, of sum(gpus x MFU x progress rate) of running jobs over all GPUs (a job slowed by a
  spread placement counts at its lower rate).
- ``useful_work_by_time``: share of sum(W) done by t = k/10 x makespan, k = 1..10.
- ``team_share``: per team, its quota (``quotas_from_load``), the GPUs it used on average, and
  ``contended_quota_share``: over contended time in which the team's demand (running + waiting
  GPUs) exceeded its quota, the GPU-time it got (capped at its quota) / its quota's GPU-time -
  the measure behind "a team above quota gets >= 90% of its quota"; null if that never happened.
- ``worst_rho``, ``share_rho_above_1``: finish-time fairness (Themis, Sia), defined and computed
  in ``fairness.py``.
- ``aging_violations``: passes' orders in which a job stood behind a job of its tier submitted
  more than the aging bound after it (``ordering.aging_violations``): 0 in every replay.
"""

from __future__ import annotations

import numpy as np

from gpudiag.scheduler.sim.fairness import fairness_summary, finish_time_fairness
from gpudiag.scheduler.sim.simulator import SimResult

KEYS = ("jobs", "rejected", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_delay_s", "p99_queue_delay_s",
        "max_queue_delay_s", "makespan_s", "gpu_utilisation", "useful_work_weighted_jct_s",
        "useful_work_weighted_wait_s", "high_mfu_avg_jct_s", "contended_cluster_mfu", "useful_work_by_time",
        "preemptions", "lost_gpu_seconds", "placement_slowdown_gpu_seconds", "team_share",
        "max_wait_low_mfu_s", "worst_rho", "share_rho_above_1", "aging_violations", "sim_wall_s")


def _grid(times: np.ndarray, deltas: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Value of a step function (sum of deltas at times) on each interval [grid[i], grid[i+1])."""
    acc = np.zeros(len(grid))
    np.add.at(acc, np.searchsorted(grid, times), deltas)
    return np.cumsum(acc)[:-1]


def summarise(res: SimResult) -> dict:
    jobs = res.jobs
    n = len(jobs)
    sub = np.array([s.job.submit for s in jobs])
    end = np.array([s.end for s in jobs])
    g = np.array([s.job.gpus for s in jobs], dtype=float)
    dur = np.array([s.duration for s in jobs])
    mfu = np.array([s.mfu for s in jobs])
    ran = np.array([sum(e - b for b, e, _ in s.segments) for s in jobs])
    jct = end - sub
    wait = np.maximum(0.0, jct - ran)
    w = g * dur * mfu
    med = float(np.median(mfu))
    hi = mfu >= med
    makespan = float(end.max())

    # step functions over time: useful rate, waiting jobs, per-team running and waiting GPUs
    seg_t, seg_rate, seg_job = [], [], []
    wait_t, wait_d, wait_job = [], [], []
    for i, s in enumerate(jobs):
        prev = s.job.submit
        for b, e, prog in s.segments:
            if e > b:
                r = s.job.gpus * s.mfu * prog / (e - b)
                seg_t += [b, e]
                seg_rate += [r, -r]
                seg_job += [i, i]
            if b > prev:
                wait_t += [prev, b]
                wait_d += [1.0, -1.0]
                wait_job += [i, i]
            prev = e
    grid = np.unique(np.concatenate([seg_t, wait_t, [0.0, makespan]]))
    dt = np.diff(grid)
    seg_t, seg_rate, seg_job = np.array(seg_t), np.array(seg_rate), np.array(seg_job, dtype=int)
    wait_t, wait_d, wait_job = np.array(wait_t), np.array(wait_d), np.array(wait_job, dtype=int)
    rate = _grid(seg_t, seg_rate, grid)
    contended = _grid(wait_t, wait_d, grid) > 0.5
    c_time = float(dt[contended].sum())
    total_w = float(w.sum())
    done = np.concatenate([[0.0], np.cumsum(rate * dt)])
    marks = [makespan * k / 10 for k in range(1, 11)]
    by_time = [round(float(np.interp(t, grid, done)) / total_w, 4) if total_w else 0.0 for t in marks]

    teams = [s.job.team for s in jobs]
    team_share = {}
    for team, quota in sorted(res.quotas.items()):
        mine = np.array([t == team for t in teams])
        sm, wm = mine[seg_job] if len(seg_job) else seg_job, mine[wait_job] if len(wait_job) else wait_job
        gs = g[seg_job[sm]] * np.sign(seg_rate[sm]) if len(seg_job) else np.array([])
        run = _grid(seg_t[sm], gs, grid) if len(gs) else np.zeros(len(dt))
        pend = _grid(wait_t[wm], g[wait_job[wm]] * wait_d[wm], grid) if len(wait_job) else np.zeros(len(dt))
        over = contended & (run + pend > quota + 1e-9)
        got = float((np.minimum(run[over], quota) * dt[over]).sum())
        due = quota * float(dt[over].sum())
        used = float((run * dt).sum()) / makespan if makespan else 0.0
        team_share[team] = {"quota_gpus": round(quota, 2), "avg_used_gpus": round(used, 2),
                            "contended_over_quota_s": round(float(dt[over].sum()), 1),
                            "contended_quota_share": round(got / due, 4) if due > 0 else None}

    def r(x: float) -> float:
        return round(float(x), 3)

    out = {
        "jobs": n, "rejected": res.rejected,
        "avg_jct_s": r(jct.mean()), "p50_jct_s": r(np.percentile(jct, 50)),
        "p99_jct_s": r(np.percentile(jct, 99)),
        "avg_queue_delay_s": r(wait.mean()), "p99_queue_delay_s": r(np.percentile(wait, 99)),
        "max_queue_delay_s": r(wait.max()), "makespan_s": r(makespan),
        "gpu_utilisation": round(float((g * dur).sum()) / (res.total_gpus * makespan), 4)
        if makespan else 0.0,
        "useful_work_weighted_jct_s": r((w * jct).sum() / total_w) if total_w else 0.0,
        "useful_work_weighted_wait_s": r((w * wait).sum() / total_w) if total_w else 0.0,
        "high_mfu_avg_jct_s": r(jct[hi].mean()),
        "contended_cluster_mfu": round(float((rate * dt)[contended].sum()) / (res.total_gpus * c_time), 4)
        if c_time else 0.0,
        "useful_work_by_time": by_time,
        "preemptions": int(sum(s.preemptions for s in jobs)),
        "lost_gpu_seconds": r(sum(s.lost_gpu_s for s in jobs)),
        "placement_slowdown_gpu_seconds": r(sum(s.slow_gpu_s for s in jobs)),
        "team_share": team_share,
        "max_wait_low_mfu_s": r(wait[~hi].max()) if (~hi).any() else 0.0,
        **fairness_summary(finish_time_fairness(sub, end, g, dur, res.total_gpus)),
        "aging_violations": res.aging_violations,
        "sim_wall_s": round(res.wall_s, 3),
    }
    assert tuple(out) == KEYS
    return out
