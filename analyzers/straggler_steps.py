"""A straggler rank from the step timer alone: not stuck, but slowing every step. Pure.

In a synchronous job every rank's step takes as long as the slowest rank's: the others wait for
it in the step's collectives. So step times do not tell the straggler (they are all equal);
each rank's **own work** does: its step less the time it waited in collectives (the step rows'
``exposed`` seconds). The straggler is the rank whose own work is STRAGGLER_RATIO times the
other ranks' median or more; where its time goes comes from its training thread's counters
over the same steps (on a core: compute; runnable but waiting for a core: CPU contention; the
rest: blocked on I/O, a sleep or a lock).
"""

from __future__ import annotations

import statistics

from gpudiag.incident import STRAGGLER, Verdict
from gpudiag.rundir import STARTUP_STEPS, StepRow, collective_wait, collectives_wait_s
from gpudiag.units import ms_of_seconds

# 1.5x: a rank 50% slower costs every other rank a third of its step; below that, the other
# ranks' collective waits are within what a shared machine's jitter gives them anyway.
STRAGGLER_RATIO = 1.5
MIN_STEPS = 5


def find_straggler(steps: dict[int, list[StepRow]]) -> Verdict | None:
    """The straggler verdict, or None (one rank, too few steps, or no rank far enough out)."""
    rows = {rank: [r for r in rs if r.profiler is None and r.step > STARTUP_STEPS]
            for rank, rs in steps.items()}
    rows = {k: v for k, v in rows.items() if len(v) >= MIN_STEPS}
    if len(rows) < 2:
        return None
    own = {k: statistics.median(max(0.0, r.dt - collectives_wait_s(r)) for r in v) for k, v in rows.items()}
    slow = max(own, key=lambda k: own[k])
    others = statistics.median(v for k, v in own.items() if k != slow)
    if others <= 0 or own[slow] < STRAGGLER_RATIO * others:
        return None
    mine = rows[slow]
    run = [r.run_s for r in mine if r.run_s is not None]
    wait = [r.wait_s for r in mine if r.wait_s is not None]
    waits = {k: statistics.median(collectives_wait_s(r) for r in v) for k, v in rows.items() if k != slow}
    colls: dict[str, float] = {}
    for k, v in rows.items():
        if k != slow:
            for r in v:
                for name, c in r.collectives.items():
                    colls[name] = colls.get(name, 0.0) + collective_wait(c)
    where = max(colls, key=lambda n: colls[n]) if colls else "collectives"
    ratio = own[slow] / others
    step = statistics.median(r.dt for r in mine)
    waited = statistics.median(waits.values())
    head = (f"straggler: rank {slow} slows every step: its own work takes {ms_of_seconds(own[slow])} per "
            f"step against {ms_of_seconds(others)} on the other ranks ({ratio:.1f}x); they wait "
            f"{ms_of_seconds(waited)} per step in {where} for it")
    details = []
    numbers = {"own_s": round(own[slow], 6), "others_own_s": round(others, 6), "ratio": round(ratio, 3),
               "step_s": round(step, 6)}
    if run and wait:
        on_core, for_core = statistics.median(run), statistics.median(wait)
        blocked = max(0.0, own[slow] - on_core - for_core)
        numbers.update(on_core_s=round(on_core, 6), waiting_for_core_s=round(for_core, 6),
                       blocked_s=round(blocked, 6))
        parts = sorted([(on_core, "on a core (compute)"), (for_core, "runnable, waiting for a core (other "
                        "work on its cores)"), (blocked, "blocked (I/O, a sleep or a lock)")], reverse=True)
        details.append(f"where rank {slow}'s {ms_of_seconds(own[slow])} go: "
                       + ", ".join(f"{ms_of_seconds(v)} {w}" for v, w in parts))
    details.append("per rank, own work per step: "
                   + ", ".join(f"rank {k} {ms_of_seconds(v)}" for k, v in sorted(own.items())))
    return Verdict(kind=STRAGGLER, headline=head, details=details, culprits=[slow],
                   waiting=sorted(k for k in rows if k != slow), op=where, numbers=numbers)
