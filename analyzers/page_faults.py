"""Memory the allocator gives back to the kernel every step and faults in again.

glibc's malloc serves blocks of 128 kB and more from fresh mappings and unmaps them on free,
until a freed block raises its threshold (up to 32 MB). A step whose temporaries are MB-sized
can then fault in and zero every page of them each step: kernel time inside whichever operator
first writes the memory, which the trace shows as that operator's work. The step timer records
the process's minor faults and kernel seconds per step (``StepRow.minflt``, ``sys_s``), and the
bootstrap what one fault costs the process (``BootstrapMeta.fault_us``).

Held-out set 8 (2026-11-29, 2-core AMD EPYC): two jobs whose optimizers made 2.4 and 5 MB
temporaries ran 22.4 and 14.4 ms a step by default and 13.7 and 7.7 ms with glibc's thresholds
set high; gpudiag named neither, and read the time as the optimizer's work.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpudiag.rundir import StepRow
from gpudiag.steps import WindowSteps

# Below this share of the mean step, the faults are not worth a fix: the step timer's noise is
# 1-4% (``checkpoint.SAVE_NOTABLE``, ``syncs.SYNC_NOTABLE``).
FAULTS_NOTABLE = 0.05
# Fewer untraced steps with the counters than this on a side: that side is not read.
MIN_ROWS = 3
# One side faulting this many times the other's count a step: the trace window moved the
# allocator (the profiler's own buffers, freed, move glibc's thresholds as one large free does).
MOVED = 2.0
# ...where the larger side faults at least this often a step (1 MB of 4 kB pages): a few
# hundred faults either way is noise of the job's own allocations.
MIN_MOVED_FAULTS = 256
# What the advice tells the job to set: glibc keeps blocks up to 256 MB in its heap and trims
# its top only past 1 GB free (the values held-out set 8's side check ran with).
GLIBC_ENV = "MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824"


@dataclass(frozen=True)
class Faults:
    """Page faults of the lowest rank's process over its untraced steps before the window (the
    job as the profiler had not yet touched its allocator), or after it where none before."""

    faults: float  # minor faults per step, mean
    cpu_us: float  # CPU time per step, mean (all threads)
    step_us: float  # wall step over the same steps, mean
    probe_us: float  # one fault's cost as the bootstrap's probe measured it in the process
    # kernel seconds over faults across all the untraced steps of the run: an upper bound on
    # one fault's cost in this job (the kernel time also holds other system calls). Over many
    # steps because the kernel splits a thread's time into user and system by clock ticks (4 ms
    # at 250 Hz): one step's share reads 0, 4.3 or 7.7 ms for the same 4,480 faults
    run_us: float | None
    side: str  # "before" or "after": the window side the steps are from
    after_faults: float | None = None  # faults per step after the window, where the side above is before

    @property
    def fault_us(self) -> float:
        """One fault's cost: the probe's, or this job's kernel time per fault where lower (a
        probe's fresh 16 MB mapping cost 3.5-3.7 us a fault on the 2-core AMD EPYC VM, the
        job's 2.4 MB temporaries 1.8 us)."""
        return self.probe_us if self.run_us is None else min(self.probe_us, self.run_us)

    @property
    def kernel_us(self) -> float:
        return self.faults * self.fault_us

    @property
    def parallel(self) -> float:
        """Cores the process used over the step: faults on intra-op threads overlap."""
        return max(1.0, self.cpu_us / self.step_us) if self.step_us > 0 else 1.0

    @property
    def saving_us(self) -> float:
        return min(self.kernel_us / self.parallel, self.step_us)

    @property
    def share(self) -> float:
        return self.saving_us / self.step_us if self.step_us > 0 else 0.0


