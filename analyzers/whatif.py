"""What each fix is worth: the step time it predicts if it worked fully.

Daydream (Zhu et al., ATC'20) showed that the effect of an optimisation can be predicted by
replaying a trace's dependency graph with the optimised part changed. We replay the step of
the verdict's view (its breakdown: the parts add up to the step, ``diagnosis.TimeBreakdown``)
with one part removed or overlapped, and say what bounds the result:

- input wait hidden (DataLoader workers): the step loses its input wait; the rest of the step
  (compute, communication, gaps) bounds it, enough workers are needed to produce a batch in
  that time, and where the loading is CPU work, the cores left to them bound it too (a batch's
  work is the main thread's time in the wait, not the CPU its intra-op threads burnt);
- exposed communication overlapped: it is hidden behind compute, as far as the compute not
  already hiding communication reaches;
- host gaps closed (CUDA graphs, fewer larger ops): the step loses its host overhead; device
  work bounds it; ``torch.compile`` also fuses (below), so its prediction has both;
- compute at a faster dtype's peak (bf16 autocast): compute-bound fp32 work takes
  ``peak_fp32 / peak_bf16`` of its time, at the efficiency it had;
- memory-bound work fused (``torch.compile``, which also closes the host gaps): each run of
  consecutive memory-bound elementwise operators (or kernels) becomes one pass over the data,
  costing its longest member (``fusion_runs``);
- copies hidden, a straggler brought to the median rank's pace.

A prediction is an upper bound on the gain ("if the fix worked fully"); where the trace cannot
bound it, there is none, and the reason says why. Pure functions: breakdown in, seconds out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gpudiag.analyzers.autocast_gemms import AutocastGemms
from gpudiag.diagnosis import TimeBreakdown
from gpudiag.units import ms, pct_whole, us


@dataclass
class Prediction:
    step_us: float | None
    why: str
    # the step the prediction starts from, where it is not the verdict's view (a periodic
    # save's cost lives in the mean step, not the median the view holds): None, the view's
    from_us: float | None = None
    # what that step is, in a few words ("mean untraced step"), where ``from_us`` is given
    from_what: str = ""
    # the step at the prediction's other end where it states one that a run of the fix alone
    # can settle (torch.compile on a CPU: its fused kernels reading each run's data once)
    best_us: float | None = None
    # the DataLoader workers the predicted step needs, where it names a count (``input_hidden``)
    workers: int | None = None


@dataclass(frozen=True)
class JobCpu:
    """What the job's processes used of the machine's cores (``analyzers.host_cpu``)."""

    cores_used: float  # mean over the untraced steps, the whole process tree
    cpus: int  # cores the job could run on
    threads: int  # the model's intra-op threads (1 where unknown)
    other_cores: float = 0.0  # cores the machine's other work kept busy meanwhile
    runq_cores: float = 0.0  # cores' worth of the job's processes waiting runnable for a core
    step_us: float | None = None  # the untraced step cores_used was measured over
    # the loader's own time busy in next(loader) (``JobTraits.loader_busy``), where recorded
    loader_busy: float | None = None
    # of cores_used, the training processes' own; the rest is their DataLoader workers' (None:
    # not recorded)
    proc_cores: float | None = None
    # cores' worth the job's threads wanted (on a core or waiting for one) and the machine's
    # runnable tasks outside the job, over the same steps (``HostCpu``; None: not recorded)
    wants: float | None = None
    others_runnable: float | None = None

    @property
    def worker_cores(self) -> float | None:
        """Of ``cores_used``, what the training processes' children (DataLoader workers) used;
        None where the processes' own CPU was not recorded."""
        return None if self.proc_cores is None else max(0.0, self.cores_used - self.proc_cores)

    def unobserved(self, b: TimeBreakdown) -> float:
        """What brings the view's times to the job's unobserved pace, the pace the host samples
        measured its cores at: the untraced step they cover (the mean: its CPU over its wall
        time) over the view's step. In a traced view (the profiler's step, longer by its cost)
        that removes the profiler; in the unprofiled view (the median step's) it is the mean
        over the median, near 1 but for skewed steps: blind check 19's one-worker augmenting
        loader (median 12-15 ms, mean 17-19) compared a cores bound at its mean pace with its
        median step and flipped between 0.70x and 1.25x over four profiles of the same job, and
        read "would not help" twice where 3 workers ran 0.85x."""
        return self.step_us / b.step_time if self.step_us and b.step_time > 0 else 1.0

    @property
    def available(self) -> float:
        """Cores the job can count on: what the other work leaves, and at least what it has."""
        return max(self.cores_used, self.cpus - self.other_cores, 1e-9)

    def cores_with(self, extra: float = 1.0) -> float:
        """Cores the job would have with ``extra`` more runnable threads (DataLoader workers):
        the scheduler shares the cores among the runnable threads, so beside other processes'
        runnable work a new one takes its share from that work too, not only from the job's own
        threads (by the fair share of ``gpudiag.pace.wait_shares``: the job has ``cpus x want /
        (want + others)`` of them where all together want more than there are). Blind check 21
        (2-core VM, load 3-8): three single-process loaders were told workers would have no
        core of their own, with the other work's cores taken as fixed, and 1-2 workers ran
        0.50-0.90x by the mean step. On an idle machine it is what the other work leaves: a
        worker then only takes turns with the job's threads. At least ``available``."""
        if self.wants is None or self.others_runnable is None:
            return self.available
        want = self.wants + extra
        total = want + self.others_runnable
        share = self.cpus * want / total if total > self.cpus else want
        return max(self.available, min(share, float(self.cpus)))

    def cores_words(self, cores: float) -> str:
        """``cores`` in words: what the other work leaves, or the fair share with a worker more."""
        if cores > self.available + 1e-9:
            return (f"the {cores:.3g} of {self.cpus} cores the job would have with a worker more beside "
                    f"the machine's other work (its fair share; {self.available:.3g} now)")
        return f"the {cores:.3g} of {self.cpus} cores the machine's other work leaves"

    @property
    def model_cores(self) -> int:
        return max(1, min(self.threads, self.cpus))


# A single-process loader whose wait uses at least half a core is decoding, not waiting on
# storage: its workers need cores of their own.
CPU_LOADING = 0.5


def loading_cores(b: TimeBreakdown, cpu: JobCpu) -> float:
    """Cores the loading wanted while the job waited for it: the processes' CPU per step, and
    their waiting runnable for a core (a busy machine), less the most the rest of the step can
    have wanted (the model's threads), over the wait. A classifier (storage or CPU work), not
    the loading's cost: intra-op threads spinning while they wait count here too."""
    if b.input_wait <= 0:
        return 0.0
    if cpu.loader_busy is not None:
        # the thread that makes the batch, timed in next(loader): on a core or waiting for one
        # is decoding, blocked is storage (or a sleep); the process tree's CPU over the step
        # mixes the model's threads in (a zlib-decoding loader read 0.6 cores, "storage")
        return cpu.loader_busy
    rest = b.step_time - b.input_wait
    spare = (cpu.cores_used + cpu.runq_cores) * b.step_time - cpu.model_cores * rest
    return min(1.0, max(0.0, spare / b.input_wait))


