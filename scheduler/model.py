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

    Each mechanism can be switched off on its own (the benchmark's ablation). Why each default:
    docs/scheduler.md, "Settings" (tests/unit/test_scheduler_settings.py keeps the two equal).
    """

    name: str = "gpudiag"
    backfill: bool = True                 # start jobs behind a blocked head ...
    reservation: bool = True              # ... only where they cannot delay its reservation (EASY)
    # "arrival" (FIFO/EASY), "priority" (tier, aging, penalties) or "mfu" (simulator only: the
    # calibration prototype's order by each job's MFU known up front)
    order: str = "priority"
    efficiency: bool = True               # low MFU / GPU-idle label lowers priority
    team_queues: bool = True              # per-team queues (team_queues.py); order="priority" only
    team_overdue_s: float = 21 * 86400.0  # their starvation bound: an overdue job goes ahead
    waste_charge: bool = True             # a GPU counts 1 + waste_weight x (1 - factor) across teams
    waste_weight: float = 1.0
    reclaim: bool = True                  # quota reclaim (preempt.reclaim_victims)
    label_aware_placement: bool = True    # communication-bound jobs wait for one node / fewest racks
    spread_small: bool = True             # a one-node job may span a rack's nodes when no node fits
    spread_unknown: bool = False          # ... even when its label is unknown (ordering.may_spread)
    preemption: bool = True               # a higher tier may preempt a lower one
    min_signal_confidence: float = 0.5
    max_signal_age_s: float = 300.0       # twenty missed writes of an agent that writes every 15 s
    min_history_weight: float = 0.5       # a key's history counts while it weighs this much
    history_half_life_s: float = 7 * 86400.0   # Slurm's PriorityDecayHalfLife default
    # a job at ratio r < 1 of its class median MFU waits as if submitted (1 - factor) x this later
    max_efficiency_delay_s: float = 72 * 3600.0
    idle_label_factor: float = 0.5        # the factor's cap for GPU-idle labels
    min_efficiency_factor: float = 0.1
    min_runtime_s: float = 600.0          # no victim younger than this: no thrashing
    stalled_action: str = "off"           # "requeue", "cancel" or "off" (stalled.py)
    stalled_after_s: float = 1800.0
    default_grace_s: float = DEFAULT_GRACE_S   # SIGTERM to SIGKILL for a job that asks none
    # what backfill and reservations assume of a job without a time limit (Slurm's UNLIMITED)
    default_estimate_s: float = 365 * 86400.0
    max_pending_per_user: int = 500       # a runtime that takes submissions; 0: no limit

    @property
    def aging_bound_s(self) -> float:
        """A pending job is never ordered behind a job of its tier submitted more than this later:
        the largest of the efficiency shift's cap and the team queues' overdue cap (the argument:
        docs/scheduler.md, "Aging bound")."""
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
