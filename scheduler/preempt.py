"""Victims for a blocked higher-tier job: the least useful work lost, then the fewest jobs.

Only a strictly higher tier preempts, only preemptible jobs that have run ``Policy.min_runtime_s``
(so two tiers cannot thrash each other's jobs), and never a job already in its grace period.
Useful work lost by killing a job now = MFU x GPUs x seconds since its last checkpoint: a
victim gets SIGTERM and its grace period to checkpoint, but what it computed since the last
checkpoint is what we assume is lost if it cannot. A job without a usable MFU counts at its
class median (neutral, like the priority's treatment of unknown jobs).

For a one-node head we look at every node and, per node, take its eligible jobs in order of
lost work until enough GPUs are free (a greedy cover, exact for one victim and close otherwise);
the cheapest node wins. A head needing whole nodes takes the cheapest nodes whose every job is
eligible; a victim spanning two chosen nodes is counted on each (an over-estimate, never under).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import TIER_NAMES, Decision, Job, Policy, Running
from gpudiag.scheduler.placement import Rule, nodes_needed
from gpudiag.scheduler.priority import fmt_mfu


def lost_work(r: Running, mfu: float, now: float) -> float:
    """GPU-seconds of useful (MFU-weighted) work since the job's last checkpoint."""
    return mfu * r.job.gpus * max(0.0, now - r.last_checkpoint)


def choose_victims(state: ClusterState, head: Job, rule: Rule, running: Sequence[Running], now: float,
                   policy: Policy, mfu_of: Callable[[Running], float]) -> list[Decision]:
    """Preempt decisions that let ``head`` start once the victims are gone; [] if none can."""
    eligible = [r for r in running
                if r.job.tier < head.tier and r.job.preemptible and not r.terminating
                and now - r.start >= policy.min_runtime_s]
    if not eligible:
        return []
    cost = {r.job.id: lost_work(r, mfu_of(r), now) for r in eligible}
    on_node: dict[int, list[Running]] = {}
    for r in eligible:
        for n in r.placement.nodes:
            on_node.setdefault(n, []).append(r)
    best: tuple[float, int, int] | None = None
    chosen: list[Running] = []
    if rule.whole:
        per_node_all: dict[int, list[Running]] = {}
        for r in running:
            for n in r.placement.nodes:
                per_node_all.setdefault(n, []).append(r)
        options = []
        for n in range(len(state.free)):
            users = per_node_all.get(n, [])
            if all(u.job.id in cost for u in users):
                options.append((sum(cost[u.job.id] for u in users), len(users), n, users))
        k = nodes_needed(rule.gpus, state.max_gpus)
        if len(options) < k:
            return []
        options.sort(key=lambda o: o[:3])
        seen: dict[int, Running] = {}
        for o in options[:k]:
            for u in o[3]:
                seen[u.job.id] = u
        chosen = list(seen.values())
    else:
        for n, rs in on_node.items():
            need = rule.gpus - state.free[n]
            if need <= 0 or state.size[n] < rule.gpus:
                continue
            got, total, picked = 0, 0.0, []
            for r in sorted(rs, key=lambda r: (cost[r.job.id], r.job.id)):
                got += sum(len(idx) for node, idx in r.placement.slots if node == n)
                total += cost[r.job.id]
                picked.append(r)
                if got >= need:
                    break
            if got >= need and (best is None or (total, len(picked), n) < best):
                best, chosen = (total, len(picked), n), picked
    out = []
    for r in chosen:
        grace = r.job.grace_s
        mfu = mfu_of(r)
        since = max(0.0, now - r.last_checkpoint)
        out.append(Decision(
            "preempt", r.job.id,
            f"victim: lowest useful work lost (MFU {fmt_mfu(mfu)} x {r.job.gpus} GPUs x {since / 60:.0f} min "
            f"since checkpoint = {cost[r.job.id] / 3600:.1f} GPU-h) so that job {head.id} "
            f"({TIER_NAMES[head.tier]}) can start; SIGTERM, {grace:.0f} s grace",
            placement=r.placement, grace_s=grace,
            numbers={"lost_gpu_s": cost[r.job.id], "mfu": mfu, "for_job": head.id,
                     "victim_tier": int(r.job.tier), "head_tier": int(head.tier)}))
    return out
