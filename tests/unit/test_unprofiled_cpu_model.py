"""How a CPU job's profiled step is taken apart into what it costs unobserved: the profiler's
cost per recorded event, and the long operators it slowed themselves (``unprofiled._cpu_per_event``).

Measured on a chain of GEMMs between many small operators (docs/diagnosis.md): the profiler
slowed the GEMMs themselves (their data crowded out of the caches by its records), and charging
that per event took it from the gaps between the small operators, which is what
``torch.compile`` removes: its predicted step read 1.3x the compiled one.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpudiag.analyzers.rank_facts import (
    SLOW_FLOOR_QUANTILE,
    SLOW_MIN_CALLS,
    SLOW_MIN_US,
    slowed_beyond_floor,
)
from gpudiag.analyzers.trace_loader import load_rank
from gpudiag.analyzers.unprofiled import DISPATCH_PER_EVENT_MIN, CpuEvents, estimate_unprofiled
from gpudiag.diagnosis import Dilation, TimeBreakdown


@pytest.fixture(scope="module")
def gemm_trace(tmp_path_factory):
    """A real torch profiler trace (CPU, shapes recorded) of three classes of matmul: a long one
    called often, a short one called often, a long one called too few times to have a floor.
    (torch, like pandas below, is imported where it is used: every worker of `make test`'s first
    pass collects this module, and most of them never run it.)"""
    import torch

    torch.manual_seed(0)
    big, small, rare = torch.randn(384, 384), torch.randn(32, 32), torch.randn(512, 512)
    path = tmp_path_factory.mktemp("trace") / "rank-0.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
        for i in range(3 * SLOW_MIN_CALLS):
            torch.mm(big, big)
            torch.mm(small, small)
            if i < SLOW_MIN_CALLS - 3:
                torch.mm(rare, rare)
    p.export_chrome_trace(str(path))
    return load_rank(path)


def test_each_long_call_loses_what_it_took_beyond_its_class_fastest_tenth(gemm_trace):
    import pandas as pd

    rt = gemm_trace
    top = rt.cpu_is_op & (rt.cpu_depth == 0)
    got = slowed_beyond_floor(rt, rt.cpu_dur, top)
    # the same definition, computed another way
    df = pd.DataFrame({"name": [rt.names[i] for i in rt.cpu_name[top]], "shape": rt.cpu_shape[top],
                       "dur": rt.cpu_dur[top]})
    by = df.groupby(["name", "shape"])["dur"]
    floor = by.transform(lambda d: np.sort(d.to_numpy())[int(len(d) * SLOW_FLOOR_QUANTILE)])
    has_floor = (by.transform("size") >= SLOW_MIN_CALLS) & (floor >= SLOW_MIN_US)
    want = np.where(has_floor, np.maximum(0.0, df["dur"] - floor), 0.0)
    np.testing.assert_allclose(got[top], want)
    assert not got[~top].any()
    mm = df["name"] == "aten::mm"
    sizes = df[mm].groupby("shape")["dur"].agg(["size", "median"])
    assert len(sizes) == 3 and has_floor[mm].any() and not has_floor[mm].all(), sizes
    # the test holds something: the long class's slower calls lost time, its fastest did not
    long_cls = has_floor & mm
    assert (want[long_cls] > 0).any() and (want[long_cls] == 0).sum() >= 1


# A profiled CPU step as the chain job's (docs/diagnosis.md): 40 ms traced, of which 26 ms in
# operators (GEMMs) and 14 ms of gaps (small operators, dispatch); 30 ms unobserved; 8,000
# recorded events, 400 of them inside operators.
TRACED = TimeBreakdown(step_time=40e3, gpu_busy=26e3, compute=26e3, compute_bound=26e3,
                       idle=14e3, host_overhead=14e3)


def unprofiled(slowed_us: float) -> tuple[TimeBreakdown, Dilation]:
    dil = Dilation(traced_step_us=40e3, untraced_step_us=30e3, factor=40 / 30, traced_steps=5,
                   untraced_steps=20, untraced_spread=0.02, model="test")
    b, _ = estimate_unprofiled(TRACED, dil, "cpu", CpuEvents(8000, 400, slowed_us))
    return b, dil


def test_long_operators_slowed_by_the_profiler_lose_that_time_before_the_gaps_lose_theirs():
    plain, _ = unprofiled(0.0)
    # 10 ms extra over 8,000 events: 1.25 us each; 0.5 ms from operators, 9.5 ms from the gaps
    assert plain.compute == pytest.approx(25.5e3) and plain.host_overhead == pytest.approx(4.5e3)
    b, dil = unprofiled(4e3)
    # 4 ms from the GEMMs first, then 6 ms over 8,000 events: 0.75 us each, 0.3 ms of it in operators
    assert b.compute == pytest.approx(26e3 - 4e3 - 0.3e3)
    assert b.host_overhead == pytest.approx(14e3 - 5.7e3)
    assert b.step_time == pytest.approx(b.compute + b.idle) == pytest.approx(30e3)
    assert any("4 ms per step" in c and "0.75 us each" in c for c in dil.caveats), dil.caveats


def test_slowed_time_is_bounded_by_the_profilers_extra_time():
    b, dil = unprofiled(25e3)  # more than the 10 ms the profiler added: only those 10 ms go
    assert b.compute == pytest.approx(16e3) and b.host_overhead == pytest.approx(14e3)
    assert any("10 ms per step" in c and "0 us each" in c for c in dil.caveats), dil.caveats


# A window the machine ran 1.8x slower than the steps around it (another tenant for a moment),
# beside a profiler that cost 1 us per event: unobserved, 20 ms of operators and 4 ms of gaps
# from which the job calls 2,000 operators (2 us each: DISPATCH_PER_EVENT_MIN x 1 us); traced,
# 1.8x each plus 1 us per event (400 inside operators, 7,600 in the gaps).
SLOW_WINDOW = TimeBreakdown(step_time=51.2e3, gpu_busy=36.4e3, compute=36.4e3, compute_bound=36.4e3,
                            idle=14.8e3, host_overhead=14.8e3)


def window(traced: TimeBreakdown, untraced_us: float) -> Dilation:
    return Dilation(traced_step_us=traced.step_time, untraced_step_us=untraced_us,
                    factor=traced.step_time / untraced_us, traced_steps=5, untraced_steps=20,
                    untraced_spread=0.02, model="test")


def test_a_window_the_machine_slowed_is_brought_to_the_reference_pace_not_charged_to_the_profiler():
    """Charged per event alone, the window's 27.2 ms beyond the reference would be 3.4 us per
    event, more than the 14.8 ms of gaps hold: the gaps would read empty, and torch.compile's
    gain (what the gaps cost) nothing. The pace and the per-event cost that keep the gaps at the
    dispatch floor are the ones the window was made with."""
    assert DISPATCH_PER_EVENT_MIN == 2.0  # the synthetic window below is built on it
    dil = window(SLOW_WINDOW, 24e3)
    b, cuts = estimate_unprofiled(SLOW_WINDOW, dil, "cpu", CpuEvents(8000, 400, dispatched=2000))
    assert b.compute == pytest.approx(20e3) and b.host_overhead == pytest.approx(4e3)
    assert b.step_time == pytest.approx(24e3) and b.idle == pytest.approx(4e3)
    assert b.compute_bound == pytest.approx(20e3)  # the split keeps its proportions
    assert any("1.80x slower" in c for c in dil.caveats) and any("1 us each" in c for c in dil.caveats)
    [pace] = [x for x in cuts if "slower than the steps around it" in x.reason]
    assert pace.amount == pytest.approx(0.5)  # 0.8 points of pace change, at most 0.5


def test_a_window_at_the_reference_pace_is_charged_per_event_as_before():
    """The same job in a steady window: 30 ms unobserved with 10 ms of gaps (5 us per operator
    called from them, above the floor); the plain per-event charge, 1 us, is the answer."""
    traced = TimeBreakdown(step_time=38e3, gpu_busy=20.4e3, compute=20.4e3, compute_bound=20.4e3,
                           idle=17.6e3, host_overhead=17.6e3)
    dil = window(traced, 30e3)
    b, cuts = estimate_unprofiled(traced, dil, "cpu", CpuEvents(8000, 400, dispatched=2000))
    assert b.compute == pytest.approx(20e3) and b.host_overhead == pytest.approx(10e3)
    assert not any("slower than the steps around it" in c for c in dil.caveats)
    assert not any("slower than the steps around it" in x.reason for x in cuts)


@pytest.mark.parametrize("slowed_us", [0.0, 4e3, 25e3])
def test_the_cpu_caveat_names_where_all_of_the_traced_steps_extra_time_went(slowed_us):
    """'slowed the traced steps 11x' beside '0 us per recorded event' read as a contradiction
    (issue 37): the caveat names every part of the extra time, and the parts add up to it."""
    _, dil = unprofiled(slowed_us)
    [text] = [c for c in dil.caveats if c.startswith("the device is the CPU")]
    total = float(re.search(r"took ([0-9.]+) ms per step more", text).group(1))
    parts = [float(x) for x in re.findall(r"; ([0-9.]+) ms per step ", text.split(": ", 1)[1])]
    first = re.match(r"([0-9.]+) ms per step", text.split("): ", 1)[1])
    parts += [float(first.group(1))] if first else []
    assert total == pytest.approx(10.0) and sum(parts) == pytest.approx(total)
