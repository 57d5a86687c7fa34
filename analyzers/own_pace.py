"""A step's breakdown with the machine's part (other processes' hold on the cores) apart.

The step timer says, per step, how much of it other processes took (``gpudiag.pace``: its
threads' waits for a core, split by who held the cores). In a breakdown that part is
``host_stalled``: host time, shown apart, that no verdict counts as the job's and no fix
removes. These functions put it there and take it out again:

- ``charge``: a traced step's part, from its step row. On a GPU the wait sits in the host gaps
  (the device waits for launches the thread could not make; kernels run at their pace); on
  the CPU, the device *is* the cores, so the OS taking them slowed every part the job's
  threads ran (operators, the gaps between them, a loader in its process): the part is taken
  from all of them in proportion, which keeps their proportions (the job's own picture) and
  puts it in ``host_stalled``.
- ``without_machine`` / ``with_machine``: the job's own step (the wall step less that part),
  which the verdict, MFU and the profiler's dilation are measured in; and back, the reference
  steps' own part added as ``host_stalled``, so the view's step is still the wall clock the
  user sees and the part is a row of its own.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from gpudiag.analyzers.unprofiled import CpuEvents
from gpudiag.diagnosis import Mfu, TimeBreakdown
from gpudiag.pace import wall
from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps
from gpudiag.units import ms

# The parts a CPU step's machine share is taken from (in proportion): every part the job's
# threads spend time in. ``host_overhead`` stands for its gaps beyond what is stalled already.
_CPU_PARTS = ("compute", "comm_exposed", "memcpy_exposed", "input_wait")


def _cpu_pool(b: TimeBreakdown) -> float:
    """The parts of a CPU step the cores ran, which other processes take their part from: the
    work, the exposed waits and the job's own host gaps."""
    return float(sum(getattr(b, p) for p in _CPU_PARTS)) + b.host_overhead - b.host_stalled


def charge(b: TimeBreakdown, device_kind: str, machine_us: float, wait_us: float = 0.0,
           blocked_input: float = 0.0) -> TimeBreakdown:
    """``b`` with ``machine_us`` of it held by other processes as ``host_stalled`` (at least what
    it holds already), and on a GPU ``wait_us`` of its training thread's wait for a core as
    ``host_waiting`` (within its host gaps; the CPU's waiting is its stalls). ``blocked_input``:
    the share of the input wait the thread was blocked in ``__getitem__`` (a read, a sleep),
    which other processes cannot have taken: on a CPU that part keeps its length (a 3 ms sleep
    per sample read 19 ms a step where the job timed 119 ms, shrunk with the step by a busy
    machine's share)."""
    if device_kind == "gpu":
        waiting = max(b.host_waiting, min(max(0.0, wait_us, machine_us), b.host_overhead))
        return replace(b, host_waiting=waiting,
                       host_stalled=max(b.host_stalled, min(max(0.0, machine_us), waiting)))
    extra = min(max(0.0, machine_us), b.step_time) - b.host_stalled
    if extra <= 0:
        return replace(b, host_waiting=max(b.host_waiting, b.host_stalled))
    gaps = b.host_overhead - b.host_stalled
    kept = b.input_wait * min(1.0, max(0.0, blocked_input))  # blocked: no process took it
    pool = _cpu_pool(b) - kept
    extra = min(extra, pool)
    k = max(0.0, 1 - extra / pool) if pool > 0 else 1.0
    out = replace(b, compute=b.compute * k, compute_bound=b.compute_bound * k,
                  memory_bound=b.memory_bound * k, gpu_busy=b.gpu_busy * k,
                  comm_total=b.comm_total - b.comm_exposed * (1 - k),
                  comm_exposed=b.comm_exposed * k, comm_stalled=b.comm_stalled + b.comm_exposed * (1 - k),
                  memcpy_exposed=b.memcpy_exposed * k,
                  input_wait=kept + (b.input_wait - kept) * k, host_stalled=b.host_stalled + pool * (1 - k))
    out.host_overhead = gaps * k + out.host_stalled
    out.host_waiting = out.host_stalled
    out.idle = out.input_wait + out.host_overhead
    return out


def without_machine(b: TimeBreakdown) -> TimeBreakdown:
    """The step at the job's own pace: ``host_stalled`` taken out of the step and its host gaps."""
    s = b.host_stalled
    if s <= 0:
        return b
    return replace(b, step_time=b.step_time - s, host_overhead=b.host_overhead - s, idle=b.idle - s,
                   host_waiting=max(0.0, b.host_waiting - s), host_stalled=0.0, comm_stalled=0.0)


def with_machine(b: TimeBreakdown, machine_us: float, device_kind: str = "gpu") -> TimeBreakdown:
    """``b`` (at the job's own pace) with ``machine_us`` other processes took added to its step as
    ``host_stalled``: the wall-clock step, with the machine's part a row of its own. On a CPU the
    other processes took it from every part the cores ran, as ``charge`` reads a traced step: the
    exposed communication's part of it is ``comm_stalled`` (what its fix removes by the wall
    clock, ``comm_cost.cost``)."""
    if machine_us <= 0:
        return b
    comm_stalled = b.comm_stalled
    if device_kind != "gpu":
        pool = _cpu_pool(b)
        comm_stalled += machine_us * b.comm_exposed / pool if pool > 0 else 0.0
    return replace(b, step_time=b.step_time + machine_us, host_overhead=b.host_overhead + machine_us,
                   idle=b.idle + machine_us, host_waiting=b.host_waiting + machine_us,
                   host_stalled=b.host_stalled + machine_us, comm_stalled=comm_stalled)


