"""The queue order and the terms behind it: one implementation for every runtime and the replay.

Every term is a function of the pass's ``now`` and of columns: the efficiency factor and effective
submit, the placement kind, the waste charge and each team's GPUs held (``team_use``), then the
order (tier, team interleave or effective submit). The runtimes build an ``Ordering`` per pass; the
replay keeps one and ``current`` recomputes only rows whose inputs changed - the same values. Ties
go to the row registered first. docs/scheduler.md, "The policy core".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpudiag.scheduler.model import COMM_LABEL, GPU_IDLE_LABELS, UNKNOWN, Job, Policy, Running, Signal
from gpudiag.scheduler.pending import (
    EST_COL,
    GPUS_COL,
    KEY_COL,
    KIND_COL,
    NEGTIER_COL,
    NUM_COLS,
    ONE_NODE,
    SPREAD,
    TAG_COL,
    WHOLE,
    PendingQueue,
)
from gpudiag.scheduler.priority import MfuBook, efficiency_factors, job_class, lowered
from gpudiag.scheduler.team_queues import drain_time, interleave, team_quotas

_CLASS_GPUS = (1, 2, 9)                               # a job size of each class ...
CLASSES = tuple(job_class(g) for g in _CLASS_GPUS)   # ... and priority.job_class's name for it
# Policy.order == "mfu" (the calibration oracle): 1e-4 of MFU outweighs any submit-time
# difference (< 1e7 s), so the order is by MFU first.
ORACLE_SPAN_S = 1e11
# Up to this many stale rows ``Ordering.current`` computes one by one in plain floats: ~30 numpy
# calls on a short array cost more (whole Philly replay, 80 nodes: its 14,208 calls with 2-99
# stale rows took 0.85 s of CPU, 0.58 s with this).
_ONE_BY_ONE = 6


def may_spread(policy: Policy, label: str) -> bool:
    """Spreading a one-node job is a bet that it is not placement-sensitive: made only on evidence.

    Known communication-bound jobs wait for one node (label-aware placement); jobs with no
    usable label wait too unless ``Policy.spread_unknown`` (a quarter of multi-GPU keys are
    communication-bound in the simulator's model, and those run 1.5x as long spread).
    """
    if not policy.spread_small:
        return False
    if label == UNKNOWN:
        return policy.spread_unknown
    return not (label == COMM_LABEL and policy.label_aware_placement)


@dataclass(frozen=True)
class RunningCols:
    """The running jobs as columns: their rows, expected ends and whether they are stopping."""

    rows: np.ndarray
    ends: np.ndarray
    stopping: np.ndarray


def _class_index(gpus: np.ndarray) -> np.ndarray:
    """``priority.job_class`` of each size, as an index into ``CLASSES``."""
    return np.where(gpus <= 1, 0, np.where(gpus <= 8, 1, 2)).astype(np.int8)


class Ordering:
    """Every known job's columns, each key's history and each team's index; the terms at a time.

    ``book`` holds the key histories; ``medians`` the class medians efficiency compares with
    (default: the same book; a replay's oracle passes the whole trace's). ``per_node``: the
    largest node's GPUs (a larger job needs whole nodes).
    """

    def __init__(self, policy: Policy, book: MfuBook, per_node: int, medians: MfuBook | None = None) -> None:
        self.policy, self.book, self.per_node = policy, book, per_node
        self.medians = medians or book
        p = policy
        self.use_eff = p.order == "priority" and p.efficiency
        self.use_waste = p.order == "priority" and p.waste_charge
        self.jobs: list[Job] = []
        self.job_arr = np.zeros(0, dtype=object)   # the same, for fancy indexing
        self.row_of: dict[int, int] = {}        # job id -> row
        self.sub = np.zeros(0)
        self.gpus = np.zeros(0, dtype=np.int64)
        self.est = np.zeros(0)
        self.tier = np.zeros(0, dtype=np.int64)
        self.cls = np.zeros(0, dtype=np.int8)
        self.key_i = np.zeros(0, dtype=np.int64)
        self.team_i = np.zeros(0, dtype=np.int64)
        self.own_mfu = np.zeros(0)              # a job's own latest signal ...
        self.own_label = np.zeros(0, dtype=np.int64)
        self.own_conf = np.zeros(0)
        self.own_until = np.zeros(0)            # ... usable until then
        self.own_at: dict[int, float] = {}      # row -> when it was heard (its age in a reason)
        self.oracle_mfu = np.zeros(0)           # Policy.order == "mfu" only
        self.keys_ix: dict[str, int] = {}
        self.key_mfu = np.zeros(0)              # a key's history ...
        self.key_label = np.zeros(0, dtype=np.int64)
        self.key_until = np.zeros(0)            # ... usable until then
        self.labels: dict[str, int] = {UNKNOWN: 0}
        self.label_names = [UNKNOWN]
        self.spread = np.array([may_spread(p, UNKNOWN)])
        self.idle = np.array([False])
        self.teams_ix: dict[str, int] = {}
        self.team_names: list[str] = []
        self.quota_cache: tuple[Mapping[str, float] | None, np.ndarray] | None = None
        self.reclaim_cache: tuple[Mapping[str, float] | None, dict[str, float]] | None = None
        # Each row's terms as last computed (``current``), kept until an input changes: its
        # signal, its key's history, a class median, or the time one of them stops being usable.
        self.key_rows: list[list[int]] = []      # key -> its rows
        self.c_key = np.zeros(0)
        self.c_kind = np.zeros(0, dtype=np.int8)
        self.c_charge = np.zeros(0)
        # valid until then (an evidence's usable-until); -inf: an input changed, compute again
        self.c_until = np.zeros(0)
        self.num = np.zeros((0, NUM_COLS))        # each row's queue columns (``pending.PendingQueue.num``)
        self.c_med = np.full(len(CLASSES), np.nan)
        self.c_seen = -1                          # the medians' book's observations at c_med
        self.by_key = np.zeros(0, dtype=np.int64)   # the last queue's rows by (key, row)
        self.moved = np.zeros(0, dtype=bool)        # rows whose key changed since
        self.mark = np.zeros(0, dtype=bool)         # scratch

    # --- registering -------------------------------------------------------------------------------
    def _label(self, label: str) -> int:
        i = self.labels.get(label)
        if i is None:
            i = self.labels[label] = len(self.label_names)
            self.label_names.append(label)
            self.spread = np.append(self.spread, may_spread(self.policy, label))
            self.idle = np.append(self.idle, label in GPU_IDLE_LABELS)
        return i

    def team(self, name: str) -> int:
        i = self.teams_ix.get(name)
        if i is None:
            i = self.teams_ix[name] = len(self.team_names)
            self.team_names.append(name)
        return i

    def _keys(self, names: Sequence[str]) -> np.ndarray:
        """Each name's key index, registering the new ones (their history read from the book)."""
        new = [k for k in dict.fromkeys(names) if k not in self.keys_ix]
        if new:
            k0 = len(self.key_mfu)
            self.keys_ix.update((k, k0 + i) for i, k in enumerate(new))
            self.key_mfu = np.concatenate([self.key_mfu, np.full(len(new), np.nan)])
            self.key_label = np.concatenate([self.key_label, np.zeros(len(new), dtype=np.int64)])
            self.key_until = np.concatenate([self.key_until, np.full(len(new), -np.inf)])
            self.key_rows.extend([] for _ in new)
            for k in new:
                if k in self.book.keys:
                    self.learned(k)
        return np.fromiter((self.keys_ix[k] for k in names), np.int64, len(names))

    def add(self, jobs: Sequence[Job]) -> np.ndarray:
        """Register jobs (once each; the order registered is the tie-break); returns their rows."""
        n0, n = len(self.jobs), len(jobs)
        self.jobs.extend(jobs)
        arr = np.empty(n, dtype=object)
        arr[:] = list(jobs)
        self.job_arr = np.concatenate([self.job_arr, arr])
        self.row_of.update((j.id, n0 + i) for i, j in enumerate(jobs))
        cat = np.concatenate
        gpus = np.fromiter((j.gpus for j in jobs), np.int64, n)
        self.sub = cat([self.sub, np.fromiter((j.submit for j in jobs), float, n)])
        self.gpus = cat([self.gpus, gpus])
        self.est = cat([self.est, np.fromiter((j.estimate_s for j in jobs), float, n)])
        self.tier = cat([self.tier, np.fromiter((int(j.tier) for j in jobs), np.int64, n)])
        self.cls = cat([self.cls, _class_index(gpus)])
        self.key_i = cat([self.key_i, self._keys([j.key for j in jobs])])
        self.team_i = cat([self.team_i, np.fromiter((self.team(j.team) for j in jobs), np.int64, n)])
        self.own_mfu = cat([self.own_mfu, np.full(n, np.nan)])
        self.own_label = cat([self.own_label, np.zeros(n, dtype=np.int64)])
        self.own_conf = cat([self.own_conf, np.zeros(n)])
        self.own_until = cat([self.own_until, np.full(n, -np.inf)])
        self.oracle_mfu = cat([self.oracle_mfu, np.full(n, np.nan)])
        for i, k in enumerate(self.key_i[n0:].tolist()):
            self.key_rows[k].append(n0 + i)
        self.c_key = cat([self.c_key, np.zeros(n)])
        self.c_kind = cat([self.c_kind, np.zeros(n, dtype=np.int8)])
        self.c_charge = cat([self.c_charge, np.ones(n)])
        self.c_until = cat([self.c_until, np.full(n, -np.inf)])
        num = np.zeros((n, NUM_COLS))   # (kind and key filled in by ``current``)
        num[:, GPUS_COL], num[:, EST_COL], num[:, TAG_COL] = gpus, self.est[n0:], np.arange(n0, n0 + n)
        num[:, NEGTIER_COL] = -self.tier[n0:]
        self.num = cat([self.num, num])
        self.moved = cat([self.moved, np.zeros(n, dtype=bool)])
        self.mark = cat([self.mark, np.zeros(n, dtype=bool)])
        return np.arange(n0, n0 + n)

    # --- what the runtime learns -----------------------------------------------------------------
    def learned(self, key: str) -> None:
        """The book has a new observation of ``key``: its history's columns (call after every
        ``book.observe`` of a registered key). A job without a key has no history."""
        k = self.keys_ix.get(key)
        if k is None:
            return
        self.c_until[self.key_rows[k]] = -np.inf
        h = self.book.keys.get(key) if key else None
        p = self.policy
        if h is None or h.weight < p.min_history_weight:
            self.key_until[k] = -np.inf
            return
        self.key_mfu[k], self.key_label[k] = h.mfu, self._label(h.label)
        # decayed weight w * 2^-(t - updated)/half-life stays >= min_history_weight until:
        self.key_until[k] = h.updated + self.book.half_life_s * math.log2(h.weight / p.min_history_weight)

    def hear(self, row: int, mfu: float, label: str, confidence: float, at: float) -> None:
        """The job's own latest signal, last heard from at ``at``: usable while it is younger
        than ``Policy.max_signal_age_s`` and confident enough (``priority.signal_usable``)."""
        p = self.policy
        self.c_until[row] = -np.inf
        self.own_mfu[row], self.own_label[row], self.own_conf[row] = mfu, self._label(label), confidence
        self.own_at[row] = at
        self.own_until[row] = at + p.max_signal_age_s if confidence >= p.min_signal_confidence else -np.inf

    def hear_all(self, signals: Mapping[int, Signal], now: float) -> None:
        """Each registered job's signal as a runtime holds it (its age at ``now``)."""
        for jid, sig in signals.items():
            row = self.row_of.get(jid)
            if row is not None:
                sig = sig.scheduled(self.policy.min_signal_confidence)
                self.hear(row, sig.mfu, sig.label, sig.confidence, now - sig.age_s)

    def know_mfu(self, rows: np.ndarray, mfu: np.ndarray) -> None:
        """``Policy.order == "mfu"``: every job's MFU known up front (only a replay knows it)."""
        self.oracle_mfu[rows] = mfu
        self.c_until[rows] = -np.inf

    # --- the terms at ``now`` ----------------------------------------------------------------------
    def evidence(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(MFU, label index, own signal usable, key history usable) of ``rows`` at ``now``: the
        job's own signal first, its key's history next; NaN / unknown where neither is usable."""
        k = self.key_i[rows]
        own = self.own_until[rows] >= now
        hist = ~own & (self.key_until[k] >= now)
        mfu = np.where(own, self.own_mfu[rows], np.where(hist, self.key_mfu[k], np.nan))
        label = np.where(own, self.own_label[rows], np.where(hist, self.key_label[k], 0))
        return mfu, label, own, hist

    def _medians(self) -> np.ndarray:
        return np.array([self.medians.class_median(c) or np.nan for c in CLASSES])

    def factors(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(efficiency factor, label index) of ``rows``: 1 where nothing usable is known."""
        mfu, label, _, _ = self.evidence(rows, now)
        return efficiency_factors(mfu, self._medians()[self.cls[rows]], self.idle[label], self.policy), label

    def keys(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(effective submit time, placement kind, waste charge per GPU) of ``rows`` at ``now``."""
        p = self.policy
        factor, label = self.factors(rows, now)
        keys = self.sub[rows]
        if self.use_eff:
            keys = keys + (1.0 - factor) * p.max_efficiency_delay_s
        elif p.order == "mfu":
            keys = keys + np.nan_to_num((1.0 - self.oracle_mfu[rows]) * ORACLE_SPAN_S)
        kinds = np.where(self.gpus[rows] > self.per_node, WHOLE,
                         np.where(self.spread[label], SPREAD, ONE_NODE)).astype(np.int8)
        charge = 1.0 + p.waste_weight * (1.0 - factor) if self.use_waste else np.ones(len(rows))
        return keys, kinds, charge

    def rows(self, running: Sequence[Running]) -> np.ndarray:
        return np.fromiter((self.row_of[r.job.id] for r in running), np.int64, len(running))

    def running_cols(self, running: Sequence[Running]) -> RunningCols:
        n = len(running)
        return RunningCols(self.rows(running), np.fromiter((r.expected_end for r in running), float, n),
                           np.fromiter((r.terminating for r in running), bool, n))

    def current(self, rows: np.ndarray, now: float) -> None:
        """Bring ``c_key``/``c_kind``/``c_charge`` of ``rows`` to ``keys(rows, now)``, computing
        only rows whose inputs changed since (a replay asks for thousands on each pass)."""
        if self.medians.observations != self.c_seen:
            self.c_seen = self.medians.observations
            med = self._medians()
            same = (med == self.c_med) | (np.isnan(med) & np.isnan(self.c_med))
            if not same.all():   # a class median moved: every term of that class
                self.c_until[~same[self.cls]] = -np.inf
                self.c_med = med
        stale = rows[self.c_until[rows] < now]
        if len(stale) <= _ONE_BY_ONE and self.policy.order != "mfu":   # (most passes: a report or an arrival)
            for row in stale.tolist():
                self._current_one(row, now)
        elif len(stale):
            key, kind, charge = self.keys(stale, now)
            self.moved[stale[key != self.c_key[stale]]] = True
            own, hist = self.own_until[stale], self.key_until[self.key_i[stale]]
            self.c_until[stale] = np.minimum(np.where(own >= now, own, np.inf),
                                             np.where(hist >= now, hist, np.inf))
            self.c_key[stale], self.c_kind[stale], self.c_charge[stale] = key, kind, charge
            self.num[stale, KEY_COL], self.num[stale, KIND_COL] = key, kind

    def _current_one(self, row: int, now: float) -> None:
        """``current`` of one row in plain floats: ``keys`` and ``efficiency_factors``' arithmetic
        step by step (the same IEEE operations, so the same values), without ~30 numpy calls on
        one element. Not for ``Policy.order == "mfu"``."""
        p = self.policy
        k = int(self.key_i[row])
        own_until, hist_until = float(self.own_until[row]), float(self.key_until[k])
        if own_until >= now:
            mfu, label = float(self.own_mfu[row]), int(self.own_label[row])
        elif hist_until >= now:
            mfu, label = float(self.key_mfu[k]), int(self.key_label[k])
        else:
            mfu, label = math.nan, 0
        median = float(self.c_med[self.cls[row]])   # (``current`` has just brought it up to date)
        factor = max(p.min_efficiency_factor, mfu / median) if median > 0 and mfu < median else 1.0
        if self.idle[label]:
            factor = min(factor, p.idle_label_factor)
        key = float(self.sub[row])
        if self.use_eff:
            key = key + (1.0 - factor) * p.max_efficiency_delay_s
        kind = WHOLE if self.gpus[row] > self.per_node else SPREAD if self.spread[label] else ONE_NODE
        if key != self.c_key[row]:
            self.moved[row] = True
        self.c_until[row] = min(own_until if own_until >= now else math.inf,
                                hist_until if hist_until >= now else math.inf)
        self.c_key[row], self.c_kind[row] = key, kind
        self.c_charge[row] = 1.0 + p.waste_weight * (1.0 - factor) if self.use_waste else 1.0
        self.num[row, KEY_COL], self.num[row, KIND_COL] = key, kind

    def _by_key(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (ascending) in (key, row) order: the last call's order, less the rows gone or
        whose key moved, with the others put in their places; sorted afresh when many changed."""
        if len(rows) <= 32:   # a short queue: one small sort costs less than the merge below
            out = rows[np.argsort(self.c_key[rows], kind="stable")]
            self.moved[rows] = False
            self.by_key = out
            return out
        keep = self.by_key
        if len(keep):
            self.mark[rows] = True
            keep = keep[self.mark[keep] & ~self.moved[keep]]
            self.mark[rows] = False
        self.mark[keep] = True
        add = rows[~self.mark[rows]]
        self.mark[keep] = False
        if len(add) > max(32, len(keep) // 8):
            out = rows[np.argsort(self.c_key[rows], kind="stable")]
        elif len(add):
            ka = self.c_key[add]
            o = np.lexsort((add, ka))
            add, ka = add[o], ka[o]
            ks = self.c_key[keep]
            pos = np.searchsorted(ks, ka, "left")
            hi = np.searchsorted(ks, ka, "right")
            for i in np.flatnonzero(hi > pos).tolist():   # equal keys: by row
                pos[i] += int(np.searchsorted(keep[pos[i]:hi[i]], add[i]))
            out = np.insert(keep, pos, add)
        else:
            out = keep
        self.moved[add] = False
        self.by_key = out
        return out

    def team_use(self, run: RunningCols, charge: np.ndarray | float = 1.0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Fair share's one input, by ``team_names`` index: the GPUs each team's running jobs hold
        now (``use``), the same counted at their waste charge (``charged``: ``charge`` per GPU of
        each running job), and without the jobs in their grace period (``live``: what quota
        reclaim counts; their GPUs are leaving)."""
        rows, stopping = run.rows, run.stopping
        team, g = self.team_i[rows], self.gpus[rows].astype(float)
        n = len(self.team_names)
        held = np.bincount(team, g, n)
        return (held, np.bincount(team, g * charge, n),
                np.bincount(team[~stopping], g[~stopping], n) if stopping.any() else held)

    def victim_mfu(self, running: Sequence[Running], now: float) -> Callable[[Running], tuple[float, bool]]:
        """A running job's (MFU, measured?) for the victim rule: its own signal, else its key's
        history, else its class median (1 with none). Computed for all of ``running`` when asked."""
        got: dict[int, tuple[float, bool]] = {}

        def mfu_of(r: Running) -> tuple[float, bool]:
            if not got:
                rows = self.rows(running)
                mfu, _, own, hist = self.evidence(rows, now)
                med = np.nan_to_num(self._medians()[self.cls[rows]], nan=1.0)
                known = own | hist   # (pairs zipped in C: a reclaim asks for hundreds of jobs)
                pairs = zip(np.where(known, mfu, med).tolist(), known.tolist(), strict=True)
                got.update(zip([x.job.id for x in running], pairs, strict=True))
            return got[r.job.id]

        return mfu_of

    def why(self, rows: np.ndarray, now: float) -> dict[int, str]:
        """What lowered each job, in words (``priority.lowered``: the reason
        ``priority.efficiency_factor`` gives), and what its GPUs cost its team (the waste
        charge). Only runtimes that show reasons ask."""
        out: dict[int, str] = {}
        mfu, label, own, _ = self.evidence(rows, now)
        factor = self.factors(rows, now)[0]
        charge = self.c_charge[rows]
        med = self._medians()
        for i in np.flatnonzero((factor < 1.0) & self.use_eff | (charge > 1.0 + 1e-9)).tolist():
            job, parts = self.jobs[int(rows[i])], []
            if self.use_eff and factor[i] < 1.0:
                m = med[self.cls[rows[i]]]
                src = "its signal" if own[i] else f"earlier jobs of key {job.key}"
                parts.append(lowered(job, float(mfu[i]), self.label_names[int(label[i])], src,
                                     None if np.isnan(m) else float(m), float(factor[i])))
            if charge[i] > 1.0 + 1e-9:
                parts.append(f"waste charge: its GPUs count {charge[i]:.2f}x toward team "
                             f"{job.team or '(none)'}'s share for low MFU")
            out[job.id] = "; ".join(parts)
        return out

    def _quota_array(self, quotas: Mapping[str, float] | None) -> np.ndarray:
        """Each team's quota by ``team_names`` index (0: none), kept while the map and the teams
        stay the same (a replay passes one map for its whole run)."""
        got = self.quota_cache
        if got is None or got[0] is not quotas or len(got[1]) != len(self.team_names):
            got = self.quota_cache = (quotas, np.array([(quotas or {}).get(t, 0.0) for t in self.team_names]))
        return got[1]

    def reclaim_quotas(self, quotas: Mapping[str, float] | None) -> dict[str, float]:
        """The teams with a positive quota (what quota reclaim reads), kept while the map stays
        the same (not copied on each of a replay's passes)."""
        got = self.reclaim_cache
        if got is None or got[0] is not quotas:
            got = self.reclaim_cache = (quotas, {t: q for t, q in (quotas or {}).items() if q > 0})
        return got[1]

    # --- the order ---------------------------------------------------------------------------------
    def head(self, rows: np.ndarray, now: float, cols: RunningCols, quotas: Mapping[str, float] | None,
             total_gpus: int | None) -> int:
        """The row ``queue`` puts first, without ordering the others (per-team queues only): the
        highest tier's first overdue job in (key, row) order, else the first job of the team
        whose charged use / quota is lowest, ties to the earlier job (each team's ratio only
        grows along its queue). Why: a replay skips a pass only the head could act on, quota
        reclaim, when the head's team has no room (``Replay._worth_a_pass``); ordering
        thousands of jobs to learn the head costs a pass's worth."""
        self.current(np.concatenate([rows, cols.rows]), now)
        by = self._by_key(rows)
        tier = self.tier[by]
        top = by[tier == tier.max()]
        drain = drain_time(self.gpus[by], self.est[by], self.gpus[cols.rows], cols.ends, now, total_gpus)
        overdue_s = min(self.policy.team_overdue_s, drain)
        over = top[~(now - self.sub[top] < overdue_s)]   # (``interleave``'s test, negated)
        if len(over):
            return int(over[0])
        held, charged, _ = self.team_use(cols, self.c_charge[cols.rows])
        quota = self._quota_array(quotas)
        if not (quota > 0).all():
            present = (np.bincount(self.team_i[by], minlength=len(self.team_names)) > 0) | (held > 0)
            quota = team_quotas(present, quota, total_gpus)
        team = self.team_i[top]
        return int(top[np.argmin(charged[team] / quota[team])])   # (the first of the lowest: the earlier)

    def queue(self, rows: np.ndarray, now: float, running: Sequence[Running] = (),
              quotas: Mapping[str, float] | None = None, total_gpus: int | None = None,
              why: bool = False, cols: RunningCols | None = None
              ) -> tuple[PendingQueue, np.ndarray | None]:
        """``rows`` (pending jobs, ascending) as the ordered queue a pass walks, and each team's
        GPUs held by ``running`` jobs not in their grace period (by ``team_names`` index; None
        when the policy has no per-team view).

        Tier first; inside a tier, with ``Policy.team_queues`` each team's own queue (effective
        submit order) interleaved by (GPUs its running jobs hold now, as charged, + GPUs given
        to it earlier in the order) / quota (``team_queues.interleave``; a team without a quota
        gets the equal share ``team_queues.team_quotas`` documents); else the effective submit
        time. ``cols``: ``running_cols(running)``, when the caller keeps them.
        """
        p = self.policy
        teams = p.order == "priority" and (p.team_queues or p.reclaim)
        run = cols if cols is not None else self.running_cols(running) if teams else None
        self.current(rows if run is None else np.concatenate([rows, run.rows]), now)
        if teams:
            held, charged, live = self.team_use(run, self.c_charge[run.rows])
        else:
            live = None
        rows = self._by_key(rows)   # from here on in (key, row) order
        gpus = self.gpus[rows]
        share = None
        overdue_s = math.inf
        if p.order == "priority" and p.team_queues:
            overdue_s = min(p.team_overdue_s, drain_time(gpus, self.est[rows], self.gpus[run.rows],
                                                         run.ends, now, total_gpus))
            nt = len(self.team_names)
            team = self.team_i[rows]
            quota = self._quota_array(quotas)
            present = (np.bincount(team, minlength=nt) > 0) | (held > 0)
            if not (quota > 0).all():   # who is present only sizes the equal share of teams without one
                quota = team_quotas(present, quota, total_gpus)
            share = (self.team_names, present, held, quota, charged)
            if len(rows) < 2:   # (most of a replay's passes at 80 nodes: the job that just arrived)
                perm = np.zeros(len(rows), dtype=np.int64)
            else:
                perm = interleave(self.tier[rows], team, gpus * self.c_charge[rows], self.sub[rows], charged,
                                  quota, now, overdue_s)
        else:
            perm = np.argsort((2 - self.tier[rows]).astype(np.int8), kind="stable")
        ordered = rows[perm]
        # the queue's columns are each row's own (``num``, kept by ``add`` and ``current``): one
        # gather (``take``: indexing a 2-D array by rows costs four times as much)
        q = PendingQueue.of_rows(self.job_arr[ordered], self.num.take(ordered, axis=0),
                                 self.why(rows, now) if why else {})
        q.teams = share
        q.overdue_s = overdue_s
        return q, live
