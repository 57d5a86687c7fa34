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
    every: float  # steps per save: the median gap between consecutive saves' step numbers
    per_step_us: float  # mean save time per step
    step_us: float  # mean wall step over the same steps (saves included)
    # whether ``every`` is that gap (True), or, with fewer than two saves on either side of
    # the window, the rows over the saves (an average over too few steps to name the period)
    every_exact: bool = True

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
    gaps = [b - a for side in (w.before_rows, w.after_rows)
            for a, b in _pairs([r.step for r in side if r.save_s > 0])]
    every, exact = (float(statistics.median(gaps)), True) if gaps else (len(rows) / len(saved), False)
    return Saves(save_us=statistics.fmean(saved) * 1e6, every=every, every_exact=exact,
                 per_step_us=sum(saved) / len(rows) * 1e6, step_us=step * 1e6)


def _pairs(xs: list[int]) -> list[tuple[int, int]]:
    """Consecutive pairs: the gaps between saves on one side of the window (the traced steps
    between the two sides are not in the rows, so no gap spans them). Steps over the rows'
    saves gave "every 4.5 steps" for a save every 4 (nine rows, two saves)."""
    return list(zip(xs, xs[1:], strict=False))


def every_text(s: Saves) -> str:
    return f"every {s.every:.0f} steps" if s.every_exact else f"about every {s.every:.2g} steps"


def predicted_step_us(s: Saves) -> tuple[float, float, str]:
    """(the mean step, the mean step with the saves ``LESS_OFTEN`` times rarer, why). In the
    frame of the mean step, the one the saves' cost lives in: the verdict's view is of median
    steps, which hold no save (held-out zoo, ckpt_often: "step 6.97 ms -> 3.84 ms" for a median
    step no fewer saves could shorten; the 45% was of the 68.8 ms mean step)."""
    after = s.step_us - s.per_step_us * (1 - 1 / LESS_OFTEN)
    return s.step_us, after, (
        f"the mean step over the untraced steps around the window, saves included ({s.step_us / 1e3:.3g} ms; "
        f"the median step holds no save and no fewer saves shorten it): its "
        f"{s.per_step_us / 1e3:.3g} ms of saves per step ({100 * s.share:.0f}%; one of "
        f"{s.save_us / 1e3:.3g} ms {every_text(s)}, timed by the step timer in torch.save) paid "
        f"{LESS_OFTEN}x less often, {every_text(_rarer(s))}; assumes a save costs the same however "
        "many steps it follows")


def _rarer(s: Saves) -> Saves:
    return Saves(s.save_us, s.every * LESS_OFTEN, s.per_step_us / LESS_OFTEN, s.step_us, s.every_exact)


def text(s: Saves) -> str:
    return (f"Checkpointing takes {s.share * 100:.0f}% of the training time (torch.save of "
            f"{s.save_us / 1e3:.3g} ms {every_text(s)}, on the training thread): save "
            "less often, or asynchronously (torch.distributed.checkpoint.async_save, or a copy of "
            "the state dict handed to a background thread or process), which takes the pickling and "
            "writing off the step where a core is free for it.")
