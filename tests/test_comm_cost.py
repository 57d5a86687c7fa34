"""Communication read by its cost, not only its exposed time (issue 37, item 4).

Seen on a 2-core AMD EPYC: 2-rank DDP over gloo with 100 MB of gradients read memory-bound
(0.85), communication 25-29% "exposed", while the same steps under ``no_sync()`` took 126-154 ms
against 348-373 ms: the collectives cost 59-62% of the step. On a CPU gloo runs on the ranks'
own cores and DDP copies every gradient into its buckets and back on the training thread; the
diagnosis now counts both (``analyzers.comm_cost``), the first from the collectives' threads' CPU
time the step timer records, the second from the trace.

A real 2-rank gloo DDP job (tests/jobs/ddp_grads_job.py, 57 MB of gradients) alternates steps
as they are with steps under ``no_sync()`` (the step without its collectives), and gpudiag traces
a window of the first kind: the communication share it gives is held to the share the job's own
timer shows, 1 - (no_sync step / step), within COMM_SHARE_MARGIN.
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
from tests.harness import free_port

JOBS = Path(__file__).parent / "jobs"
# Absolute, on the share of the step: the two figures come from different steps of a machine
# whose pace moves by a third within seconds (the no_sync steps are a fifth of the run), and the
# cost's parts are each an estimate (the contention's share of the threads' CPU above all). On
# this project's 2-core AMD EPYC at load average 20-28 (other engineers' suites beside it): 0.29
# against 0.30 (exposed alone 0.14); with the threads' CPU not yet recorded, 0.22 against 0.36.
COMM_SHARE_MARGIN = 0.2
SKIP_STEPS = 5  # the job's first steps: allocator and thread-pool warm-up


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Diagnosis, dict, Path]:
    if not __import__("torch").distributed.is_gloo_available():
        pytest.skip("no gloo")
    tmp = tmp_path_factory.mktemp("ddp")
    run, own = tmp / "run", tmp / "own.json"
    job = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(JOBS / "ddp_grads_job.py"), "--width", "1536",
           "--steps", "56", "--phases", "b20,a8", "--fix", "no-sync", "--report", str(own)]
    proc = subprocess.run([sys.executable, "-m", "gpudiag", "profile", "--out", str(run), "--skip", "7",
                           "--", *job], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
    truth = 1 - own_median(own, "a", touched) / own_median(own, "b", touched)
    view = d.unprofiled or d.breakdown
    share = cost(view) / view.step_time
    assert d.verdict.evidence[f"{Bottleneck.COMMUNICATION.value} share"] == pytest.approx(share, abs=1e-3)
    detail = (f"share {share:.2f} (exposed {view.fraction('comm_exposed'):.2f}, copies "
              f"{view.fraction('comm_work'):.2f}, cores {view.fraction('comm_contention'):.2f}) against "
              f"no_sync's {truth:.2f}; {d.verdict.summary}")
    assert view.comm_work > 0, detail  # DDP's copies into and out of its buckets, from the trace
    assert abs(share - truth) <= COMM_SHARE_MARGIN, detail


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
    if view.comm_exposed >= 0.1 * view.step_time:  # the share overlap-communication applies at
        assert overlap is not None and "overlapped with backward" in overlap.why, overlap
        if view.comm_contention > 0:
            assert "slowed it" in overlap.why and "(measured)" in overlap.why, overlap.why
        assert overlap.gain is None or overlap.gain < less.gain, (overlap, less)