def _reference_rows(windows: list[WindowSteps], steps: list[int]) -> list[StepRow]:
    """The untraced rows around the windows at the reference's step numbers."""
    keep = set(steps)
    return [r for w in windows for r in (*w.before_rows, *w.after_rows) if r.step in keep]


def reference_machine_us(windows: list[WindowSteps], steps: list[int]) -> float:
    """The machine's part of the reference's typical step (us): the median wall step less the
    median own step of the rows at those step numbers (rows at the job's own pace)."""
    rows = _reference_rows(windows, steps)
    if not rows:
        return 0.0
    return max(0.0, statistics.median(wall(rows)) - statistics.median(r.dt for r in rows)) * 1e6


def reference_input_us(windows: list[WindowSteps], steps: list[int]) -> float | None:
    """The median wait in next(loader) (us) of the reference's rows at those step numbers, where
    the step timer recorded it for every one of them; None where a row did not (a step that asked
    for no batch, a loop without a DataLoader, runs from before the hook)."""
    rows = _reference_rows(windows, steps)
    if not rows or any(r.input_s is None for r in rows):
        return None
    return statistics.median(r.input_s or 0.0 for r in rows) * 1e6


def untraced_wall_us(windows: list[WindowSteps]) -> float | None:
    """The median wall step (us) of the untraced steps around the traced windows, the machine's
    part included: the step the job's own timer reads between windows. None without them."""
    rows = [r for w in windows for r in (*w.before_rows, *w.after_rows)]
    return statistics.median(wall(rows)) * 1e6 if rows else None


# The wall-clock MFU is shown beside the job's own where the two differ by more than this
# (the 10%): less is within the step-to-step noise of most jobs on a shared machine.
WALL_MFU_SHOWN = 0.10

NOT_SPLIT = ("no split of the step recorded (a run directory written before gpudiag's step timer read "
             "/proc schedstat, or not Linux): MFU is over the wall-clock step, other processes' "
             "hold on the cores included")


# Of a traced CPU step's stalls (its operators 20x their kind's fastest call: the OS ran other work
# while they waited), other processes' part by the step timer below this share names the rest
# the job's own: blind check 20's FFT loader on an idle 2-core machine read "a busy machine" for
# 18.4 ms of a 59 ms traced step where the step timer put other processes' part at 2.7 ms.
OTHERS_MOSTLY = 0.5


def stalls_owner(stalled_us: float, machine_us: float | None) -> str:
    """Whose work the OS ran while the job's operators waited (``host_stalled`` of a traced CPU
    step, read from the trace alone): other processes' where the step timer's split of the same
    steps (``machine_us``: the part other processes took) holds most of it, else mostly the
    job's own threads' and processes' (its DataLoader workers, intra-op threads) or the
    profiler's, which the trace cannot tell from another process's."""
    if machine_us is None:
        return "a busy machine, or the job's own threads: the step timer did not split these steps"
    if machine_us >= OTHERS_MOSTLY * stalled_us:
        # "other processes' work", not "a busy machine": blind check 34 read the latter on a
        # quiet run where they took 4.1 ms of a 57 ms step (most of its few stalls, 7% of it)
        return f"other processes' work: the step timer puts their part at {ms(max(0.0, machine_us))}"
    return ("mostly the job's own workers and threads, or the profiler's: the step timer puts other "
            f"processes' part at only {ms(max(0.0, machine_us))}")


def with_wall(own: Mfu, wall_mfu: Mfu, b: TimeBreakdown, recorded: bool | None,
              machine_us: float | None = None) -> Mfu:
    """The job's MFU (over the view's step less ``host_stalled``) with the wall-clock MFU beside
    it and why they differ; ``recorded``: whether the step timer split the step (None: no step
    timer, traces only). ``machine_us``: in a traced view, the step timer's part of other
    processes in the traced steps, where ``host_stalled`` is also the trace's stalls
    (``stalls_owner``): it names whose work that was."""
    if recorded is False:
        return replace(own, pace=NOT_SPLIT)
    if own.value is None or wall_mfu.value is None or b.host_stalled <= 0:
        return own
    shown = own.value > (1 + WALL_MFU_SHOWN) * wall_mfu.value
    stalled = ms(max(0.0, b.host_stalled))
    if machine_us is not None and machine_us < OTHERS_MOSTLY * b.host_stalled:
        owner = stalls_owner(b.host_stalled, machine_us)
        reason = (f": {ms(b.step_time)} by wall clock less the {stalled} of each step the OS ran other "
                  f"work while its operators waited ({owner})")
        why = (f"the OS ran other work for {stalled} of each {ms(b.step_time)} traced step while the "
               f"job's operators waited for a core: {owner}")
    else:
        reason = (f": the job's own pace, {ms(b.step_time)} by wall clock less the {stalled} of each step "
                  "other processes took")
        why = (f"other processes took {stalled} of each {ms(b.step_time)} step: the OS ran their work "
               "while the job's threads waited for a core")
    return replace(own, reason=own.reason + reason, wall_value=wall_mfu.value,
                   wall_step_time_us=wall_mfu.step_time_us, pace=why if shown else "")


def own_events(events: CpuEvents | None, traced: TimeBreakdown) -> CpuEvents | None:
    """A CPU trace's events for its steps at the job's own pace (``without_machine``): the long
    operators' time beyond their fastest calls (``CpuEvents.slowed_us``) is first the time the OS
    ran other processes inside them (a preempted call is a slow one), so the machine's part of
    the operator time (``host_stalled``'s share of the step, applied to it) comes out of it."""
    if events is None or traced.host_stalled <= 0 or traced.step_time <= traced.host_stalled:
        return events
    m = traced.host_stalled / traced.step_time
    in_ops = traced.compute * m / (1 - m)  # compute is what is left of it after ``charge``
    return replace(events, slowed_us=max(0.0, events.slowed_us - in_ops))
