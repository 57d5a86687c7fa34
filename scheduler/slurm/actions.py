"""Changes to Slurm, made write-ahead (``ledger``): intents recorded, commands run, results confirmed.

``apply``: every intent of a round in one ledger update, the commands (Nice in batches, one
``scontrol update JobId=a,b,c Nice=V`` per value), then one confirmation. ``reconcile`` turns
what a crash or a failed command left into facts by reading Slurm, so a value gpudiag wrote is
never taken for an original. ``restore`` undoes what is still gpudiag's value and names the
rest. docs/slurm.md, "Undo, whatever happens".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpudiag.scheduler.slurm.arrays import adopt_split_tasks
from gpudiag.scheduler.slurm.ledger import (
    JobRef,
    Ledger,
    LedgerStore,
    ModeEntry,
    NiceEntry,
    Requeue,
    conf_reloaded,
)
from gpudiag.scheduler.slurm.slurmconf import ConfModes, Partition, same_mode
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob

log = logging.getLogger("gpudiag.scheduler.slurm")

PREEMPT_OFF = "OFF"
NICE_KINDS = ("nice", "lift", "restore")   # the changes that are a job's Nice
# Nice batches (one value each, different jobs) written at the same time: a round's ~20 calls
# then cost about five calls' time; slurmctld serves each call's updates one by one anyway.
NICE_CALLS_AT_ONCE = 4


@dataclass
class Action:
    kind: str            # "nice" | "lift" | "restore" | "requeue" | "preempt_mode"
    target: str          # job id or partition name
    old: str
    new: str
    reason: str
    applied: bool = False
    error: str = ""
    for_job: int | None = None   # a requeue: the pending job it makes room for
    reclaim: bool = False        # a requeue for quota reclaim (``reclaim``), not for a higher tier
    ref: JobRef | None = field(default=None, repr=False)


def record_intents(ledger: Ledger, actions: list[Action], now: float) -> None:
    """Before any command: each change with the value it replaces (kept from an earlier entry)."""
    for a in actions:
        if a.kind == "preempt_mode":
            e = ledger.modes.get(a.target)
            if e is None:
                ledger.modes[a.target] = ModeEntry(original=a.old, set=None, want=a.new, at=now)
            else:
                e.want, e.at = a.new, now
        elif a.kind in NICE_KINDS:
            jid = int(a.target)
            e = ledger.nice.get(jid)
            if e is None:
                e = NiceEntry(a.ref, original=int(a.old), set=None, want=int(a.new), at=now)
                ledger.nice[jid] = e
            else:
                e.want, e.at = int(a.new), now
            e.lifted = a.kind == "lift"
        elif a.kind == "requeue":
            ledger.requeued[int(a.target)] = Requeue(a.ref, now, a.for_job, done=False)


def confirm(ledger: Ledger, actions: list[Action]) -> None:
    """After the commands: what ran is fact, what did not is forgotten (its target kept its value)."""
    for a in actions:
        if a.kind == "preempt_mode" and a.target in ledger.modes:
            e = ledger.modes[a.target]
            if a.applied and a.new.upper() == e.original.upper():
                del ledger.modes[a.target]
            elif a.applied:
                e.set, e.want = a.new, None
            elif e.set is None:
                del ledger.modes[a.target]
            else:
                e.want = None
        elif a.kind in NICE_KINDS and int(a.target) in ledger.nice:
            e = ledger.nice[int(a.target)]
            if a.applied and int(a.new) == e.original:
                del ledger.nice[int(a.target)]
            elif a.applied:
                e.set, e.want = int(a.new), None
            else:   # the intent stays: next round's reconcile reads the job's Nice and settles it
                e.lifted = False   # a failed lift: its efficiency Nice is the efficiency's again
        elif a.kind == "requeue" and int(a.target) in ledger.requeued:
            if a.applied:
                ledger.requeued[int(a.target)].done = True
            else:
                del ledger.requeued[int(a.target)]


def _run(io: SlurmIO, a: Action) -> None:
    if a.kind in NICE_KINDS:
        io.set_nice(int(a.target), int(a.new))
    elif a.kind == "preempt_mode":
        io.set_preempt_mode(a.target, a.new)
    elif a.kind == "requeue":
        io.requeue(int(a.target))


def _steps(todo: list[Action]) -> list[list[Action]]:
    """The writes in order: each run of consecutive Nice changes split by value (one ``scontrol``
    call each, no job twice in one), every other change alone."""
    out: list[list[Action]] = []
    run: dict[str, list[Action]] = {}
    for a in todo:
        if a.kind in NICE_KINDS and not any(b.target == a.target for g in run.values() for b in g):
            run.setdefault(a.new, []).append(a)
            continue
        out += run.values()
        run = {}
        if a.kind in NICE_KINDS:
            run[a.new] = [a]
        else:
            out.append([a])
    return out + list(run.values())


def _write(io: SlurmIO, step: list[Action]) -> None:
    """One step of ``_steps``: sets ``applied`` or ``error`` on each; raises SlurmUnreachable."""
    a = step[0]
    if a.kind not in NICE_KINDS:
        _run(io, a)
        a.applied = True
        return
    failed = io.set_nice_many([int(b.target) for b in step], int(a.new))
    for b in step:
        b.error = failed.get(int(b.target), "")
        b.applied = not b.error


def apply(actions: list[Action], io: SlurmIO, store: LedgerStore, now: float,
          renew: Callable[[Ledger], None], renew_every_s: float,
          precheck: Callable[[Action], str] | None = None,
          prepare: Callable[[Ledger], None] | None = None) -> None:
    """Record, run, confirm: two ledger writes (one when there is nothing to change).
    ``prepare(ledger)`` goes into the first write (the round's reconciliation and lease);
    ``precheck(action)`` may veto a requeue or a PreemptMode write just before it runs (Slurm,
    read again, no longer shows what the round decided on: ``fresh``): its answer is the error.
    Slurm unreachable: the rest are not tried, the ledger is confirmed, and SlurmUnreachable is
    raised again so the loop names the outage once (not here and again next round)."""
    todo = [a for a in actions if not a.error]
    with store.update() as ledger:
        if prepare is not None:
            prepare(ledger)
        record_intents(ledger, todo, now)
        renew(ledger)
    if not todo:
        return
    last = time.monotonic()
    out: SlurmUnreachable | None = None
    runs = _runs(_steps(todo))
    try:
        for i, run in enumerate(runs):
            if time.monotonic() - last > renew_every_s:
                with store.update() as ledger:
                    renew(ledger)
                last = time.monotonic()
            a = run[0][0]
            why = precheck(a) if precheck is not None and a.kind in ("requeue", "preempt_mode") else ""
            if why:
                a.error = why
                log.info("%s %s not done: %s", a.kind, a.target, why)
                continue
            out = _write_run(io, run)
            if out is not None:    # named once, by whoever handles the outage
                log.warning("%s not done: Slurm cannot be reached; the rest wait until it is back",
                            ", ".join(f"{b.kind} {b.target}" for step in run for b in step if not b.applied))
                for rest in [b for later in runs[i + 1:] for step in later for b in step]:
                    rest.error = rest.error or "not tried: slurmctld unreachable"
                break
    finally:
        with store.update() as ledger:
            confirm(ledger, todo)
            renew(ledger)
    if out is not None:
        raise out


def _runs(steps: list[list[Action]]) -> list[list[list[Action]]]:
    """Steps grouped into runs: consecutive Nice steps (different values, different jobs) are one
    run, written at once; any other step is a run of its own, in its place."""
    out: list[list[list[Action]]] = []
    for step in steps:
        if out and step[0].kind in NICE_KINDS and out[-1][0][0].kind in NICE_KINDS:
            out[-1].append(step)
        else:
            out.append([step])
    return out


def _write_run(io: SlurmIO, run: list[list[Action]]) -> SlurmUnreachable | None:
    """The steps of one run, ``NICE_CALLS_AT_ONCE`` scontrol calls at a time (each updates its own
    jobs); each action's outcome set and logged; returns an outage that stopped any of them."""
    def one(step: list[Action]) -> SlurmUnreachable | None:
        try:
            _write(io, step)
        except SlurmUnreachable as e:
            for b in step:
                b.error = str(e)
            return e
        except SlurmError as e:
            for b in step:
                b.error = str(e)
        return None

    if len(run) == 1:
        outcomes = [one(run[0])]
    else:
        with ThreadPoolExecutor(min(NICE_CALLS_AT_ONCE, len(run))) as pool:
            outcomes = list(pool.map(one, run))
    outage = next((o for o in outcomes if o is not None), None)
    for step in run:
        for b in step:
            if b.applied:
                log.info("%s %s: %s -> %s (%s)", b.kind, b.target, b.old, b.new, b.reason)
            elif b.error and outage is None:     # an outage is named once, by the caller
                log.warning("%s %s failed: %s", b.kind, b.target, b.error)
    return outage


def reconcile(ledger: Ledger, jobs: Mapping[int, SlurmJob], notes: list[str]) -> None:
    """Jobs: entries of jobs gone (or ids reused by another job) dropped; a crash's intents
    resolved by the job's current Nice; a Nice someone else set since is theirs."""
    for jid, e in list(ledger.nice.items()):
        j = jobs.get(jid)
        if j is None or not e.ref.matches(j):
            del ledger.nice[jid]
            continue
        e.ref = JobRef.of(j)
        if e.want is not None:
            if j.nice == e.want:
                e.set = e.want
            e.want = None
        if j.nice == e.original and e.set in (None, e.original):
            del ledger.nice[jid]    # gpudiag's change never ran, or it put the original back itself
        elif e.set is None or j.nice != e.set:
            # gpudiag wrote e.set and never anything else since: any other value, the original
            # included, is an administrator's (or the user's) word on this job
            back = " (its original)" if j.nice == e.original else ""
            notes.append(f"job {jid}: Nice set to {j.nice}{back} by someone else since gpudiag set "
                         f"{e.set}: theirs, left alone from now on")
            del ledger.nice[jid]
            ledger.theirs[jid] = e.ref
    for jid, ref in list(ledger.theirs.items()):
        if jid not in jobs or not ref.matches(jobs[jid]):
            del ledger.theirs[jid]
    for jid, r in list(ledger.requeued.items()):
        j = jobs.get(jid)
        if j is None or not (r.ref.matches(j) or j.restarts > r.ref.restarts):
            del ledger.requeued[jid]
        elif not r.done:   # the crash came between intent and confirmation: did Slurm requeue it?
            if j.restarts > r.ref.restarts or j.state != "RUNNING":
                r.done = True
            else:
                del ledger.requeued[jid]
    for jid in [k for k in ledger.handed_back if k not in jobs or jobs[k].state != "PENDING"]:
        del ledger.handed_back[jid]


@dataclass
class Restored:
    actions: list[Action] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)     # what could not be restored, in words
    left: list[str] = field(default_factory=list)       # changed by someone else since: theirs
    notes: list[str] = field(default_factory=list)      # said beside what was restored (one line each)


