"""Host time on a GPU job split in two: the job's own work, and time waiting for a core.

Why: a GPU sits idle while the training thread prepares the next launches. That thread is
either running (Python, launches, syncs: the job's own host work, which CUDA graphs or
``torch.compile`` remove) or runnable but waiting for a core that its DataLoader workers, its
intra-op threads or another job hold. The fixes differ (fewer threads, workers sized to the
free cores, augmentation on the GPU), and a trace cannot tell the two apart: the gap looks the
same. The kernel can: ``/proc/<pid>/task/<tid>/schedstat`` counts the nanoseconds a thread
waited on a run queue. The step timer reads it for the thread that ends each step (the
training loop's, ``StepRow.wait_s``), so each step says how long that thread waited.

Where in the step the wait fell, a per-step count cannot say: it is taken as host gap time up
to the step's host gaps (a host-bound step's GPU waits for every launch the thread could not
make; a GPU-bound step has few gaps, so little is charged). Whose work held the cores comes
from the host sampler over the untraced steps (``host_cpu``): the CPU the job's processes used
beyond the training thread (its own) against the CPU the rest of the machine used (others),
the wait split in proportion. That is the scheduler's fair share assumed, at the sampler's 1 s
grain; it cannot name a process outside the job, nor tell a worker from an intra-op thread.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpudiag.analyzers.breakdown import sum_breakdowns
from gpudiag.analyzers.host_cpu import HostCpu, host_cpu
from gpudiag.diagnosis import HostWait, RankResult, TimeBreakdown
from gpudiag.rundir import (
    STARTUP_STEPS,
    BootstrapMeta,
    HostSample,
    StepRow,
    WindowSteps,
    wait_shares,
)

NOT_RECORDED = ("the training thread's wait for a core was not recorded (a run directory written "
                "before gpudiag's step timer read /proc schedstat, or not Linux): the host time is "
                "not split into the job's own and waiting for a core")


def _reference(windows: list[WindowSteps] | None, steps: dict[int, list[StepRow]]) -> list[StepRow]:
    """The untraced steps the verdict's reference uses (around the window, lowest rank), else
    every untraced step after start-up."""
    for w in sorted(windows or [], key=lambda w: w.rank):
        if w.before_rows or w.after_rows:
            return w.before_rows + w.after_rows
    rows = steps.get(min(steps), []) if steps else []
    return [r for r in rows if r.profiler is None and r.step > STARTUP_STEPS]


def shares(host: HostCpu | None, thread_cores: float | None) -> tuple[float, float] | None:
    """(own, other) over the untraced steps (``rundir.wait_shares``); None where the sampler
    has no machine figure or nothing competed."""
    if host is None or thread_cores is None:
        return None
    return wait_shares(host.cores_used, thread_cores, host.other_cores)


def host_wait(windows: list[WindowSteps] | None, steps: dict[int, list[StepRow]],
              host: HostCpu | None, samples: Sequence[HostSample] = (),
              boot: Mapping[int, BootstrapMeta] | None = None) -> HostWait | None:
    """The run's ``HostWait``; None where there are no step rows at all. Who held the cores
    comes from ``host`` (the untraced steps); where those are too short for the 1 s sampler (a
    40-step GPU job: 2 s), from every step after start-up, traced ones included (the profiler's
    own work then counts as the job's)."""
    if not steps:
        return None
    rows = [r for rs in steps.values() for r in rs]
    if not any(r.wait_s is not None for r in rows):
        return HostWait(recorded=False, note=NOT_RECORDED)
    traced = [r for w in windows or [] for r in w.traced_rows if r.wait_s is not None]
    ref = [r for r in _reference(windows, steps) if r.wait_s is not None and r.dt > 0]
    ran = [r for r in ref if r.run_s is not None]  # a torn row may lack one of the two
    wait = statistics.median(r.wait_s for r in ref) * 1e6 if ref else None
    run = statistics.median(r.run_s for r in ran) * 1e6 if ran else None
    cores = statistics.median(r.run_s / r.dt for r in ran) if ran else None
    over = "untraced steps"
    if host is None and samples:
        every = {k: [replace(r, profiler=None) for r in rs] for k, rs in steps.items()}
        host = host_cpu(samples, every, boot or {}, min_samples=1)
        over = "every step, traced ones included: the untraced ones were too short for it"
    split = shares(host, cores)
    tw = sum(r.wait_s for r in traced) / len(traced) * 1e6 if traced else None
    parts = []
    if tw is not None:
        parts.append(f"{tw / 1e3:.3g} ms per traced step")
    if wait is not None:
        parts.append(f"{wait / 1e3:.3g} ms per untraced step (median of {len(ref)})")
    whose = (f"; of the CPU competing with it, {100 * split[0]:.0f}% was the job's own processes "
             f"and threads, {100 * split[1]:.0f}% other processes (host sampler, {over})"
             if split else "; who held the cores is unknown (too few host samples, or none of the "
             "machine's)")
    note = ("the training thread waited for a core " + (", ".join(parts) or "(no step to say)")
            + whose)
    return HostWait(recorded=True, note=note, traced_wait_us=tw, untraced_wait_us=wait,
                    untraced_run_us=run, own_share=split[0] if split else None,
                    other_share=split[1] if split else None)


def charge(b: TimeBreakdown, wait_us: float, other_share: float | None) -> TimeBreakdown:
    """``b`` with ``wait_us`` of the training thread's wait charged to its host gaps (at most
    all of them), and the part other processes held as ``host_stalled``; without a split, none
    is the machine's (the job's own threads may have held every core)."""
    w = max(b.host_waiting, min(max(0.0, wait_us), b.host_overhead))
    return replace(b, host_waiting=w, host_stalled=max(b.host_stalled, w * (other_share or 0.0)))


def with_waits(result: RankResult, rows: list[StepRow], wait: HostWait) -> RankResult:
    """A GPU rank's traced steps with their step rows' waits charged, step by step where the
    trace's steps and the step timer's traced rows pair up one to one, else each at their mean."""
    waits = [r.wait_s * 1e6 for r in rows if r.wait_s is not None]
    if not wait.recorded or not waits or not result.steps or result.steps[0].step is None:
        return result
    pair = len(waits) == len(result.steps)
    mean = sum(waits) / len(waits)
    steps = [replace(s, breakdown=charge(s.breakdown, waits[i] if pair else mean, wait.other_share))
             for i, s in enumerate(result.steps)]
    return replace(result, steps=steps, total=sum_breakdowns([s.breakdown for s in steps]))


def unprofiled_waits(b: TimeBreakdown, wait: HostWait | None) -> TimeBreakdown:
    """The estimate of the unobserved step with the reference steps' own wait (not the traced
    steps', which the profiler's extra host work changed)."""
    if wait is None or wait.untraced_wait_us is None:
        return b
    out = replace(b, host_waiting=0.0, host_stalled=0.0)
    return charge(out, wait.untraced_wait_us, wait.other_share)