@dataclass(frozen=True)
class LoaderWork:
    """What producing a batch and the rest of the step cost in cores, at the job's unobserved
    pace: the work is time on the thread that does it, not the CPU time the kernel counts."""

    batch_us: float  # a batch's work: the main thread's time in the wait (num_workers=0 does it there)
    main_us: float  # core-time the training process needs per step outside the loading
    cores: float  # cores the job has with a worker more (``JobCpu.cores_with``)
    # why main_us is what the training process spent, not what its work needs (its threads
    # spinning beside the batch), in words; "" where it is the work
    spent: str = ""

    @property
    def bound_us(self) -> float:
        """The least step at which workers keep up: they need ``batch_us`` of core-time per
        step, and the cores left to them over a step S are ``cores * S - main_us`` (the main
        process's needs, averaged over the step), so S >= (batch_us + main_us) / cores."""
        return (self.batch_us + self.main_us) / self.cores


def loader_work(b: TimeBreakdown, cpu: JobCpu, gpu: bool) -> LoaderWork:
    """With num_workers=0 the batch is produced on the main thread inside the wait: that time
    is a batch's work, whatever else the process's intra-op threads burnt meanwhile (they spin
    while they wait: on an H200, a ResNet-50 loader's process showed 14 busy cores for a batch
    that one worker thread made in the same ~0.46 s, ``../shared/runs/h200-2026-11-27``). The
    training process needs its main thread through the rest of the step; where the CPU is the
    device, the model's intra-op threads too, through its operators."""
    k = cpu.unobserved(b)
    main = operators_need(b, cpu, gpu) * k
    batch = b.input_wait * k
    spent = spent_beside(cpu, batch)
    if not gpu and cpu.proc_cores is not None and spent < main:
        # its operators' need read from the wall clock holds their waits for a core; what the
        # process spent is what they took
        return LoaderWork(batch, spent, cpu.cores_with(1),
                          f"measured: its process's CPU a step beyond the batch, less than the "
                          f"{ms(main)} its operators' time would say, which holds their waits for a core")
    if spent <= main:
        return LoaderWork(batch, main, cpu.cores_with(1))
    threads = (f"; with fewer than its {cpu.threads} intra-op threads (torch.set_num_threads) more "
               "of the cores go to the workers" if cpu.threads > 1 else "")
    return LoaderWork(batch, spent, cpu.cores_with(1),
                      f"measured: its process's CPU a step beyond the batch, where its operators need "
                      f"{ms(main)}; the rest is its threads' waiting, which OpenMP threads spend "
                      f"spinning{threads}")


def operators_need(b: TimeBreakdown, cpu: JobCpu, gpu: bool) -> float:
    """Core-time the training process's work needs per step outside the loading, at the view's
    pace: its main thread through the rest of the step and, where the CPU is the device, the
    model's other intra-op threads through its operators."""
    rest = b.step_time - b.input_wait
    return rest if gpu else rest + (cpu.model_cores - 1) * min(b.compute, rest)


def spent_beside(cpu: JobCpu, batch_us: float) -> float:
    """Core-time the training process spent per untraced step beyond the batch it made (its
    own CPU, the step timer's ``cpu_s``, less the loading's): its threads' work, and their
    spinning, where they spin. Workers compete with all of it for the cores: blind check 19's
    decoding loader in the training process (num_workers=0, torch's 2 intra-op threads, its
    process at 1.5 of 2 cores) was told 0.53x with 2 workers from the threads' work alone (2.5 ms
    a step beside a 15.7 ms batch) and ran 1.00-1.08x by the mean step; its process had spent 10
    ms a step beyond the batch, and with one intra-op thread the same 2 workers ran 0.58x.
    0 where not recorded."""
    if cpu.proc_cores is None or not cpu.step_us:
        return 0.0
    return max(0.0, cpu.proc_cores * cpu.step_us - batch_us)


def workers_work(b: TimeBreakdown, cpu: JobCpu, gpu: bool) -> LoaderWork | None:
    """What a loader's workers and the training process cost in cores per step, where the step
    timer recorded the training processes' own CPU: the rest of the tree's CPU per untraced step
    is the workers' (a batch a step, in a step the loader holds), and the training process needs
    the rest of the step beside them (its operators' need, as ``loader_work`` before its
    ``spent_beside``). Only the workers' CPU counts as the loading's, and the training process's
    spinning and polling is not charged: blind check 17's loader asleep on storage, its
    processes at 0.5 of 1.9 cores, ran 6.1-6.3 ms with 7 workers where a bound on all of it said
    11.5 (its workers needed no core, so spinning took none from them; whether it does where
    workers decode, as it does for a single-process loader's, is not measured yet).
    Blind check 18's decoding loader, 1 worker, its processes at 1.17 of 2 cores, was told 0.15x
    with 7 workers and ran 0.59x by the mean step with 2 to 10 of them: the cores held it."""
    workers = cpu.worker_cores
    if workers is None or not cpu.step_us:
        return None
    return LoaderWork(workers * cpu.step_us, operators_need(b, cpu, gpu) * cpu.unobserved(b),
                      cpu.cores_with(1))


def input_hidden(b: TimeBreakdown, cpu: JobCpu | None = None, gpu: bool = True,
                 workers: bool = False, count: int = 0) -> Prediction:
    """The rest of the step bounds it, and so do the cores: hiding a wait behind workers moves
    the loading's work to other processes, it does not remove it. ``workers``: the loader has
    workers already, whose work is in the job's processes' CPU (``tree_bound``); ``count``: how
    many, where known (``more_workers_needed``)."""
    rest, w = _hidden_rest(b, cpu, gpu)
    step = rest if w is None else max(rest, w.bound_us)
    paced_at = w is not None  # the prediction is at the pace the cores were measured at
    bound = ""
    if w is not None and cpu is not None and w.bound_us > rest:   # a bound needs the cores
        spent = f" ({w.spent})" if w.spent else ""
        bound = (f"; a batch is {ms(w.batch_us)} of work on the thread that makes it and the "
                 f"training process needs {ms(w.main_us)} of core time per step beside it{spent}, "
                 f"which {cpu.cores_words(w.cores)} cannot do in less than {ms(step)}")
    # the bounds below are at the pace the CPU was read at (the untraced steps'), and so is the
    # rest of the step beside them
    paced = rest * cpu.unobserved(b) if w is None and cpu is not None else rest
    ww = workers_work(b, cpu, gpu) if workers and cpu is not None else None
    if ww is not None and cpu is not None and ww.bound_us > step:
        rest, paced_at = paced, True
        step = max(rest, ww.bound_us)
        bound = (f"; its workers used {cpu.worker_cores:.3g} cores over the "
                 f"untraced steps ({ms(ww.batch_us)} of CPU a batch) and the training process needs "
                 f"{ms(ww.main_us)} of core time per step beside them, which "
                 f"{cpu.cores_words(ww.cores)} cannot do in less than {ms(step)}")
    tree = tree_bound(cpu) if workers and cpu is not None else None
    if tree is not None and cpu is not None and tree > step:
        rest, paced_at = paced, True
        step = max(rest, tree)
        waiting = (f", and {cpu.runq_cores:.2g} of its threads waited for a core on average"
                   if cpu.runq_cores >= 0.05 else "")
        bound = (f"; the job's processes (its workers among them) already keep {cpu.cores_used:.3g} "
                 f"of the {cpu.available:.3g} cores the machine's other work leaves busy{waiting}: "
                 "more workers move the loading's work, they do not remove it, so the step cannot "
                 f"be shorter than that work over {cpu.cores_words(cpu.cores_with(1))}, {ms(tree)}")
    # today's step at that pace: the step the prediction starts from (in the unprofiled view the
    # mean where the view holds the median; in a traced view the untraced step, not the
    # profiler's)
    now = b.step_time * cpu.unobserved(b) if paced_at and cpu is not None else b.step_time
    at = replace(b, step_time=now, input_wait=b.input_wait * now / b.step_time) if b.step_time > 0 else b
    needed = more_workers_needed(at, step, count) if workers else workers_needed(at, step)
    need = ""
    if needed and workers:
        need = (f"; needs about {needed} workers: with {count} now, each makes a batch in about "
                f"{count} step{'s' if count > 1 else ''} ({ms(count * now)}), and the step "
                f"left takes one every {ms(step)}")
    elif needed:
        need = (f"; needs at least {needed} DataLoader worker{'s' if needed > 1 else ''} producing a "
                "batch in that time")
    assumes = ("assumes more workers make batches as fast as the step takes them" if workers else
               "assumes a worker makes a batch in the time the main thread takes now")
    return Prediction(step, f"input wait ({ms(at.input_wait)}) hidden behind the rest of the step "
                            f"({ms(rest)} of compute, communication and gaps), which bounds it"
                            f"{bound}{need}; {assumes}",
                      from_us=now if now != b.step_time else None, workers=needed,
                      from_what=MEAN_UNTRACED)


