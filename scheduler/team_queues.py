"""Per-team queues: inside a tier, the next job comes from the team furthest below its quota.

The greedy merge by (GPUs held + GPUs given earlier) / quota equals one global sort by (ratio
before the job, effective submit), since a team's ratio only grows along its queue: a pass is a
few numpy sorts. An overdue job (``drain_time``, capped at ``Policy.team_overdue_s``) goes ahead
of its tier; a team without a quota gets an equal share. Why, and the aging bound this gives
(checked by ``aging_violations``): docs/scheduler.md, "Per-team queues" and "Aging bound".
"""

from __future__ import annotations

import numpy as np


def team_quotas(present: np.ndarray, quota: np.ndarray, total_gpus: int | None) -> np.ndarray:
    """Each team's quota in GPUs; teams without a positive quota get the documented equal share.

    ``quota``: the runtime's quota per team (0: none); ``present``: the teams with pending or
    running jobs. The equal share is the cluster's GPUs over the teams seen (present, or with a
    quota); 1 GPU when the cluster size is not known.
    """
    seen = int(np.count_nonzero(present | (quota > 0)))
    equal = total_gpus / seen if total_gpus and seen else 1.0
    return np.where(quota > 0, quota, equal)


def interleave(tier: np.ndarray, team: np.ndarray, gpus: np.ndarray, submit: np.ndarray, use: np.ndarray,
               quota: np.ndarray, now: float, overdue_s: float) -> np.ndarray:
    """The permutation that puts queue rows in per-team fair-share order.

    Rows are pending jobs in (effective submit, arrival) order, which breaks every tie below:
    tier, team index (into ``use``/``quota``, the team's GPUs in use now and its quota), GPUs
    (as charged) and submit time. Order: tier (highest first); then overdue jobs (waited
    ``overdue_s`` or more); then the rest by the team's ratio before the job. Stable sorts of
    one column each (small integers by radix), not multi-column lexsorts: a replay orders its
    queue before every pass.
    """
    n = len(tier)
    if n < 2:   # (most of a replay's passes at 80 nodes: the job that just arrived)
        return np.zeros(n, dtype=np.int64)
    fresh = now - submit < overdue_s   # False = overdue: goes first
    all_fresh = bool(fresh.all())
    one_tier = tier[0] == tier[-1] and (n < 3 or (tier == tier[0]).all())
    small = np.int16 if len(use) < 5000 else np.int32
    # each team's own queue: tier, overdue first, then the rows' order; GPUs given before each job
    # (one tier: the tier term orders nothing; and with no overdue job, neither does that one)
    if one_tier:
        own_key = team.astype(small) if all_fresh else (team * 2 + fresh).astype(small)
    else:
        own_key = ((team * 3 + (2 - tier)) * 2 + fresh).astype(small)
    own = np.argsort(own_key, kind="stable")
    g = np.asarray(gpus, float)[own]
    before = np.cumsum(g) - g
    t = team[own]
    # each team is one run of ``own``: subtract the GPUs given before the run from all of it
    # (the run's first value, through a per-team column: one gather, not a repeat of the runs)
    first = np.flatnonzero(t[1:] != t[:-1]) + 1
    start = np.zeros(len(use))
    start[t[first]] = before[first]   # (the first run's start is 0 already)
    before -= start[t]
    own_ratio = (use[t] + before) / quota[t]
    if one_tier and all_fresh:   # no overdue job, one tier: the last sort would keep the order
        # ``own_ratio`` is one ascending run per team, which a stable sort merges at a quarter
        # of the cost of sorting the rows' order; it keeps ties in team order, not the rows'
        # order, so where two values are equal the rows' order is sorted as before
        by = np.argsort(own_ratio, kind="stable")
        r = own_ratio[by]
        if not (r[1:] == r[:-1]).any():
            return own[by]
    ratio = np.empty(n)
    ratio[own] = own_ratio
    if one_tier and all_fresh:
        return np.argsort(ratio, kind="stable")
    ratio[~fresh] = 0.0   # overdue jobs: effective-submit order only
    order = np.argsort(ratio, kind="stable")
    return order[np.argsort(((2 - tier) * 2 + fresh)[order].astype(np.int8), kind="stable")]


def drain_time(gpus: np.ndarray, est: np.ndarray, run_gpus: np.ndarray, run_ends: np.ndarray, now: float,
               total_gpus: int | None) -> float:
    """How long the cluster needs to run what it holds and what waits, by estimate: (GPUs x time
    left of every running job, to its expected end + GPUs x estimate of every pending job) /
    the cluster's GPUs. A job that has waited this long has waited about what the arrival order
    would make a job submitted now wait: per-team queues stop passing it (``Policy.team_overdue_s``
    caps it). Jobs without a time limit count at ``Policy.default_estimate_s``, which leaves the cap."""
    held = float(np.dot(run_gpus, np.maximum(run_ends - now, 0.0)))
    return (float(np.dot(gpus, est)) + held) / max(total_gpus or 1, 1)


def aging_violations(submit: np.ndarray, tier: np.ndarray, bound_s: float) -> int:
    """How many jobs of a queue (``submit``, ``tier`` in the order a pass walks) stand behind a
    job of their tier submitted more than ``bound_s`` after them: 0 is the aging bound
    (``Policy.aging_bound_s``; with per-team queues ``max(efficiency cap, overdue time)`` at the
    pass). A replay counts these on every pass."""
    if len(tier) < 2:
        return 0
    if tier[0] == tier[-1]:   # one tier (they come in runs)
        return int(np.count_nonzero(np.maximum.accumulate(submit) > submit + bound_s + 1e-6))
    bad = 0
    cuts = [0, *(np.flatnonzero(tier[1:] != tier[:-1]) + 1).tolist(), len(tier)]   # tiers come in runs
    for a, b in zip(cuts, cuts[1:], strict=False):
        s = submit[a:b]
        bad += int(np.count_nonzero(np.maximum.accumulate(s) > s + bound_s + 1e-6))
    return bad
