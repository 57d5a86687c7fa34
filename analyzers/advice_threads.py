"""Fewer intra-op threads on a CPU that other processes crowd.

Why: a CPU job's operators split their work over torch's intra-op threads, which meet at each
operator's end. Where the machine's other work leaves the job fewer cores than it has threads,
one of them waits for a core and the others wait for it: asleep, or spinning (OpenMP's default
policy), which takes a core from the thread they wait for. The job's own pace rightly leaves
that wait to the machine (``gpudiag.pace``), so no share of the verdict shows it, yet the fix is
the job's: fewer threads, so that none waits for another. Blind check 21 (2026-11-30, this
project's 2-core AMD EPYC VM at load 3-8, torch's default 2 threads, workers 0 or 2) measured
one thread at 0.14x, 0.28x and 0.19x the mean step of three jobs, the largest change of any
applied there, where gpudiag named threads only inside a refusal, or not at all.

It is advised only where it cannot take a core the job has: the job's processes used no more
than the cores the other work left (``JobCpu.available``), and those are at least a whole core
fewer than its threads; so on an idle machine, where the threads have their cores, it is
silent.

What it saves (``predict``), on a CPU: where the operators are short, the step returns to the
job's own pace (its untraced step less other processes' part): no thread then waits at an
operator's end for one that waits for a core. Where they are long, the threads' work was also
parallel work, and one thread does it in turn: between that pace and today's step. On a GPU
job's loader the spinning of many threads is most of the cost and no wait reads it (the H200
case below: 36x), so it is not predicted there.
"""

from __future__ import annotations

import math

from gpudiag.analyzers import whatif
from gpudiag.analyzers.advice_inputs import AdviceInputs, job_cpu, on_gpu
from gpudiag.analyzers.classify import HOST_NOTABLE
from gpudiag.analyzers.compile_facts import LONG_CALL_US, long_share
from gpudiag.diagnosis import Bottleneck
from gpudiag.units import ms, pct_whole


def crowded(a: AdviceInputs) -> tuple[whatif.JobCpu, float, float] | None:
    """(the job's CPU use, other processes' part of an untraced step, that step's wall clock),
    us, where the advice applies: a job whose intra-op threads outnumber the cores the machine's
    other work left it by a whole core or more, on a CPU or, on a GPU, where a DataLoader with
    no workers runs the loading on them; and whose untraced steps other processes took
    HOST_NOTABLE of or more. On an H200 (16 cores), a ResNet-50 whose num_workers=0 loader ran on
    16 intra-op threads stepped in 507 ms alone and 18.3 s beside four busy loops, its process
    at 12.4 cores spinning at the operators' ends, other processes' part 8-24% of its steps:
    a GPU job, which the advice left out. Else None."""
    cpu, hw = job_cpu(a.traits), a.host_wait
    if cpu is None or cpu.threads < 2 or hw is None or (on_gpu(a) and not a.traits.single_process_loader):
        return None
    machine, wall = hw.untraced_machine_us, hw.untraced_wall_us
    if machine is None or not wall or machine < HOST_NOTABLE * wall:
        return None
    if cpu.threads < cpu.available + 1:
        return None
    return cpu, machine, wall


# From this share of the operators' typical time in long ones (``compile_facts.long_share``:
# median call 2 ms or more), the operators are long: the wait at each one's end for a thread
# that waits for a core (about a scheduler slice, 1-3 ms beside busy loops) is a small part of
# it, and fewer threads do not lead. Blind check 24 (2-core VM, two busy loops): one thread ran
# 0.96-1.00x on a 2048-wide MLP at 5.9 ms a call, and 0.37-0.90x on three jobs at 66-242 us a
# call, where it was the largest win. Blind check 26's 1D conv net (five 86 ms convolutions a
# step among ~400 short calls, 2 ms a call on average) led with it, predicted 0.50x, and ran
# 0.92x, where bf16 ran 0.59x: by the mean call it read as short.
LONG_SHARE = 0.5