# What each prediction's starting step is (``Recommendation.step_from``): the unprofiled view's
# and the untraced frame's are medians of the untraced steps around the window; a prediction held
# by the cores starts from the host samples' (or the rows') mean; the traced view's is the trace's
MEDIAN_UNTRACED = "median untraced step"
MEAN_UNTRACED = "mean untraced step"
MEAN_TRACED = "mean traced step"


def loader_pace(busy_us: float | None, workers: int) -> float | None:
    """The shortest step a loader with ``workers`` worker processes can feed (us), whatever is
    done to the training process: ``busy_us`` is its workers' time a step on a core or waiting
    for one, each worker's busiest thread, summed over the workers. Each worker makes one batch
    in ``workers`` (one batch a step in steady state), so a worker busy ``b`` a step takes
    ``workers x b`` a batch, and the loader cannot feed a step shorter than ``b``: the mean over
    the workers. None where not recorded.

    Over the workers, not over the cores: where the workers outnumber the cores, their waits for
    one another are in their busy time already (4 workers on 2 cores, B of CPU a batch: each is
    busy B/2 a step, the loader's pace B/2). Why: a fix to the training thread's work (compile,
    lower precision, fewer syncs) shortens the step only down to the pace the workers make
    batches at. Blind check 37 (2-core AMD VM): a 1-worker loader doing FFTs, its step held by
    the worker's batch (~8.4 ms alone, ~17 ms beside two busy loops), was told 0.73-0.75x for a
    compiled optimizer step and ran 0.97x. The wait for a core counts: beside other processes
    the worker's share of the cores is taken as the fix leaves it."""
    if busy_us is None or busy_us <= 0 or workers <= 0:
        return None
    return busy_us / workers


def tree_bound(cpu: JobCpu) -> float | None:
    """The shortest step a loader that has workers can reach with more of them: its processes'
    CPU per untraced step (the workers' decoding, the model's threads) over the cores the
    machine's other work leaves. Where they already keep those cores busy, more workers only
    take turns on them: six workers decoding on 2 cores (1.86-1.98 of them busy) were told
    "raise num_workers", -44%, and ran slower with more; the suite's feed job, 4 workers at
    1.66-1.81 cores, ran 0.82x with 6 (issue 37's blind check and its repeat, 2026-11-29).
    Only where the cores hold the step: its threads wanted every core the machine leaves
    (on one or waiting for one). Not all of that CPU is work a step must do (intra-op threads
    spin at a region's end, a process polls): blind check 17's loader asleep on storage, its
    processes at 0.5 of 1.9 cores, was held to 11.5 ms this way, and ran 6.1-6.3 ms with 7
    workers (2026-11-30). Over the cores the job would have with a worker more
    (``JobCpu.cores_with``): beside other processes' runnable work, a worker takes its share."""
    if cpu.step_us is None or cpu.step_us <= 0 or cpu.cores_used + cpu.runq_cores < cpu.available:
        return None  # the cores are not what holds the step: its threads did not want them all
    return cpu.cores_used * cpu.step_us / cpu.cores_with(1)


def workers_needed(b: TimeBreakdown, step: float) -> int | None:
    """Workers that hide a single-process loader's wait: each makes a batch in the time the
    main process now waits for one, and the predicted step (``input_hidden``) must cover it (a
    step that the cores bound is longer, and needs fewer of them)."""
    if b.input_wait <= 0 or step <= 0:
        return None
    return max(1, math.ceil(b.input_wait / step))


def more_workers_needed(b: TimeBreakdown, step_us: float, workers: int) -> int | None:
    """Workers that hide the wait of a loader with ``workers`` already: in a step the loader holds,
    the step is the time a worker takes for a batch over the workers, so each takes ``workers``
    steps a batch, and the predicted step (``step_us``) must cover one batch per step. None where
    that is no more than there are. Blind check 17's storage loader (1 worker, a 43.8 ms step,
    6.0 ms of it beside the wait) was told "raise num_workers" with no count: 3 ran 0.33x by the
    mean step; this gives 8 (7 from its repeat profile), and 7 ran 0.14x, as predicted."""
    if workers <= 0 or b.input_wait <= 0 or step_us <= 0:
        return None
    need = math.ceil(workers * b.step_time / step_us - 1e-9)
    return need if need > workers else None


def _hidden_rest(b: TimeBreakdown, cpu: JobCpu | None, gpu: bool) -> tuple[float, LoaderWork | None]:
    """The rest of the step once its input wait is hidden, and, where the loading is CPU work,
    what the loader's work costs (``loader_work``). Where it is, both are at the job's
    unobserved pace: the traced view's rest of the step, compared with a bound at the untraced
    pace, hid the bound (a decoding job on 2 cores: rest 21.9 ms traced, 14.4 ms untraced,
    bound 19.3 ms). A wait on storage moves no CPU into the step (its workers sleep): no work."""
    rest = b.step_time - b.input_wait
    if cpu is None or loading_cores(b, cpu) < CPU_LOADING:
        return rest, None
    return rest * cpu.unobserved(b), loader_work(b, cpu, gpu)


# The share of the step a single-process loader's wait must hold for the workers-with-fewer-threads
# pair to be named where workers alone would take turns with the model's threads
# (``no_core_for_workers``)
PAIR_LOADING = 0.5

# A loader with workers whose processes keep this share of the cores the machine leaves busy has
# none to give more workers: within a step timer's noise on a CPU (``advice.CPU_MIN_GAIN``).
CORES_FULL = 0.97


