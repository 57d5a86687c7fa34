"""What one controller round did (``Controller.round``): read by the loop, the log and the writes.

Its own module so that the modules a round calls (``writes``, ``says``) can name it without
importing the controller that calls them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpudiag.scheduler.slurm.actions import Action


@dataclass
class RoundResult:
    at: float
    skipped: str = ""
    signals: dict = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    jobs: dict = field(default_factory=dict)
    held: list[str] = field(default_factory=list)             # partitions gpudiag holds after the round
    handed_back: dict[int, str] = field(default_factory=dict)  # waiting job -> why Slurm serves it
    not_reclaimed: dict[int, str] = field(default_factory=dict)  # a reclaim decided, not enacted: why

    def to_dict(self) -> dict:
        return {**asdict(self), "actions": [{k: v for k, v in asdict(a).items() if k != "ref"}
                                            for a in self.actions]}
