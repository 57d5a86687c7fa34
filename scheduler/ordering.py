"""The queue order - one implementation for the simulator, the local daemon and the Slurm controller.

Why one object: a replay speaks for a runtime only if it orders the queue as that runtime does.
The stateless runtimes build an ``Ordering`` for each pass (``policy.order_queue``); the
simulator keeps one across passes and feeds it what changed (a key learned, a job heard from,
the teams' use), because recomputing every term for thousands of queued jobs on each of ~80,000
passes would take minutes. Both read the same cached terms through the same ``keys``:

- per key (and size class, whose median it is compared with): the efficiency delay of its
  history and its label, valid while the key's decayed weight is at least
  ``Policy.min_history_weight`` (the time that ends is computed once, not per pass);
- per job: the same from its own signal (a requeued job's last report), valid while the signal
  is younger than ``Policy.max_signal_age_s``;
- per team: the fair-share delay, set when the runtime reads the teams' use;
- per key and per job, the efficiency factor itself: what ``priority.waste_charge`` makes of it
  is what a job's GPUs cost its team in the order across teams (``charge``, ``team_order``);
- per label: whether a one-node job of that label may spread (``may_spread``).

Every value comes from ``priority.efficiency_factor`` / ``fair_share_delay`` - the semantics
stay those of ``scheduler/priority.py``; this module only caches them and combines them with
numpy. Ties within a tier go to the row registered first (runtimes register in job-id order),
so the order is a function of the jobs, never of the order in which a runtime happened to hold
them. A cached key term goes stale when a class median moves: ``refresh`` recomputes them all
(the simulator does it once per priority period, as Slurm recomputes priorities every
PriorityCalcPeriod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from gpudiag.scheduler.model import COMM_LABEL, Job, KeyHistory, Policy, Running, Signal, TeamShare
from gpudiag.scheduler.pending import ONE_NODE, SPREAD, WHOLE, PendingQueue
from gpudiag.scheduler.priority import (
    MfuBook,
    efficiency_delay,
    efficiency_factor,
    fair_share_delay,
    job_class,
    waste_charge,
)
from gpudiag.scheduler.team_queues import interleave, team_quotas

_CLASS_GPUS = (1, 2, 9)                               # a job size of each class ...
CLASSES = tuple(job_class(g) for g in _CLASS_GPUS)   # ... and priority.job_class's name for it
UNKNOWN = "unknown"
# Policy.order == "mfu" (the calibration oracle): 1e-4 of MFU outweighs any submit-time
# difference (< 1e7 s), so the order is by MFU first.
ORACLE_SPAN_S = 1e11


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


def _class_index(gpus: np.ndarray) -> np.ndarray:
    """``priority.job_class`` of each size, as an index into ``CLASSES``."""
    sizes, inverse = np.unique(gpus, return_inverse=True)
    return np.array([CLASSES.index(job_class(int(g))) for g in sizes], dtype=np.int8)[inverse]


class Ordering:
    """Pending jobs' sort keys and placement kinds, from cached per-key, per-job and per-team terms.

    ``book`` holds the key histories; ``medians`` the class medians efficiency compares with
    (default: the same book; a replay's oracle passes the whole trace's). ``per_node``: the
    largest node's GPUs (a larger job needs whole nodes).
    """

    def __init__(self, policy: Policy, book: MfuBook, per_node: int, medians: MfuBook | None = None) -> None:
        self.policy, self.book, self.per_node = policy, book, per_node
        self.medians = medians or book
        p = policy
        self.prio = p.order == "priority"
        self.use_eff = self.prio and p.efficiency
        self.use_fair = self.prio and p.fair_share
        self.use_waste = self.prio and p.waste_charge
        self.jobs: list[Job] = []
        self.sub = np.zeros(0)
        self.gpus = np.zeros(0, dtype=np.int64)
        self.est = np.zeros(0)
        self.neg_tier = np.zeros(0)
        self.cls = np.zeros(0, dtype=np.int8)
        self.key_i = np.zeros(0, dtype=np.int64)
        self.team_i = np.zeros(0, dtype=np.int64)
        self.own_delay = np.zeros(0)
        self.own_factor = np.zeros(0)
        self.own_label = np.zeros(0, dtype=np.int64)
        self.own_until = np.zeros(0)            # a job's own signal is usable until then
        self.own: dict[int, tuple[float, str, float, float]] = {}   # row -> (mfu, label, confidence, at)
        self.own_why: dict[int, str] = {}
        self.oracle_mfu = np.zeros(0)           # Policy.order == "mfu" only
        self.keys_ix: dict[str, int] = {}
        self.key_names: list[str] = []
        self.key_delay = np.zeros((0, 3))
        self.key_factor = np.zeros((0, 3))
        self.key_label = np.zeros(0, dtype=np.int64)
        self.key_until = np.zeros(0)            # the key's history is usable until then
        self.key_cls: list[list[int]] = []      # the classes of a key's jobs (its delay is per class)
        self.key_why: dict[tuple[int, int], str] = {}
        self.labels: dict[str, int] = {UNKNOWN: 0}
        self.spread = np.array([may_spread(p, UNKNOWN)])
        self.teams_ix: dict[str, int] = {}
        self.team_names: list[str] = []
        self.team_delay = np.zeros(0)
        self.team_why: list[str] = []
        self.fair_at = -math.inf
        self.seen = [self.medians.class_median(c) for c in CLASSES]   # medians the terms use
        self.moved: set[int] = set()   # classes whose median moved since the last refresh

    # --- registering -------------------------------------------------------------------------------
    def _label(self, label: str) -> int:
        i = self.labels.get(label)
        if i is None:
            i = self.labels[label] = len(self.labels)
            self.spread = np.append(self.spread, may_spread(self.policy, label))
        return i

    def team(self, name: str) -> int:
        i = self.teams_ix.get(name)
        if i is None:
            i = self.teams_ix[name] = len(self.team_names)
            self.team_names.append(name)
            self.team_delay = np.append(self.team_delay, 0.0)
            self.team_why.append("")
        return i

    def add(self, jobs: Sequence[Job]) -> np.ndarray:
        """Register jobs (once each, in job-id order: the tie-break); returns their rows."""
        n0, n = len(self.jobs), len(jobs)
        self.jobs.extend(jobs)
        cat = np.concatenate
        gpus = np.fromiter((j.gpus for j in jobs), np.int64, n)
        cls = _class_index(gpus)
        self.sub = cat([self.sub, np.fromiter((j.submit for j in jobs), float, n)])
        self.gpus = cat([self.gpus, gpus])
        self.est = cat([self.est, np.fromiter((j.estimate_s for j in jobs), float, n)])
        self.neg_tier = cat([self.neg_tier, np.fromiter((-int(j.tier) for j in jobs), float, n)])
        self.cls = cat([self.cls, cls])
        key_i = np.fromiter((self._key_of(j.key) for j in jobs), np.int64, n)
        self.key_i = cat([self.key_i, key_i])
        self._grow_keys()
        fresh = set()   # keys with a class they did not have: their terms for it
        for k, c in set(zip(key_i.tolist(), cls.tolist(), strict=True)):
            if c not in self.key_cls[k]:
                self.key_cls[k].append(c)
                fresh.add(k)
        for k in sorted(fresh):
            self._key_terms(k)
        self.team_i = cat([self.team_i, np.fromiter((self.team(j.team) for j in jobs), np.int64, n)])
        self.own_delay = cat([self.own_delay, np.zeros(n)])
        self.own_factor = cat([self.own_factor, np.ones(n)])
        self.own_label = cat([self.own_label, np.zeros(n, dtype=np.int64)])
        self.own_until = cat([self.own_until, np.full(n, -np.inf)])
        self.oracle_mfu = cat([self.oracle_mfu, np.full(n, np.nan)])
        return np.arange(n0, n0 + n)

    def _key_of(self, name: str) -> int:
        i = self.keys_ix.get(name)
        if i is None:
            i = self.keys_ix[name] = len(self.key_names)
            self.key_names.append(name)
        return i

    def _grow_keys(self) -> None:
        new = len(self.key_names) - len(self.key_until)
        if new > 0:
            self.key_delay = np.vstack([self.key_delay, np.zeros((new, 3))])
            self.key_factor = np.vstack([self.key_factor, np.ones((new, 3))])
            self.key_label = np.append(self.key_label, np.zeros(new, dtype=np.int64))
            self.key_until = np.append(self.key_until, np.full(new, -np.inf))
            self.key_cls.extend([] for _ in range(new))

    # --- what the runtime learns -----------------------------------------------------------------
    def _key_terms(self, k: int, classes: set[int] | None = None) -> None:
        """Key ``k``'s terms from the book: its delay per class, its label, how long it counts.
        ``classes``: only the delays of these (a refresh: the rest does not depend on medians)."""
        name = self.key_names[k]
        h = self.book.keys.get(name) if name else None   # a job without a key has no history
        if h is None:
            self.key_until[k] = -np.inf
            return
        p = self.policy
        hist = KeyHistory(h.mfu, h.label, max(h.weight, p.min_history_weight), h.updated)
        for c in self.key_cls[k] if classes is None else set(self.key_cls[k]) & classes:
            f, why = efficiency_factor(Job(0, _CLASS_GPUS[c], 0.0, 0.0, key=name), None, hist, p,
                                       self.medians.class_median(CLASSES[c]))
            self.key_delay[k, c] = efficiency_delay(f, p)
            self.key_factor[k, c] = f
            self.key_why[(k, c)] = why if f < 1.0 else ""
        if classes is not None:
            return
        self.key_label[k] = self._label(h.label)
        # decayed weight w * 2^-(t - updated)/half-life stays >= min_history_weight until:
        self.key_until[k] = (h.updated + self.book.half_life_s * math.log2(h.weight / p.min_history_weight)
                             if h.weight >= p.min_history_weight else -np.inf)

    def learned(self, key: str) -> None:
        """The book has a new observation of ``key`` (call it after every ``book.observe``): its
        terms now; every term of a class whose median the observation moved at ``refresh``."""
        k = self.keys_ix.get(key)
        if k is not None:
            self._key_terms(k)
        for i, c in enumerate(CLASSES):
            m = self.medians.class_median(c)
            if m != self.seen[i]:
                self.seen[i] = m
                self.moved.add(i)

    def _own_terms(self, row: int) -> None:
        mfu, label, conf, _ = self.own[row]
        job = self.jobs[row]
        f, why = efficiency_factor(job, Signal(mfu, label, conf, 0.0), None, self.policy,
                                   self.medians.class_median(job_class(job.gpus)))
        self.own_delay[row] = efficiency_delay(f, self.policy)
        self.own_factor[row] = f
        self.own_why[row] = why if f < 1.0 else ""
        self.own_label[row] = self._label(label)

    def hear(self, row: int, mfu: float, label: str, confidence: float, at: float) -> None:
        """The job's own latest signal, last heard from at ``at``: usable while it is younger
        than ``Policy.max_signal_age_s`` and confident enough (``priority.signal_usable``)."""
        p = self.policy
        self.own[row] = (mfu, label, confidence, at)
        self._own_terms(row)
        self.own_until[row] = at + p.max_signal_age_s if confidence >= p.min_signal_confidence else -np.inf

    def signal_of(self, row: int, now: float) -> Signal | None:
        """The job's own latest signal as a runtime hands it to ``policy.order_queue`` (heard at
        ``inf``: a running job's, always fresh)."""
        own = self.own.get(row)
        return None if own is None else Signal(own[0], own[1], own[2], max(0.0, now - own[3]))

    def know_mfu(self, rows: np.ndarray, mfu: np.ndarray) -> None:
        """``Policy.order == "mfu"``: every job's MFU known up front (only a replay knows it)."""
        self.oracle_mfu[rows] = mfu

    def set_teams(self, shares: Mapping[str, TeamShare], now: float) -> None:
        """Each team's fair-share delay from its decayed use against its quota; absent: none."""
        for t in shares:
            self.team(t)
        for i, t in enumerate(self.team_names):
            d, why = fair_share_delay(shares.get(t), self.policy) if self.use_fair else (0.0, "")
            self.team_delay[i], self.team_why[i] = d, why
        self.fair_at = now

    def refresh(self) -> None:
        """After class medians moved: the efficiency terms of those classes against the new ones."""
        if not self.moved:
            return
        moved = self.moved
        for key in self.book.keys:
            k = self.keys_ix.get(key)
            if k is not None and not moved.isdisjoint(self.key_cls[k]):
                self._key_terms(k, moved)
        for row in self.own:
            if int(self.cls[row]) in self.moved:
                self._own_terms(row)
        self.moved.clear()

    # --- the order -------------------------------------------------------------------------------
    def _valid(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = self.key_i[rows]
        return k, self.own_until[rows] >= now, self.key_until[k] >= now

    def keys(self, rows: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(effective submit time, placement kind) of ``rows`` at ``now`` (``priority``'s terms)."""
        k, own, hist = self._valid(rows, now)
        eff = 0.0
        if self.use_eff:
            eff = np.where(own, self.own_delay[rows], np.where(hist, self.key_delay[k, self.cls[rows]], 0.0))
        elif self.policy.order == "mfu":
            eff = np.nan_to_num((1.0 - self.oracle_mfu[rows]) * ORACLE_SPAN_S)
        fair = self.team_delay[self.team_i[rows]] if self.use_fair else 0.0
        keys = self.sub[rows] + eff + fair
        label = np.where(own, self.own_label[rows], np.where(hist, self.key_label[k], 0))
        kinds = np.where(self.gpus[rows] > self.per_node, WHOLE,
                         np.where(self.spread[label], SPREAD, ONE_NODE)).astype(np.int8)
        return keys, kinds

    def charge(self, rows: np.ndarray, now: float) -> np.ndarray:
        """What each GPU of ``rows``' jobs costs its team in the order across teams:
        ``priority.waste_charge`` of the job's efficiency factor (own signal, else key history,
        else neutral), 1 with the charge off."""
        if not self.use_waste:
            return np.ones(len(rows))
        k, own, hist = self._valid(rows, now)
        f = np.where(own, self.own_factor[rows], np.where(hist, self.key_factor[k, self.cls[rows]], 1.0))
        return 1.0 + self.policy.waste_weight * (1.0 - f)

    def why(self, rows: np.ndarray, now: float) -> dict[int, str]:
        """What lowered (or raised) each job, in words: its efficiency term, its team's term, the
        waste charge its GPUs cost its team."""
        out: dict[int, str] = {}
        k, own, hist = self._valid(rows, now)
        charge = self.charge(rows, now)
        for r, kk, o, h, c in zip(rows.tolist(), k.tolist(), own.tolist(), hist.tolist(), charge.tolist(),
                                  strict=True):
            e = "" if not self.use_eff else self.own_why[r] if o else (
                self.key_why.get((kk, int(self.cls[r])), "") if h else "")
            f = self.team_why[self.team_i[r]] if self.use_fair else ""
            team = self.jobs[r].team or "(none)"
            w = (f"waste charge: its GPUs count {c:.2f}x toward team {team}'s share for low MFU"
                 if c > 1.0 + 1e-9 else "")
            text = "; ".join(x for x in (e, f, w) if x)
            if text:
                out[self.jobs[r].id] = text
        return out

    def queue(self, rows: np.ndarray, now: float, why: bool = False) -> PendingQueue:
        """``rows`` as the ordered ``PendingQueue`` the pass walks: tier, key, then row."""
        keys, kinds = self.keys(rows, now)
        jobs = np.empty(len(rows), dtype=object)
        jobs[:] = [self.jobs[r] for r in rows.tolist()]
        return PendingQueue.of(jobs, self.gpus[rows], self.est[rows], kinds, keys, rows, self.neg_tier[rows],
                               self.why(rows, now) if why else {})

    def team_order(self, q: PendingQueue, use: np.ndarray, quotas: Mapping[str, float],
                   total_gpus: int | None, now: float, charged: np.ndarray | None = None) -> np.ndarray:
        """``team_queues.interleave``'s permutation of ``q`` (rows of this ordering as tags).

        ``use``: GPUs each team (by ``team_names`` index) holds now; ``charged``: the same
        GPUs counted with the waste charge (``use_of``; default: ``use``); ``quotas`` the
        runtime's map (a team without one gets the equal share ``team_queues.team_quotas``
        documents). Pending jobs count at their own charge (``charge``) as they are given GPUs.
        """
        if not quotas.keys() <= self.teams_ix.keys():
            for t in quotas:
                self.team(t)
        charged = use if charged is None else charged
        if len(use) < len(self.team_names):
            use = np.append(use, np.zeros(len(self.team_names) - len(use)))
        if len(charged) < len(self.team_names):
            charged = np.append(charged, np.zeros(len(self.team_names) - len(charged)))
        tags = q.tag
        team = self.team_i[tags]
        n = len(self.team_names)
        quota = np.array([quotas.get(t, 0.0) for t in self.team_names])
        present = (np.bincount(team, minlength=n) > 0) | (use > 0)
        if not (quota > 0).all():   # who is present only sizes the equal share of teams without one
            quota = team_quotas(present, quota, total_gpus)
        # each present team's (GPUs in use, quota, in use as charged): what the reasons name when
        # fair share decides
        q.share = {t: (float(use[i]), float(quota[i]), float(charged[i]))
                   for i, t in enumerate(self.team_names) if present[i]}
        return interleave(q.neg_tier, team, q.key, tags, q.gpus * self.charge(tags, now), self.sub[tags],
                          charged, quota, now, self.policy.team_overdue_s)

    def running_charge(self, job: Job, signal: Signal | None, now: float) -> float:
        """``priority.waste_charge`` of a running job: its own signal, else its key's history."""
        if not self.use_waste:
            return 1.0
        h = self.book.lookup(job.key, now) if job.key else None
        f, _ = efficiency_factor(job, signal, h, self.policy, self.medians.class_median(job_class(job.gpus)))
        return waste_charge(f, self.policy)

    def use_of(self, running: Sequence[Running], signals: Mapping[int, Signal] | None = None,
               now: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(GPUs each team holds in ``running``, the same with the waste charge), by
        ``team_names`` index (registers new teams)."""
        idx = np.array([self.team(r.job.team) for r in running], dtype=np.int64)
        g = np.array([r.job.gpus for r in running], float)
        c = np.array([self.running_charge(r.job, (signals or {}).get(r.job.id), now) for r in running], float)
        use, charged = np.zeros(len(self.team_names)), np.zeros(len(self.team_names))
        np.add.at(use, idx, g)
        np.add.at(charged, idx, g * c)
        return use, charged
