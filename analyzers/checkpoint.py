"""Periodic checkpoints: what the steps that save cost beyond the steps that do not.

A save every few steps lands in one step in N, rarely in the traced window, and has no
operator in the trace: pickling and writing are the host's work. The step timer times each
``torch.save`` of the job's main thread (``StepRow.save_s``) and so marks the steps that save;
over the untraced steps around the window, what each such step took beyond the median step
without a save (at least its ``torch.save``) is the checkpoint's cost, and their sum per step
over the mean step its share of the training time. Seen in the held-out zoo: a 144 MB save
every 4 steps, 346 ms a save and 12% of the mean step by the job's own timer, was named nowhere.

Why the step's excess and not ``torch.save``'s time alone: a checkpoint is more than the call.
Blind check 43 saved to an open file, then flushed and ``os.fsync``-ed it, as a durable
checkpoint does: its own timer put each checkpoint at 164-169 ms, the saving steps' excess read
172 ms (mean of 29), and ``torch.save`` alone 38 ms: the advice said 6% of the time where the
job's timer said 24%, and under-told what saving half as often gave back 4.5x. Whatever else the
job does in the steps it saves in (a rename, an upload, an evaluation beside it) is in the excess
too; the advice says so, and that the median step holds none of it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from gpudiag.steps import WindowSteps

# Below this share of the mean step, a save is not worth naming (the step timer's noise is 1-4%,
# as for host syncs: ``syncs.SYNC_NOTABLE``).
SAVE_NOTABLE = 0.03
# How much less often the advice's prediction saves.
LESS_OFTEN = 2
# Steps without a save needed for their median to be the base a saving step's excess is read
# against; with fewer, a save's cost is its torch.save alone (a floor).
MIN_PLAIN = 3


@dataclass(frozen=True)
class Saves:
    """Checkpoints over the untraced steps of the lowest rank around the window."""

    save_us: float  # mean cost of one save: its step's excess over the median step without one
    every: float  # steps per save: the median gap between consecutive saves' step numbers
    per_step_us: float  # mean save time per step
    step_us: float  # mean wall step over the same steps (saves included)
    # whether ``every`` is that gap (True), or, with fewer than two saves on either side of
    # the window, the rows over the saves (an average over too few steps to name the period)
    every_exact: bool = True
    call_us: float | None = None  # mean time in torch.save of one save (None: as ``save_us``)

    @property
    def share(self) -> float:
        return self.per_step_us / self.step_us if self.step_us > 0 else 0.0


def saves(windows: list[WindowSteps] | None) -> Saves | None:
    """The checkpoints' time per step, or None where no save was timed."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    rows = [*w.before_rows, *w.after_rows]
    calls = [r.save_s for r in rows if r.save_s > 0]
    if not rows or not calls:
        return None
    step = statistics.fmean(r.dt + r.machine_s for r in rows)
    plain = [r.dt + r.machine_s for r in rows if r.save_s <= 0]
    base = statistics.median(plain) if len(plain) >= MIN_PLAIN else None
    saved = [max(r.save_s, r.dt + r.machine_s - base) if base is not None else r.save_s
             for r in rows if r.save_s > 0]
    gaps = [b - a for side in (w.before_rows, w.after_rows)
            for a, b in _pairs([r.step for r in side if r.save_s > 0])]
    every, exact = (float(statistics.median(gaps)), True) if gaps else (len(rows) / len(saved), False)
    return Saves(save_us=statistics.fmean(saved) * 1e6, every=every, every_exact=exact,
                 per_step_us=sum(saved) / len(rows) * 1e6, step_us=step * 1e6,
                 call_us=statistics.fmean(calls) * 1e6 if base is not None else None)


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
        f"{s.save_us / 1e3:.3g} ms {every_text(s)}, {_measured(s)}) paid "
        f"{LESS_OFTEN}x less often, {every_text(_rarer(s))}; assumes a save costs the same however "
        "many steps it follows")


def _measured(s: Saves) -> str:
    """How a save's cost was measured, with torch.save's own part where the step's excess is it."""
    if s.call_us is None:
        return "timed by the step timer in torch.save"
    return (f"what each step that saved took beyond the median step without a save, by the step "
            f"timer; {s.call_us / 1e3:.3g} ms of it in torch.save itself")


def _rarer(s: Saves) -> Saves:
    return replace(s, every=s.every * LESS_OFTEN, per_step_us=s.per_step_us / LESS_OFTEN)


def text(s: Saves) -> str:
    if s.call_us is None:
        what = f"torch.save of {s.save_us / 1e3:.3g} ms {every_text(s)}, on the training thread"
    else:
        # the rest of the excess is named as what it usually is, and as what else it could be
        what = (f"a save {every_text(s)}, each step that saves {s.save_us / 1e3:.3g} ms longer than "
                f"those that do not: {s.call_us / 1e3:.3g} ms in torch.save on the training thread, "
                "the rest what the job does around it, such as flushing and fsyncing the file, or "
                "anything else it runs in those steps")
    return (f"Checkpointing takes {s.share * 100:.0f}% of the training time ({what}): save "
            "less often, or asynchronously (torch.distributed.checkpoint.async_save, or a copy of "
            "the state dict handed to a background thread or process), which takes the pickling and "
            "writing off the step where a core is free for it.")
