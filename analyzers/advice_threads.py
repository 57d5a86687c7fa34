"""Fewer intra-op threads on a CPU that other processes crowd.

Why: a CPU job's operators split their work over torch's intra-op threads, which meet at each
operator's end. Where the machine's other work leaves the job fewer cores than it has threads,
one of them waits for a core and the others wait for it: asleep, or spinning (OpenMP's default
policy), which takes a core from the thread they wait for. The job's own pace rightly leaves
that wait to the machine (``gpudiag.pace``), so no share of the verdict shows it, yet the fix is
the job's: fewer threads, so that none waits for another. Blind check 21 (2026-11-30, this
project's 2-core AMD EPYC VM at load 3-8, torch's default 2 threads, workers 0 or 2) measured
one thread at 0.14x, 0.28x and 0.19x the mean step of three jobs, the largest change of any
applied there, where gpudiag named threads only inside a refusal, or not at all.

It is advised only where it cannot take a core the job has: the job's processes used no more
than the cores the other work left (``JobCpu.available``), and those are at least a whole core
fewer than its threads; so on an idle machine, where the threads have their cores, it is
silent. What it saves is not predicted: it is the wait for one another, which depends on what
else the machine runs while the job does; a run with it applied tells.
"""

from __future__ import annotations

import math

from gpudiag.analyzers import whatif
from gpudiag.analyzers.advice_inputs import AdviceInputs, job_cpu, on_gpu
from gpudiag.analyzers.classify import HOST_NOTABLE
from gpudiag.diagnosis import Bottleneck
from gpudiag.units import ms, pct_whole


def crowded(a: AdviceInputs) -> tuple[whatif.JobCpu, float, float] | None:
    """(the job's CPU use, other processes' part of an untraced step, that step's wall clock),
    us, where the advice applies: a CPU job whose intra-op threads outnumber the cores the
    machine's other work left it by a whole core or more, and whose untraced steps those
    processes took HOST_NOTABLE of or more; else None."""
    cpu, hw = job_cpu(a.traits), a.host_wait
    if on_gpu(a) or cpu is None or cpu.threads < 2 or hw is None:
        return None
    machine, wall = hw.untraced_machine_us, hw.untraced_wall_us
    if machine is None or not wall or machine < HOST_NOTABLE * wall:
        return None
    if cpu.threads < cpu.available + 1:
        return None
    return cpu, machine, wall


def threads_to_use(cpu: whatif.JobCpu) -> int:
    """As many threads as whole cores the other work leaves, at least one."""
    return max(1, math.floor(cpu.available))


def text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    found = crowded(a)
    assert found is not None
    cpu, machine, wall = found
    return (f"Other processes took {ms(machine)} of each {ms(wall)} step "
            f"({pct_whole(machine / wall)}) and left the job {cpu.available:.2g} of its {cpu.cpus} "
            f"cores, fewer than its {cpu.threads} intra-op threads: each operator waits at its end for "
            "its slowest thread, so one waiting for a core holds the others (with OpenMP's default "
            "wait policy they spin meanwhile, taking cores from it). While the machine is this busy, "
            "run with "
            f"torch.set_num_threads({threads_to_use(cpu)}), or give the job cores of its own "
            "(taskset, a cgroup), then profile again.")


def predict(a: AdviceInputs) -> whatif.Prediction:
    return whatif.Prediction(None, "what it saves is the threads' wait for one another, which depends "
                                   "on what else the machine runs meanwhile: a run with it applied tells")