def no_core_for_workers(b: TimeBreakdown, cpu: JobCpu | None, gpu: bool = True,
                        workers: bool = False) -> str | None:
    """Why DataLoader workers would not help, or None: the loading is CPU work and the cores the
    machine's other work leaves are no more than the training process keeps busy beside it, so
    a worker would run on a core the model needs, and the step at which workers keep up
    (``LoaderWork.bound_us``) is no shorter than today's, where the main thread loads in turn.
    ``workers``: the loader has workers, and the job's processes already keep the cores the
    machine leaves busy (``tree_bound``: the step they bound is today's).

    On a CPU, a single-process loader's workers would share the cores with the model's intra-op
    threads where those already number the cores: the threads meet at each operator's end, so
    one of them waiting for a core holds them all. Blind checks 19 and 20 (2026-11-30, 2-core
    AMD VM, torch's default 2 threads): decoding and text parsing in the training process, told
    0.53x and 0.83-0.93x with workers, ran 1.00-1.08x and 1.16-1.26x by the mean step; with one
    intra-op thread the first ran 0.58x with 2 workers (the second 0.92-1.10x with 1), and a
    third job at one thread (blind check 20, job 2) ran 0.57x, as told (0.50-0.52x). Beside other
    processes' work it is not so: blind check 21 (the same VM at load 3-8) ran 0.50-0.90x with 1-2
    workers where this said they would not help, taking cores from that work too: the refusals
    here now count the cores a worker more would have by the fair share (``JobCpu.cores_with``),
    and the first two hold only where a worker would bring the job no more cores."""
    if (workers and cpu is not None and cpu.cores_used >= CORES_FULL * cpu.available
            and cpu.available >= CORES_FULL * cpu.cores_with(1)):
        return (f"the job's processes (its workers among them) already keep {cpu.cores_used:.3g} of the "
                f"{cpu.available:.3g} cores the machine's other work leaves busy ({pct_whole(CORES_FULL)} "
                "or more): more workers would have no core of their own, and would take turns with "
                "those there")
    rest, w = _hidden_rest(b, cpu, gpu)
    if w is None or cpu is None:
        return None
    if (not gpu and cpu.threads > 1 and cpu.threads >= cpu.available
            and cpu.available >= CORES_FULL * cpu.cores_with(1)):
        # the pair (workers with fewer threads) only where the loading is most of the step: blind
        # check 23's idle VM ran it 0.75x and 0.82x where the loading was 55-70% of the step,
        # 1.02x at 90%, and 1.48x where it was 15%
        pair = (" The change to try is the two together: workers and torch.set_num_threads below "
                f"{cpu.threads}, which leaves them cores (fewer threads alone may be slower), then profile "
                "again" if b.input_wait >= PAIR_LOADING * b.step_time else "")
        return (f"the loading is CPU work ({ms(w.batch_us)} a batch on the thread that makes it) and "
                f"the model's {cpu.threads} intra-op threads already take the {cpu.available:.3g} of "
                f"{cpu.cpus} cores the machine's other work leaves: a worker would take turns with "
                f"them, and each operator waits at its end for its slowest thread.{pair}")
    # within CORES_FULL of today's step is no shorter: where the process spent all the cores
    # left, the bound is today's step itself (beside a busy loop: 52.9 ms against 52.9 ms)
    if max(rest, w.bound_us) < CORES_FULL * b.step_time * cpu.unobserved(b):
        return None
    return (f"the loading is CPU work ({ms(w.batch_us)} a batch on the thread that makes it) and "
            f"{cpu.cores_words(w.cores)} are what the training process needs beside it "
            f"({ms(w.main_us)} of core time per step): workers would have no core of their own, and "
            "would take turns with the model as the main thread does now")


def input_hidden_step(b: TimeBreakdown, cpu: JobCpu | None = None, gpu: bool = True) -> float:
    """The step with its input wait hidden: the rest of it; and where the loading is CPU work,
    no less than the step at which the cores left to workers make a batch per step
    (``LoaderWork.bound_us``)."""
    rest, w = _hidden_rest(b, cpu, gpu)
    return rest if w is None else max(rest, w.bound_us)


def communication_overlapped(b: TimeBreakdown, cpu: bool = False,
                             backward_us: float | None = None) -> Prediction:
    """Exposed communication hidden behind compute, as far as compute not already hiding some
    reaches. A training step's gradients can hide only behind the backward still running after
    they are ready (``backward_us``, where the trace tells the backward apart: not behind the
    forward, nor the optimizer step that needs them). On a CPU the collectives' threads share the
    ranks' cores: each ms of compute they ran beside already cost ``comm_contention /
    (comm_total - comm_exposed)`` ms of compute (measured, ``comm_cost``), and each ms more
    hidden costs as much, so where that is a whole ms, overlapping gains nothing (issue 37:
    smaller DDP buckets on 2 ranks of a 2-core machine, predicted 367 -> 262 ms, measured no
    gain)."""
    hiding = b.comm_total - b.comm_exposed  # communication already hidden by compute
    behind, what = ((backward_us, "backward") if backward_us is not None else (b.compute, "compute"))
    capacity = max(0.0, behind - hiding)
    hidden = min(b.comm_exposed, capacity)
    bound = ("" if hidden >= b.comm_exposed else
             f"; only {ms(capacity)} of {what} is left to hide it behind (of {ms(behind)}, "
             f"{ms(hiding)} already hides communication), so {ms(b.comm_exposed - hidden)} stays "
             "exposed")
    rate = min(1.0, b.comm_contention / hiding) if cpu and hiding > 0 else 0.0
    slower = (f"; on the CPU the collectives' threads share the ranks' cores: each ms of them beside "
              f"the compute slowed it {rate:.2g} ms (measured), so the {ms(hidden)} hidden cost "
              f"{ms(hidden * rate)} of compute" if rate > 0 else "")
    return Prediction(b.step_time - hidden * (1 - rate),
                      f"exposed communication ({ms(b.comm_exposed)}{_own_pace_words(b)}) overlapped "
                      f"with {what}{bound}"
                      f"{slower}; assumes the collectives run as fast beside the compute as they do "
                      "now" + (", and slow the compute as they do now" if cpu else ""))


def _own_pace_words(b: TimeBreakdown) -> str:
    """Where other processes took part of the exposed wait (``comm_stalled``), the frame the
    exposed figure is in and the wall clock's beside it, so that this prediction and
    all-reduce-less-often's (whose cost counts that part: ``comm_exposed_wall``) quote figures a
    reader can tell apart (blind check 33: "39.5 ms exposed" in one, "23.2 ms" in the other)."""
    if b.comm_stalled <= 0:
        return ""
    return (f" at the job's own pace; {ms(b.comm_exposed_wall)} by the wall clock, other processes' "
            "part of it not a wait that overlapping hides")


# Micro-batches per all-reduce that the gradient-accumulation advice predicts for: a common
# choice (it quarters communication's cost per sample), stated in the advice's text.
ACCUMULATE_STEPS = 4


def accumulated(b: TimeBreakdown, comm_cost: float, k: int = ACCUMULATE_STEPS,
                optimizer_us: float | None = None) -> Prediction:
    """Gradient accumulation over ``k`` micro-batches, all-reducing and stepping the optimizer
    on the last: per micro-batch, the step without communication's cost (``comm_cost.cost``:
    exposed, the training thread's copies, the compute slowed beside it) and without the
    optimizer's step and zero_grad (``optimizer_us``, at the view's pace), plus a k-th of each.
    The optimizer left in per micro-batch under-stated the gain 2x (held-out zoo, ddp_bigrad:
    SGD over 64 MB of parameters, predicted 0.72x, measured 0.38-0.46x)."""
    opt = optimizer_us or 0.0
    saved = (comm_cost + opt) * (1 - 1 / k)
    step = (f"; the optimizer's step and zero_grad ({ms(opt)} a step) run once every {k} micro-batches "
            "too" if optimizer_us is not None else
            "; the optimizer's time was not told apart in this trace and is left in every micro-batch "
            "(the gain is under-stated by what it costs)")
    return Prediction(b.step_time - saved,
                      f"per micro-batch: communication's cost ({ms(comm_cost)} a step: exposed "
                      f"{ms(b.comm_exposed_wall)}"
                      + (f" by the wall clock ({ms(b.comm_stalled)} of it other processes')"
                         if b.comm_stalled > 0.5 else "")
                      + f", the training thread's copies for it {ms(b.comm_work)}, "
                      f"compute slowed beside it {ms(b.comm_contention)}) paid once every {k} "
                      f"micro-batches{step}; assumes a micro-batch's forward and backward are the step's "
                      "and the all-reduce of accumulated gradients costs what one step's does")


