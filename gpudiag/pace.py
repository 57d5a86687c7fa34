"""The job's own pace: each step less the wait for a core that processes outside the job caused.

Why: gpudiag runs on shared nodes (data-loading processes, other users' jobs, a monitoring
agent). A step that other processes slowed is the machine's pace, not the job's: compared by
wall clock, the same job twice reads "significantly slower" when the machine was busier the
second time, and its MFU is charged for others' work. Every number that judges the job (the
diagnosis' MFU and verdict, ``gpudiag diff``, the agent's signal) reads the steps at their own
pace, from here; the wall clock is kept beside it.

A step's wait (``step_wait``): the training thread's own wait for a core (its schedstat, read
by the step timer), plus, while it was neither running nor waiting (asleep at the end of a
parallel region, or waiting for a batch), the largest wait any other thread of the job had over
the step (its intra-op threads, its DataLoader workers: ``collectors.thread_waits``), less
what of that thread's run a quiet machine would make the training thread wait for too (its run
beyond the training thread's own: ``peer_part``), less the
time it was blocked asking a single-process DataLoader for a batch (a read or a sleep in
``__getitem__``, which no thread's wait for a core delays): a step is as slow as the slowest
thread it waits for. The largest, not the sum: waits in parallel delay
the step once, and waits in turn (read as the largest of them) charge the job. Where the
training thread slept on something else (the GPU, a file) while another thread waited for a
core off the step's path (a worker prefetching ahead), that wait is read as the step's: the
job is then excused up to it.

Whose wait it was (``wait_shares``): the job's own threads and workers crowd each other only
where they want more cores than it may use; other processes crowd it as soon as all together
want more than that. By the scheduler's fair share (each runnable thread gets cores/runnable of
a core), a runnable thread waits ``1 - C/R`` of its time, R the runnable threads, C the cores;
the job alone would wait ``1 - C/R_job`` (nothing where R_job <= C), so of the wait seen the
job's own part is that over ``1 - C/(R_job + R_others)`` and the rest is other processes'.
R_job is what the host sampler saw the job's tree run and wait for (all its threads, cores'
worth), R_others the machine's runnable tasks (``/proc/loadavg``, read ten times a sample) less
the job's, at least the cores the rest of the machine kept busy. C is the cores the job may run
on (its affinity); others on cores it may not use count as crowding it, which makes the job's
own part read low only where the job crowds itself. Threads that take turns (a rank's gloo
threads run its all-reduce while its training thread sleeps in it) are counted once
(``taking_turns``).
Where no core was short on average (a 1 s sample) the wait is wake-up latency or short bursts:
split in proportion to the CPU the job's other threads and the rest of the machine used.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gpudiag.rundir import BootstrapMeta, HostSample, StepRow, collectives_wait_s

# Cores' worth the rest of the machine must have run over a host sample before its runnable
# tasks (beyond the job's) are read as crowding the job. Below it the excess is the count's noise
# (ten instant reads of /proc/loadavg while the job's threads come and go) or tasks so low in
# priority that they hardly ran: an idle 2-core VM read 0.2-0.5 more runnable tasks than the
# 2-rank gloo test job's own while the rest of the machine used 0.00-0.03 cores, and the job's
# whole wait for a core (its ranks' gloo threads crowding each other) was read as other
# processes', a third of each step (2026-12-02).
OTHERS_RAN = 0.1


def wait_shares(job_cores: float, thread_cores: float, other_cores: float | None,
                job_runq: float | None = None, cpus: int | None = None,
                runnable: float | None = None, turns: float = 0.0) -> tuple[float, float] | None:
    """(own, other): of the wait for a core a job's thread saw, the share the job's own threads
    and processes caused and the share processes outside it caused (module docstring). Inputs
    are cores' worth over one host sample: what the job's tree ran (``job_cores``), what the
    stepping thread ran (``thread_cores``), what the rest of the machine kept busy
    (``other_cores``), what the job's threads waited for a core (``job_runq``, all threads), the
    cores it may use (``cpus``) and the machine's runnable tasks (``runnable``, the job's
    included: what the rest wanted is that less the job's, read only where the rest ran at least
    ``OTHERS_RAN`` cores). ``turns``: cores' worth of ``job_runq`` that threads taking turns
    added (``taking_turns``), out of the job's demand but in the runnable count, which saw the
    threads as they were. None where the machine's figure is unknown or nothing competed.
    Without ``job_runq`` or ``cpus`` (runs recorded before they were), the split is in
    proportion to the CPU used, the scheduler's fair share assumed."""
    if other_cores is None:
        return None
    other = max(0.0, other_cores)
    if job_runq is not None and cpus:
        want = max(0.0, job_cores) + max(0.0, job_runq - turns)
        rest = other
        if runnable is not None and other >= OTHERS_RAN:
            rest = max(other, runnable - max(0.0, job_cores) - max(0.0, job_runq))
        crowded = 1 - cpus / (want + rest) if want + rest > cpus else 0.0
        if crowded > 0:
            alone = 1 - cpus / want if want > cpus else 0.0
            own = min(1.0, alone / crowded)
            return round(own, 3), round(1 - own, 3)
    own_cpu = max(0.0, job_cores - thread_cores)
    if own_cpu + other <= 0:
        return None
    return round(own_cpu / (own_cpu + other), 3), round(other / (own_cpu + other), 3)