def _mode_back(name: str, e: ModeEntry, p: Partition | None, conf: ConfModes | None, reloaded: bool | None,
               out: Restored) -> Action | None:
    """The write that gives partition ``name`` back: the mode Slurm ran before gpudiag took it,
    unless slurm.conf was reloaded since and set the partition's mode itself (then that one is
    Slurm's now, and stays). A slurm.conf edited but not reloaded is named, never applied: Slurm
    would run the old mode until the administrator reloads it."""
    if p is None:
        out.left.append(f"partition {name}: gone from Slurm")
        return None
    now_conf = conf.mode(name) if conf is not None else None
    edited = now_conf is not None and not same_mode(now_conf, e.original)
    if edited and same_mode(p.preempt_mode, now_conf) and reloaded is not False:
        since = "reloaded since gpudiag took it" if reloaded else "whether reloaded or not cannot be told"
        out.left.append(f"partition {name}: left at PreemptMode={p.preempt_mode}, as slurm.conf now sets it "
                        f"({since}; not {e.original}, its mode when gpudiag took it)")
        return None
    if same_mode(p.preempt_mode, e.original):
        return None
    if not e.ours(p.preempt_mode):
        out.left.append(f"partition {name}: PreemptMode={p.preempt_mode} set by someone else, left alone")
        return None
    if edited:
        out.notes.append(f"partition {name}: slurm.conf now sets PreemptMode={now_conf}, not reloaded yet: "
                        f"restored {e.original}, the mode Slurm ran; {now_conf} takes effect at the next "
                        "`scontrol reconfigure`")
    return Action("preempt_mode", name, p.preempt_mode, e.original,
                  "restore: Slurm chooses preemption victims again")


