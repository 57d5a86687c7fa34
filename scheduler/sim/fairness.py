"""Finish-time fairness of a replay (Themis, NSDI'20; as Sia reports it), and how many teams got their quota.

rho = T_shared / T_fair with T_fair = d x max(1, g x N / C): N the time-average of jobs in the
system over the job's lifetime, itself included; the slice C / N is a share of GPU-time, not a
partition. ``quota_attainment`` counts the teams reaching ``QUOTA_TARGET`` of their contended share.
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