def _gaps(b: TimeBreakdown) -> tuple[float, str]:
    """The host gaps a launch-overhead fix can close, and what stays: the time the training
    thread waited for a core (``host_waiting``: the job's own workers and threads held them, or
    other processes, ``host_stalled``) is not launch overhead, whatever the launches become."""
    waiting = max(b.host_waiting, b.host_stalled)
    own = waiting - b.host_stalled
    if own > 0:
        kept = (f" (the {ms(waiting)} the training thread waited for a core in them stays: "
                f"{ms(own)} of it the job's own workers and threads held the cores"
                + (f", {ms(b.host_stalled)} other processes" if b.host_stalled > 0 else "") + ")")
    else:
        kept = (f" (the {ms(b.host_stalled)} the OS ran other work in them stays: a busy machine)"
                if b.host_stalled > 0 else "")
    return b.host_overhead - waiting, kept


def contention_removed(b: TimeBreakdown) -> Prediction:
    """The training thread's wait for cores the job's own workers and threads held
    (``host_waiting - host_stalled``) removed, and nothing else: its own host work and the
    cores other processes hold stay."""
    own = max(0.0, b.host_waiting - b.host_stalled)
    other = (f"; the {ms(b.host_stalled)} other processes held the cores stays"
             if b.host_stalled > 0 else "")
    return Prediction(b.step_time - own,
                      f"the training thread's wait for cores its own workers and threads held "
                      f"({ms(own)} per step) removed{other}; its own host work (Python, launches, "
                      "syncs) and the device's work keep their time")


def host_gaps_closed(b: TimeBreakdown, other_fix_us: float = 0.0, other_fix: str = "") -> Prediction:
    """The host gaps closed, but for ``other_fix_us`` of them that ``other_fix`` addresses
    (a CPU optimizer's per-tensor loop: ``compile-optimizer-step``), which keep their time."""
    gaps, kept = _gaps(b)
    other_fix_us = min(max(0.0, other_fix_us), gaps)
    rest = (f"; {other_fix}, keeps its time ({ms(other_fix_us)})" if other_fix_us > 0 else "")
    return Prediction(b.step_time - gaps + other_fix_us,
                      f"host gaps ({ms(gaps - other_fix_us)}) closed{kept}{rest}; the device's own "
                      "work and the input wait bound the step; assumes the device's work keeps its time")


def compiled(b: TimeBreakdown, saved_share: float | None) -> Prediction:
    """``torch.compile`` does both: the gaps between ops close (one compiled call instead of
    one dispatch per op), and runs of consecutive elementwise ops fuse into one pass."""
    fused = b.memory_bound * (saved_share or 0.0)
    gaps, kept = _gaps(b)
    return Prediction(b.step_time - gaps - fused,
                      f"host gaps ({ms(gaps)}) closed{kept} and each run of consecutive "
                      f"memory-bound elementwise operators fused into one pass ({ms(fused)} saved); "
                      "the operators compile does not fuse (GEMMs, convolutions) keep their time; "
                      "assumes the device runs behind the host (a GPU), so the gaps are launch "
                      "overhead, and a fused run costs its longest member")


# What a compiled graph costs, in calls of the job's own eager operators (the per-call cost the
# job's trace shows): a kernel call of the compiled graph RHO of one, each graph (guards, runtime
# wrappers, the autograd function of a training graph) GRAPH_CALLS. Measured on this project's
# 2-core AMD EPYC with torch 2.13 (benchmarks/compile_calls.py, tiny tensors, four models: Linear-
# LayerNorm-GELU blocks trained and run, chains of 8 and 32 elementwise ops between GEMMs; two
# runs at load average 10 and 14): a compiled kernel call 0.22-0.91x an eager call of the same
# model, a graph 4-15 calls. RHO is taken at 1 (no call of compiled code assumed cheaper than an
# eager one: the prediction errs on the side of less gain), GRAPH_CALLS inside the range measured.
# The training job of 48 blocks (benchmarks/predicted_vs_applied.py, compile-training) gained
# 27-58% in four runs at load average 10-24, predicted 34-37%: the load moved the truth more
# than RHO between 0.5 and 1 would move the prediction. A graph called once per iteration of a
# loop (a module compiled alone, called per sample or per time step), where the graphs are many
# enough to be told apart from the step's noise, measured 9-13 eager calls a graph on this VM at
# load 1 (a per-sample encoder 9, the zoo's rnn_loop 12, blind set 11's GRU cell 13; 8 had told
# the cell 1.05x, measured 1.34x): GRAPH_CALLS is taken at 12.
RHO = 1.0
GRAPH_CALLS = 12.0
# The prediction's other end: the cheapest compiled code the same measurements showed (a kernel
# call 0.22x an eager call, a graph 4 calls), with the fused runs below. RHO at 1 errs on the side
# of less gain, and on jobs it was not calibrated on it did: blind check 15 (three jobs written
# for it, compiled and timed by their own timers, 2026-11-30) measured compiling at 0.58x, 0.37x
# and 0.56x quiet where RHO 1 predicted 0.82x, 0.46x and 0.47x. The range states what the
# constants' own spread leaves open; only a run of the fix can settle where in it the job lands.
RHO_LOW = 0.22
GRAPH_CALLS_LOW = 4.0


def _cpu_region(view: TimeBreakdown, traced: TimeBreakdown, kept_us: float,
                extern_us: float, asleep_us: float = 0.0) -> tuple[float, float, float]:
    """(region, kept, extern) of the view's own step: its time outside what no call count
    changes (kept work, the GEMMs' own operators, waits, communication), the cost of its
    operator calls with the Python between them. Traced times are brought to the view's own
    time: the kept work by its share of the traced step (``own_of_traced``), the GEMMs' own
    operators by the job's own share of the traced step (their durations in the trace hold
    the machine's time as the step does: ``own_pace.charge`` takes it out of every part in
    proportion), then by the compute's ratio (the profiler's cost in operator time). Taken of
    the wall step and then less the machine's part, the machine's time inside those was taken
    out twice: beside the suite's other tests a per-sample model read no region left, and
    compile "1.00x"."""
    if traced.step_time <= 0:
        return 0.0, 0.0, 0.0
    k_work = (view.compute / traced.compute if traced.compute > 0 else
              view.own_step / traced.own_step if traced.own_step > 0 else 1.0)
    kept = own_of_traced(view, traced, kept_us)
    extern = extern_us * traced.own_step / traced.step_time * k_work
    region = max(0.0, view.own_step - kept - extern - view.input_wait - view.comm_exposed
                 - view.memcpy_exposed - asleep_us)
    return region, kept, extern