def faults(windows: list[WindowSteps] | None) -> Faults | None:
    """The faults per step of the lowest rank, or None where the counters or the fault's cost
    were not recorded (runs from before they were, or a job's meta file that says otherwise)."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    cost = w.fault_us
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost < 1e4:
        return None
    before, after = _counted(w.before_rows), _counted(w.after_rows)
    rows, side = (before, "before") if len(before) >= MIN_ROWS else (after, "after")
    if len(rows) < MIN_ROWS:
        return None
    every = [*before, *after, *_counted(w.later_rows)]
    total = sum(r.minflt or 0 for r in every)
    run_us = sum(r.sys_s or 0.0 for r in every) * 1e6 / total if total > 0 else None
    return Faults(faults=statistics.fmean(r.minflt or 0 for r in rows),
                  cpu_us=statistics.fmean(r.cpu_s or 0.0 for r in rows) * 1e6,
                  step_us=statistics.fmean(r.dt + r.machine_s for r in rows) * 1e6,
                  probe_us=float(cost), run_us=run_us, side=side,
                  after_faults=side_faults(after) if side == "before" else None)


def side_faults(rows: list[StepRow]) -> float | None:
    """Faults per step over one side's rows that carry the counters (None: too few)."""
    counted = _counted(rows)
    return statistics.fmean(r.minflt or 0 for r in counted) if len(counted) >= MIN_ROWS else None


def allocator_moved(windows: list[WindowSteps]) -> tuple[float, float] | None:
    """(faults per step before the window, after it) where they differ by ``MOVED`` or more on
    the lowest rank: the window itself moved the allocator, and the steps after it are not the
    job's pace. Seen both ways on the 2-core AMD EPYC VM: this project's alloc_job ran 12-24 ms
    (mean 15.7-17.7) alone and 21.7 ms with 4,480 faults every step after the window; held-out
    set 8's jobs ran faster after it. None: no such change, or not recorded."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    b, a = side_faults(w.before_rows), side_faults(w.after_rows)
    if b is None or a is None or max(a, b) < MIN_MOVED_FAULTS:
        return None
    return (b, a) if max(a, b) >= MOVED * max(min(a, b), 1.0) else None


def _counted(rows: list[StepRow]) -> list[StepRow]:
    return [r for r in rows if r.minflt is not None and r.sys_s is not None and r.cpu_s is not None]


def notable(f: Faults | None) -> bool:
    return f is not None and f.share >= FAULTS_NOTABLE


def predicted_step_us(f: Faults) -> tuple[float, float, str]:
    """(the mean step, the mean step without the faults' kernel time, why). The mean step is the
    frame: glibc's threshold moves as blocks are freed, so steps alternate between faulting and
    not (held-out set 8: 12 or 25 ms), and the median may hold either kind."""
    par = f", over the {f.parallel:.2g} cores the step kept busy" if f.parallel > 1.05 else ""
    run = (f", the lower of the probe's {f.probe_us:.2g} us and the run's kernel time per fault "
           f"{f.run_us:.2g} us" if f.run_us is not None else ", as the probe measured it")
    return f.step_us, f.step_us - f.saving_us, (
        f"the mean of the untraced steps {f.side} the window ({f.step_us / 1e3:.3g} ms) less its "
        f"page faults' kernel time ({f.faults:,.0f} faults a step at {f.fault_us:.2g} us each{run}){par}; "
        "assumes every fault is the allocator's and none is left once freed blocks stay in the heap")


def text(f: Faults) -> str:
    moved = (f" After the traced window it faulted {f.after_faults:,.0f} times a step: the profiler's "
             "own buffers, freed, moved glibc's thresholds, as the job's own large frees do."
             if f.after_faults is not None and max(f.after_faults, f.faults) >= MOVED * max(
                 min(f.after_faults, f.faults), 1.0) else "")
    return (f"The training process faults in {f.faults:,.0f} fresh pages a step, "
            f"{f.kernel_us / 1e3:.3g} ms of kernel time ({100 * f.share:.0f}% of the mean step) that the "
            "trace shows as the work of the operators that first write them: glibc's malloc hands "
            "blocks of 128 kB and more back to the kernel when they are freed and maps them afresh "
            f"the next step. Keep them in the process: run the job with {GLIBC_ENV} in its "
            "environment, or with jemalloc or tcmalloc preloaded (LD_PRELOAD)." + moved)
