"""The ordered pending queue, with numpy columns so a pass filters thousands of jobs at C speed.

Why: on the full Philly trace EASY's queue holds about 5,900 jobs on average and there are
about 80,000 scheduling passes; asking each queued job in Python whether it could backfill
(about 5e8 questions) takes minutes. Instead a pass computes, per placement kind, the largest
request that could possibly start now (and, behind a reservation, without touching the head's
GPUs) and selects the candidates with one vectorised comparison; only those are checked exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from gpudiag.scheduler.model import Job

ONE_NODE, SPREAD, WHOLE = 0, 1, 2   # placement kinds: one node; may span nodes; whole nodes


def kind_of(gpus: int, per_node: int, may_spread: bool) -> int:
    return WHOLE if gpus > per_node else (SPREAD if may_spread else ONE_NODE)


class PendingQueue:
    """Jobs in scheduling order with parallel columns: GPUs, estimate, kind, order key, why."""

    def __init__(self) -> None:
        self.jobs = np.zeros(0, dtype=object)   # Job objects (object arrays permute at C speed)
        self.why = np.zeros(0, dtype=object)
        self.gpus = np.zeros(0, dtype=np.int64)
        self.est = np.zeros(0)
        self.kind = np.zeros(0, dtype=np.int8)
        self.key = np.zeros(0)
        self.tag = np.zeros(0, dtype=np.int64)   # the runtime's own index of each job

    def __len__(self) -> int:
        return len(self.jobs)

    @classmethod
    def build(cls, rows: Iterable[tuple[float, Job, int, str]]) -> PendingQueue:
        """From (order key, job, kind, why) rows; sorts them (stable) by key."""
        q = cls()
        rows = sorted(rows, key=lambda r: r[0])
        q.jobs = np.empty(len(rows), dtype=object)
        q.why = np.empty(len(rows), dtype=object)
        q.jobs[:] = [r[1] for r in rows]
        q.why[:] = [r[3] for r in rows]
        q.gpus = np.array([j.gpus for j in q.jobs], dtype=np.int64)
        q.est = np.array([j.estimate_s for j in q.jobs], dtype=float)
        q.kind = np.array([r[2] for r in rows], dtype=np.int8)
        q.key = np.array([r[0] for r in rows], dtype=float)
        q.tag = np.arange(len(rows), dtype=np.int64)
        return q

    def insert(self, key: float, job: Job, kind: int, why: str = "", tag: int = -1) -> None:
        """After every job whose key is <= ``key`` (ties keep arrival order)."""
        i = int(np.searchsorted(self.key, key, side="right"))
        self.jobs = np.insert(self.jobs, i, None)
        self.jobs[i] = job
        self.why = np.insert(self.why, i, why)
        self.gpus = np.insert(self.gpus, i, job.gpus)
        self.est = np.insert(self.est, i, job.estimate_s)
        self.kind = np.insert(self.kind, i, kind)
        self.key = np.insert(self.key, i, key)
        self.tag = np.insert(self.tag, i, tag)

    def remove(self, positions: list[int]) -> None:
        if not positions:
            return
        self.jobs = np.delete(self.jobs, positions)
        self.why = np.delete(self.why, positions)
        self.gpus = np.delete(self.gpus, positions)
        self.est = np.delete(self.est, positions)
        self.kind = np.delete(self.kind, positions)
        self.key = np.delete(self.key, positions)
        self.tag = np.delete(self.tag, positions)

    def reorder(self, keys: np.ndarray, kinds: np.ndarray, whys: list[str] | None = None) -> None:
        """New keys/kinds for the jobs in their current order; re-sorts (stable)."""
        perm = np.argsort(keys, kind="stable")
        self.jobs = self.jobs[perm]
        self.why = (self.why if whys is None else np.array(whys, dtype=object))[perm]
        self.gpus, self.est = self.gpus[perm], self.est[perm]
        self.kind, self.key, self.tag = kinds[perm].astype(np.int8), keys[perm], self.tag[perm]