def compiled_cpu(view: TimeBreakdown, traced: TimeBreakdown, calls: float, kernels: float,
                 graphs: float, extern_us: float, kept_us: float, syncs: float = 0.0,
                 rho: float = RHO, graph_calls: float = GRAPH_CALLS,
                 loop_calls: float = 0.0, asleep_us: float = 0.0, after_us: float = 0.0,
                 work_us: float = 0.0, fusable_us: float = 0.0) -> Prediction:
    """``torch.compile`` on a CPU: it removes calls, not work (``compile_facts``). The step's
    time outside what compile keeps (the optimizer, AccumulateGrad, DataLoader waits,
    collectives, the OS running other work) and outside the GEMMs' and convolutions' own
    operators is the cost of its operator calls with the Python between them, at the view's
    pace, the same per call for each: ``calls`` of them compile would replace, and
    ``loop_calls`` in Python loops over samples (``step_loops``) that it would not (compiling
    the model leaves a loss's loop as it is; held-out zoo, py_loss: the loop's calls credited
    to compile predicted -30..-91%, measured 0.92-1.37x slower). Compiled, the replaced calls
    become ``kernels`` calls and ``graphs`` graph calls, each at the cost per call the job's own
    trace shows (``rho``, ``graph_calls``). The time the training thread slept in a blocking
    call of the job's (``asleep_us``: ``analyzers.blocked``) is no call's cost: it keeps its time.
    The calls after the backward (``after_us`` of ``kept_us``: a hand-written optimizer's loop, a
    metric) lie outside the model that compile is given: they keep theirs. Nor is the calls' work
    (``work_us``, traced: ``compile_facts.call_work``): compiled, a fused kernel still reads and
    writes what its operators did, and this stays (compile_chain, 14 elementwise operators a
    block: 0.77x compiled where its calls alone say 0.93x; blind set 10's transformer block and
    CNN, calls mostly work, credited with all of it: promised 0.89x and 0.98x, measured 1.02x
    and 1.10x)."""
    if calls <= 0 or traced.step_time <= 0:
        return Prediction(None, "no operator calls that torch.compile would replace were found")
    region, kept, extern = _cpu_region(view, traced, kept_us, extern_us, asleep_us)
    work = min(own_of_traced(view, traced, max(0.0, work_us)), region)
    fusable = min(own_of_traced(view, traced, max(0.0, fusable_us)), work)
    per_call = (region - work) / (calls + loop_calls)
    compiled = per_call * (rho * kernels + graph_calls * graphs)
    saved = per_call * calls - compiled
    breaks = (f", {syncs:.0f} of them split by values read back into Python (.item() and the like: "
              "graph breaks)" if syncs >= 0.5 else "")
    loop = (f"; the {loop_calls:.0f} calls of the Python loop over samples keep theirs "
            f"({ms(per_call * loop_calls)}): compiling the model does not reach a loop outside it"
            if loop_calls >= 0.5 else "")
    step = _busy_share(view, saved)
    cheap = per_call * calls - per_call * (RHO_LOW * kernels + GRAPH_CALLS_LOW * graphs)
    best = _busy_share(view, max(saved, cheap) + fusable)
    fused = (f"; at its other end, compiled calls as cheap as measured on other models ({RHO_LOW:g}x "
             f"an eager call, a graph {GRAPH_CALLS_LOW:g}x)"
             + (" and fused runs reading their data once (each run costing its longest member's "
                "work, where inductor's kernels beat ATen's: on a CPU they can also be the slower)"
                if fusable > 0 else "")
             + f": ≈ {ms(best)} ({best / view.step_time:.2f}x)" if best < step else "")
    return Prediction(
        step,
        f"the {calls:.0f} operator calls per step torch.compile would replace ({ms(per_call * calls)} "
        f"with the Python between them: {us(per_call)} a call) become {kernels:.0f} calls of "
        "compiled kernels (fused runs, and the GEMMs and convolutions it still calls) in "
        f"{graphs:.0f} graph{'s' if graphs >= 1.5 else ''}{breaks}; what compile leaves as it is "
        f"keeps its time (the optimizer, AccumulateGrad, DDP's copies where there are: {ms(kept)}"
        + (f", of which the calls after the backward, outside the model: {ms(after_us * kept / kept_us)}"
           if after_us > 0 and kept_us > 0 else "")
        + f"; the GEMMs' own operators: {ms(extern)}"
        + (f"; the other operators' work, beyond what a call of each costs with none: {ms(work)}"
           if work > 0 else "") + f"{loop}"
        + (f"; the thread asleep in a blocking call: {ms(asleep_us)}" if asleep_us > 0 else "")
        + "); assumes a compiled kernel "
        f"call costs {rho:g}x, and a graph {graph_calls:g}x, an eager call of this job (on a CPU "
        "compile removes calls, not their work)" + (", and the loop runs outside the compiled "
                                                    "module" if loop_calls >= 0.5 else "") + fused,
        best_us=best if best < step else None)


# What a per-tensor update compiled (``torch.compile(opt.step)``) still takes of the eager calls'
# work on the larger tensors, on a CPU: inductor's fused update is one C++ loop over each tensor,
# no more vectorised than ATen's own kernels, so the fewer passes over memory the fusion makes do
# not make it cheaper. Measured on this project's 2-core AMD EPYC (``benchmarks/compiled_optimizer.py``,
# torch 2.13, 32 tensors of 8 Linear+LayerNorm blocks, widths 128-512, 2026-12-03): AdamW kept
# 1.11-1.80 of it, SGD with momentum 0.71-1.40, RMSprop 1.02-1.16. Taken as all of it, the range
# as measured; 0.3 (one fused pass where the eager calls made several) had blind check 41's AdamW
# over 36 tensors predicted 0.70x, and it ran 0.94-0.95x.
COMPILED_WORK = 1.0
COMPILED_WORK_RANGE = (0.7, 1.8)
# Where the eager calls' temporaries fault their pages in afresh each step (``page_faults``:
# tensors past the allocator's reuse), the fused update, which makes none, leaves that part of
# the work: one fused pass over each tensor's state where the eager calls made several (Adam:
# 7 passes against about 25, and the temporaries). Blind check 40's SGD with momentum over 36 MB
# of gradients, its pages faulted each step: 0.92x predicted at this share (0.83-0.93 between
# none and all of the work), 0.75-0.93x measured (pooled 0.82).
FUSED_PASSES = 0.3
# What one parameter tensor's compiled update costs, in the loop's eager calls: the fused
# kernel's call from the compiled wrapper, and the guards on the tensor, its gradient and its
# state. Blind set 11's SGD with momentum over 130 tiny tensors (3 calls a tensor): its step
# compiled measured 0.97x (0.89-1.05, 6 runs), predicted 0.84x at one call a tensor; 2.6 calls a
# tensor give what it measured. Blind set 10's Adam over 162 tensors (10 calls a tensor):
# predicted 0.57x at one call, measured 0.59-0.63x.
TENSOR_CALLS = 2.5


