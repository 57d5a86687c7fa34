"""The order's terms: tier first; inside a tier, age shifted by a bounded efficiency term.

The efficiency term shifts a job's *effective submit time* by at most its cap, so a penalty
delays a job, never forever (``Policy.aging_bound_s``); its MFU comes from a usable live signal,
else its key's history, against its class median; fair share is the per-team queues
(``team_queues``), each GPU at its ``waste_charge``. docs/scheduler.md, "Priority".
"""

from __future__ import annotations

import math

import numpy as np

from gpudiag.scheduler.model import (
    GPU_IDLE_LABELS,
    TIER_NAMES,
    UNKNOWN,
    Job,
    KeyHistory,
    Policy,
    Signal,
)

_BINS = 200   # class-median resolution: 0.5 percentage points of MFU


def job_class(gpus: int) -> str:
    """Jobs are compared with jobs of their size: MFU falls with scale (communication)."""
    return "1 GPU" if gpus == 1 else ("2-8 GPUs" if gpus <= 8 else ">8 GPUs")


class MfuBook:
    """MFU learned per key (decayed) and per class (a histogram, for the class median)."""

    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.keys: dict[str, KeyHistory] = {}
        self.hist: dict[str, list[int]] = {}
        self.counts: dict[str, int] = {}
        self._median: dict[str, float | None] = {}
        self.observations = 0   # a class median can have moved only when this has

    def _decayed(self, h: KeyHistory, now: float) -> float:
        return h.weight * math.pow(2.0, -max(0.0, now - h.updated) / self.half_life_s)

    def observe(self, key: str, cls: str, mfu: float, label: str, now: float) -> None:
        """One job's MFU (and label) for its key and class. An UNKNOWN label (a signal whose
        MFU was trusted and its label not: ``Signal.scheduled``, a busy machine) keeps the key's
        last known one: it says the label was not read, not that it changed. (Overwritten, a
        Slurm test's input-bound key read "unknown" after one low-confidence window, 2026-12-01.)"""
        h = self.keys.get(key)
        if h is None:
            self.keys[key] = KeyHistory(mfu, label, 1.0, now)
        else:
            w = self._decayed(h, now)
            h.mfu = (h.mfu * w + mfu) / (w + 1.0)
            h.weight, h.updated = w + 1.0, now
            if label != UNKNOWN:
                h.label = label
        bins = self.hist.setdefault(cls, [0] * _BINS)
        bins[min(_BINS - 1, max(0, int(mfu * _BINS)))] += 1
        self.counts[cls] = self.counts.get(cls, 0) + 1
        self._median.pop(cls, None)
        self.observations += 1

    def relabel(self, key: str, label: str) -> None:
        """A key's label read later than its MFU (``slurm.history.History.observe``): the label
        changes, the MFU and its weight do not (no second observation)."""
        h = self.keys.get(key)
        if h is not None:
            h.label = label

    def lookup(self, key: str, now: float) -> KeyHistory | None:
        h = self.keys.get(key)
        return None if h is None else KeyHistory(h.mfu, h.label, self._decayed(h, now), now)

    def class_median(self, cls: str) -> float | None:
        if cls in self._median:
            return self._median[cls]
        n = self.counts.get(cls, 0)
        m = None
        seen = 0
        for i, c in enumerate(self.hist.get(cls, ())):
            seen += c
            if 2 * seen >= n:
                m = (i + 0.5) / _BINS
                break
        self._median[cls] = m
        return m


def fmt_mfu(x: float) -> str:
    """An MFU in words with the digits that tell values apart: "0.12%", "3.4%", "41%" (MFUs of
    input-bound jobs are often below 1%, where "0% vs 0% median" said nothing)."""
    if x < 0.01:
        return f"{x:.2%}"
    return f"{x:.1%}" if x < 0.1 else f"{x:.0%}"


