"""How many cores the job's processes used while it ran untraced (``samples/host.jsonl``).

Why: a DataLoader wait in the training process is either storage (a worker needs no core of its
own while it waits: ten workers can hide a slow read on two cores) or decoding (each worker
needs a core, beside the cores the model's threads use). The trace cannot tell them apart - the
main thread just waits in ``__next__`` - but the host sampler's figures for the process tree
can: a num_workers=0 job waiting on storage uses almost no CPU and waits for none, one that
decodes uses a core, or waits runnable for one when the machine is busy. The traced steps are
left out (the profiler's own work runs in them), as are the first steps (start-up).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from gpudiag.rundir import STARTUP_STEPS, BootstrapMeta, HostSample, StepRow

# A 1 s sampler over a job of a few seconds gives a handful; fewer than this is no estimate.
MIN_SAMPLES = 2
# Untraced steps after start-up with the processes' CPU in their rows that ``rows_cpu`` needs
# (per rank): fewer are start-up and the window's aftermath, not the job's pace.
MIN_ROWS = 10
# A sample averages the second before it: it counts where most of that second was untraced
# steps (the sampler's clock is not the steps': a sample a few ms past the job's last step is
# still the job's).
MIN_OVERLAP = 0.8


@dataclass(frozen=True)
class HostCpu:
    """Means over the job's untraced steps."""

    cores_used: float  # CPU cores of the job's process tree
    runq_cores: float  # cores' worth of its processes' waiting runnable for a core
    other_cores: float | None  # cores the rest of the machine kept busy
    samples: int  # host samples these rest on (0: the step timer's rows alone, ``rows_cpu``)
    cpus: int | None  # cores the job could run on (its affinity), from the bootstrap
    intra_op_threads: int | None  # torch's intra-op threads in the job
    # the mean untraced step over the same samples (s): cores_used x step_s is the CPU a step
    # costs the job unobserved, whatever step the diagnosis' view has (a traced one is longer)
    step_s: float | None = None
    # all the job's threads' wait for a core (cores' worth) and the machine's runnable tasks
    # (``gpudiag.pace.wait_shares``); None where the samples did not record them
    runq_threads: float | None = None
    runnable: float | None = None
    # the training processes' own CPU (each rank's, its threads, not its children) over the same
    # steps, from the step timer's rows (``StepRow.cpu_s``): the rest of ``cores_used`` is their
    # children's, the DataLoader workers' (None: not recorded)
    proc_cores: float | None = None

    @property
    def wants(self) -> float | None:
        """Cores' worth the job's threads wanted: on a core, or waiting runnable for one."""
        return None if self.runq_threads is None else round(self.cores_used + self.runq_threads, 3)

    @property
    def others_runnable(self) -> float | None:
        """The machine's runnable tasks outside the job: what a new thread of the job shares
        the cores with (``whatif.JobCpu.cores_with``); at least the cores the rest kept busy."""
        if self.runnable is None or self.wants is None:
            return None
        return round(max(self.other_cores or 0.0, self.runnable - self.wants), 3)


def loader_busy(rows: Sequence[StepRow]) -> float | None:
    """Over the untraced steps after start-up: the training thread's time on a core or
    runnable in next(loader), over its wall time there (the step timer's DataLoader hook)."""
    rs = [r for r in rows if r.profiler is None and r.step > STARTUP_STEPS and r.input_s
          and r.input_run_s is not None and r.input_wait_s is not None]
    total = sum(r.input_s or 0.0 for r in rs)
    if total <= 0:
        return None
    return round(min(1.0, sum((r.input_run_s or 0.0) + (r.input_wait_s or 0.0) for r in rs) / total), 3)


def workers_busy(rows: Sequence[StepRow]) -> float | None:
    """Over the untraced steps after start-up whose rows carry it: the DataLoader workers' pace
    per step (seconds; each worker's busiest thread on a core or waiting runnable for one,
    summed: ``collectors.thread_waits``). In steady state the loader makes one batch a step, so
    this is the time a batch takes its workers, all of them together; None where fewer than
    ``MIN_ROWS`` rows carry it (no workers, or a run written before they were read)."""
    rs = [r for r in rows if r.profiler is None and r.step > STARTUP_STEPS and r.workers_busy_s is not None]
    if len(rs) < MIN_ROWS:
        return None
    return sum(r.workers_busy_s or 0.0 for r in rs) / len(rs)


def untraced_spans(rows: Sequence[StepRow]) -> list[tuple[float, float]]:
    """(start, end) unix times of runs of consecutive untraced steps after start-up."""
    spans: list[tuple[float, float]] = []
    prev: StepRow | None = None
    for r in sorted(rows, key=lambda r: r.step):
        if r.profiler is not None or r.step <= STARTUP_STEPS:
            prev = None
            continue
        if prev is not None and r.step == prev.step + 1:
            spans[-1] = (spans[-1][0], r.t)
        else:
            spans.append((r.t - r.dt, r.t))
        prev = r
    return spans


