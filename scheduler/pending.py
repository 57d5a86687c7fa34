"""The ordered pending queue, with numpy columns so a pass filters thousands of jobs at C speed.

Why: on the full Philly trace EASY's queue holds about 5,900 jobs on average and there are
about 80,000 scheduling passes; asking each queued job in Python whether it could backfill
(about 5e8 questions) takes minutes. Instead a pass computes, per placement kind, the largest
request that could possibly start now (and, behind a reservation, without touching the head's
GPUs) and selects the candidates with one vectorised comparison; only those are checked exactly.
The numeric columns live in one 2-D array so an insertion or removal is one copy, not five.
"""

from __future__ import annotations

import numpy as np

from gpudiag.scheduler.model import Job

ONE_NODE, SPREAD, WHOLE = 0, 1, 2   # placement kinds: one node; may span nodes; whole nodes
# the columns of ``PendingQueue.num`` (also for a runtime that keeps them by job:
# ``ordering.Ordering``)
GPUS_COL, EST_COL, KIND_COL, KEY_COL, TAG_COL, NEGTIER_COL = range(6)
NUM_COLS = 6


def kind_of(gpus: int, per_node: int, may_spread: bool) -> int:
    return WHOLE if gpus > per_node else (SPREAD if may_spread else ONE_NODE)


def _insert(a: np.ndarray, i: int, row) -> np.ndarray:
    out = np.empty((a.shape[0] + 1, *a.shape[1:]), dtype=a.dtype)
    out[:i] = a[:i]
    out[i] = row
    out[i + 1:] = a[i:]
    return out


class PendingQueue:
    """Jobs in scheduling order - higher tier first, then lower key, then lower tag - with
    parallel columns.

    Columns: GPUs, estimate, kind, key (the effective submit time), tag (the runtime's own index
    of the job), -tier. ``why`` (job id -> text) says what lowered a job. Tiers are a column of
    their own, not an offset added to the key: a large offset would cost the key its precision.
    """

    def __init__(self) -> None:
        self.jobs = np.zeros(0, dtype=object)   # Job objects (object arrays permute at C speed)
        self.num = np.zeros((0, 6))
        self.why: dict[int, str] = {}
        # per team (GPUs in use, quota) when the order interleaved teams: for the reasons
        self.teams: tuple | None = None   # (names, present, held, quota, charged) of the interleave
        self.overdue_s = float("inf")   # a job waited this long goes first (``Policy.team_overdue_s``)

    @property
    def share(self) -> dict[str, tuple[float, float, float]]:
        """Each team present in the interleave: (GPUs its running jobs hold, its quota, the same
        held GPUs as charged) - what the reasons name when fair share decides."""
        if self.teams is None:
            return {}
        names, present, held, quota, charged = self.teams
        return {t: (float(held[i]), float(quota[i]), float(charged[i]))
                for i, t in enumerate(names) if present[i]}

    def share_of(self, team: str) -> tuple[float, float, float] | None:
        """``share[team]`` without building the map (a pass asks for the head's team only)."""
        if self.teams is None:
            return None
        names, present, held, quota, charged = self.teams
        i = names.index(team) if team in names else -1
        return (float(held[i]), float(quota[i]), float(charged[i])) if i >= 0 and present[i] else None

    def __len__(self) -> int:
        return len(self.jobs)

    def request(self, i: int) -> tuple[int, int]:
        """(GPUs, placement kind) of the job at position ``i``."""
        return int(self.num[i, GPUS_COL]), int(self.num[i, KIND_COL])

    @property
    def gpus(self) -> np.ndarray:
        return self.num[:, GPUS_COL].astype(np.int64)

    @property
    def est(self) -> np.ndarray:
        return self.num[:, EST_COL]

    @property
    def kind(self) -> np.ndarray:
        return self.num[:, KIND_COL].astype(np.int8)

    @property
    def key(self) -> np.ndarray:
        return self.num[:, KEY_COL]

    @property
    def tag(self) -> np.ndarray:
        return self.num[:, TAG_COL].astype(np.int64)

    @classmethod
    def ordered(cls, jobs: np.ndarray, gpus: np.ndarray, est: np.ndarray, kinds: np.ndarray, keys: np.ndarray,
                tags: np.ndarray, neg_tier: np.ndarray, why: dict[int, str] | None = None) -> PendingQueue:
        """From columns already in the order the pass walks (``ordering.Ordering.queue``)."""
        q = cls()
        q.jobs = jobs
        q.num = np.empty((len(jobs), 6))
        for c, col in enumerate((gpus, est, kinds, keys, tags, neg_tier)):
            q.num[:, c] = col
        q.why = dict(why or {})
        return q

    @classmethod
    def of_rows(cls, jobs: np.ndarray, num: np.ndarray, why: dict[int, str] | None = None) -> PendingQueue:
        """From the columns as one array already in the order the pass walks (``num``'s layout:
        GPUs, estimate, kind, key, tag, -tier)."""
        q = cls()
        q.jobs = jobs
        q.num = num
        q.why = dict(why or {})
        return q

    def insert(self, key: float, job: Job, kind: int, why: str = "", tag: int = -1) -> None:
        """At its place in (tier, key, tag) order: ties in key go to the lower tag."""
        neg = -int(job.tier)
        tiers = self.num[:, NEGTIER_COL]
        lo, hi = int(np.searchsorted(tiers, neg, "left")), int(np.searchsorted(tiers, neg, "right"))
        keys = self.num[lo:hi, KEY_COL]
        a, b = lo + int(np.searchsorted(keys, key, "left")), lo + int(np.searchsorted(keys, key, "right"))
        i = a + int(np.searchsorted(self.num[a:b, TAG_COL], tag, "left"))
        self.jobs = _insert(self.jobs, i, None)
        self.jobs[i] = job
        self.num = _insert(self.num, i, (job.gpus, job.estimate_s, kind, key, tag, neg))
        if why:
            self.why[job.id] = why

    def remove(self, positions: list[int]) -> None:
        if not positions:
            return
        keep = np.ones(len(self.jobs), bool)
        keep[positions] = False
        if self.why:
            for j in self.jobs[~keep]:
                self.why.pop(j.id, None)
        self.jobs = self.jobs[keep]
        self.num = self.num[keep]

    @property
    def neg_tier(self) -> np.ndarray:
        return self.num[:, NEGTIER_COL]
