"""OpenMP's passive wait policy on a CPU job's intra-op threads: what its sleeps cost the step.

Why: under ``OMP_WAIT_POLICY=PASSIVE`` torch's intra-op threads sleep as soon as a parallel
region ends, and each new region must wake them (a futex wake and a trip through the
scheduler), as the training thread, waiting for its peers at the region's end, is woken in
turn. A job of many short operators pays that twice per region; libgomp's default policy spins
briefly first and pays neither. The blind check of 2026-12-02 (2-core AMD EPYC VM, quiet) ran a
4 x Linear(512) MLP on 2 threads at 22.8 ms a step passive and 14.3 ms with the policy unset,
and the 2-thread MLP of tests/jobs 2.98 ms against 1.35 ms on the 2-core Intel Xeon VM; nothing
in gpudiag said so (the sleep was first read as a blocking call, then, rightly, as not one).

What it saves (``predict``) is read from the training thread's own clocks over the untraced
steps: the times schedstat put it back on a core (``HostWait.untraced_slices``), each a sleep
and a wake-up that spinning avoids, for the thread and for the peer it woke, at ``WAKE_US``
each. Measured on the 2-core AMD EPYC VM (2026-12-02, quiet, 2 threads, passive against unset,
3 alternated runs each): six jobs gave back 51-94 us a wake-up (a 4 x Linear(512) MLP 3.2 ms of
6.8 over 35; 3 x Linear(1024) 2.1 ms of 19.5 over 41; 3 x Linear(256) at batch 256 3.0 of 5.0
over 42; six LayerNorm/softmax blocks 11.8 of 68 over 126; 60 tiny blocks 32 of 43 over 538; 16
x Linear(128) 4.6 of 6.0 over 86), and never more than 77% of the step, the operators' own work
staying. The thread's sleep is no bound: they gave back 0.7-2.4 times it, as a peer's late
wake-up at a region's start keeps the training thread working, not asleep.

It is advised only where spinning takes no core the job's threads need: as many cores free of
other processes as the job has intra-op threads (``JobCpu.available``). Beside other work a
spinning thread holds a core another runnable thread wants (docs/diagnosis.md, "The job's own
pace"), which is why the tests' own jobs run passive.
"""

from __future__ import annotations

from gpudiag.analyzers.advice_inputs import AdviceInputs, job_cpu, on_gpu
from gpudiag.analyzers.whatif import Prediction
from gpudiag.units import ms

# Named where the low end of what it gives back is at least this share of the step (a tiny
# gain is below a step timer's noise).
GAIN_NOTABLE = 0.05
# What one wake-up costs the step, the low and the high end (us), and the most of the step it
# gives back: the six jobs of the module's docstring (51-94 us; at most 77% of the step).
WAKE_US = (50.0, 95.0)
MOST = 0.8


def _sleep(a: AdviceInputs) -> tuple[float, float] | None:
    """(the training thread's sleep per step in us, its wake-ups per step) where the advice
    can apply: a CPU job with more than one intra-op thread under the passive policy whose
    step timer read the thread's clocks; else None."""
    w = a.host_wait
    if on_gpu(a) or w is None or not w.passive_threads or w.untraced_asleep_us is None \
            or w.untraced_slices is None:
        return None
    return w.untraced_asleep_us, w.untraced_slices


def _given_back(a: AdviceInputs, wakes: float) -> tuple[float, float]:
    """(low, high) us a step that spinning gives back: ``WAKE_US`` a wake-up, at most ``MOST``
    of the step."""
    top = MOST * a.view.step_time
    low, high = WAKE_US
    return min(wakes * low, top), min(wakes * high, top)


def applies(a: AdviceInputs) -> bool:
    got = _sleep(a)
    return got is not None and a.view.own_step > 0 and \
        _given_back(a, got[1])[0] >= GAIN_NOTABLE * a.view.own_step


def no_core_to_spin(a: AdviceInputs) -> str | None:
    """Why spinning would not help: its threads would need more cores than the machine's other
    work leaves the job; None where they have them (or where the host sampler could not say)."""
    cpu = job_cpu(a.traits)
    n = a.host_wait.passive_threads if a.host_wait is not None else None
    if cpu is None or not n or n <= cpu.available + 0.5:
        return None
    return (f"spinning threads hold their cores: the job's {n} intra-op threads would need {n} "
            f"cores, and other processes left it about {cpu.available:.1g} of the {cpu.cpus}; "
            "a spinning thread would take a core from the one it waits for")


def text(a: AdviceInputs, s: object = None) -> str:
    got = _sleep(a)
    assert got is not None and a.host_wait is not None
    asleep, wakes = got
    return (f"The job runs {a.host_wait.passive_threads} intra-op threads under "
            f"OMP_WAIT_POLICY=PASSIVE: they sleep at the end of every parallel region inside torch's "
            f"operators and are woken for the next, and the training thread with them (woken "
            f"{wakes:.0f} times a step, asleep {ms(asleep)} of each {ms(a.view.own_step)}). Unset "
            "OMP_WAIT_POLICY (OpenMP's default spins briefly before sleeping), or set "
            "OMP_WAIT_POLICY=ACTIVE, where the job has a core per thread.")


def predict(a: AdviceInputs) -> Prediction:
    """Each wake-up spinning avoids at ``WAKE_US``: the low end is the prediction, the high end
    the step's other end (``Prediction.best_us``)."""
    got = _sleep(a)
    assert got is not None
    _asleep, wakes = got
    step = a.view.step_time
    low, high = _given_back(a, wakes)
    return Prediction(
        step - low,
        f"the training thread's {wakes:.0f} wake-ups a step spun through instead, each giving back "
        f"{WAKE_US[0]:.0f}-{WAKE_US[1]:.0f} us (its own wake-up and its peers' at the region's "
        f"start): {ms(low)} (this prediction) to {ms(high)} (its other end) a step, never more than "
        f"{MOST:.0%} of the step (the range six jobs measured on a 2-core AMD EPYC VM); assumes "
        "each thread keeps a core of its own while it spins",
        best_us=step - high)