def loads_in_thread(meta: BootstrapMeta | None) -> bool:
    """Whether the job's DataLoaders all ran with num_workers=0 (batches made in the thread)."""
    return bool(meta and meta.dataloader_workers and not any(meta.dataloader_workers))


def step_wait(r: StepRow, loader_in_thread: bool = False) -> float | None:
    """Seconds the step waited for a core, on its own thread or (while that thread was neither
    running nor waiting) on the slowest other thread of the job; None where not recorded."""
    if r.wait_s is None or r.run_s is None:
        return None
    idle = max(0.0, r.dt - r.run_s - r.wait_s)  # asleep: on a lock, a barrier, the loader's queue
    # blocked in next(loader) where the loader runs in the thread (num_workers=0: a read, a
    # sleep in __getitem__, timed by the step timer's DataLoader hook): no other thread's wait
    # for a core delays that (with workers, the thread waits on them, and their wait does)
    if loader_in_thread:
        idle -= min(idle, r.input_blocked_s or 0.0)
    return r.wait_s + peer_part(idle, r)


def peer_part(idle: float, r: StepRow) -> float:
    """Of ``idle`` (seconds the training thread slept over the step, on another thread), those
    other processes caused. The slowest other thread's time on the step (its run and its wait
    for a core) can explain that much of the sleep; of it, the job's own is what a quiet machine
    would have had the training thread wait for too: the other thread's run beyond the training
    thread's own (an intra-op thread with more of the parallel region, a loader worker slower
    than the step). The rest it ran *after* the training thread's part instead of beside it,
    because other processes held the cores (the scheduler shares a core by turns): that is
    theirs. Charged as the job's before (the share of the sleep the thread ran), a 2-thread MLP
    beside eight busy loops read 7.4 ms a step at its own pace against 3.5 ms quiet and a 1.5x
    slower core (a clean clone's solo pass, 2-core EPYC VM, 2026-12-03), a passive 2-thread conv
    net 51-68 ms against 43 (blind check 35). Never more than the thread's wait itself (taking
    its whole wait up to the sleep excused a crowded MLP to 1.7x its quiet FLOP/s, a CI run).
    Without the thread's run (runs recorded before it was), the process's other threads' CPU
    over the step stands for it (more than one thread's: the job is charged, not excused);
    without that either, the whole wait up to the idle, as before."""
    wait = r.peer_wait_s or 0.0
    if wait <= 0 or idle <= 0:
        return 0.0
    run = r.peer_run_s
    if run is None and r.cpu_s is not None and r.run_s is not None:
        run = max(0.0, r.cpu_s - r.run_s)
    if run is None:
        return min(idle, wait)
    held = min(idle, run + wait)  # the sleep the other thread's time on the step can explain
    own = min(held, max(0.0, run - (r.run_s or 0.0)))  # what a quiet run would wait for too
    return min(wait, held - own)


