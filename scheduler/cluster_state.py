"""Which GPUs are free, kept so that a placement question costs O(GPUs per node), not O(nodes).

Nodes are bucketed by free GPUs (best fit: the first node of the first non-empty bucket at or
above the request); per rack, the free GPUs and wholly free nodes. Counts are of *placeable* GPUs
(a drained node offers none), while the bitmask keeps the truth, so its jobs release what they took.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from gpudiag.scheduler.model import Cluster, Placement


class ClusterState:
    """Free GPUs per node, with the indices of the free ones (a bitmask per node)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.size = [n.gpus for n in cluster.nodes]
        self.rack = [n.rack for n in cluster.nodes]
        self.usable = [n.available for n in cluster.nodes]
        usable_sizes = {g for g, u in zip(self.size, self.usable, strict=True) if u}
        # the largest node a job can be placed on: a job of more GPUs needs whole nodes
        self.max_gpus = max(usable_sizes, default=0)
        # every usable node has max_gpus GPUs: whole-node placement takes the fast path
        self.uniform = len(usable_sizes) <= 1
        self.real = list(self.size)   # free GPUs, placeable or not
        self.free = [g if u else 0 for g, u in zip(self.size, self.usable, strict=True)]
        self.mask = [(1 << g) - 1 for g in self.size]
        self.buckets: list[list[int]] = [[] for _ in range(self.max_gpus + 1)]
        for i, g in enumerate(self.free):
            self.buckets[g].append(i)
        self.racks = max(self.rack) + 1
        self.rack_nodes: list[list[int]] = [[] for _ in range(self.racks)]
        for i, r in enumerate(self.rack):
            self.rack_nodes[r].append(i)
        self.rack_free = [sum(self.free[i] for i in nodes) for nodes in self.rack_nodes]
        self.rack_whole = [sum(1 for i in nodes if self.usable[i]) for nodes in self.rack_nodes]
        self.whole: list[int] = [i for i, u in enumerate(self.usable) if u]   # sorted wholly free nodes
        self.total_free = sum(self.free)
        self.total_gpus = self.total_free   # placeable GPUs: drained and down nodes' are not

    # -- queries --------------------------------------------------------------------------
    def max_free_on_a_node(self) -> int:
        for k in range(self.max_gpus, 0, -1):
            if self.buckets[k]:
                return k
        return 0

    def best_fit_node(self, gpus: int, exclude: dict[int, int] | None = None) -> int | None:
        """The node with the fewest free GPUs >= ``gpus`` (lowest index on ties).

        ``exclude`` maps node -> GPUs usable there (a reservation's spare); nodes it names are
        skipped when their spare is below the request.
        """
        for k in range(gpus, self.max_gpus + 1):
            for n in self.buckets[k]:
                if exclude is None or n not in exclude or exclude[n] >= gpus:
                    return n
        return None

    # -- changes --------------------------------------------------------------------------
    def _set_free(self, node: int, real: int) -> None:
        self.real[node] = real
        new = real if self.usable[node] else 0
        old = self.free[node]
        if old == new:
            return
        b = self.buckets[old]
        del b[bisect_left(b, node)]
        insort(self.buckets[new], node)
        full = self.size[node]
        r = self.rack[node]
        if old == full:
            del self.whole[bisect_left(self.whole, node)]
            self.rack_whole[r] -= 1
        if new == full:
            insort(self.whole, node)
            self.rack_whole[r] += 1
        self.rack_free[r] += new - old
        self.total_free += new - old
        self.free[node] = new

    def take(self, node: int, gpus: int) -> tuple[int, ...]:
        """Take the ``gpus`` lowest-indexed free GPUs of ``node``; returns their indices."""
        m = self.mask[node]
        got = []
        i = 0
        while len(got) < gpus:
            if m >> i & 1:
                got.append(i)
            i += 1
            if i > self.size[node]:
                raise ValueError(f"node {node} has fewer than {gpus} free GPUs")
        for i in got:
            m &= ~(1 << i)
        self.mask[node] = m
        self._set_free(node, self.real[node] - gpus)
        return tuple(got)

    def allocate(self, plan: list[tuple[int, int]]) -> Placement:
        """Take (node, count) pairs; all-or-nothing: checked before anything is taken."""
        for node, g in plan:
            if g > self.free[node]:
                raise ValueError(f"node {node}: {g} GPUs asked, {self.free[node]} free")
        return Placement(tuple((node, self.take(node, g)) for node, g in plan))

    def occupy(self, placement: Placement) -> None:
        """Mark exactly these GPUs as used (rebuilding state from running jobs)."""
        for node, idx in placement.slots:
            m = self.mask[node]
            for i in idx:
                if not m >> i & 1:
                    raise ValueError(f"GPU {i} of node {node} given twice")
                m &= ~(1 << i)
            self.mask[node] = m
            self._set_free(node, self.real[node] - len(idx))

    def release(self, placement: Placement) -> None:
        for node, idx in placement.slots:
            m = self.mask[node]
            for i in idx:
                if m >> i & 1:
                    raise ValueError(f"GPU {i} of node {node} released twice")
                m |= 1 << i
            self.mask[node] = m
            self._set_free(node, self.real[node] + len(idx))

    @contextmanager
    def released(self, placements: Iterable[Placement]) -> Iterator[None]:
        """The cluster as it will be once these jobs (in their grace period) are gone: for asking
        where a job would go then; nothing may be allocated inside."""
        placements = list(placements)
        for p in placements:
            self.release(p)
        try:
            yield
        finally:
            for p in placements:
                self.occupy(p)