def host_cpu(samples: Sequence[HostSample], steps: Mapping[int, Sequence[StepRow]],
             boot: Mapping[int, BootstrapMeta], min_samples: int = MIN_SAMPLES) -> HostCpu | None:
    """Over the lowest rank's untraced steps (ranks step together), or None where the samples
    are too few to say. A sample counts where ``MIN_OVERLAP`` of the interval it averages (since
    the sample before it) lies inside runs of untraced steps."""
    if not steps:
        return None
    spans = untraced_spans(steps[min(steps)])

    def inside(t0: float, t1: float) -> float:
        return sum(max(0.0, min(hi, t1) - max(lo, t0)) for lo, hi in spans)

    used = [(b.t - a.t, b) for a, b in zip(samples, samples[1:], strict=False)
            if b.t > a.t and inside(a.t, b.t) >= MIN_OVERLAP * (b.t - a.t)]
    total = sum(d for d, _ in used)
    if len(used) < min_samples or total <= 0:
        return None

    def mean(f: Callable[[HostSample], float | None]) -> float:  # a HostSample field getter
        # read only for fields every used sample has (checked by the caller where optional)
        return sum(d * cast(float, f(h)) for d, h in used) / total

    job = mean(lambda h: h.cores)
    other = None
    if all(h.machine_busy is not None for _, h in used):
        other = round(max(0.0, mean(lambda h: h.machine_busy) - job), 3)
    ends = [h.t for _, h in used]  # in time order, the intervals disjoint

    def sampled(t: float) -> bool:
        k = bisect.bisect_left(ends, t)
        return k < len(used) and used[k][1].t - used[k][0] < t

    dts = [r.dt for r in _sampled_rows(steps[min(steps)], sampled)]
    meta = boot.get(min(steps))

    def known(f: Callable[[HostSample], float | None]) -> float | None:  # a HostSample field getter
        return round(mean(f), 3) if all(f(h) is not None for _, h in used) else None

    return HostCpu(round(job, 3), round(mean(lambda h: h.runq_cores), 3), other, len(used),
                   meta.cpus if meta else None, meta.intra_op_threads if meta else None,
                   sum(dts) / len(dts) if dts else None, known(lambda h: h.runq_threads),
                   known(lambda h: h.runnable), _proc_cores(steps, sampled))


def rows_cpu(steps: Mapping[int, Sequence[StepRow]], boot: Mapping[int, BootstrapMeta]) -> HostCpu | None:
    """The same means from the step timer's rows alone, for a job with DataLoader workers where
    the host sampler gave too few samples (``host_cpu`` None: a job of a few seconds): per rank,
    its process's CPU (``StepRow.cpu_s``) and its workers' threads' (``StepRow.workers_run_s``)
    over its untraced steps' wall time, summed over ranks. What the rows cannot tell is left
    unknown: the machine's other work (``other_cores`` None, the job's fair share unread), and
    of the job's wait for a core only the training threads' is counted (``runq_cores``).

    Why: a loader's workers' CPU is what bounds its step beside more workers, or beside any fix
    to the training thread's work. Blind check 37 (2-core AMD VM, a 1.2 s job, one worker doing
    FFTs, 8.4 ms a step alone): with no host sample, 2 workers were told 0.51x and ran 0.90x,
    and a compiled optimizer step was told 0.73x and ran 0.97x."""
    if not steps:
        return None
    cores = proc = runq = 0.0
    dts: list[float] = []
    for rank in sorted(steps):
        rs = [r for r in steps[rank] if r.profiler is None and r.step > STARTUP_STEPS]
        have = [r for r in rs if r.cpu_s is not None and r.workers_run_s is not None]
        wall = sum(r.dt for r in have)
        if len(have) < max(MIN_ROWS, len(rs) // 2) or wall <= 0:
            return None
        own = sum(r.cpu_s or 0.0 for r in have) / wall
        proc += own
        cores += own + sum(r.workers_run_s or 0.0 for r in have) / wall
        runq += sum(r.wait_s or 0.0 for r in have) / wall
        if not dts:
            dts = [r.dt for r in have]
    meta = boot.get(min(steps))
    return HostCpu(round(cores, 3), round(runq, 3), None, 0, meta.cpus if meta else None,
                   meta.intra_op_threads if meta else None, sum(dts) / len(dts),
                   proc_cores=round(proc, 3))


def _proc_cores(steps: Mapping[int, Sequence[StepRow]], sampled: Callable[[float], bool]) -> float | None:
    """The ranks' own CPU in cores over their untraced steps the samples cover: per rank, its
    process's CPU seconds over those steps' wall seconds, summed over ranks (None where a rank's
    rows did not record it)."""
    total = 0.0
    for rows in steps.values():
        rs = _sampled_rows(rows, sampled)
        if not rs or any(r.cpu_s is None for r in rs):
            return None
        wall = sum(r.dt for r in rs)
        if wall <= 0:
            return None
        total += sum(r.cpu_s or 0.0 for r in rs) / wall
    return round(total, 3)


def _sampled_rows(rows: Sequence[StepRow], sampled: Callable[[float], bool]) -> list[StepRow]:
    """A rank's untraced steps after start-up whose end a used host sample covers."""
    return [r for r in rows if r.profiler is None and r.step > STARTUP_STEPS and sampled(r.t)]