def taking_turns(r: StepRow, ranks: int = 1) -> float:
    """Cores' worth of the job's threads' wanting a core (run and wait) that its collectives' own
    threads (gloo's) did while its training threads slept in their collectives, over ``ranks``
    ranks alike: they take turns, so they never wanted a core at once, and the fair share must
    not count them as wanting two. Why: the job's own part of a wait is read from how many of
    its threads wanted a core (``wait_shares``); beside busy loops a rank's gloo threads wait for
    a core in the all-reduce, runnable the longer the longer they wait, and summed with the
    training thread's they read as more threads than cores, as though the job crowded itself.
    Two gloo ranks beside four busy loops in the project's CI read rank 0 at 37.2 ms a step at
    its own pace, 70 ms by the wall clock, where the job alone stepped in 23 ms. The slowest
    other thread's wait (``peer_wait_s``) stands for the gloo threads' (a rank asleep in its
    collective has no intra-op work running); never more than the training thread's wait in
    the collectives. Nothing without the gloo threads' CPU (NCCL's run on the GPU)."""
    if not r.comm_cpu_s or r.dt <= 0:
        return 0.0
    return ranks * min(collectives_wait_s(r), r.comm_cpu_s + (r.peer_wait_s or 0.0)) / r.dt


def others_ran(other_cores: float | None, dt: float) -> float:
    """Seconds of a step's wait other processes can have caused at most: what they ran over it.
    Why: the step's wait (``step_wait``) is the training thread's and, while it slept, the
    slowest other thread's, in turn, so each instant of it is one thread waiting for a core that
    another task held; a task of another process held it no longer than it ran. The fair share
    (``wait_shares``) counts runnable tasks alike, whatever share of the cores each got, and
    reads a job that fits its cores as waiting on the others for all of its wait, its own
    included; what they ran bounds that."""
    return max(0.0, other_cores or 0.0) * dt


def _sample_for(ends: list[float], samples: Sequence[HostSample], t: float) -> HostSample | None:
    """The host sample whose interval holds ``t`` (the first sample has none: no interval)."""
    k = bisect.bisect_left(ends, t)
    return samples[k] if 0 < k < len(samples) else None


def own_step_seconds(rows: Sequence[StepRow], samples: Sequence[HostSample],
                     cpus: int | None = None, loader_in_thread: bool = False,
                     device_s: float = 0.0, ranks: int = 1) -> list[float]:
    """Each step's wall time less the part of its wait for a core that processes outside the job
    caused (``step_wait`` x the other share of the host sample covering the step's end): the
    job's own pace, which another tenant's load does not change. Never below the training
    thread's own time on a core, nor below ``device_s``, the accelerator's busy time per step
    (from the trace): the host's wait overlaps the kernels it queued, so only what runs past
    them delays the step (on an H200, an LM beside two busy loops per core read 14.5-19.6 ms a
    step at its own pace before the traced window, its GPU busy 21.6 ms of each, the job alone
    25-27 ms). A step without a recorded wait, or with no sample to split it by, keeps its wall
    time (the job is charged, not excused). ``ranks``: the job's ranks on this machine, whose
    collectives' threads take turns with their training threads (``taking_turns``)."""
    ends = [h.t for h in samples]
    out = []
    for r in rows:
        own = r.dt
        wait = step_wait(r, loader_in_thread)
        h = _sample_for(ends, samples, r.t)
        run = r.run_s  # a torn row may lack it: then no split (the job is charged)
        if wait and r.dt > 0 and h is not None and run is not None:
            other = h.machine_busy - h.cores if h.machine_busy is not None else None
            turns = taking_turns(r, ranks) if h.runq_threads is not None else 0.0
            split = wait_shares(h.cores, min(1.0, run / r.dt), other, h.runq_threads, cpus,
                                h.runnable, turns)
            if split is not None:
                own = min(r.dt, max(run, device_s, r.dt - min(wait * split[1], others_ran(other, r.dt))))
        out.append(own)
    return out


