"""Periodic checkpoints: the steps' time in ``torch.save`` on the training thread.

A save every few steps lands in one step in N, rarely in the traced window, and has no
operator in the trace: pickling and writing are the host's work. The step timer times each
``torch.save`` of the job's main thread (``StepRow.save_s``); over the untraced steps around
the window, their mean per step over the mean step is the checkpoint's share of the training
time. Seen in the held-out zoo: a 144 MB save every 4 steps, 346 ms a save and 12% of the mean
step by the job's own timer, was named nowhere.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudiag.steps import WindowSteps

# Below this share of the mean step, a save is not worth naming (the step timer's noise is 1-4%,
# as for host syncs: ``syncs.SYNC_NOTABLE``).
SAVE_NOTABLE = 0.03
# How much less often the advice's prediction saves.
LESS_OFTEN = 2


@dataclass(frozen=True)
class Saves:
    """Checkpoints over the untraced steps of the lowest rank around the window."""

    save_us: float  # mean time of one save
    every: float  # steps per save, on average
    per_step_us: float  # mean save time per step
    step_us: float  # mean wall step over the same steps (saves included)

    @property
    def share(self) -> float:
        return self.per_step_us / self.step_us if self.step_us > 0 else 0.0


def saves(windows: list[WindowSteps] | None) -> Saves | None:
    """The checkpoints' time per step, or None where no save was timed."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    rows = [*w.before_rows, *w.after_rows]
    saved = [r.save_s for r in rows if r.save_s > 0]
    if not rows or not saved:
        return None
    step = statistics.fmean(r.dt + r.machine_s for r in rows)
    return Saves(save_us=statistics.fmean(saved) * 1e6, every=len(rows) / len(saved),
                 per_step_us=sum(saved) / len(rows) * 1e6, step_us=step * 1e6)


def predicted_step_us(s: Saves, view_step_us: float) -> tuple[float, str]:
    """The view's step with the saves ``LESS_OFTEN`` times rarer, by their share of the mean
    step (a view of median steps holds no save step: the gain is the mean's)."""
    gain = s.share * (1 - 1 / LESS_OFTEN)
    return view_step_us * (1 - gain), (
        f"the saves' {s.per_step_us / 1e3:.3g} ms per step ({100 * s.share:.0f}% of the mean "
        f"{s.step_us / 1e3:.3g} ms step; one of {s.save_us / 1e3:.3g} ms every {s.every:.2g} steps, "
        f"timed by the step timer in torch.save) paid {LESS_OFTEN}x less often, the same share off "
        "this step; assumes a save costs the same however many steps it follows")


def text(s: Saves) -> str:
    return (f"Checkpointing takes {s.share * 100:.0f}% of the training time (torch.save of "
            f"{s.save_us / 1e3:.3g} ms every {s.every:.2g} steps, on the training thread): save "
            "less often, or asynchronously (torch.distributed.checkpoint.async_save, or a copy of "
            "the state dict handed to a background thread or process), which takes the pickling and "
            "writing off the step where a core is free for it.")