def long_operators(a: AdviceInputs) -> float | None:
    """The share of the operators' typical time in long ones where it is LONG_SHARE or more (a
    CPU trace's ``CompileFacts``); None where less or not counted."""
    f = a.compile_facts
    share = None if f is None else long_share(f)
    return share if share is not None and share >= LONG_SHARE else None


def cores_left(cpu: whatif.JobCpu) -> float:
    """The cores the machine's other work leaves the job (not the cores the job used: threads
    spinning at an operator's end count there)."""
    return max(0.0, cpu.cpus - cpu.other_cores)


def threads_to_use(cpu: whatif.JobCpu) -> int:
    """As many threads as whole cores the other work leaves, at least one."""
    return max(1, math.floor(cores_left(cpu) + 1e-9))


def text(a: AdviceInputs, s: dict[Bottleneck, float]) -> str:
    found = crowded(a)
    assert found is not None
    cpu, machine, wall = found
    left = cores_left(cpu)
    where = " (its DataLoader's work runs on them, in the training process)" if on_gpu(a) else ""
    fewer = f"fewer than its {cpu.threads} intra-op threads{where}"
    took = (f"Other processes took {ms(machine)} of each {ms(wall)} step ({pct_whole(machine / wall)}) "
            f"and left the job {left:.2g} of its {cpu.cpus} cores, {fewer}")
    long = long_operators(a)
    amortised = (f" Its operators are long ({pct_whole(long)} of their time in operators of "
                 f"{ms(LONG_CALL_US)} a call or more, as traced), so that wait is a smaller part "
                 "of each, and the fixes that shorten them are listed first; fewer threads may still "
                 "gain (a run tells)." if long is not None else "")
    return (f"{took}: each operator waits at its end for its slowest thread, so one waiting for a "
            "core holds the others (with OpenMP's default wait policy they spin meanwhile, taking "
            f"cores from it).{amortised} While the machine is this busy, run with "
            f"torch.set_num_threads({threads_to_use(cpu)}), or give the job cores of its own "
            "(taskset, a cgroup), then profile again.")


def predict(a: AdviceInputs) -> whatif.Prediction:
    """The untraced step at the job's own pace where its operators are short; where they are
    long, the middle of that pace and today's step, that pace its other end. Blind checks 24
    and 25 (2-core AMD EPYC VM, two busy loops, other processes' part 45-51% of each step),
    one thread against the same job's busy runs, by its own timer: on five jobs whose operators
    took 66-242 us a call, 0.39-0.59x the step where its own pace was 0.49-0.55x of it; on three
    at 4.9-9.0 ms a call, 0.67-0.98x where it was 0.50x. Blind check 21's jobs, at load 3-8,
    gained more (0.14-0.28x), as did blind check 26's two new short-operator jobs (told 0.51x
    and 0.40x, ran 0.36-0.42x beside two loops and 0.19x beside three): threads spinning at each
    operator's end take cores from the job too, which the own pace keeps as the job's; this
    predicts the pace, not that, and so under-promises there. Its long-operator job (attention,
    three loops) was told 0.69x, its other end 0.38x, and ran 0.76-0.80x."""
    found = crowded(a)
    if found is None or on_gpu(a):
        return whatif.Prediction(None, "what it saves is the threads' wait for one another and their "
                                       "spinning, which depends on what else the machine runs "
                                       "meanwhile: a run with it applied tells")
    _, machine, wall = found
    own = wall - machine
    start = f"the untraced step ({ms(wall)}) less other processes' part ({ms(machine)})"
    if long_operators(a) is None:
        return whatif.Prediction(own, f"{start}: its operators are short, so with no thread waiting at "
                                      "their ends for one that waits for a core, it runs at its own "
                                      "pace; where its threads also spun, taking cores from it, it can "
                                      "gain more", from_us=wall,
                                 from_what=whatif.MEDIAN_UNTRACED)
    return whatif.Prediction((own + wall) / 2, f"between {start}, its other end, and today's step: its "
                                               "operators are long, and one thread does in turn what "
                                               "the threads did side by side; the middle is shown",
                             from_us=wall, best_us=own, from_what=whatif.MEDIAN_UNTRACED)
