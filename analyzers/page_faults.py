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
# 1-4% (``checkpoint.SAVE_NOTABLE``, ``syncs.SYNC_NOTABLE``). Blind set 9's wide MLP gained 5%
# (0.951x) from the fix with 3.4% on its most-faulting side.
FAULTS_NOTABLE = 0.03
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
    """Page faults of the lowest rank's process over all its untraced steps around the window.

    All of them, not one side: glibc's thresholds move as blocks are freed, so a job flips
    between steps that fault and steps that do not, and any stretch of steps may sit in either
    mode (blind set 9: a job's steps before the window faulted 12,256 times a step, those after
    it 0 to 14,304; another's 1,776 a step before the window where alone it faulted ~7,560
    times more than with the fix). Each step less its own faults' time is the step with the fix,
    whichever mode it ran in: the prediction, and the range the modes span."""

    faults: float  # minor faults per step, mean over the steps
    max_faults: float  # the most-faulting side's mean (before, after, or the steps beyond)
    peak_faults: float  # the most-faulting step's
    min_faults: float  # the least-faulting side's mean
    cpu_us: float  # CPU time per step, mean (all threads)
    step_us: float  # wall step, mean
    probe_us: float  # one fault's cost as the bootstrap's probe measured it in the process
    # kernel seconds over faults across all the untraced steps of the run: an upper bound on
    # one fault's cost in this job (the kernel time also holds other system calls). Over many
    # steps because the kernel splits a thread's time into user and system by clock ticks (4 ms
    # at 250 Hz): one step's share reads 0, 4.3 or 7.7 ms for the same 4,480 faults
    run_us: float | None
    steps: int  # the untraced steps read
    # faults per step before and after the window (None: too few steps on that side)
    before_faults: float | None = None
    after_faults: float | None = None

    @property
    def fault_us(self) -> float:
        """One fault's cost: the probe's, or this job's kernel time per fault where lower (a
        probe's fresh 16 MB mapping cost 3.5-3.7 us a fault on the 2-core AMD EPYC VM, the
        job's 2.4 MB temporaries 1.8 us)."""
        return self.probe_us if self.run_us is None else min(self.probe_us, self.run_us)

    @property
    def parallel(self) -> float:
        """Cores the process used over the step: faults on intra-op threads overlap."""
        return max(1.0, self.cpu_us / self.step_us) if self.step_us > 0 else 1.0

    def cost_us(self, faults: float) -> float:
        """The wall time ``faults`` faults a step take of the step."""
        return faults * self.fault_us / self.parallel

    @property
    def saving_us(self) -> float:
        return min(self.cost_us(self.faults), self.step_us)

    @property
    def fixed_us(self) -> float:
        """The step with no fault left: the same in every mode of the allocator."""
        return self.step_us - self.saving_us

    @property
    def share(self) -> float:
        return self.saving_us / self.step_us if self.step_us > 0 else 0.0

    @property
    def worst_share(self) -> float:
        """The share in the most-faulting stretch: what the fix is worth where the job, alone,
        sits in that mode."""
        worst = self.fixed_us + self.cost_us(self.max_faults)
        return self.cost_us(self.max_faults) / worst if worst > 0 else 0.0

    def ratio_range(self) -> tuple[float, float]:
        """(the fixed step over a step faulting as the most-faulting step did, the same over
        the least-faulting side's mean): the ratio the fix gives in either mode. The step, not a
        side, for the low end: blind set 9's AdamW job faulted 2,264 a step on its worst side
        and 6,112 in its worst step; alone it ran 44.6 ms where 29.2 with the fix (0.655x, the
        worst step's mode: 0.66x)."""
        lo = self.fixed_us / (self.fixed_us + self.cost_us(self.peak_faults))
        hi = self.fixed_us / (self.fixed_us + self.cost_us(self.min_faults))
        return lo, hi


def faults(windows: list[WindowSteps] | None) -> Faults | None:
    """The faults per step of the lowest rank, or None where the counters or the fault's cost
    were not recorded (runs from before they were, or a job's meta file that says otherwise)."""
    if not windows:
        return None
    w = min(windows, key=lambda x: x.rank)
    cost = w.fault_us
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 < cost < 1e4:
        return None
    sides = [_counted(x) for x in (w.before_rows, _settled(w.after_rows), w.later_rows)]
    burst = _burst([r for side in sides for r in side])
    sides = [[r for r in side if r is not burst] for side in sides]
    rows = [r for side in sides for r in side]
    if len(rows) < MIN_ROWS:
        return None
    means = [statistics.fmean(r.minflt or 0 for r in side) for side in sides if len(side) >= MIN_ROWS]
    total = sum(r.minflt or 0 for r in rows)
    run_us = sum(r.sys_s or 0.0 for r in rows) * 1e6 / total if total > 0 else None
    mean = statistics.fmean(r.minflt or 0 for r in rows)
    return Faults(faults=mean, max_faults=max(means, default=mean), min_faults=min(means, default=mean),
                  peak_faults=float(max(r.minflt or 0 for r in rows)),
                  cpu_us=statistics.fmean(r.cpu_s or 0.0 for r in rows) * 1e6,
                  step_us=statistics.fmean(r.dt + r.machine_s for r in rows) * 1e6,
                  probe_us=float(cost), run_us=run_us, steps=len(rows),
                  before_faults=side_faults(w.before_rows), after_faults=side_faults(_settled(w.after_rows)))


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
    b, a = side_faults(w.before_rows), side_faults(_settled(w.after_rows))
    if b is None or a is None or max(a, b) < MIN_MOVED_FAULTS:
        return None
    return (b, a) if max(a, b) >= MOVED * max(min(a, b), 1.0) else None


