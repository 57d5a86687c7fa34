"""What ``gpudiag fleet`` reports, as data: the rows, the totals and the versioned JSON schema.

The page, the terminal summary, the CSV and ``--json`` all render a ``FleetSummary`` and
compute nothing. docs/fleet.md lists every field of the JSON; a change to a field's meaning or
a removal raises SCHEMA_VERSION (adding a field does not).

One word for a person everywhere: **user** (the login name behind a job), never "owner" in one
place and "user" in another. ``owner_uid`` remains only where it is the agent's label.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1

NO_SIGNAL = "no signal"          # held by a job not run under gpudiag
STALLED = "stalled"              # held by a job under gpudiag that finished no step (docs/stall.md)
NO_LABEL = "no label"            # held by a job under gpudiag at a time it had reported no label
NO_JOB = "no job"                # held by no job
UNATTRIBUTED = "(unattributed)"  # no signal, no Slurm and no node named the job's user or team

# How much a job lost, by cause (GPU-hours). "stalled" and "below_peers" are disjoint hours (the
# stalled ones, and the rest while it ran), so they add up; the others overlap them (a stalled or
# slow GPU is often idle, a fix may remove the idle time), so a job's loss is the larger of that
# sum, its idle hours and its fix's win (``fleet.job_losses``, ``fleet.lost``).
LOSS_CAUSES = {
    "stalled": "held while it finished no step: all lost, whatever MFU was still exported",
    "idle": "held while idle (under 5% SM activity)",
    "below_peers": "MFU below the median of its size class",
    "fixable": "what its top recommendation predicts it would save",
}
WEEK_S = 7 * 86400.0


@dataclass
class JobRow:
    job_id: str
    user: str                  # login name, "uid N", or UNATTRIBUTED
    user_source: str           # "signal" (its signals' writer), "slurm", "node" (the uid its node saw), ""
    team: str                  # its signals' team, else its Slurm account, else UNATTRIBUTED
    team_source: str           # "signal", "slurm", ""
    nodes: list[str]
    gpus: int                  # most GPUs held at once (all nodes)
    size_class: str
    signalled: bool            # run under gpudiag: it reported in the range (with or without an MFU)
    gpu_hours: float           # held
    useful_gpu_hours: float    # held x MFU, where an MFU was reported
    mfu_gpu_hours: float       # of gpu_hours, those with an MFU at the time
    no_mfu_gpu_hours: float    # signalled, but no MFU at the time (no matmuls; before its first report)
    no_signal_gpu_hours: float  # all of gpu_hours for a job not run under gpudiag, else 0
    idle_gpu_hours: float
    stalled_gpu_hours: float   # held while it finished no step (docs/stall.md): at MFU 0, all lost
    stall_cause: str | None    # the cause of most of those hours
    mfu: float | None          # useful / mfu_gpu_hours (its MFU while it ran); None: no MFU
    label: str | None          # its latest bottleneck label
    confidence: float | None
    step_s: float | None       # its latest step time
    action: str | None         # its top recommendation's id
    predicted_step_s: float | None
    fix_gpu_hours: float = 0.0  # gpu_hours x (1 - predicted_step_s / step_s)
    class_median_mfu: float | None = None
    losses: dict[str, float] = field(default_factory=dict)   # LOSS_CAUSES -> GPU-hours
    lost_gpu_hours: float = 0.0
    lost_cause: str | None = None
    first_seen: float = 0.0    # the first and last window it held GPUs in (their ends, unix s)
    last_seen: float = 0.0


@dataclass
class Group:
    name: str
    jobs: int = 0
    gpu_hours: float = 0.0
    useful_gpu_hours: float = 0.0
    no_mfu_gpu_hours: float = 0.0
    no_signal_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    stalled_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    previous_gpu_hours: float | None = None          # the same name in the previous period
    previous_useful_gpu_hours: float | None = None


@dataclass
class NodeRow:
    instance: str
    gpus: int                  # most GPUs it exported at once
    jobs: int
    gpu_hours: float           # held by jobs
    useful_gpu_hours: float
    idle_gpu_hours: float
    unallocated_gpu_hours: float
    scrape_interval_s: float


@dataclass
class Fix:
    """One job's top recommendation and what it would win: the job's GPU-hours x the step time
    it predicts saving, at the range's rate per week."""

    job_id: str
    user: str
    team: str
    action: str
    label: str | None
    step_s: float
    predicted_step_s: float
    gpu_hours: float
    win_gpu_hours: float
    win_gpu_hours_per_week: float


@dataclass
class Totals:
    gpu_hours: float = 0.0
    useful_gpu_hours: float = 0.0
    mfu_gpu_hours: float = 0.0
    no_mfu_gpu_hours: float = 0.0
    no_signal_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    stalled_gpu_hours: float = 0.0
    unallocated_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    jobs: int = 0
    signalled_jobs: int = 0
    teams: int = 0             # not counting UNATTRIBUTED
    users: int = 0
    gpus_max: int = 0

    @property
    def no_signal_share(self) -> float | None:
        return self.no_signal_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else None

    @property
    def useful_share(self) -> float | None:
        return self.useful_gpu_hours / self.gpu_hours if self.gpu_hours > 0 else None


@dataclass
class Coverage:
    """Which part of the range Prometheus held gpudiag GPU samples for."""

    first_sample: float | None   # the end of the first window with a GPU sample
    last_sample: float | None
    windows_with_data: int
    windows: int
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (first, last) window ends with none

    @property
    def share(self) -> float:
        return self.windows_with_data / self.windows if self.windows else 0.0


@dataclass
class Period:
    start: float
    end: float
    totals: Totals
    coverage: Coverage


@dataclass
class LabelMix:
    """Held GPU-hours per label per bucket of time (a day over a week)."""

    bucket_s: float
    starts: list[float]
    labels: dict[str, list[float]]


@dataclass
class FleetSummary:
    prometheus: str            # the base URL, never with credentials
    requested_start: float
    requested_end: float
    start: float               # the windows' range: (start, end]
    end: float
    step_s: float
    clipped_to_now: bool
    totals: Totals
    coverage: Coverage
    jobs: list[JobRow]
    teams: list[Group]
    users: list[Group]
    nodes: list[NodeRow]
    fixes: list[Fix]
    most_lost: list[dict[str, Any]]      # {job_id, lost_gpu_hours, cause}, largest first
    label_mix: LabelMix
    scheduler: list[dict[str, Any]]
    scrape_intervals: dict[str, float]
    queries: dict[str, str]
    notes: list[str] = field(default_factory=list)
    previous: Period | None = None
    attribution: dict[str, int] = field(default_factory=dict)  # source -> silent jobs it named
    jobs_omitted: int = 0      # the page lists the largest jobs; the CSV and --json all of them

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        before = self.previous.totals if self.previous else None
        for key, obj in (("totals", self.totals), ("previous", before)):
            if obj is None:
                continue
            target = d[key] if key == "totals" else d["previous"]["totals"]
            target["no_signal_share"] = obj.no_signal_share
            target["useful_share"] = obj.useful_share
        d["coverage"]["share"] = self.coverage.share
        if self.previous is not None:
            d["previous"]["coverage"]["share"] = self.previous.coverage.share
        return {"schema_version": d.pop("schema_version"), **d}
