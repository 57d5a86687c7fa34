"""Host time on a GPU job split in two: the job's own work, and time waiting for a core.

Why: a GPU sits idle while the training thread prepares the next launches. That thread is
either running (Python, launches, syncs: the job's own host work, which CUDA graphs or
``torch.compile`` remove) or runnable but waiting for a core that its DataLoader workers, its
intra-op threads or another job hold. The fixes differ (fewer threads, workers sized to the
free cores, augmentation on the GPU), and a trace cannot tell the two apart: the gap looks the
same. The kernel can: ``/proc/<pid>/task/<tid>/schedstat`` counts the nanoseconds a thread
waited on a run queue. The step timer reads it for the thread that ends each step (the
training loop's, ``StepRow.wait_s``), so each step says how long that thread waited, and for
every other thread of the job (``StepRow.peer_wait_s``, the largest: ``collectors.thread_waits``).

Where in the step the wait fell, a per-step count cannot say: it is taken as host gap time up
to the step's host gaps (a host-bound step's GPU waits for every launch the thread could not
make; a GPU-bound step has few gaps, so little is charged). Whose work held the cores comes
from the host sampler (``gpudiag.pace.wait_shares``: the scheduler's fair share, at the
sampler's 1 s grain): what the job alone would have waited, against what it waited beside the
rest of the machine. It cannot name a process outside the job, nor tell a worker from an
intra-op thread. The part other processes caused, per step, is the machine's
(``StepRow.machine_s``, ``gpudiag.pace``): ``own_pace.charge`` puts it in the traced steps'
``host_stalled``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpudiag.analyzers.breakdown import sum_breakdowns
from gpudiag.analyzers.host_cpu import HostCpu, host_cpu
from gpudiag.analyzers.own_pace import charge
from gpudiag.diagnosis import HostWait, RankResult, TimeBreakdown
from gpudiag.pace import peer_part, wait_shares, wall
from gpudiag.rundir import STARTUP_STEPS, BootstrapMeta, HostSample, StepRow
from gpudiag.steps import WindowSteps
from gpudiag.units import pct_whole

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


# a wait for a core (the training thread's and its slowest other thread's) under this share of
# the step is not split by whose work it was in the note
HARDLY = 0.01


def shares(host: HostCpu | None, thread_cores: float | None) -> tuple[float, float] | None:
    """(own, other) over the untraced steps (``pace.wait_shares``); None where the sampler
    has no machine figure or nothing competed."""
    if host is None or thread_cores is None:
        return None
    return wait_shares(host.cores_used, thread_cores, host.other_cores, host.runq_threads,
                       host.cpus, host.runnable)


def host_wait(windows: list[WindowSteps] | None, steps: dict[int, list[StepRow]],
              host: HostCpu | None, samples: Sequence[HostSample] = (),
              boot: Mapping[int, BootstrapMeta] | None = None) -> HostWait | None:
    """The run's ``HostWait``; None where there are no step rows at all. ``windows`` and
    ``steps`` at the job's own pace (``pace.at_own_pace``). Who held the cores comes from
    ``host`` (the untraced steps); where those are too short for the 1 s sampler (a 40-step GPU
    job: 2 s), from every step after start-up, traced ones included (the profiler's own work
    then counts as the job's)."""
    if not steps:
        return None
    rows = [r for rs in steps.values() for r in rs]
    if not any(r.wait_s is not None for r in rows):
        return HostWait(recorded=False, note=NOT_RECORDED)
    traced = [r for w in windows or [] for r in w.traced_rows if r.wait_s is not None]
    ref = [r for r in _reference(windows, steps) if r.wait_s is not None and r.dt > 0]
    ran = [r for r in ref if r.run_s is not None]  # a torn row may lack one of the two
    ref_waits = [w for r in ref if (w := r.wait_s) is not None]
    runs = [(x, r.dt + r.machine_s) for r in ran if (x := r.run_s) is not None]
    wait = statistics.median(ref_waits) * 1e6 if ref_waits else None
    run = statistics.median(x for x, _ in runs) * 1e6 if runs else None
    cores = statistics.median(x / step for x, step in runs) if runs else None
    peers = [r.peer_wait_s for r in ref if r.peer_wait_s is not None]
    peer = statistics.median(peers) * 1e6 if peers else None
    walls = statistics.median(wall(ref)) * 1e6 if ref else None
    machine = walls - statistics.median(r.dt for r in ref) * 1e6 if walls is not None else None
    sleeps = [s for r in ran if (s := blocked_s(r)) is not None]
    blocked = max(0.0, statistics.median(sleeps)) * 1e6 if sleeps else None
    asleeps = [s for r in ran if (s := asleep_s(r)) is not None]
    asleep = max(0.0, statistics.median(asleeps)) * 1e6 if asleeps else None
    counts = [r.slices for r in ran if r.slices is not None]
    slices = float(statistics.median(counts)) if counts else None
    traced_machine = sum(r.machine_s for r in traced) / len(traced) * 1e6 if traced else None
    over = "untraced steps"
    if host is None and samples:
        every = {k: [replace(r, profiler=None, dt=r.dt + r.machine_s) for r in rs] for k, rs in steps.items()}
        host = host_cpu(samples, every, boot or {}, min_samples=1)
        over = "every step, traced ones included: the untraced ones were too short for it"
    split = shares(host, cores)
    tw = sum(w for r in traced if (w := r.wait_s) is not None) / len(traced) * 1e6 if traced else None
    parts = []
    if tw is not None:
        parts.append(f"{tw / 1e3:.3g} ms per traced step")
    if wait is not None:
        parts.append(f"{wait / 1e3:.3g} ms per untraced step (median of {len(ref)})")
    whose = (f"; of the CPU competing with it, {100 * split[0]:.0f}% was the job's own processes "
             f"and threads, {100 * split[1]:.0f}% other processes (host sampler, {over})"
             if split else "; who held the cores is unknown (too few host samples, or none of the "
             "machine's)")
    if split and walls and (wait or 0.0) + (peer or 0.0) < HARDLY * walls:
        # shares of next to nothing read as "other processes took it all" (blind check 22: an idle
        # VM's "0% the job's own, 100% other processes" of a 0.0004 ms wait)
        whose = f"; under {pct_whole(HARDLY)} of its step, too little to say whose work it waited for"
    if peer is not None:
        parts.append(f"its other threads (intra-op, DataLoader workers) up to {peer / 1e3:.3g} ms "
                     "per untraced step (median of the largest)")
    passive = passive_threads(boot)
    if blocked is not None and blocked > 0:
        parts.append(f"asleep outside the DataLoader, collectives and torch.save {blocked / 1e3:.3g} ms "
                     "per untraced step (median; beyond the short waits of a parallel region's end"
                     + (f"; with {passive} intra-op threads under OMP_WAIT_POLICY=PASSIVE, which sleep "
                        "at each region's end, not told from a blocking call" if passive else "") + ")")
    if machine is not None and walls is not None:
        parts.append(f"other processes' part of its untraced steps {machine / 1e3:.3g} ms of each "
                     f"{walls / 1e3:.3g} ms (the job's own pace: the rest)")
    note = ("the training thread waited for a core " + (", ".join(parts) or "(no step to say)")
            + whose)
    return HostWait(recorded=True, note=note, traced_wait_us=tw, untraced_wait_us=wait,
                    untraced_run_us=run, own_share=split[0] if split else None,
                    other_share=split[1] if split else None, untraced_peer_wait_us=peer,
                    untraced_machine_us=machine, traced_machine_us=traced_machine,
                    untraced_blocked_us=blocked, untraced_wall_us=walls, passive_threads=passive,
                    untraced_asleep_us=asleep, untraced_slices=slices)


def passive_threads(boot: Mapping[int, BootstrapMeta] | None) -> int | None:
    """torch's intra-op threads where a rank ran more than one under OMP_WAIT_POLICY=PASSIVE
    (the most of any such rank), else None. Why: such threads sleep at the end of each parallel
    region, and the training thread with them, inside torch's operators; the sleeps are many
    and short in a quick operator and few and long in a big one, so the thread's clocks (its
    step less its time on a core and its wait for one) cannot tell them from a blocking call's.
    A blind check on the 2-core AMD EPYC VM: a 16-block model with no call read 9.1 ms of a
    31 ms step asleep "in a blocking call", and a 1.9 ms fsync read 10.3 ms."""
    counts = [m.intra_op_threads for m in (boot or {}).values()
              if m.passive_policy and isinstance(m.intra_op_threads, int) and m.intra_op_threads > 1]
    return max(counts) if counts else None


def asleep_s(r: StepRow) -> float | None:
    """Seconds of the step the training thread was neither on a core nor waiting for one,
    less its sleeps gpudiag names elsewhere: in next(loader), the collectives' calls and
    torch.save (their whole time: a floor). None where the clocks were not read. Row at the
    job's own pace: ``dt`` excludes what other processes took, which is in ``wait_s``."""
    if r.run_s is None or r.wait_s is None:
        return None
    colls = sum(c.get("seconds", 0.0) for c in r.collectives.values())
    return (r.dt + r.machine_s - r.run_s - r.wait_s - (r.input_blocked_s or 0.0) - colls
            - r.save_s)


# The longest a wake-up is taken to have slept at a parallel region's end (an intra-op thread's
# barrier under OpenMP's passive wait policy): measured on the 2-core AMD EPYC VM, quiet, the
# MLP of tests/jobs (2 threads) slept 1.02 ms a 5.24 ms step over 24 wake-ups, 43 us each, and
# at width 1024 2.13 ms of 41.5 ms over 21 (100 us each); a reply awaited in recv, 5.2 ms over 1
# wake-up; a lock held by a publisher thread, 9.07 ms over 31.
SHORT_SLEEP_S = 50e-6


def blocked_s(r: StepRow) -> float | None:
    """What the training thread slept over the step in long sleeps (``asleep_s``, less
    ``SHORT_SLEEP_S`` per time it was put back on a core): a floor of a blocking call's sleep.
    Why: a thread with intra-op peers sleeps inside torch's operators too, at the end of each
    parallel region until the slowest peer is done (OpenMP's passive wait policy), and the
    clocks alone cannot tell that sleep from a call's (the 2-thread MLP was told to move "a
    blocking call" of 0.64 ms of its 3.3 ms step off the step, where it had none: its step
    measured 2.98 ms passive, 1.35 ms with the threads spinning, on the 2-core Intel Xeon VM).
    Those sleeps are many and short, a blocking call's few and long. A peer crowded off its
    core makes the waits at the region's end long: the part of the sleep other processes caused
    by holding the slowest other thread off a core (``pace.peer_part``, as the own pace reads
    it) is left out too. Runs recorded before the count: the whole sleep."""
    sleep = asleep_s(r)
    if sleep is None or r.slices is None:
        return sleep
    return max(0.0, sleep - peer_part(max(0.0, sleep), r) - r.slices * SHORT_SLEEP_S)


def with_waits(result: RankResult, rows: list[StepRow], wait: HostWait | None,
               device_kind: str, loader_in_thread: bool = False) -> RankResult:
    """A rank's traced steps with their step rows' machine part (``StepRow.machine_s``: rows at
    the job's own pace) as ``host_stalled`` and, on a GPU, the training thread's wait as
    ``host_waiting`` (``own_pace.charge``): step by step where the trace's steps and the step
    timer's traced rows pair up one to one, else each at their mean. The machine's part is
    taken as its share of the timer's step, applied to the trace's step; where the loader runs in
    the thread (``loader_in_thread``), the part of its wait the thread was blocked keeps its
    length (``own_pace.charge``)."""
    rows = [r for r in rows if r.wait_s is not None and r.dt + r.machine_s > 0]
    if wait is None or not wait.recorded or not rows or not result.steps or result.steps[0].step is None:
        return result
    share = [r.machine_s / (r.dt + r.machine_s) for r in rows]
    waits = [w * 1e6 for r in rows if (w := r.wait_s) is not None]
    blocked = [(r.input_blocked_s or 0.0) / r.input_s if loader_in_thread and r.input_s else 0.0
               for r in rows]
    pair = len(rows) == len(result.steps)

    def at(xs: list[float], i: int) -> float:
        return xs[i] if pair else sum(xs) / len(xs)

    steps = [replace(s, breakdown=charge(s.breakdown, device_kind, at(share, i) * s.breakdown.step_time,
                                         at(waits, i), at(blocked, i)))
             for i, s in enumerate(result.steps)]
    return replace(result, steps=steps, total=sum_breakdowns([s.breakdown for s in steps]))


def unprofiled_waits(b: TimeBreakdown, wait: HostWait | None, device_kind: str) -> TimeBreakdown:
    """The estimate of the unobserved step (its machine part already ``host_stalled``:
    ``own_pace.with_machine``) with the reference steps' own wait: on a GPU the training
    thread's, within its host gaps; the CPU's waiting is its stalls."""
    if device_kind != "gpu" or wait is None or wait.untraced_wait_us is None:
        return replace(b, host_waiting=b.host_stalled)
    return replace(b, host_waiting=max(b.host_stalled, min(wait.untraced_wait_us, b.host_overhead)))