def at_own_pace(steps: Mapping[int, Sequence[StepRow]], samples: Sequence[HostSample],
                boot: Mapping[int, BootstrapMeta],
                device_s: Mapping[int, float] | None = None) -> dict[int, list[StepRow]]:
    """Per rank, its step rows at the job's own pace: ``dt`` the own step, ``machine_s`` the part
    of the wall step other processes took (``dt + machine_s`` is the wall clock), a crowded
    peer's part included where the rank waited for it in a collective (``peers_crowded``).
    ``device_s``: per rank, its accelerator's busy seconds per step, where a trace says."""
    out = {}
    for rank, rows in steps.items():
        meta = boot.get(rank)
        own = own_step_seconds(rows, samples, meta.cpus if meta else None, loads_in_thread(meta),
                               (device_s or {}).get(rank, 0.0), len(steps))
        out[rank] = [replace(r, dt=o, machine_s=r.dt - o) for r, o in zip(rows, own, strict=True)]
    return peers_crowded(out, device_s)


def peers_crowded(ranks: Mapping[int, Sequence[StepRow]],
                  device_s: Mapping[int, float] | None = None) -> dict[int, list[StepRow]]:
    """Ranks at their own pace, each excused the largest part other processes took of any rank's
    same step, up to the time it waited in that step's collectives. Why: synchronous ranks meet
    in the all-reduce, so a rank whose core a busy loop crowded holds the others there: they
    wait for it asleep, which no wait for a core of theirs shows. Read alone, the uncrowded rank
    kept its wall step (two gloo ranks beside four busy loops: rank 0 waited about 1 ms a step
    for a core and 19-27 ms in the all-reduce while rank 1 waited 9-21 ms for a core, so rank
    0's own pace read 1.6x its time on a core where the crowded rank's read 1.2x). Only a wait
    in a collective is excused (a rank that does not meet the others waits for nobody), never
    more than the crowded rank's part, and never below the rank's own time on a core or its
    accelerator's busy time per step (``device_s``, as in ``own_step_seconds``)."""
    if len(ranks) < 2:
        return {k: list(v) for k, v in ranks.items()}
    most: dict[int, float] = {}
    for rows in ranks.values():
        for r in rows:
            most[r.step] = max(most.get(r.step, 0.0), r.machine_s)
    out = {}
    for rank, rows in ranks.items():
        fixed = []
        for r in rows:
            extra = min(max(0.0, most[r.step] - r.machine_s), collectives_wait_s(r))
            floor = max(r.run_s or 0.0, (device_s or {}).get(rank, 0.0))
            own = max(floor, r.dt - extra) if extra > 0 else r.dt
            fixed.append(replace(r, dt=own, machine_s=r.machine_s + r.dt - own) if own < r.dt else r)
        out[rank] = fixed
    return out


def recorded(steps: Mapping[int, Sequence[StepRow]]) -> bool:
    """Whether the step timer read the training thread's waits (run directories written before
    it did, or off Linux, have none: their own pace is their wall clock)."""
    return any(r.wait_s is not None for rows in steps.values() for r in rows)


def wall(rows: Sequence[StepRow]) -> list[float]:
    """The wall seconds of rows at their own pace (``at_own_pace``)."""
    return [r.dt + r.machine_s for r in rows]


def machine_part(rows: Sequence[StepRow]) -> tuple[float, float] | None:
    """(median wall step, median own step) of ``rows`` at their own pace, seconds; their
    difference is the machine's part of a typical step. None without rows."""
    if not rows:
        return None
    return statistics.median(wall(rows)), statistics.median(r.dt for r in rows)
