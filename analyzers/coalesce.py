"""Many small collectives a step, each paying a fixed cost: coalesce them.

Why: a loop that all-reduces each gradient tensor by itself (no DDP) makes one call per
tensor, and every call pays a fixed cost beside its bytes (a rendezvous, a gloo round, a
kernel launch): the third blind zoo's ``allreduce_manual`` made 98 all-reduces a step, and one
flat buffer all-reduced once ran 0.35-0.53x the step; gpudiag named only accumulation and
DDP-style overlap. The fixed cost is read from the trace: the intercept of the line through
the calls' times against their bytes (``communication.call_cost``), where the calls' sizes
spread enough to tell it from the cost per byte (a model's weights and biases do).

DDP and FSDP already bucket their collectives (their knob is the bucket size, which the
overlap advice names): not for them.
"""

from __future__ import annotations

from gpudiag.analyzers.advice_inputs import AdviceInputs
from gpudiag.analyzers.classify import COMM_NOTABLE
from gpudiag.analyzers.whatif import Prediction
from gpudiag.diagnosis import CollectiveStats
from gpudiag.units import ms

# calls of one collective a step from which one buffer is worth it (a handful of calls pays
# a handful of fixed costs: within the step's noise)
MIN_CALLS = 8


def _busiest(a: AdviceInputs) -> tuple[CollectiveStats, float] | None:
    """The collective with a fitted fixed cost, and its calls per step and rank (the table's
    counts are summed over the ranks)."""
    if not a.collectives or not a.steps_per_rank:
        return None
    c = a.collectives[0]
    if c.call_us is None or c.count <= 0 or c.total_time_us <= 0:
        return None
    return c, c.count / a.steps_per_rank / max(a.ranks, 1)


def applies(a: AdviceInputs) -> bool:
    got = _busiest(a)
    if got is None or a.traits.ddp or a.traits.fsdp or a.view.step_time <= 0:
        return False
    c, per_step = got
    exposed = c.exposed_per_step_us or 0.0
    return per_step >= MIN_CALLS and exposed / a.view.step_time >= COMM_NOTABLE


def _latency_share(c: CollectiveStats) -> float:
    """The share of the calls' traced time that is their fixed cost."""
    assert c.call_us is not None
    return min(1.0, c.count * c.call_us / c.total_time_us)


def text(a: AdviceInputs, s: object = None) -> str:
    got = _busiest(a)
    assert got is not None
    c, per_step = got
    size = (f", {c.bytes / c.count / 1e6:.3g} MB on average" if c.bytes else "")
    return (f"Each step makes {per_step:.0f} {c.collective} calls{size}, and each pays a fixed "
            f"{ms(c.call_us or 0.0)} beside its bytes ({100 * _latency_share(c):.0f}% of their time; "
            "fitted over calls of different sizes): coalesce them into one flat buffer reduced once "
            "(torch's _flatten_dense_tensors, or DistributedDataParallel, which buckets the "
            "gradients) instead of one call per tensor.")


def predict(a: AdviceInputs) -> Prediction:
    got = _busiest(a)
    assert got is not None
    c, per_step = got
    share = _latency_share(c)
    exposed = c.exposed_per_step_us or 0.0
    saved = exposed * share * (1 - 1 / per_step)
    return Prediction(a.view.step_time - saved, (
        f"the {per_step:.0f} calls a step become one: their fixed cost ({ms(c.call_us or 0.0)} a "
        f"call, {100 * share:.0f}% of their traced time) paid once, the bytes' cost as before; taken "
        f"from the exposed part ({ms(exposed)} a step); assumes the one large call moves the bytes "
        "as fast as the small ones did. A floor on the gain: the line's fixed cost is what the "
        "smallest calls show, and the larger ones pay per call too (gloo's rounds): a 2-rank gloo "
        "job of 32 calls a step was predicted 0.45x and ran 0.24x coalesced, the third blind zoo's "
        "98 calls 0.54x and 0.38-0.45x"))