def compiled_update(view: TimeBreakdown, traced: TimeBreakdown, update_us: float, calls: float,
                    params: float, tensor_calls: float = TENSOR_CALLS, graph_calls: float = GRAPH_CALLS,
                    where: str = "after the backward", work_us: float = 0.0, events: float = 0.0,
                    per_event_us: float = 0.0, profiler_us: float = 0.0,
                    temporaries_fault: bool = False) -> Prediction:
    """An optimizer's per-tensor step compiled (``torch.compile`` on the function that updates
    the parameters): its ``calls`` (``where``), ``update_us`` of the traced step with the
    Python between them, become one compiled kernel per parameter tensor (each tensor's update is
    a chain of elementwise operators, fused into one pass) and a graph call, each at the loop's
    own cost per call. On a CPU compile removes calls, not their work: a tensor's fused update,
    with the guards on its tensors, is taken to cost ``tensor_calls`` eager calls of the loop,
    and the operators' work on the larger tensors (``work_us``) stays (``COMPILED_WORK``), but
    where the eager calls' temporaries fault their pages in each step (``FUSED_PASSES``).

    The loop is brought to the view's pace without the profiler's cost: ``per_event_us`` for
    each of its ``events`` first (the view's estimate charged that per event, ``profiler_us``
    in all a traced step), then the step's remaining ratio. A loop of tiny calls records several events a
    call (AdamW: 1,117 for 360 calls, ``aten::to`` four deep), so the step's whole ratio left
    it too long: blind check 41's AdamW read 3.09 ms at the job's pace where its step alone
    timed 2.2-2.5 ms eager on the same machine."""
    if calls <= 0 or params < 1 or traced.step_time <= 0 or update_us <= 0:
        return Prediction(None, "no optimizer updating one parameter tensor at a time was found")
    charged = per_event_us * events if per_event_us > 0 else 0.0
    base = traced.step_time - profiler_us if per_event_us > 0 else traced.step_time
    if charged >= update_us or base <= 0:
        charged, base = 0.0, traced.step_time  # the model does not fit this loop: the step's ratio
    k = view.step_time / base
    loop = (update_us - charged) * k
    work = min(max(0.0, work_us) * k, loop)
    per_call = (loop - work) / calls
    calls_after = per_call * (tensor_calls * min(params, calls) + graph_calls)

    def step(share: float) -> float:
        return view.step_time - max(0.0, loop - calls_after - share * work)

    share, (lo, hi) = ((FUSED_PASSES, (0.0, 1.0)) if temporaries_fault
                       else (COMPILED_WORK, COMPILED_WORK_RANGE))
    why_share = (f"takes {share:g} of its time, one fused pass over each tensor's state where the "
                 "eager calls made several and faulted their temporaries' pages in, which puts the "
                 f"step between {ms(step(lo))} (that work all the calls' overhead) and "
                 f"{ms(step(hi))} (all of it kept)" if temporaries_fault else
                 f"stays: on a CPU a compiled update took {lo:g}-{hi:g}x the eager calls' work "
                 f"(benchmarks/compiled_optimizer.py), which puts the step between {ms(step(lo))} "
                 f"and {ms(step(hi))}")
    kept = (f"; the operators' work on the larger tensors ({ms(work)}: each call's time beyond the "
            f"same operator's fastest call) {why_share}" if work > 0 else "")
    profiler = (f", less the profiler's {us(per_event_us)} for each of the {events:.0f} events it "
                "recorded there" if charged > 0 else "")
    return Prediction(
        step(share),
        f"the {calls:.0f} operator calls {where} ({ms(loop)} a step at the job's pace{profiler}) "
        f"become one compiled kernel for each of the {params:.0f} parameter tensors and a graph "
        f"call{kept}; assumes a tensor's compiled update (its kernel's call, the guards on its "
        f"tensors) costs {tensor_calls:g}x, and a graph {graph_calls:g}x, the loop's overhead per "
        f"call ({us(per_call)}, the Python between the calls included; on a CPU compile removes "
        "calls, not their work), and that the model's forward and backward stay as they are",
        best_us=step(lo) if work > 0 else None)


def busy_share_step(step: float, own: float, own_saved: float) -> float:
    """A ``step`` of which ``own`` is the job's own time, with ``own_saved`` of that removed,
    where the machine's other work keeps its share of the step: on cores the job shares, each
    ms of its own work brings the other processes' part with it."""
    if own <= 0:
        return step
    return max(0.0, own - own_saved) * step / own


def own_of_traced(view: TimeBreakdown, traced: TimeBreakdown, traced_us: float) -> float:
    """``traced_us`` of the traced step as time of the view's own step: its share of the traced
    step, both by wall clock (other processes' time in each in proportion: the run-queue waits
    the sampler measures have no place in the trace), taken of the view's own time. Of the
    view's wall step instead, beside a busy process (27.4 of each 34.2 ms the machine's), an
    optimizer read 7.66 ms, more than the 6.83 ms own step. 0 for a traced step of no time."""
    return traced_us * view.own_step / traced.step_time if traced.step_time > 0 else 0.0


def _busy_share(view: TimeBreakdown, own_saved: float) -> float:
    """The view's step with ``own_saved`` of the job's own time removed (``busy_share_step``;
    the machine's share is the view's ``host_stalled``)."""
    return busy_share_step(view.step_time, view.own_step, own_saved)


def vectorised_loop(view: TimeBreakdown, traced: TimeBreakdown, loop_us: float, loop_calls: float,
                    iters: float) -> Prediction:
    """A Python loop over samples written as one batch expression: the loop's own time in the
    trace (``step_loops``: from its first forward call to its last, the Python between them
    included, and its first backward node to its last) becomes one iteration's. Its share of
    the traced step (both by wall clock, other processes' time in each in proportion: the
    run-queue waits the sampler measures have no place in the trace) is taken of the view's own
    time. Priced from the step's average per call before (held-out zoo 2, py_loss: 0.22x predicted,
    0.076x measured vectorised): the loop's calls are each a row's, cheaper than the model's on
    the batch, and the Python between them, not the calls, is most of a loop."""
    if loop_calls <= 0 or iters < 2 or traced.step_time <= 0 or loop_us <= 0:
        return Prediction(None, "no Python loop over samples was found")
    view_own = view.own_step
    if view_own <= 0:
        return Prediction(None, "no time of the job's own in the step")
    share = min(1.0, loop_us / traced.step_time)
    loop = share * view_own
    saved = loop * (1 - 1 / iters)
    return Prediction(
        _busy_share(view, saved),
        f"the loop's {iters:.0f} iterations, {pct_whole(share)} of the traced step ({ms(loop_us)}: "
        f"its {loop_calls:.0f} operator calls, forward and backward, with the Python between them), "
        f"take {ms(loop)} of the step at the job's own pace and become one iteration's "
        f"({ms(loop / iters)}) on the whole batch; assumes an iteration on the batch costs what one "
        "on a row does now (tiny rows: the dispatch and Python, not the arithmetic), that the "
        "profiler and the machine's other work slowed the loop as much as the rest of the step, "
        "and that the other work keeps its share of the shorter step")


# How much larger the micro-batch the accumulation advice predicts for (fewer accumulation steps
# in proportion, the samples per optimizer step unchanged), stated in its text.
LARGER_MICRO = 4


def fewer_micro_batches(view: TimeBreakdown, traced: TimeBreakdown, passes: float,
                        optimizer_us: float, flops: float | None, peak: float | None,
                        larger: int = LARGER_MICRO) -> Prediction:
    """``passes`` forward/backward passes per optimizer step (gradient accumulation) in
    ``larger`` times fewer, larger micro-batches. Each pass costs a fixed part (its operator
    calls, the Python between them, AccumulateGrad) and per-sample work; the work is taken at
    its floor, the step's FLOPs at the device's measured peak, so everything else the passes
    take is fixed cost, paid ``larger`` times less often. An upper bound on the gain: work at
    less than the peak's efficiency stays with the samples."""
    n_after = max(1, round(passes / larger))
    if passes < 2 or traced.step_time <= 0:
        return Prediction(None, "one forward/backward pass per optimizer step")
    k = passes / n_after
    opt = own_of_traced(view, traced, optimizer_us)   # of the own step, as the passes are
    passes_us = max(0.0, view.own_step - view.input_wait - view.comm_exposed
                    - view.memcpy_exposed - opt)
    work = flops / peak * 1e6 if flops and peak else 0.0
    fixed = max(0.0, passes_us - work)
    basis = (f"the step's FLOPs at the measured peak ({ms(work)})" if work > 0 else
             "no FLOP count: all of it counted fixed")
    return Prediction(
        _busy_share(view, fixed * (1 - 1 / k)),
        f"{passes:.0f} forward/backward passes per optimizer step take {ms(passes_us)} "
        f"({ms(passes_us / passes)} each; the optimizer's {ms(opt)} once a step aside): per-sample "
        f"work at its floor, {basis}, the rest ({ms(fixed / passes)} a pass) fixed cost of each "
        f"pass, paid {n_after} times instead of {passes:.0f} (micro-batches {k:.2g}x larger, the "
        "same samples per optimizer step); assumes a larger micro-batch's work runs at no better "
        "efficiency than the peak's, and that the machine's other work keeps its share of the "
        "shorter step")


