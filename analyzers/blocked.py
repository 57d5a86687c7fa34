"""The training thread asleep outside torch: a blocking call in the step, named and costed.

Why: a step whose thread sleeps in a socket's ``recv``, a file's ``fsync``, a lock, a
``subprocess.run`` or a ``time.sleep`` leaves the same gap in a trace as Python and operator
dispatch: no operator runs. Read as dispatch, the fix offered is ``torch.compile`` and its
prediction charges the sleep to each call's Python (held-out zoo, ``rpc_wait``: a thread asleep
in ``recv`` 53-80% of the step read "launch, Python and synchronisation overhead", no advice,
and compile predicted +120% beside "1.13e+03 us a call"; compiled, 1.00x). The thread's own
clocks tell the two apart: per step, the step timer reads its time on a core (its CPU clock)
and its wait for one (schedstat); the rest it slept. Taken out of that are the sleeps gpudiag
already names: the DataLoader's (``StepRow.input_blocked_s``), the collectives' calls and
``torch.save`` (their whole time, so what is left is a floor), and the short sleeps of a thread
whose intra-op peers it waits for at each parallel region's end (``host_wait.blocked_s``: a
short wait per wake-up). What remains is a blocking call of the job's own
(``HostWait.untraced_blocked_us``, the median over the untraced steps).

On a CPU it is read within the step's host gaps: an operator's threads keep the training
thread on a core (it runs its share of each parallel region). On a GPU the thread may also
sleep in a CUDA synchronisation while the device works (a blocking-sync context), which is not
this: gpudiag does not name it there (not measured on a GPU yet).
"""

from __future__ import annotations

from gpudiag.analyzers.advice_inputs import AdviceInputs, on_gpu
from gpudiag.analyzers.whatif import Prediction
from gpudiag.diagnosis import HostWait, TimeBreakdown
from gpudiag.units import ms

# A blocking call named where its sleep is at least this share of the step at the job's own
# pace (the host advice's threshold: ``advice.HOST_NOTABLE``). The thread's clocks put the sleep
# of 15 held-out and test jobs without a blocking call at -3%..+1% of their step (median per
# step), and of ``rpc_wait`` at 65-82%.
BLOCKED_NOTABLE = 0.10


def asleep_us(b: TimeBreakdown, w: HostWait | None, gpu: bool) -> float:
    """The training thread's sleep outside torch per step (us), within ``b``'s own host gaps;
    0 on a GPU, or where the step timer did not read the thread's clocks."""
    if gpu or w is None or not w.untraced_blocked_us:
        return 0.0
    return max(0.0, min(w.untraced_blocked_us, b.host_overhead - b.host_stalled))


def notable(b: TimeBreakdown, w: HostWait | None, gpu: bool) -> bool:
    return b.own_step > 0 and asleep_us(b, w, gpu) / b.own_step >= BLOCKED_NOTABLE


def unsure(a: AdviceInputs) -> str | None:
    """Why the sleep may not be a blocking call at all (``HostWait.passive_threads``), else None:
    the advice is then listed as one that would not help, with this reason."""
    n = a.host_wait.passive_threads if a.host_wait is not None else None
    if not n:
        return None
    return (f"the job runs {n} intra-op threads under OMP_WAIT_POLICY=PASSIVE, which sleep at the "
            "end of each parallel region inside torch's operators, the training thread with them: "
            "its clocks cannot tell that sleep from a blocking call's. Profile it once with "
            "OMP_WAIT_POLICY unset (or torch.set_num_threads(1)): a sleep that stays is a blocking call")


def blocked_us(a: AdviceInputs) -> float:
    return asleep_us(a.view, a.host_wait, on_gpu(a))


def applies(a: AdviceInputs) -> bool:
    return notable(a.view, a.host_wait, on_gpu(a))


def cause(b: TimeBreakdown, w: HostWait | None, gpu: bool) -> str | None:
    """What a host-bound summary names of its host share: the thread asleep in a blocking call,
    where that is notable (the label stays: the device idles on the host either way)."""
    if not notable(b, w, gpu) or (w is not None and w.passive_threads):
        return None
    return (f"the training thread asleep in a blocking call outside torch ({ms(asleep_us(b, w, gpu))} "
            "of each step)")


def text(a: AdviceInputs, s: object = None) -> str:
    b, own = blocked_us(a), a.view.own_step
    return (f"The training thread sleeps {ms(b)} of each {ms(own)} step ({100 * b / own:.0f}%) "
            "outside torch's operators, the DataLoader and collectives (its own clocks: the step "
            "less its time on a core and its wait for one): a blocking call in the step, such as a "
            "socket or RPC reply, a file's write or fsync, a lock, a subprocess or a sleep. Make it "
            "beside the step: a background thread that fetches a step ahead, a non-blocking call, "
            "or do it less often (every N steps). Where it already runs beside the step, the wait "
            "is the call being slower than the step: make it faster, or several at once.")


def predict(a: AdviceInputs) -> Prediction:
    """The wait moved beside the step, one in flight at a time: the step becomes the longer of
    the rest of the step and the wait (a wait longer than the rest still sets the pace). What
    other processes took of the step (``host_stalled``) stays with the rest: they take the
    thread's cores while it runs, not while it sleeps (a job asleep 15 ms in ``recv`` beside a
    full test suite: 5.3 ms on a core, 12.7 ms waiting for one, 33 ms by the wall clock)."""
    b, own = blocked_us(a), a.view.own_step
    rest = own - b + a.view.host_stalled
    step = max(rest, b)
    bound = (f"; the wait is longer than the rest of the step ({ms(rest)}), so it sets the step"
             if b > rest else "")
    # the other end: a thread that no longer waits at all keeps its core, and the waits for one
    # after each wake-up go with the sleep. No longer floored by the wait: with several calls in
    # flight or the wait gone (a lock taken out of the loop) the wait sets no pace (held-out set
    # 4, load 1-6: a queue fed by 3 producers ran 7.5-10.4 ms where one in flight predicted
    # 13.7-17.6, the thread's CPU 6.3-6.7; a lock taken out ran 6.7-7.5 against 8.5-13.0; beside
    # a test suite at load 5-7 the waits for a core stayed: 0.55x measured, 0.54x predicted)
    run = a.host_wait.untraced_run_us if a.host_wait is not None else None
    fast = min(run, step) if run else step
    between = (f"; with several calls in flight, or the wait gone (a lock taken out of the loop), "
               f"and the waits for a core after each wake-up gone with the sleep (a thread that no "
               f"longer sleeps keeps its core), as fast as {ms(fast)}, its time on a core: the step "
               f"lies between" if fast < step * 0.95 else "")
    return Prediction(step, f"the thread's {ms(b)} asleep moved beside the step (a background "
                            f"thread, one call a step ahead){bound}; assumes the call takes as long "
                            "beside the step as in it and can be made a step before its result is "
                            f"needed, and the machine's other work keeps its part of the step{between}")
