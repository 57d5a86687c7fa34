"""Before/after: what changed between two diagnoses of (supposedly) the same job.

Kernels and operators are compared by mean time *per step*, so runs that traced a
different number of steps or ranks still compare like for like.
"""

from __future__ import annotations

from gpudiag.diagnosis import (
    DIFF_SCHEMA_VERSION,
    Diagnosis,
    DiagnosisDiff,
    ItemDelta,
    TimeBreakdown,
    TopItem,
)

MAX_ITEMS = 15


def _steps(d: Diagnosis) -> int:
    return max(1, sum(len(r.steps) for r in d.ranks))


def _per_step(items: list[TopItem], steps: int) -> dict[str, float]:
    return {t.name: t.time_us / steps for t in items}


def _deltas(before: dict[str, float], after: dict[str, float]) -> list[ItemDelta]:
    out = []
    for name in set(before) | set(after):
        b, a = before.get(name, 0.0), after.get(name, 0.0)
        out.append(ItemDelta(name=name, before_us=b, after_us=a, delta_us=a - b,
                             ratio=a / b if b > 0 and a > 0 else None))
    out.sort(key=lambda x: -abs(x.delta_us))
    return out[:MAX_ITEMS]


def compare(before: Diagnosis, after: Diagnosis) -> DiagnosisDiff:
    nb, na = _steps(before), _steps(after)
    notes = []
    if before.device.name != after.device.name:
        notes.append(f"different devices: {before.device.name} before, {after.device.name} after")
    if (before.world_size or 1) != (after.world_size or 1):
        notes.append(f"different world sizes: {before.world_size} before, {after.world_size} after")
    if before.top_kernels and after.top_kernels:
        notes.append("kernels and operators are compared by mean time per traced step and rank, "
                     "over the top items of each run")
    bst, ast = before.breakdown.step_time, after.breakdown.step_time
    return DiagnosisDiff(
        schema_version=DIFF_SCHEMA_VERSION,
        before_sources=before.sources, after_sources=after.sources,
        before=before.breakdown, after=after.breakdown,
        step_time_change=(ast / bst - 1) if bst > 0 and ast > 0 else None,
        label_before=before.verdict.label, label_after=after.verdict.label,
        mfu_before=before.mfu.value, mfu_after=after.mfu.value,
        kernels=_deltas(_per_step(before.top_kernels, nb), _per_step(after.top_kernels, na)),
        ops=_deltas(_per_step(before.top_ops, nb), _per_step(after.top_ops, na)),
        device_before=before.device.name, device_after=after.device.name, notes=notes,
        breakdown_delta=TimeBreakdown(**{
            f: getattr(after.breakdown, f) - getattr(before.breakdown, f)
            for f in TimeBreakdown.__dataclass_fields__}),
    )
