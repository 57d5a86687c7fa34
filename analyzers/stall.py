"""When "no step for a while" is a stall: each rank's limit, with the numbers behind it. Pure.

A rank is stalled when it has not finished a step for longer than its limit:

- ``--stall-after D``: D, outright;
- otherwise ``max(K x its median recent step, FLOOR_S)``. K = 10: healthy steps vary by a few
  times their median (a garbage collection, a slow batch, a re-trace), so ten times the median is
  far outside a healthy job's noise, and NVIDIA's fault-tolerance package sizes its own step
  timeouts as 5 x the longest interval it saw (``safety_factor=5.0``), longest rather than median.
  FLOOR_S = 60 s: jobs with millisecond steps must not be called stuck by a one-second hiccup,
  and 60 s stays well inside NCCL's default collective timeout (10 min), after which the
  watchdog aborts the job and the evidence dies with it.
- before its first step: STARTUP_S (imports, data download, compilation, rendezvous);
- inside a phase the job marked (``with gpudiag.phase("eval"):``): PHASE_LIMIT_S from the
  phase's start, so a checkpoint that hangs is still found;
- a job whose step pattern shows long pauses (at least PATTERN_PAUSES earlier steps above its
  limit: an unmarked eval or checkpoint every N steps) gets PATTERN_MARGIN x the longest of them;
- while gpudiag's own profiler window is open (a trace export takes seconds to minutes):
  PROFILER_GRACE_S more. That is gpudiag's doing, never the job's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

K = 10.0
FLOOR_S = 60.0
STARTUP_S = 600.0
PHASE_LIMIT_S = 1800.0
PATTERN_PAUSES = 2
PATTERN_MARGIN = 2.0
PROFILER_GRACE_S = 120.0
MIN_STEPS = 3  # steps before a median means anything; fewer: the floor alone


@dataclass(frozen=True)
class StallRule:
    after_s: float | None = None     # --stall-after: the limit outright
    k: float = K
    floor_s: float = FLOOR_S
    startup_s: float = STARTUP_S
    phase_limit_s: float = PHASE_LIMIT_S

    def describe(self) -> str:
        """The limit in words, as the incident prints it."""
        if self.after_s is not None:
            return f"--stall-after {self.after_s:g} s"
        return f"max({self.k:g} x the rank's median step, {self.floor_s:g} s)"


@dataclass
class Progress:
    """One rank as its black box shows it (``collectors/blackbox.py``)."""

    rank: int
    step: int
    last_step_t: float | None
    start: float
    phase: str | None = None
    phase_since: float | None = None
    profiler_open: bool = False
    dts: list[float] = field(default_factory=list)   # recent step durations, oldest first
    alive: bool = True


@dataclass
class RankLimit:
    rank: int
    limit_s: float
    why: str
    since: float          # when the wait began: the last step's end (or the phase's, the start)
    idle_s: float
    stalled: bool
    median_s: float | None = None


def median_step(dts: list[float]) -> float | None:
    return statistics.median(dts) if len(dts) >= MIN_STEPS else None


def rank_limit(p: Progress, rule: StallRule, now: float) -> RankLimit:
    med = median_step(p.dts)
    if p.phase is not None:
        since = p.phase_since if p.phase_since is not None else now
        limit, why = rule.phase_limit_s, f"in the phase {p.phase!r} the job marked: {rule.phase_limit_s:g} s"
    elif p.last_step_t is None:
        since = p.start
        limit = max(rule.startup_s, rule.after_s or 0.0)
        why = f"before its first step: {limit:g} s"
    else:
        since = p.last_step_t
        if rule.after_s is not None:
            limit, why = rule.after_s, f"--stall-after {rule.after_s:g} s"
        else:
            limit = max(rule.k * med, rule.floor_s) if med is not None else rule.floor_s
            why = (f"{rule.k:g} x median step {med:.3g} s, at least {rule.floor_s:g} s" if med is not None
                   else f"{rule.floor_s:g} s (fewer than {MIN_STEPS} steps for a median)")
            pauses = [d for d in p.dts if d > limit]
            if len(pauses) >= PATTERN_PAUSES:
                limit = PATTERN_MARGIN * max(pauses)
                why += (f"; raised to {limit:.0f} s: {len(pauses)} earlier steps paused up to "
                        f"{max(pauses):.0f} s (an eval or checkpoint every few steps)")
    if p.profiler_open:
        limit += PROFILER_GRACE_S
        why += f"; +{PROFILER_GRACE_S:g} s while gpudiag's profiler window is open"
    idle = max(0.0, now - since)
    return RankLimit(p.rank, limit, why, since, idle, p.alive and idle > limit, med)


def assess(ranks: list[Progress], rule: StallRule, now: float) -> list[RankLimit]:
    """Each rank's limit and whether it is stalled (the job is, when any rank is)."""
    return [rank_limit(p, rule, now) for p in sorted(ranks, key=lambda p: p.rank)]


def job_limit(limits: list[RankLimit]) -> tuple[float | None, float | None]:
    """(the job's last step: the earliest of its ranks' last steps, the limit that applies to
    it): what the agent needs to call the job stalled on its own between two signals."""
    if not limits:
        return None, None
    worst = min(limits, key=lambda r: r.since)
    return worst.since, worst.limit_s
