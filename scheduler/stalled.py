"""What to do with a job that has stopped finishing steps: a decision of the policy core.

The agent says a job is stalled (``Signal.stalled_s``: no step for longer than its stall limit,
with the stall's cause) and exports its MFU as 0, so ordering, efficiency and victim choice
already treat it as doing no work. Beyond that, an administrator may ask for action: with
``Policy.stalled_action`` set, a running job whose signal has been stalled for
``Policy.stalled_after_s`` or longer is requeued or cancelled, one decision per job, each with
its numbers in one line. Pure: the runtimes carry the decisions out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpudiag.durations import format_duration
from gpudiag.scheduler.model import Policy, Signal

ACTIONS = ("requeue", "cancel")


@dataclass(frozen=True)
class StalledDecision:
    job_id: int
    action: str          # one of ACTIONS
    reason: str          # one line, with the numbers behind it


def _age(s: float) -> str:
    return format_duration(round(s)) if s >= 1 else f"{s:.1f}s"


def stalled_decisions(running: Mapping[int, Signal], policy: Policy) -> list[StalledDecision]:
    """One decision per running job stalled for at least ``policy.stalled_after_s`` (none when
    ``policy.stalled_action`` is "off"). ``running``: the running jobs' own signals."""
    if policy.stalled_action not in ACTIONS:
        return []
    out = []
    for job_id, s in sorted(running.items()):
        if s.stalled_s is None or s.stalled_s < policy.stalled_after_s:
            continue
        cause = f" ({s.stall_cause})" if s.stall_cause else ""
        out.append(StalledDecision(job_id, policy.stalled_action,
                                   f"stalled: no step for {_age(s.stalled_s)}{cause}, the limit is "
                                   f"{_age(policy.stalled_after_s)} (--stalled-after): "
                                   f"{policy.stalled_action}"))
    return out