def signal_usable(sig: Signal | None, policy: Policy) -> bool:
    """Whether the job's own MFU orders it: fresh, and its MFU's confidence (``Signal
    .mfu_confidence``, else the label's) at the floor."""
    return sig is not None and sig.trust >= policy.min_signal_confidence \
        and sig.age_s <= policy.max_signal_age_s


def efficiency_factors(mfu, median, idle, policy: Policy):
    """The efficiency factor's arithmetic, elementwise (numpy arrays or plain numbers): MFU over
    its class median below it, floored at ``Policy.min_efficiency_factor``; at most
    ``Policy.idle_label_factor`` for a GPU-idle label; 1 where the MFU is unknown (NaN) and
    the label is not GPU-idle. ``efficiency_factor`` and every ``ordering.Ordering`` use it."""
    mfu, median = np.asarray(mfu, float), np.asarray(median, float)
    low = (median > 0) & (mfu < median)   # (comparisons with NaN are False, and warn of nothing)
    f = np.where(low, np.maximum(policy.min_efficiency_factor, mfu / np.where(low, median, 1.0)), 1.0)
    return np.where(idle, np.minimum(f, policy.idle_label_factor), f)


def efficiency_factor(job: Job, signal: Signal | None, history: KeyHistory | None, policy: Policy,
                      class_median: float | None) -> tuple[float, str]:
    """(factor in (0, 1], reason): 1 is neutral; lower factors wait longer (never forever)."""
    signal = signal.scheduled(policy.min_signal_confidence) if signal is not None else None
    if signal_usable(signal, policy):
        mfu, label, src = signal.mfu, signal.label, "its signal"
    elif history is not None and history.weight >= policy.min_history_weight:
        mfu, label, src = history.mfu, history.label, f"earlier jobs of key {job.key}"
    else:
        why = "no signal"
        if signal is not None:
            why = (f"signal ignored (confidence {signal.confidence:.2f} < {policy.min_signal_confidence})"
                   if signal.confidence < policy.min_signal_confidence
                   else f"signal ignored (stale: {signal.age_s:.0f} s old)")
        return 1.0, f"{why}: neutral"
    factor = float(efficiency_factors(mfu, class_median or np.nan, label in GPU_IDLE_LABELS, policy))
    return factor, lowered(job, mfu, label, src, class_median, factor)


def lowered(job: Job, mfu: float, label: str, src: str, class_median: float | None, factor: float) -> str:
    """The reason a job's efficiency ``factor`` (``efficiency_factors``) gives, in words."""
    parts = []
    if class_median and mfu < class_median:
        parts.append(f"MFU {fmt_mfu(mfu)} vs {fmt_mfu(class_median)} median of its class "
                     f"({job_class(job.gpus)})")
    if label in GPU_IDLE_LABELS:
        parts.append(f"{label}: its GPUs wait idle")
    if factor >= 1.0:
        return f"MFU {fmt_mfu(mfu)} from {src}: not lowered"
    return f"priority lowered: {'; '.join(parts)} (from {src})"


def efficiency_delay(factor: float, policy: Policy) -> float:
    """Seconds added to the effective submit time for an efficiency factor: at most
    ``Policy.max_efficiency_delay_s`` (at factor 0), none at 1 or with efficiency off."""
    return (1.0 - factor) * policy.max_efficiency_delay_s if policy.efficiency else 0.0


def waste_charge(factor: float, policy: Policy) -> float:
    """GPUs a team is charged per GPU of a job at efficiency ``factor`` (``efficiency_factor``):
    1 at factor 1 (or with ``Policy.waste_charge`` off), at most 1 + 0.9 x ``Policy.waste_weight``
    at the factor floor. Why a charge and not a delay: the delay only reorders a team's own
    queue, while the order across teams reads use against quota - charging the use is what
    makes the team that wastes GPUs the one that waits (Slurm's billing weights, on MFU)."""
    return 1.0 + policy.waste_weight * (1.0 - factor) if policy.waste_charge else 1.0


def tier_name(job: Job) -> str:
    return TIER_NAMES[job.tier]