def restore(io: SlurmIO, store: LedgerStore, modes_only: bool = False, dry_run: bool = False) -> Restored:
    """Put back every recorded value that is still gpudiag's; entries leave the ledger only once
    restored (a crash here leaves them for the next restore). ``modes_only``: the watchdog's
    restore (preemption back to Slurm; Nice values stay for the controller's next start).
    The reload mark is dropped with the last entry, unless an administrator's runtime mode
    (``theirs_modes``) still needs it to tell their next reload. The watchdog's restore reads the
    ledger without waiting for its lock (``LedgerStore.peek``: its holder may be the stopped
    controller whose lease lapsed) and gives preemption back in Slurm first; its entries leave
    the ledger once the lock is free (the same entries only: a controller back from its hang may
    have made new ones)."""
    out = Restored()
    ledger = store.peek() if modes_only else store.read()
    if not ledger.modes and (modes_only or not ledger.nice):
        return out
    try:
        parts: dict[str, Partition] = io.partitions() if ledger.modes else {}
        cfg = io.config() if ledger.modes else {}
        conf = io.slurm_conf(cfg) if ledger.modes else None
        jobs = {j.id: j for j in io.jobs()} if ledger.nice and not modes_only else {}
    except (SlurmError, BadSlurmOutput) as e:
        out.failed.append(f"slurmctld could not be read ({e}): nothing restored, the ledger keeps everything")
        return out
    reloaded = conf_reloaded(ledger, cfg.get("BOOT_TIME"), io.marked) if ledger.modes else None
    adopt_split_tasks(ledger, jobs.values())    # array tasks that split off since the last round
    for name, e in ledger.modes.items():
        a = _mode_back(name, e, parts.get(name), conf, reloaded, out)
        out.actions += [a] if a is not None else []
    if not modes_only:
        for jid, e in ledger.nice.items():
            j = jobs.get(jid)
            if j is None or not e.ref.matches(j) or j.nice == e.original:
                continue
            if e.ours(j.nice):
                out.actions.append(Action("restore", str(jid), str(j.nice), str(e.original),
                                          "restore: the Nice the job had before gpudiag"))
            else:
                out.left.append(f"job {jid}: Nice {j.nice} set by someone else, left alone")
    if dry_run:
        return out
    steps = _steps(out.actions)
    for i, step in enumerate(steps):
        what = "partition" if step[0].kind == "preempt_mode" else "job"
        try:
            _write(io, step)
        except SlurmError as err:
            for b in step:
                b.error = str(err)
            if isinstance(err, SlurmUnreachable):
                for rest in [b for later in steps[i + 1:] for b in later]:
                    rest.error = "not tried: slurmctld unreachable"
        for b in step:
            if b.applied:
                log.info("restored %s of %s %s: %s -> %s", "PreemptMode" if what == "partition" else "Nice",
                         what, b.target, b.old, b.new)
            elif b.error:
                out.failed.append(f"{what} {b.target}: {b.error}")
    failed_modes = {a.target for a in out.actions if a.kind == "preempt_mode" and a.error}
    failed_jobs = {int(a.target) for a in out.actions if a.kind == "restore" and a.error}
    with store.update() as now_ledger:
        # an entry leaves only if it is the one read above (a controller may have made a new one)
        for name, e in list(now_ledger.modes.items()):
            if name not in failed_modes and name in ledger.modes and e.at == ledger.modes[name].at:
                del now_ledger.modes[name]
        if not modes_only:
            for jid, e in list(now_ledger.nice.items()):
                if jid not in failed_jobs and jid in ledger.nice and e.at == ledger.nice[jid].at:
                    del now_ledger.nice[jid]
            now_ledger.requeued.clear()
            now_ledger.handed_back.clear()
        if not now_ledger.modes and (modes_only or not now_ledger.nice):
            now_ledger.lease = None
        if not now_ledger.holds_changes and not now_ledger.theirs_modes and now_ledger.marked:
            _drop_mark(io, now_ledger)
    return out


def _drop_mark(io: SlurmIO, ledger: Ledger) -> None:
    """Nothing left that a reload could change: the reload mark goes with the controller."""
    try:
        io.delete_mark()
    except SlurmError as e:
        if "Invalid partition name" not in str(e):
            log.warning("reload mark not removed (%s): `scontrol delete PartitionName=gpudiag-reload-mark` "
                        "removes it", e)
            return
    ledger.marked, ledger.boot = False, None
