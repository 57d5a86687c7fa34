"""The scheduler's invariants, checked on every pass a runtime makes (``Checker``), against a
reference written from the rules (``fits``, ``ref_shadow``), not from the code under test.

Used by tests/unit/test_scheduler_statemachine.py; the invariants are listed in its docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpudiag.scheduler.model import Cluster, Placement, Tier
from gpudiag.scheduler.pending import ONE_NODE, SPREAD, WHOLE

EPS = 1e-6
Free = dict[int, set[int]]


def gpus_of(p: Placement) -> set[tuple[int, int]]:
    return {(n, i) for n, idx in p.slots for i in idx}


def _add(free: Free, p: Placement) -> None:
    for n, idx in p.slots:
        free[n] |= set(idx)


def _future(free: Free, ahead: list, held: list) -> Free:
    """Free GPUs once the jobs the pass starts have taken theirs and the jobs stopping have let
    theirs go: what a preemptor can count on without new victims."""
    future = {n: set(s) for n, s in free.items()}
    for d in ahead:
        _take(future, d.placement)
    for h in held:
        if h.stopping:
            _add(future, h.placement)
    return future


def _take(free: Free, p: Placement) -> None:
    for n, idx in p.slots:
        free[n] -= set(idx)


# --- the reference: placement and reservation by their written rules, independent of the code ----

def fits(cluster: Cluster, free: Free, gpus: int, kind: int) -> bool:
    """One node with enough free GPUs; or (may spread) one rack with enough; or (larger than any
    usable node) wholly free usable nodes whose GPUs add up to the request."""
    usable = [n for n in cluster.nodes if n.available]
    if kind == WHOLE:
        return sum(n.gpus for n in usable if len(free[n.index]) == n.gpus) >= gpus
    if any(len(free[n.index]) >= gpus for n in usable):
        return True
    racks: dict[int, int] = {}
    for n in usable:
        racks[n.rack] = racks.get(n.rack, 0) + len(free[n.index])
    return kind == SPREAD and any(v >= gpus for v in racks.values())


def ref_shadow(cluster: Cluster, free: Free, gpus: int, kind: int, ends: list[tuple[float, Placement]],
               now: float) -> float | None:
    """When the head fits (a spreading head is reserved one node), releasing jobs at their ends."""
    kind = ONE_NODE if kind == SPREAD else kind
    free = {n: set(s) for n, s in free.items()}
    if fits(cluster, free, gpus, kind):
        return now
    for t, p in sorted(ends, key=lambda e: e[0]):
        _add(free, p)
        if fits(cluster, free, gpus, kind):
            return max(now, t)
    return None


@dataclass
class Held:
    """A job holding GPUs, as the truth has it."""

    id: int
    tier: Tier
    placement: Placement
    end: float          # start + estimate, or the kill deadline of a stopping job
    stopping: bool
    team: str = ""
    start: float = math.nan


@dataclass
class Waiting:
    id: int
    gpus: int
    tier: Tier
    submit: float
    estimate: float
    kind: int
    team: str = ""


@dataclass
class Checker:
    """Invariants 1-5 over one runtime's passes; remembers victims and the GPUs they freed.
    With ``quotas`` (team -> GPUs), 2 also checks quota reclaim: the reclaimer's team stays
    within its quota, no victim's team falls below its own; no victim younger than
    ``min_runtime_s`` (where ``Held.start`` is known)."""

    cluster: Cluster
    aging_bound_s: float
    quotas: dict[str, float] = field(default_factory=dict)
    min_runtime_s: float = 0.0
    promised: dict[tuple[int, int], int] = field(default_factory=dict)   # GPU -> preemptor
    victims: dict[int, tuple[int, Placement]] = field(default_factory=dict)   # victim -> (for, where)

    def ended(self, job_id: int, pending: set[int]) -> None:
        """A job's processes are gone: a victim's GPUs are promised to its preemptor."""
        v = self.victims.pop(job_id, None)
        if v is not None and v[0] in pending:
            for g in gpus_of(v[1]):
                self.promised[g] = v[0]

    def check(self, now: float, held: list[Held], waiting: dict[int, Waiting], order: list[int],
              decisions: list) -> None:
        cluster = self.cluster
        empty = {n.index: set(range(n.gpus)) for n in cluster.nodes}
        for g, p in list(self.promised.items()):   # void once it left, or cannot fit any more (drained)
            if p not in waiting or not fits(cluster, empty, waiting[p].gpus, waiting[p].kind):
                del self.promised[g]
        pos = {jid: i for i, jid in enumerate(order)}
        free: Free = {n.index: set(range(n.gpus)) for n in cluster.nodes}
        for h in held:
            _take(free, h.placement)
        in_use = {g for h in held for g in gpus_of(h.placement)}
        starts = [d for d in decisions if d.kind == "start"]
        preempts = [d for d in decisions if d.kind == "preempt"]
        holds = [d for d in decisions if d.kind == "hold"]
        head = holds[0].job_id if holds else None
        ahead = [d for d in starts if head is None or pos[d.job_id] < pos[head]]
        backfilled = [d for d in starts if d not in ahead]
        usable = {n.index for n in cluster.nodes if n.available}

        # 1. whole gangs on free GPUs of usable nodes, none given twice
        for d in starts:
            w = waiting[d.job_id]
            got = gpus_of(d.placement)
            assert len(got) == d.placement.gpus == w.gpus, f"job {w.id}: a partial gang {d.placement}"
            assert not got & in_use, f"job {w.id} started on GPUs in use: {sorted(got & in_use)}"
            assert {n for n, _ in got} <= usable, f"job {w.id} placed on a drained node: {d.placement}"
            for n, i in got:
                assert 0 <= i < cluster.nodes[n].gpus
            in_use |= got

        # 2. never more victims than the preemptor needs
        by_id = {h.id: h for h in held}
        if preempts:
            p = waiting[preempts[0].numbers["for_job"]]
            assert p.id == head, f"victims chosen for job {p.id}, but the head is {head}"
            future = _future(free, ahead, held)
            assert not fits(cluster, future, p.gpus, p.kind), (
                f"job {p.id} ({p.gpus} GPUs) preempted {[d.job_id for d in preempts]} although the GPUs "
                f"already on their way to being free suffice: {future}")
            victims = [by_id[d.job_id] for d in preempts]
            reclaim = any(d.numbers.get("reclaim") for d in preempts)
            for v in victims:
                assert not v.stopping, f"job {v.id} preempted again in its grace period"
                assert not now - v.start < self.min_runtime_s - EPS, f"job {v.id} preempted too young"
                if reclaim:
                    assert v.tier <= p.tier and v.team != p.team, f"job {v.id} reclaimed for job {p.id}"
                else:
                    assert v.tier < p.tier
            if reclaim:   # GPUs each team holds as the pass saw them: not stopping, or started ahead
                live: dict[str, float] = {}
                for x in [(h.team, len(gpus_of(h.placement))) for h in held if not h.stopping] + [
                        (waiting[d.job_id].team, waiting[d.job_id].gpus) for d in ahead]:
                    live[x[0]] = live.get(x[0], 0.0) + x[1]
                assert live.get(p.team, 0.0) + p.gpus <= self.quotas[p.team] + EPS, (
                    f"job {p.id} reclaimed past team {p.team}'s quota")
                for t in {v.team for v in victims}:
                    taken = sum(len(gpus_of(v.placement)) for v in victims if v.team == t)
                    assert live[t] - taken >= self.quotas[t] - EPS, (
                        f"reclaim took team {t} below its quota: {live[t]} - {taken} < {self.quotas[t]}")
            need_kind = ONE_NODE if p.kind == SPREAD else p.kind   # victims free one node
            for skip in victims:
                without = {n: set(s) for n, s in future.items()}
                for v in victims:
                    if v is not skip:
                        _add(without, v.placement)
                assert not fits(cluster, without, p.gpus, need_kind), (
                    f"job {p.id} did not need victim {skip.id}: victims {[v.id for v in victims]}")

        # 3. GPUs a victim freed reach its preemptor, or a job ahead of it, first - while it is the
        # head and they, with the GPUs of the jobs still stopping, are enough for it (once a job
        # ahead of it is the head, or took part of what it needed, the head's reservation is what
        # protects the order, and 4. checks that)
        future = _future(free, ahead, held)
        for g, p in list(self.promised.items()):
            if not fits(cluster, future, waiting[p].gpus, waiting[p].kind):
                del self.promised[g]
        started = {d.job_id for d in starts}
        for d in starts:
            for g in gpus_of(d.placement):
                p = self.promised.get(g)
                if p is not None and p not in started and p == head:
                    assert pos[d.job_id] < pos[p], (
                        f"job {d.job_id} (position {pos[d.job_id]}) started on GPU {g}, freed by a victim "
                        f"for job {p} (position {pos[p]}), which still waits")
        for g, p in list(self.promised.items()):
            if p in started or g in in_use:
                del self.promised[g]
        for d in preempts:
            self.victims[d.job_id] = (d.numbers["for_job"], by_id[d.job_id].placement)

        # 4. the head's reservation is not delayed by the jobs backfilled in this pass
        if head is not None and backfilled:
            h = waiting[head]
            deadline = {d.job_id: now + d.grace_s for d in preempts}
            ends = [(deadline.get(x.id, x.end), x.placement) for x in held]
            ends += [(now + waiting[d.job_id].estimate, d.placement) for d in ahead]
            free_now = {n: set(s) for n, s in free.items()}
            for d in ahead:
                _take(free_now, d.placement)
            before = ref_shadow(cluster, free_now, h.gpus, h.kind, ends, now)
            for d in backfilled:
                _take(free_now, d.placement)
            ends += [(now + waiting[d.job_id].estimate, d.placement) for d in backfilled]
            after = ref_shadow(cluster, free_now, h.gpus, h.kind, ends, now)
            if before is not None:
                assert after is not None and after <= before + EPS, (
                    f"backfilling {[d.job_id for d in backfilled]} delayed head job {head} "
                    f"({h.gpus} GPUs) from t={before - now:.1f}s to t={(after or math.inf) - now:.1f}s")

        # 5. the aging bound on the pass's order
        in_order = [waiting[i] for i in order]
        for i, later in enumerate(in_order):
            for earlier in in_order[:i]:
                if earlier.tier == later.tier:
                    assert earlier.submit <= later.submit + self.aging_bound_s + 1e-3
                else:
                    assert earlier.tier > later.tier


