"""Gang placement: where a job's GPUs go, all at once or not at all, and the head's reservation.

One node best fit for a job of at most a node (a known, not communication-bound label may spread
over one rack's nodes: ``ordering.may_spread``); wholly free nodes for a larger one (baselines: the
lowest-indexed; gpudiag: the fewest, from the fewest racks, ``pick_whole``). EASY's reservation
releases running jobs by expected end until the head fits; a head that may spread is reserved its
one-node placement (a rack-wide one starved the backfill: +12% mean JCT on Philly).
docs/scheduler.md, "Gang and placement" and docs/sim.md, "Traces and semantics".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import Placement

Plan = list[tuple[int, int]]   # (node, GPUs there)


def nodes_needed(gpus: int, per_node: int) -> int:
    return -(-gpus // per_node)


def one_node(state: ClusterState, gpus: int, spare: dict[int, int] | None = None) -> Plan | None:
    n = state.best_fit_node(gpus, spare)
    return None if n is None else [(n, gpus)]


def _split(gpus: int, per_node: int, nodes: list[int]) -> Plan:
    plan = [(n, per_node) for n in nodes[:-1]]
    return plan + [(nodes[-1], gpus - per_node * (len(nodes) - 1))]


def _fewest(nodes: Sequence[int], size: Sequence[int], gpus: int) -> list[int] | None:
    """The fewest of ``nodes`` whose GPUs add up to ``gpus``: the largest first, then the last one
    swapped for the smallest that still covers the remainder (best fit for what is left over)."""
    by_size = sorted(nodes, key=lambda n: (-size[n], n))
    got, chosen = 0, []
    for n in by_size:
        chosen.append(n)
        got += size[n]
        if got >= gpus:
            break
    else:
        return None
    rest = gpus - (got - size[chosen[-1]])
    last = min((n for n in by_size[len(chosen) - 1:] if size[n] >= rest), key=lambda n: (size[n], n))
    return chosen[:-1] + [last]


def _fill(chosen: list[int], size: Sequence[int], gpus: int, by_index: bool = False) -> Plan:
    """Every chosen node whole but one, which takes the remainder: the smallest (the fewest
    nodes leave none empty that way) or, ``by_index``, the last; in node order."""
    order = sorted(chosen) if by_index else sorted(chosen, key=lambda n: (-size[n], n))
    plan, left = [], gpus
    for n in order:
        take = min(size[n], left)
        plan.append((n, take))
        left -= take
    return sorted(plan)


def pick_whole(cands: Sequence[int], size: Sequence[int], rack: Sequence[int], gpus: int,
               fewest_racks: bool, uniform: bool) -> Plan | None:
    """Wholly free nodes (``cands``, by index) for a job larger than any one node.

    On a mixed cluster "larger than a node" means more GPUs than the largest usable node, and
    the job takes wholly free nodes whose GPUs add up to its request: gpudiag takes the fewest
    such nodes, all in one rack when one rack can give them (the rack leaving the least over),
    else spread over the racks with the most free GPUs; the baselines take the lowest-indexed
    nodes until the request is covered. Only one chosen node is left partly used (gpudiag's
    smallest, the baselines' last). On
    a uniform cluster this is ceil(g/G) nodes, as the published simulators do.
    """
    if uniform:
        if not cands:
            return None
        per = size[cands[0]]
        k = nodes_needed(gpus, per)
        if len(cands) < k:
            return None
        if not fewest_racks:
            return _split(gpus, per, list(cands[:k]))
        by_rack: dict[int, list[int]] = {}
        for n in cands:
            by_rack.setdefault(rack[n], []).append(n)
        fitting = [r for r, ns in by_rack.items() if len(ns) >= k]
        if fitting:   # one rack: the one with the fewest whole nodes that suffice (best fit)
            r = min(fitting, key=lambda r: (len(by_rack[r]), r))
            return _split(gpus, per, by_rack[r][:k])
        chosen: list[int] = []
        for r in sorted(by_rack, key=lambda r: (-len(by_rack[r]), r)):
            chosen.extend(by_rack[r][: k - len(chosen)])
            if len(chosen) == k:
                break
        return _split(gpus, per, sorted(chosen))
    if sum(size[n] for n in cands) < gpus:
        return None
    if not fewest_racks:
        got, chosen = 0, []
        for n in cands:
            chosen.append(n)
            got += size[n]
            if got >= gpus:
                break
        return _fill(chosen, size, gpus, by_index=True)
    fewest = _fewest(cands, size, gpus)
    k = len(fewest)
    by_rack = {}
    for n in cands:
        by_rack.setdefault(rack[n], []).append(n)
    best: tuple[tuple, list[int]] | None = None
    for r, ns in by_rack.items():   # one rack, if one can do it with the fewest nodes: least left over
        pick = _fewest(ns, size, gpus)
        if pick is not None and len(pick) == k:
            key = (sum(size[n] for n in pick) - gpus, len(ns), r)
            if best is None or key < best[0]:
                best = (key, pick)
    if best is not None:
        return _fill(best[1], size, gpus)
    # across racks: the racks with the most free GPUs first, each rack's largest nodes first,
    # unless that takes more nodes than the fewest possible
    order = [n for r in sorted(by_rack, key=lambda r: (-sum(size[n] for n in by_rack[r]), r))
             for n in sorted(by_rack[r], key=lambda n: (-size[n], n))]
    got, chosen = 0, []
    for n in order:
        chosen.append(n)
        got += size[n]
        if got >= gpus:
            break
    return _fill(chosen if len(chosen) == k else fewest, size, gpus)


def whole_nodes(state: ClusterState, gpus: int, fewest_racks: bool,
                banned: frozenset[int] = frozenset()) -> Plan | None:
    """Wholly free nodes for a job larger than a node (``pick_whole``)."""
    free = [n for n in state.whole if n not in banned] if banned else state.whole
    return pick_whole(free, state.size, state.rack, gpus, fewest_racks, state.uniform)


def rack_room(state: ClusterState, banned: frozenset[int] = frozenset()) -> list[int]:
    """Each rack's free GPUs, those of ``banned`` nodes left out."""
    if not banned:
        return state.rack_free
    room = list(state.rack_free)
    for n in banned:
        room[state.rack[n]] -= state.free[n]
    return room


def spread(state: ClusterState, gpus: int, banned: frozenset[int] = frozenset()) -> Plan | None:
    """Fewest nodes inside one rack (the rack with the least room that suffices); never across racks.

    A job that fits on one node spans racks only at twice the cost (``slowdown``) for no gain
    in what it can use: if no rack has room, it waits for one (or for a node).
    """
    if state.total_free < gpus:
        return None
    room = rack_room(state, banned)
    best = -1   # the rack with the least room that suffices, ties to the lowest index
    for r, g in enumerate(room):
        if g >= gpus and (best < 0 or g < room[best]):
            best = r
    if best < 0:
        return None
    plan: Plan = []
    need = gpus
    for n in sorted((n for n in state.rack_nodes[best] if state.free[n] and n not in banned),
                    key=lambda n: (-state.free[n], n)):
        take = min(need, state.free[n])
        plan.append((n, take))
        need -= take
        if need == 0:
            break
    return plan


@dataclass
class Rule:
    """How one job may be placed."""

    gpus: int
    whole: bool           # needs wholly free nodes (more GPUs than one node has)
    fewest_racks: bool    # whole nodes from the fewest racks (gpudiag) or lowest index (baselines)
    may_spread: bool      # a one-node job that may span nodes when no node fits


def place(state: ClusterState, rule: Rule, spare: dict[int, int] | None = None,
          banned: frozenset[int] = frozenset()) -> Plan | None:
    """Where the job goes now, or None. ``spare``/``banned`` keep a reservation's GPUs."""
    if rule.gpus > state.total_free:
        return None
    if rule.whole:
        return whole_nodes(state, rule.gpus, rule.fewest_racks, banned)
    plan = one_node(state, rule.gpus, spare)
    if plan is None and rule.may_spread:
        plan = spread(state, rule.gpus, banned)
    return plan


@dataclass
class Reservation:
    """The head's start time and what long backfill jobs may still use.

    ``firm``: the head waits only for jobs in their grace period (a preemption it caused, or a
    cancel), which may end any moment before their kill deadline (the shadow): no backfill job
    may count on ending before it, and the reserved nodes' GPUs go to no one else at all.
    """

    shadow: float
    nodes: frozenset[int]                            # nodes the head will use
    spare: dict[int, int] = field(default_factory=dict)   # reserved node -> GPUs a long job may use
    firm: bool = False
    # (job id, placement) of the jobs released to find the shadow, in order of their end
    released: Sequence[tuple[int, Placement]] = ()

    @property
    def waits_for(self) -> tuple[int, ...]:
        """The jobs on the reserved nodes whose end the head waits for (computed when a reason
        asks: a replay's millions of passes never do)."""
        return tuple(j for j, p in self.released if any(n in self.nodes for n, _ in p.slots))

    def cap(self, node: int, free: int) -> int:
        """GPUs of ``node`` a long job may take."""
        return min(free, self.spare[node]) if node in self.spare else free

    def allows(self, plan: Plan) -> bool:
        return all(n not in self.spare or g <= self.spare[n] for n, g in plan)

    def charge(self, plan: Plan) -> None:
        for n, g in plan:
            if n in self.spare:
                self.spare[n] -= g


def reserve(state: ClusterState, rule: Rule, by_end: Iterable[tuple[float, int, Placement]],
            now: float) -> Reservation | None:
    """Release running jobs in order of expected end until the head fits; reserve its GPUs then.

    None when the head cannot fit even on an empty cluster (runtimes reject such jobs earlier).
    """
    free = list(state.free)
    size, usable = state.size, state.usable
    whole_g = len(state.whole) * state.max_gpus if state.uniform else sum(size[n] for n in state.whole)
    released: list[tuple[int, Placement]] = []

    shadow = now
    if (whole_g < rule.gpus) if rule.whole else (state.max_free_on_a_node() < rule.gpus):
        found = False
        for end, job_id, placement in by_end:
            if found and end > shadow:   # jobs ending at the same instant are released together
                break
            released.append((job_id, placement))
            hit = False   # only a node this job releases GPUs on can newly fit a one-node head
            for n, idx in placement.slots:
                if not usable[n]:
                    continue   # a drained node's GPUs are never placed again
                before = free[n]
                free[n] += len(idx)
                if free[n] == size[n] and before < size[n]:
                    whole_g += size[n]
                hit = hit or free[n] >= rule.gpus
            if not found:
                shadow = max(now, end)
                found = whole_g >= rule.gpus if rule.whole else hit
        if not found:
            return None
    if rule.whole:
        cands = [n for n in range(len(free)) if usable[n] and free[n] == size[n]]
        plan = pick_whole(cands, size, state.rack, rule.gpus, rule.fewest_racks, state.uniform) or []
        if len({state.rack[n] for n, _ in plan}) > 1:
            # no one rack will do: reserve the lowest-indexed nodes (the baselines' choice), as
            # this reservation always has. Reserving the racks pick_whole spreads over instead
            # raised gpudiag's mean JCT on the full Philly replay from 86,676 s to 93,988 s.
            plan = pick_whole(cands, size, state.rack, rule.gpus, False, state.uniform) or []
        nodes = frozenset(n for n, _ in plan)
        # the whole-node rule needs these nodes wholly free at the shadow time, even the last
        # one whose remainder the head will not use: nothing of them is spare for long jobs
        spare = dict.fromkeys(nodes, 0)
    else:
        n = min((n for n in range(len(free)) if free[n] >= rule.gpus), key=lambda n: (free[n], n))
        nodes, spare = frozenset((n,)), {n: free[n] - rule.gpus}
    return Reservation(shadow, nodes, spare=spare, released=released)


def promise(state: ClusterState, rule: Rule, stopping: Sequence[tuple[float, int, Placement]],
            now: float) -> Reservation | None:
    """The head's reservation when the GPUs of jobs in their grace period are enough for it.

    ``stopping``: (kill deadline, job id, placement) of every job told to stop. The head is
    reserved what ``reserve`` finds releasing only those jobs, by deadline: the earliest
    placement they free (the deadline is an upper bound: they may stop sooner), made firm, with
    nothing of those nodes spare for others until it starts. A
    head that may spread and fits no one node even then is promised where it would spread once
    they are all gone. None when it would not fit even then (it may need victims, or waits as
    any head does).
    """
    res = reserve(state, rule, sorted(stopping, key=lambda x: x[0]), now)
    if res is not None:
        # the stopping jobs may end in any order, any moment: a GPU of those nodes given away now
        # could be the one that would have let the head start at the first exit
        res.firm, res.spare = True, dict.fromkeys(res.nodes, 0)
        return res
    if not rule.may_spread:
        return None
    with state.released(p for _, _, p in stopping):
        plan = place(state, rule)
        if plan is None:
            return None
        nodes = frozenset(n for n, _ in plan)
    spare = dict.fromkeys(nodes, 0)
    on = sorted((end, j, p) for end, j, p in stopping if any(n in nodes for n, _ in p.slots))
    return Reservation(max([now, *(e for e, _, _ in on)]), nodes, spare=spare, firm=True,
                       released=[(j, p) for _, j, p in on])
