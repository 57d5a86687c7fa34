"""The training thread's wait for cores its own DataLoader workers held reads as input time in
the label (``analyzers.loader_cores``): blind check 40's 2-worker augmenting loader on 2 cores
read a compute/memory tie while caching its batches ran it 0.47x."""

from __future__ import annotations

import pytest

from gpudiag.analyzers import loader_cores
from gpudiag.analyzers.classify import classify, shares
from gpudiag.diagnosis import Bottleneck, HostWait, JobTraits, Mfu, Roofline, TimeBreakdown

# blind check 40's job a, unprofiled view (us): a 113 ms step, 15 ms of it in next(loader)
VIEW = TimeBreakdown(step_time=113e3, gpu_busy=90e3, compute=90e3, compute_bound=55e3, memory_bound=35e3,
                     idle=23e3, input_wait=15e3, host_overhead=8e3, host_stalled=0.5e3, host_waiting=2.5e3)
WAIT = HostWait(recorded=True, note="", untraced_wait_us=30.3e3, untraced_run_us=60e3, own_share=1.0,
                other_share=0.0)


def traits(workers: int = 2, proc: float | None = 0.6, threads: int = 1) -> JobTraits:
    return JobTraits(training=True, optimizer=True, dataloader_workers=[workers] if workers else [],
                     cores_used=1.98, cpus=2, intra_op_threads=threads, proc_cores=proc, cpu_step_s=0.113)


def verdict(b: TimeBreakdown, cause: str = ""):
    return classify(b, device_kind="cpu", roofline=Roofline("shapes", 192e9, 17.8e9, 10.8, "fp32", 0, 0, 0),
                    mfu=Mfu(0.05, "t", None, "shapes", "fp32", None, None), n_steps=5, input_cause=cause)


def test_the_wait_for_cores_the_workers_held_turns_a_compute_tie_into_input_bound():
    assert verdict(VIEW).label is Bottleneck.COMPUTE
    held = loader_cores.held_us(VIEW, WAIT, traits(), traced=False, device_kind="cpu")
    # the training process's cores less the thread's own (0.6 - 60/113) are its other threads'
    assert held == pytest.approx(30.3e3 * 1.38 / (1.38 + (0.6 - 60 / 113)), rel=1e-6)
    moved = loader_cores.as_input(VIEW, held)
    parts = moved.compute + moved.comm_exposed + moved.memcpy_exposed + moved.idle
    assert parts == pytest.approx(moved.step_time)
    assert moved.idle == pytest.approx(moved.input_wait + moved.host_overhead)
    assert moved.host_waiting == pytest.approx(VIEW.host_stalled)  # the own part of the gaps' wait went first
    v = verdict(moved, loader_cores.cause(held, moved.own_step))
    assert v.label is Bottleneck.INPUT, shares(moved)
    assert "points of it the training thread waiting for cores its DataLoader workers held" in v.summary


def test_nothing_moves_without_workers_a_measured_split_or_on_a_gpu():
    assert loader_cores.held_us(VIEW, WAIT, traits(workers=0), False, "cpu") == 0
    assert loader_cores.held_us(VIEW, WAIT, traits(), False, "gpu") == 0
    assert loader_cores.held_us(VIEW, HostWait(recorded=True, note="", untraced_wait_us=30e3), traits(),
                                False, "cpu") == 0  # who held the cores not sampled
    # other processes held them: not the loader's
    busy = HostWait(recorded=True, note="", untraced_wait_us=30e3, untraced_run_us=60e3, own_share=0.0,
                    other_share=1.0)
    assert loader_cores.held_us(VIEW, busy, traits(), False, "cpu") == 0
    # the training process's threads not told apart: only a one-thread model's wait is the workers'
    assert loader_cores.held_us(VIEW, WAIT, traits(proc=None, threads=2), False, "cpu") == 0
    assert loader_cores.held_us(VIEW, WAIT, traits(proc=None), False, "cpu") == pytest.approx(30.3e3)
    assert loader_cores.as_input(VIEW, 0.0) is VIEW and loader_cores.cause(0.0, 1.0) == ""
