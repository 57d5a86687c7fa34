"""Why each pending job waits, taken from the pass that decided: one wording for every runtime.

A pass (``policy.plan``) returns its decisions together with what it saw - the ordered queue and
the cluster after its own starts - and the reasons are read from those, never from a second
planning: a second planning (without preemption) once told an on-demand job it would start "in
1407 min" while the pass it lost to was preempting for it. Reasons are structured (``Why``), so
a runtime can put them in its own words (slots for GPUs, clock times, whether an estimate means
anything) without parsing the policy's sentence; ``text`` is that sentence in the policy's words
(GPUs, times as ``t=…s`` on the runtime's clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from gpudiag.scheduler.cluster_state import ClusterState
from gpudiag.scheduler.model import TIER_NAMES, Decision, Policy, n_gpus
from gpudiag.scheduler.pending import SPREAD, WHOLE, PendingQueue


@dataclass(frozen=True)
class Why:
    """One pending job as the pass left it."""

    starts: bool                      # started by this pass
    text: str                         # the reason in the policy's words
    position: int                     # in the pass's order (0: first)
    need: str = ""                    # what blocks it: "needs 4 GPUs on one node, at most 2 free on one"
    lowered: str = ""                 # what lowered its priority (efficiency, fair-share delay)
    head: bool = False                # the first job that did not fit
    start_at: float | None = None     # the head's reserved start (its shadow), if it has one
    waits_for: tuple[int, ...] = ()   # the head: running jobs whose end frees its GPUs
    firm: bool = False                # the head waits only for jobs in their grace period
    ahead: int | None = None          # the job just ahead in the order (not for the head)
    fair_share: bool = False          # the job ahead passed it by fair share (team queues)
    reclaim: str = ""                 # the head: its victims were reclaimed for its team's quota


def _charged(use: float, charged: float) -> str:
    """The waste charge in a team's share, when there is one (``Policy.waste_charge``)."""
    if charged <= use + 5e-3:
        return ""
    return f" (charged as {charged:.3g}: {charged - use:.3g} GPUs for low MFU)"


def _ahead_words(queue: PendingQueue, pos: int) -> tuple[str, bool]:
    """"behind job 12 (on-demand)", naming fair share when that is why a later job is ahead."""
    job, ahead = queue.jobs[pos], queue.jobs[pos - 1]
    if ahead.tier != job.tier:
        return f"behind job {ahead.id} ({TIER_NAMES[ahead.tier]})", False
    share = queue.share
    if ahead.submit > job.submit and ahead.team != job.team and job.team in share and ahead.team in share:
        (u, q, c), (ua, qa, ca) = share[job.team], share[ahead.team]
        return (f"behind job {ahead.id} of team {ahead.team}: fair share (team {job.team} uses "
                f"{u:.3g}{_charged(u, c)} of its {q:.3g}-GPU quota, team {ahead.team} "
                f"{ua:.3g}{_charged(ua, ca)} of {qa:.3g})"), True
    return f"behind job {ahead.id} ({TIER_NAMES[ahead.tier]})", False


def wait_reasons(state: ClusterState, queue: PendingQueue, decisions: Mapping[int, Decision],
                 policy: Policy) -> dict[int, Why]:
    """For every job of the pass's ordered queue: started, or why not - its position, what
    blocks it, what lowered its priority. ``state`` is the cluster after the pass's starts."""
    out: dict[int, Why] = {}
    kinds = queue.kind
    hold = next((d for d in decisions.values() if d.kind == "hold"), None)
    for pos, job in enumerate(queue.jobs):
        d = decisions.get(job.id)
        lowered = queue.why.get(job.id, "")
        if d is not None and d.kind == "start":
            out[job.id] = Why(True, d.reason, pos)
            continue
        if d is not None and d.kind == "hold":
            nums = d.numbers
            res = nums.get("reservation")
            text = "; ".join(w for w in (d.reason, lowered) if w)
            out[job.id] = Why(False, text, pos, need=nums.get("need", ""), lowered=lowered, head=True,
                              start_at=nums.get("shadow"), waits_for=res.waits_for if res else (),
                              firm=bool(nums.get("firm")), reclaim=nums.get("reclaim", ""))
            continue
        kind = int(kinds[pos])
        if kind == SPREAD:
            need = f"needs {n_gpus(job.gpus)}, {state.total_free} free"
            room = job.gpus <= state.total_free
        elif kind == WHOLE:
            need = f"needs {n_gpus(job.gpus)} on whole nodes, {len(state.whole)} nodes wholly free"
            room = job.gpus <= sum(state.size[n] for n in state.whole)
        else:
            most = state.max_free_on_a_node()
            need = f"needs {n_gpus(job.gpus)} on one node, at most {most} free on one"
            room = job.gpus <= most
        if room and hold is not None and hold.numbers.get("shadow") is not None:
            need += f" (held for job {hold.job_id}, the head)"
        parts, fair, ahead = [need], False, None
        if pos > 0:
            words, fair = _ahead_words(queue, pos)
            parts.append(words)
            ahead = queue.jobs[pos - 1].id
        if lowered:
            parts.append(lowered)
        out[job.id] = Why(False, "; ".join(parts), pos, need=need, lowered=lowered, ahead=ahead,
                          fair_share=fair)
    return out


class Pass:
    """One pass: its decisions, the order it walked, and (computed when first asked, from this
    pass's own queue and cluster) why each pending job waits. Runtimes keep the last one so
    ``gpudiag queue`` shows what decided."""

    def __init__(self, decisions: list[Decision], state: ClusterState, queue: PendingQueue,
                 policy: Policy, at: float) -> None:
        self.decisions = decisions
        self.at = at
        self.queue, self._state, self._policy = queue, state, policy

    @cached_property
    def order(self) -> list[int]:
        return [j.id for j in self.queue.jobs]

    @cached_property
    def why(self) -> dict[int, Why]:
        return wait_reasons(self._state, self.queue, {d.job_id: d for d in self.decisions}, self._policy)