def _burst(rows: list[StepRow]) -> StepRow | None:
    """The one step that faulted more than twice any other (and at least ``MIN_MOVED_FAULTS``):
    a heap grown once, not a mode the allocator sits in (tests/jobs/alloc_job.py with glibc's
    thresholds set: 9,168 faults in its step 4, none in any other untraced step; a CI clone run
    was told the fix it ran with). None where no step stands out so."""
    if len(rows) < 2:
        return None
    top = sorted(rows, key=lambda r: r.minflt or 0)
    first, second = top[-1].minflt or 0, top[-2].minflt or 0
    return top[-1] if first >= MIN_MOVED_FAULTS and first > MOVED * second else None


def _settled(after: list[StepRow]) -> list[StepRow]:
    """The steps after the window less the first: it faults the heap back in where the
    profiler's buffers were (tests/jobs/alloc_job.py with glibc's thresholds set: 0 faults a
    step before the window and after, 9,217 in the first step after it; its 4% of the mean
    named a fix already applied)."""
    return after[1:]


def _counted(rows: list[StepRow]) -> list[StepRow]:
    return [r for r in rows if r.minflt is not None and r.sys_s is not None and r.cpu_s is not None]


def notable(f: Faults | None) -> bool:
    """Worth a fix where the steps read faulted for 3% of them, or the most-faulting stretch
    did: the job alone may sit in that mode (blind set 9's wide MLP: 1.4% over the steps of one
    run, 3.4% on its most-faulting side, 0.951x measured with the fix)."""
    return f is not None and max(f.share, f.worst_share) >= FAULTS_NOTABLE


def predicted_step_us(f: Faults) -> tuple[float, float, str]:
    """(the mean step, the same less its faults' time, why). The mean step is the frame: the
    allocator's modes alternate (held-out set 8: steps of 12 or 25 ms), and the median may hold
    either kind."""
    par = f", over the {f.parallel:.2g} cores the step kept busy" if f.parallel > 1.05 else ""
    run = (f", the lower of the probe's {f.probe_us:.2g} us and the run's kernel time per fault "
           f"{f.run_us:.2g} us" if f.run_us is not None else ", as the probe measured it")
    lo, hi = f.ratio_range()
    spread = (f"; the steps' modes span {lo:.2f}x (every step faulting as the most-faulting one did, "
              f"{f.peak_faults:,.0f}) to {hi:.2f}x (as the least, {f.min_faults:,.0f}): the job alone "
              "may sit in either, the step with the fix is the same in both"
              if hi - lo >= 0.02 else "")
    return f.step_us, f.fixed_us, (
        f"the mean of the {f.steps} untraced steps around the window ({f.step_us / 1e3:.3g} ms) less its "
        f"page faults' time ({f.faults:,.0f} faults a step at {f.fault_us:.2g} us each{run}){par}{spread}; "
        "assumes every fault is the allocator's and none is left once freed blocks stay in the heap")


def text(f: Faults) -> str:
    b, a = f.before_faults, f.after_faults
    moved = (f" It faulted {b:,.0f} times a step before the traced window and {a:,.0f} after it: glibc's "
             "thresholds move as large blocks are freed, the job's own and the profiler's."
             if b is not None and a is not None and max(a, b) >= MOVED * max(min(a, b), 1.0) else "")
    return (f"The training process faults in {f.faults:,.0f} fresh pages a step, "
            f"{f.cost_us(f.faults) / 1e3:.3g} ms of each {f.step_us / 1e3:.3g} ms step in the kernel "
            "that the trace shows as the work of the operators that first write them: glibc's malloc "
            "hands blocks of 128 kB and more back to the kernel when they are freed and maps them "
            f"afresh the next step. Keep them in the process: run the job with {GLIBC_ENV} in its "
            "environment, or with jemalloc or tcmalloc preloaded (LD_PRELOAD)." + moved)
