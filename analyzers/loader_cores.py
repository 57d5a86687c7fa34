"""On a CPU, the training thread's wait for cores the job's own DataLoader workers held is the
input pipeline's cost: the verdict's label counts it as input time.

Why: workers whose batches are CPU work (decoding, augmenting) run on the cores the model
computes on. Where they keep those cores busy, the training thread waits for one inside its own
operators, and the trace shows that wait as stretched operators: compute. Blind check 40's job
(2 workers doing numpy augmentation on 2 cores, a small CNN) read a compute/memory-bound tie
(0.34) with the DataLoader wait at 12% of its step, while the training thread waited for a core
30 ms of each 113 ms untraced step, all of it for the job's own processes; caching its batches
ran it 0.47x. The step timer reads that wait (``HostWait``), and the host sampler what held the
cores (``own_share``, the workers' cores beside the training process's); the label weighs the
workers' part of it with the input wait. The breakdown table still shows it where it ran, the
summary says how much of the input share it is, and no prediction changes: more workers would
add to it, and a cheaper batch removes it (``cheaper-input``, which applies where the input share
with it is notable: ``AdviceInputs.loader_held_us``).
"""

from __future__ import annotations

from dataclasses import replace

from gpudiag.diagnosis import HostWait, JobTraits, TimeBreakdown
from gpudiag.units import ms


def held_us(b: TimeBreakdown, wait: HostWait | None, traits: JobTraits, traced: bool,
            device_kind: str) -> float:
    """Per step, in ``b``: the training thread's wait for a core that the job's DataLoader
    workers caused (the wait, times the job's own share of the competing CPU, times the
    workers' part of the job's other cores); 0 where any of it was not measured."""
    if device_kind != "cpu" or wait is None or wait.own_share is None or b.step_time <= 0:
        return 0.0
    if not any(n > 0 for n in traits.dataloader_workers) or traits.cores_used is None:
        return 0.0
    us = wait.traced_wait_us if traced else wait.untraced_wait_us
    if not us:
        return 0.0
    if traits.proc_cores is None:
        # the training process's other threads not told apart: only a one-thread model's
        frac = 1.0 if (traits.intra_op_threads or 1) == 1 else 0.0
    else:
        workers = max(0.0, traits.cores_used - traits.proc_cores)
        step_us = traits.cpu_step_s * 1e6 if traits.cpu_step_s else b.step_time
        thread = min(1.0, (wait.untraced_run_us or 0.0) / step_us) if step_us > 0 else 0.0
        others = max(0.0, traits.proc_cores - thread)
        frac = workers / (workers + others) if workers + others > 0 else 0.0
    return min(us * wait.own_share * frac, b.compute + max(0.0, b.host_waiting - b.host_stalled))


def as_input(b: TimeBreakdown, us: float) -> TimeBreakdown:
    """``b`` with ``us`` counted as input time: taken first from its host gaps where the thread
    waited for a core the machine's other work did not hold (``host_waiting - host_stalled``),
    then from its compute (each kind in proportion: the wait inside operators stretched them);
    the step and its parts still add up."""
    if us <= 0:
        return b
    h = min(us, max(0.0, b.host_waiting - b.host_stalled))
    c = min(us - h, b.compute)
    k = 1 - c / b.compute if b.compute > 0 else 1.0
    return replace(b, compute=b.compute - c, compute_bound=b.compute_bound * k,
                   memory_bound=b.memory_bound * k, gpu_busy=max(0.0, b.gpu_busy - c),
                   host_overhead=b.host_overhead - h, host_waiting=b.host_waiting - h,
                   idle=b.idle + c, input_wait=b.input_wait + c + h)


def cause(us: float, step_us: float) -> str:
    """What an input-bound summary adds about the part moved here; empty where none was."""
    if us <= 0 or step_us <= 0:
        return ""
    return (f", {100 * us / step_us:.0f} points of it the training thread waiting for cores its "
            f"DataLoader workers held ({ms(us)} a step: their batches are CPU work on the model's cores)")