def copies_hidden(b: TimeBreakdown) -> Prediction:
    return Prediction(b.step_time - b.memcpy_exposed,
                      f"copies ({ms(b.memcpy_exposed)}) overlapped with compute; assumes they can "
                      "run while compute runs (pinned memory, their own stream)")


def faster_dtype(b: TimeBreakdown, fp32_share: float, ratio: float, family: str) -> Prediction:
    """Compute-bound work whose FLOPs ran in fp32 (``fp32_share`` of them) at ``ratio`` =
    peak_fp32 / peak_faster of its time."""
    part = b.compute_bound * fp32_share
    saved = part * (1 - ratio)
    return Prediction(b.step_time - saved,
                      f"compute-bound fp32 work ({ms(part)}) at the {family} peak, "
                      f"{1 / ratio:.2g}x the fp32 one; assumes the same efficiency (share of the "
                      "peak) in both dtypes")


def autocast_measured(b: TimeBreakdown, fp32_share: float, peak_ratio: float, ac: AutocastGemms,
                      fp32_bytes: float | None, bandwidth: float, optimizer_us: float | None) -> Prediction:
    """torch.autocast to bf16 on a CPU, where the job's own layers were timed on this machine as
    autocast runs them (``autocast_gemms``): the timed GEMMs' time, compute-bound and
    memory-bound apart, at their measured ratios; the compute-bound rest (convolutions, batched
    GEMMs) at the peaks' ``peak_ratio``; and the memory-bound rest that autocast reaches (the
    activations' operators; not the optimizer's step, which updates fp32 weights outside
    autocast) moving half its bytes, no more than half its bytes take at the bandwidth. The same
    change whichever label called for it, so one prediction for both."""
    cb, mb = b.compute_bound * fp32_share, b.memory_bound * fp32_share
    cb_timed, mb_timed = cb * ac.share, mb * ac.mem_share
    cb_rest = cb - cb_timed
    saved = cb_timed * (1 - ac.ratio) + cb_rest * (1 - peak_ratio) + mb_timed * (1 - ac.mem_ratio)
    opt = min(optimizer_us or 0.0, max(0.0, mb - mb_timed))
    act = max(0.0, mb - mb_timed - opt)
    halved = act / 2
    bound = ""
    if fp32_bytes is not None and bandwidth > 0 and act > 0:
        by_bytes = fp32_bytes * (1 - ac.mem_bytes_share) / 2 / bandwidth * 1e6
        if by_bytes < halved:
            halved, bound = by_bytes, f", half its {fp32_bytes * (1 - ac.mem_bytes_share) / 1e6:.3g} MB at " \
                                      f"{bandwidth / 1e9:.3g} GB/s bounds it"
    saved += halved
    kind = "layer" if ac.layers else "GEMM"
    what = (f"the job's largest {kind} shape" if ac.shapes == 1 else
            f"the job's {ac.shapes} largest {kind} shapes")
    timed = [f"their compute-bound time ({ms(cb_timed)}) at {ac.ratio:.2f}x"] if cb_timed > 0 else []
    if mb_timed > 0:
        timed.append(f"their memory-bound time ({ms(mb_timed)}, a small batch's) at {ac.mem_ratio:.2f}x")
    parts = [f"{what} timed here forward and backward as autocast runs them (its casts included, "
             f"one thread): " + " and ".join(timed or ["no time of the step"])]
    if cb_rest > 0.5:
        parts.append(f"the other compute-bound fp32 work ({ms(cb_rest)}) at the bf16 peak, "
                     f"{1 / peak_ratio:.2g}x the fp32 one")
    if act > 0.5:
        parts.append(f"the activations' memory-bound work ({ms(act)}) moving half its bytes{bound}")
    if opt > 0.5:
        parts.append(f"the optimizer's step ({ms(opt)}) unchanged, fp32 outside autocast")
    return Prediction(b.step_time - saved, "; ".join(parts) + "; assumes the job's layers in bf16 "
                      f"run as those did alone (the bf16 peak's ratio, the best of 512x512x512 "
                      f"GEMMs, is {peak_ratio:.2g}x the time)")


def halved_bytes(b: TimeBreakdown, fp32_memory_share: float, fp32_bytes: float | None,
                 bandwidth: float, gemm_ratio: float = 1.0) -> Prediction:
    """Memory-bound fp32 work in bf16 moves half its bytes: at most half its time, and no more
    than half its bytes take at the device's bandwidth (an op bound by dispatch rather than
    bytes gains little). torch.autocast, which does it, also runs the matmuls in bf16: where
    ``gemm_ratio`` = peak_fp32 / peak_bf16 is above 1 (a CPU without bf16 units), the
    compute-bound fp32 work takes that much longer, at the efficiency it had."""
    part = b.memory_bound * fp32_memory_share
    saved = part / 2
    bound = ""
    if fp32_bytes is not None and bandwidth > 0:
        by_bytes = fp32_bytes / 2 / bandwidth * 1e6
        if by_bytes < saved:
            saved, bound = by_bytes, (f"; half of its {fp32_bytes / 1e6:.3g} MB per step at "
                                      f"{bandwidth / 1e9:.3g} GB/s bounds the saving")
    slower = ""
    if gemm_ratio > 1 and b.compute_bound > 0:
        lost = b.compute_bound * fp32_memory_share * (gemm_ratio - 1)
        saved -= lost
        slower = (f"; the compute-bound fp32 work ({ms(b.compute_bound * fp32_memory_share)}) would "
                  f"run at the bf16 peak, {gemm_ratio:.2g}x slower than fp32 here (+{ms(lost)})")
    return Prediction(b.step_time - saved, f"memory-bound fp32 work ({ms(part)}) moving half the "
                                           f"bytes{bound}{slower}; assumes the memory-bound work "
                                           "runs at the device's bandwidth in bf16 as in fp32")


def straggler_fixed(b: TimeBreakdown, median_us: float, worst_us: float) -> Prediction:
    if worst_us <= 0 or median_us <= 0:
        return Prediction(None, "per-rank step times unknown")
    return Prediction(b.step_time * median_us / worst_us,
                      f"every rank at the median rank's pace ({ms(median_us)} per traced step "
                      f"instead of {ms(worst_us)}); assumes the slow rank's extra time is its own "
                      "(its node, its shard), not the job's")


def fusion_runs(ts: np.ndarray, dur: np.ndarray, group: np.ndarray, fusable: np.ndarray,
                barrier: np.ndarray) -> tuple[float, float]:
    """(time of fusable items, time a fusion saves): items in time order per group (thread or
    stream); a run is a maximal sequence of fusable items with no other work (``barrier``)
    between them, and fused it costs its longest member."""
    sel = fusable | barrier
    if not fusable.any():
        return 0.0, 0.0
    idx = np.flatnonzero(sel)
    idx = idx[np.lexsort((ts[idx], group[idx]))]
    total = saved = 0.0
    run_sum = run_max = 0.0
    cur = None
    for g, f, d in zip(group[idx].tolist(), fusable[idx].tolist(), dur[idx].tolist(), strict=True):
        if g != cur or not f:
            saved += run_sum - run_max
            run_sum = run_max = 0.0
            cur = g
        if f:
            total += d
            run_sum += d
            run_max = max(run_max, d)
    saved += run_sum - run_max
    return total, saved
