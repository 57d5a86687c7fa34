"""Communication read by its cost, not only its exposed time (issue 37, item 4).

Seen on a 2-core AMD EPYC: 2-rank DDP over gloo with 100 MB of gradients read memory-bound
(0.85), communication 25-29% "exposed", while the same steps under ``no_sync()`` took 126-154 ms
against 348-373 ms: the collectives cost 59-62% of the step. On a CPU gloo runs on the ranks'
own cores and DDP copies every gradient into its buckets and back on the training thread; the
diagnosis now counts both (``analyzers.comm_cost``), the first from the collectives' threads' CPU
time the step timer records, the second from the trace.

A real 2-rank gloo DDP job (tests/jobs/ddp_grads_job.py, 57 MB of gradients) alternates steps
as they are with steps under ``no_sync()`` (the step without its collectives), and gpudiag traces
a window of the first kind: the communication cost it gives is held to the cost the job's own
timer shows (its steps less its no_sync steps), within a factor COMM_COST_FACTOR.

Solo (run alone, after the lanes): the truth is a difference of wall steps, and beside other
work a step with collectives waits for whichever rank was crowded last, a step under no_sync
for none, so the truth grows with the load while the cost, at the job's own pace, leaves that
wait out (``pace.peers_crowded``). The project's CI, at load ~4 in the lanes' pass, read
126.2 ms of truth against a cost of 62.8 ms (exposed 35.0): a factor the load made, not the cost.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpudiag.analyzers.comm_cost import cost
from gpudiag.diagnosis import Bottleneck, Diagnosis
from gpudiag.rundir import read_steps
from tests.harness import torchrun, torchrun_failure, torchrun_ran
from tests.paths import TESTS

JOBS = TESTS / "jobs"
# Relative, on the collectives' cost per step (the step with them less the step under no_sync):
# the two figures come from different steps of a machine whose pace moves by a third within
# seconds (the no_sync steps are a fifth of the run), and the cost's parts are each an estimate
# (the contention's share of the threads' CPU above all). On this project's 2-core AMD EPYC:
# 69.8 ms against 64.5 ms at load average 8; 72.3 ms against 126 ms with the suite at nice 19
# beside two other engineers' work (the truth itself nearly doubled); the exposed time alone
# (24.7-29.2 ms) is farther in both. Costs, not shares: a share's denominator on a busy machine
# is the step at the job's own pace (``gpudiag.pace``), which the job's own timer cannot give.
# A factor, not a margin: the truth itself ran 50.6 to 126 ms across runs (the project's CI clone
# at load 3-10 read 82.9 ms against 50.6, exposed 21.6); the exposed time alone, what gpudiag
# gave before the cost, falls below the factor: 0.43x there, 0.38-0.45x and 0.20-0.23x above.
COMM_COST_FACTOR = 2.0
SKIP_STEPS = 5  # the job's first steps: allocator and thread-pool warm-up


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    if not __import__("torch").distributed.is_gloo_available():
        pytest.skip("no gloo")
    tmp = tmp_path_factory.mktemp("ddp")
    run, own = tmp / "run", tmp / "own.json"
    job = [*torchrun(2), str(JOBS / "ddp_grads_job.py"), "--width", "1536",
           "--steps", "56", "--phases", "b20,a8", "--fix", "no-sync", "--report", str(own)]
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "7",
                           "--", *job], capture_output=True, text=True, timeout=900)
    assert torchrun_ran(proc, wrote=own), torchrun_failure(proc)
    return Diagnosis.from_json((run / "diagnosis.json").read_text()), json.loads(own.read_text()), run


def own_median(own: dict, phase: str, touched: set[int]) -> float:
    steps = zip(own["step_seconds"], own["phases"], strict=True)
    return statistics.median(t for i, (t, p) in enumerate(steps)
                             if p == phase and i >= SKIP_STEPS and i + 1 not in touched)


def test_the_collectives_threads_cpu_time_is_recorded_each_step(ddp):
    _, _, run = ddp
    rows = [r for rs in read_steps(run).values() for r in rs]
    cpu = [r.comm_cpu_s for r in rows if r.comm_cpu_s is not None]
    assert len(cpu) >= len(rows) / 2, f"{len(cpu)} of {len(rows)} rows"
    assert statistics.median(cpu) > 0


def test_communication_share_by_cost_is_close_to_what_no_sync_shows(ddp):
    d, own, run = ddp
    touched = {r.step for rs in read_steps(run).values() for r in rs if r.profiler}
    # what the collectives cost a step, by the job's own timer: its steps less its no_sync steps
    truth = own_median(own, "b", touched) - own_median(own, "a", touched)
    view = d.unprofiled or d.breakdown
    # the verdict's share is of the step its fix is predicted on (``classify.shares``)
    share = cost(view) / view.step_time
    assert d.verdict.evidence[f"{Bottleneck.COMMUNICATION.value} share"] == pytest.approx(share, abs=1e-3)
    got = cost(view) / 1e6
    detail = (f"cost {got * 1e3:.1f} ms (exposed {view.comm_exposed / 1e3:.1f}, copies "
              f"{view.comm_work / 1e3:.1f}, cores {view.comm_contention / 1e3:.1f}) against no_sync's "
              f"{truth * 1e3:.1f} ms; {d.verdict.summary}")
    assert view.comm_work > 0, detail  # DDP's copies into and out of its buckets, from the trace
    # within the margin of the truth. (Not "nearer than the exposed time alone": in a CI run at
    # load ~4 the exposed time read 63.2 ms, the cost 93.1, the truth 72.3 - two estimates closer
    # to each other than the truth's own run-to-run spread, 64.5-126 ms above: a benchmark's
    # comparison, not a test's.)
    assert truth / COMM_COST_FACTOR <= got <= COMM_COST_FACTOR * truth, detail


def test_the_communication_share_is_what_its_accumulation_fix_removes(ddp):
    """The share the label reads and the step the fix predicts describe one cost over one step:
    accumulating over K micro-batches removes (1 - 1/K) of communication's share of the step,
    and as much of the optimizer's, which it also runs once every K (held-out zoo, ddp_bigrad:
    the optimizer left in read 0.72x where 0.38-0.46x was measured). A share over the own-pace
    step (the machine's part left out) with a prediction over the wall step read a 2-rank DDP
    job at load 2-6 as 73% communication where accumulating over 4 ran 0.64x, as predicted: 48%
    of the step. Holds at any load (equal before only where the machine took no part of the
    step)."""
    import re

    from gpudiag.analyzers.whatif import ACCUMULATE_STEPS

    d, _, _ = ddp
    less = {r.action: r for r in d.verdict.recommendations}["all-reduce-less-often"]
    removed = 1 - less.predicted_step_s / less.step_s
    share = d.verdict.evidence[f"{Bottleneck.COMMUNICATION.value} share"]
    m = re.search(r"the optimizer's step and zero_grad \(([\d.]+) ms a step\)", less.why)
    assert m, less.why
    view = d.unprofiled or d.breakdown
    share += float(m.group(1)) * 1e3 / view.step_time  # the why's figures are the view's
    assert share * (1 - 1 / ACCUMULATE_STEPS) == pytest.approx(removed, abs=3e-3), (
        f"share {share:.3f}, removed {removed:.3f}; the machine took "
        f"{view.host_stalled / 1e3:.1f} of {view.step_time / 1e3:.1f} ms; {d.verdict.summary}")


def test_the_advice_fits_what_communication_costs(ddp):
    """Fewer all-reduces (accumulation, compression) where communication costs; overlapping
    more of it is predicted with what overlapping already cost the compute here (measured), and
    bounded by the backward it can hide behind, not the whole step's compute."""
    d, _, _ = ddp
    advised = {r.action: r for r in d.verdict.recommendations}
    refused = {r.action: r for r in d.verdict.not_advised}
    less = advised["all-reduce-less-often"]
    assert "no_sync()" in less.text and less.gain is not None and less.gain > 0, less
    view = d.unprofiled or d.breakdown
    overlap = advised.get("overlap-communication") or refused.get("overlap-communication")
    if view.comm_exposed >= 0.1 * (view.step_time - view.host_stalled):  # where overlap applies
        assert overlap is not None and "overlapped with backward" in overlap.why, overlap
        if view.comm_contention > 0:
            assert "slowed it" in overlap.why and "(measured)" in overlap.why, overlap.why
        assert overlap.gain is None or overlap.gain < less.gain, (overlap, less)
