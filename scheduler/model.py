"""The scheduler's data: cluster, jobs, live signals, decisions and the policy's knobs.

Plain dataclasses and nothing else, so that the three runtimes (the trace-replay simulator,
the one-machine daemon with its SQLite state, the Slurm controller) can build them from what
they hold and hand them to the same policy functions. Times are seconds on one clock chosen by
the runtime (the simulator's starts at the first submission).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum


class Tier(IntEnum):
    """Priority tiers; a higher value always goes first and only a higher tier may preempt (quota
    reclaim aside: ``Policy.reclaim``)."""

    SPOT = 0        # preemptible capacity, cheapest
    RESERVED = 1    # a team's reserved (quota) capacity: the default
    ON_DEMAND = 2   # paid for now, must start now


TIER_NAMES = {Tier.SPOT: "spot", Tier.RESERVED: "reserved", Tier.ON_DEMAND: "on-demand"}

# The bottleneck labels gpudiag's analyzers assign (gpudiag/diagnosis.py), plus "unknown".
UNKNOWN = "unknown"  # a label no signal gave with confidence
LABELS = ("compute-bound", "memory-bound", "communication-bound", "input-bound", "host-bound", UNKNOWN)
# A GPU that waits for input or for the host is idle however "busy" nvidia-smi says it is.
GPU_IDLE_LABELS = frozenset({"input-bound", "host-bound"})
COMM_LABEL = "communication-bound"
# SIGTERM to SIGKILL: Slurm's KillWait and Kubernetes' terminationGracePeriodSeconds both
# default to 30 s. ``Policy.default_grace_s`` (a job that does not ask for its own grace).
DEFAULT_GRACE_S = 30.0


def n_gpus(n: int) -> str:
    """"1 GPU", "4 GPUs": every count a person reads. A runtime that hands out other units (the
    local daemon's CPU slots) rewrites the word, and the plural stays right."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


@dataclass(frozen=True, slots=True)
class Node:
    """One machine. Nodes of one cluster may differ in size. ``available`` False: drained or
    down - nothing new is placed on it, and the jobs already there keep their GPUs until they end
    (Slurm's DRAIN: running jobs finish, no new ones start)."""

    index: int
    gpus: int
    rack: int
    model: str = "unknown"
    available: bool = True


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[Node, ...]

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int = 8, rack_size: int = 4,
                model: str = "unknown") -> Cluster:
        """``nodes`` identical nodes; nodes ``i*rack_size .. (i+1)*rack_size-1`` share rack ``i``."""
        return cls.of_sizes([(nodes, gpus_per_node)], rack_size, model)

    @classmethod
    def of_sizes(cls, groups: list[tuple[int, int]], rack_size: int = 4, model: str = "unknown") -> Cluster:
        """Groups of (N nodes, G GPUs each), indexed in the order given; racks of ``rack_size``
        consecutive nodes (a rack may hold nodes of two groups, as in a real row of machines)."""
        if not groups or rack_size < 1 or any(n < 1 or g < 1 for n, g in groups):
            raise ValueError("nodes, gpus per node and rack size must be positive")
        sizes = [g for n, g in groups for _ in range(n)]
        return cls(tuple(Node(i, g, i // rack_size, model) for i, g in enumerate(sizes)))

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


@dataclass(slots=True)
class Job:
    """A gang: all ``gpus`` start together or none do.

    ``key`` is the recurring "same job" identity (a sweep, a nightly run, user + job name):
    what an earlier job of the key taught us about MFU applies to this one. ``estimate_s`` is
    what backfill believes about the run time (a time limit, or the exact duration in a replay).
    """

    id: int
    gpus: int
    submit: float
    estimate_s: float
    user: str = ""
    team: str = ""
    key: str = ""
    tier: Tier = Tier.RESERVED
    preemptible: bool = True
    grace_s: float = DEFAULT_GRACE_S


@dataclass(frozen=True, slots=True)
class Signal:
    """What the gpudiag agent exports about a running job (gpudiag_job_mfu_ratio, ..._bottleneck)."""

    mfu: float          # unprofiled MFU, 0..1
    label: str          # one of LABELS
    confidence: float   # 0..1, the analyzer's confidence in the label
    age_s: float        # seconds since the agent last heard from the job
    # seconds since the job last finished a step, while past its stall limit (None: not stalled;
    # the agent then exports MFU 0), and the stall's cause (gpudiag.incident.CAUSES)
    stalled_s: float | None = None
    stall_cause: str | None = None
    # 0..1, the analyzer's confidence in ``mfu`` (the step it divides by: ``Mfu.confidence``);
    # None where the agent exports none (then ``confidence`` stands for it). A busy machine lowers
    # the label's confidence, not the MFU's: an H200 LM beside 32 busy loops read 0.05 and 0.87
    mfu_confidence: float | None = None

    @property
    def trust(self) -> float:
        """How far the policy trusts ``mfu``: its own confidence where exported, else the label's."""
        return self.mfu_confidence if self.mfu_confidence is not None else self.confidence

    def scheduled(self, floor: float) -> Signal:
        """The signal as the policy weighs it: ``confidence`` the MFU's, and the label "unknown"
        where its own confidence is under ``floor`` (``Policy.min_signal_confidence``): the MFU
        of a job on a busy machine still orders it, its label does not (GPU-idle caps, placement)."""
        if self.mfu_confidence is None:
            return self
        label = self.label if self.confidence >= floor else UNKNOWN
        return replace(self, label=label, confidence=self.trust, mfu_confidence=None)


@dataclass(slots=True)
class KeyHistory:
    """Decayed record of the MFU earlier jobs of one key reached."""

    mfu: float
    label: str
    weight: float       # decayed number of observations (1.0 = one fresh observation)
    updated: float      # when ``weight`` was last decayed


@dataclass(frozen=True, slots=True)
class Placement:
    """Exact GPUs: ((node index, (gpu indices...)), ...)."""

    slots: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.slots)

    @property
    def gpus(self) -> int:
        return sum(len(g) for _, g in self.slots)


@dataclass(slots=True)
class Running:
    job: Job
    placement: Placement
    start: float
    # what backfill plans with: start + estimate, or, for a job in its grace period (terminating),
    # its kill deadline - the latest it can hold its GPUs, whatever its estimate said
    expected_end: float
    last_checkpoint: float        # work after this is lost if the job is killed now
    # it was told to stop (preempted, cancelled, out of time) and is in its grace period: its GPUs
    # are on their way to being free, and it is never chosen as a victim again
    terminating: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """One thing to do now, with the reason a person reads and the numbers behind it."""

    kind: str                     # "start" | "preempt" | "hold"
    job_id: int
    reason: str
    placement: Placement | None = None
    grace_s: float = 0.0
    numbers: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    """Every knob of the policy; the defaults are gpudiag's, ``fifo()``/``easy()`` the baselines.

    Each mechanism can be switched off on its own (the benchmark's ablation).
    """

    name: str = "gpudiag"
    backfill: bool = True                 # start jobs behind a blocked head ...
    reservation: bool = True              # ... only where they cannot delay its reservation (EASY)
    # "arrival" (FIFO/EASY), "priority" (tier, aging, penalties) or "mfu" (simulator only: the
    # calibration prototype's order by each job's MFU known up front)
    order: str = "priority"
    efficiency: bool = True               # low MFU / GPU-idle label lowers priority
    # Per-team queues (scheduler/team_queues.py): inside a tier the next job comes from the team
    # whose (GPUs in use + GPUs given earlier in the order) / quota is lowest. Only with
    # order="priority". A job that has waited team_overdue_s goes ahead of the interleave: the
    # starvation bound. Three weeks, measured on the Philly replay (59 nodes; EASY's waits: mean
    # 4.3 days, longest 16): overdue jobs, in arrival order, are the over-quota teams' and take
    # GPUs from the teams below quota, so a short bound undoes the interleave (worst team's
    # share of its quota: 57% at 3 and 7 days, 60% at 14, 76% at 21, 81% with no bound), while
    # with no bound the longest wait grows to 2.3x EASY's (21 days: 1.5x).
    team_queues: bool = True
    team_overdue_s: float = 21 * 86400.0
    # Waste charge (priority.waste_charge): in the order across teams (the team interleave and
    # quota reclaim's view of the reclaimer) a GPU counts 1 + waste_weight x (1 - efficiency factor): Slurm's
    # TRES billing weights, applied to measured MFU and GPU-idle labels, so the team whose jobs
    # waste GPUs is the one whose jobs wait. Weight 1: a job at the floor factor counts 1.9x, a
    # GPU-idle one 1.5x; a team however wasteful still gets at least 1 / (1 + 0.9 x weight)
    # (53%) of its quota before teams below theirs go first, so the charge moves GPU-time
    # without taking a team's quota away, and the starvation bound (team_overdue_s) is untouched.
    waste_charge: bool = True
    waste_weight: float = 1.0
    # Quota reclaim (preempt.reclaim_victims; Volcano's reclaim, Kueue's reclaim within a cohort):
    # a blocked head whose team stays within its quota once started may preempt preemptible
    # jobs of its tier or lower from teams that stay at or above their quota without them.
    reclaim: bool = True
    label_aware_placement: bool = True    # communication-bound jobs wait for one node / fewest racks
    spread_small: bool = True             # a one-node job may span a rack's nodes when no node fits
    spread_unknown: bool = False          # ... even when its label is unknown (policy.may_spread)
    preemption: bool = True               # a higher tier may preempt a lower one
    # Signals: the agent writes every 15 s; twenty missed writes is a job we no longer hear.
    min_signal_confidence: float = 0.5
    max_signal_age_s: float = 300.0
    # Key history: act on it while it weighs at least one observation one half-life old.
    min_history_weight: float = 0.5
    history_half_life_s: float = 7 * 86400.0   # Slurm's PriorityDecayHalfLife default (7 days)
    # Efficiency: a job at ratio r < 1 of its class median MFU waits as if submitted
    # (1 - factor) * max_efficiency_delay_s later; GPU-idle labels cap the factor. Three days: the
    # useful-work-weighted wait is least when jobs go in MFU order (Smith's rule: weight GPUs x
    # time x MFU over GPUs x time), and the shift moves the order toward it only as far as the
    # cap reaches into the backlog; the waits that carry the weight on the whole Philly trace are
    # days-long jobs in bursts a day deep, which a one-day cap at factor 0.5 (12 h) barely
    # reorders. The promise to users: "a deprioritised job loses at most three days of queue
    # position" (docs/scheduler-evaluation/whole-trace.md measures 24 h, 72 h and 168 h).
    max_efficiency_delay_s: float = 72 * 3600.0
    idle_label_factor: float = 0.5
    min_efficiency_factor: float = 0.1
    # Preemption: no victim younger than this. The victim rule (least useful work lost) prefers
    # the jobs that ran least since their checkpoint, so without a floor a job just (re)started
    # is the cheapest victim again and again: thrashing. Ten minutes covers a typical restart
    # (framework start-up, data loader warm-up, compilation) and the agent's first MFU estimate,
    # which needs a traced step. Slurm's equivalent, PreemptExemptTime, defaults to 0 (none).
    min_runtime_s: float = 600.0
    # A stalled job (no step for its stall limit: the agent's gpudiag_job_stalled_seconds) holds
    # its GPUs for nothing; its MFU is 0 for ordering and victims either way. Where the admin
    # enables it, a job stalled for stalled_after_s is requeued or cancelled (scheduler/stalled.py):
    # off by default, because only the admin knows whether a job's pauses may be legitimate.
    stalled_action: str = "off"             # "requeue", "cancel" or "off"
    stalled_after_s: float = 1800.0
    # SIGTERM, then this long to checkpoint before SIGKILL, for a job that does not ask its own.
    default_grace_s: float = DEFAULT_GRACE_S
    # What backfill and reservations assume of a job without a time limit: as long as the
    # longest limit a runtime accepts (a year: the local daemon's MAX_TIME_LIMIT_S), so such a
    # job never backfills in front of a reservation and its GPUs are never promised to the head
    # early - Slurm's UNLIMITED time limit, in a number the arithmetic can use.
    default_estimate_s: float = 365 * 86400.0
    # Jobs one user may have waiting at once (a runtime that takes submissions: the local
    # daemon; Slurm's own is MaxSubmitJobsPerUser); 0: no limit. Every pending job is in every
    # pass and every queue listing, so one user's thousands slow and bury everyone's. 500 is
    # far more than one or two shared machines start in a day (ours).
    max_pending_per_user: int = 500

    @property
    def aging_bound_s(self) -> float:
        """A pending job is never ordered behind a job of its tier submitted more than this later.

        The efficiency term shifts a job's effective submit time by at most
        ``max_efficiency_delay_s``, so two jobs submitted further apart keep their arrival
        order: the set of jobs that can pass a given job is finite, and with the head's
        reservation (EASY) every job starts in bounded time - no starvation.

        Per-team queues (``team_queues``) may put a job behind a later job of a team further
        below its quota, but only while it has waited less than ``team_overdue_s``; then it goes
        ahead of every job of its tier that has not (``team_queues.interleave``). A job passed
        by a later one has waited at least their submit difference, so the bound is the larger
        of ``team_overdue_s`` and the shift bound above.
        """
        if self.order != "priority":
            return 0.0
        pen = self.max_efficiency_delay_s if self.efficiency else 0.0
        return max(pen, self.team_overdue_s) if self.uses_team_queues else pen

    @property
    def uses_team_queues(self) -> bool:
        return self.team_queues and self.order == "priority"

    @classmethod
    def fifo(cls) -> Policy:
        return cls(name="fifo", backfill=False, order="arrival", efficiency=False,
                   team_queues=False, waste_charge=False, reclaim=False, label_aware_placement=False,
                   spread_small=False, preemption=False)

    @classmethod
    def easy(cls) -> Policy:
        return cls(name="easy", backfill=True, order="arrival", efficiency=False,
                   team_queues=False, waste_charge=False, reclaim=False, label_aware_placement=False,
                   spread_small=False, preemption=False)
