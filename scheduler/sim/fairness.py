"""Finish-time fairness of a replay, and how many teams got their quota.

Finish-time fairness (Mahajan et al., "Themis: Fair and Efficient GPU Cluster Scheduling",
NSDI'20, section 3; reported as "worst rho" and "share of jobs with rho > 1" by Sia, Jayaram
Subramanya et al., SOSP'23): rho = T_shared / T_fair, a job's completion time in the shared
cluster over its completion time on a dedicated 1/N slice of it. rho <= 1: sharing did the job
no harm; the worst rho is the job the policy treated least fairly.

How T_fair is computed here (Themis leaves the slice's shape to the system):
- N: the time-average, over the job's own lifetime [submit, end] in the shared replay, of the
  number of jobs in the system (submitted and not finished: running or waiting), the job itself
  included, so N >= 1. Themis takes N as the average contention over the app's lifetime.
- The slice holds C / N GPUs of a C-GPU cluster. A gang of g GPUs whose recorded duration is d
  runs at full speed on it when g <= C / N; on a smaller slice it time-shares its g GPUs at
  rate (C / N) / g (the slice is an average share of GPU-time, not a partition that must hold
  the gang). So T_fair = d * max(1, g * N / C), and it starts at submission (no wait).
- d is the trace's duration (undisturbed run time), so a spread placement's slowdown, a
  preemption's lost work and queueing all count against the shared cluster, as they should.

Quota attainment: ``metrics.summarise``'s ``team_share`` already holds, per team, the share of
its quota it got in contended time while its demand exceeded it; ``quota_attainment`` only
counts the teams that reached ``QUOTA_TARGET`` of it.
"""

from __future__ import annotations

import numpy as np

# Issue 20's target: a team with demand above its quota gets >= 90% of it in contended time.
QUOTA_TARGET = 0.9
# A quota below one GPU cannot hold a single job: such teams are not counted
# (benchmarks/scheduler_replay.py's MIN_QUOTA_GPUS, same reason).
MIN_QUOTA_GPUS = 1.0


def finish_time_fairness(submit: np.ndarray, end: np.ndarray, gpus: np.ndarray, duration: np.ndarray,
                         total_gpus: int) -> np.ndarray:
    """rho of every job (module docstring): arrays indexed by job, times in seconds."""
    submit, end = np.asarray(submit, float), np.asarray(end, float)
    gpus, duration = np.asarray(gpus, float), np.asarray(duration, float)
    # jobs in the system as a step function: +1 at each submit, -1 at each end
    times = np.concatenate([submit, end])
    steps = np.concatenate([np.ones(len(submit)), -np.ones(len(end))])
    order = np.argsort(times, kind="stable")
    grid, steps = times[order], steps[order]
    in_system = np.cumsum(steps)                       # on [grid[i], grid[i+1])
    area = np.concatenate([[0.0], np.cumsum(in_system[:-1] * np.diff(grid))])   # integral up to grid[i]

    def integral(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(grid, t, side="right") - 1
        i = np.clip(i, 0, len(grid) - 1)
        return area[i] + in_system[i] * (t - grid[i])

    life = end - submit
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(life > 0, (integral(end) - integral(submit)) / np.where(life > 0, life, 1.0), 1.0)
    n = np.maximum(n, 1.0)
    fair = duration * np.maximum(1.0, gpus * n / total_gpus)
    return life / fair


def fairness_summary(rho: np.ndarray) -> dict:
    """Worst rho and the share of jobs above 1 (Sia's two numbers)."""
    if not len(rho):
        return {"worst_rho": 0.0, "share_rho_above_1": 0.0}
    return {"worst_rho": round(float(rho.max()), 4),
            "share_rho_above_1": round(float((rho > 1.0 + 1e-9).mean()), 4)}


def quota_attainment(team_share: dict) -> dict:
    """Of the teams (quota >= ``MIN_QUOTA_GPUS``) whose demand exceeded their quota in contended
    time: how many, how many got >= ``QUOTA_TARGET`` of it, and the lowest share."""
    shares = [t["contended_quota_share"] for t in team_share.values()
              if t["contended_quota_share"] is not None and t["quota_gpus"] >= MIN_QUOTA_GPUS]
    return {"teams_over_quota": len(shares),
            "teams_at_90pct": sum(s >= QUOTA_TARGET for s in shares),
            "min_quota_share": round(min(shares), 4) if shares else None}
