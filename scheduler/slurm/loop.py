"""The controller's processes: the loop of rounds, ``--restore-only`` and ``--watchdog``.

``serve``: a round every interval; an unreachable slurmctld or munged is named once and retried
every ``RETRY_S`` with the lease renewed; SIGTERM/SIGINT end it after the round; exit 0 clean, 1 a
round or restore failed, 2 the ledger is not ours. ``restore_only``: undo and exit (1 naming what
is not back). ``watchdog``: once a lease lapsed with partitions held, give preemption back.
docs/slurm.md, "Undo, whatever happens".
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

from gpudiag.scheduler.slurm import claim
from gpudiag.scheduler.slurm.actions import restore
from gpudiag.scheduler.slurm.controller import Controller, Refused, RoundResult
from gpudiag.scheduler.slurm.ledger import LedgerError, LedgerStore
from gpudiag.scheduler.slurm.slurmconf import cluster_identity
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput

log = logging.getLogger("gpudiag.scheduler.slurm")

# While slurmctld or munge is out, a round is retried this often: its first read fails at once
# (connection refused, no munge socket) or within Slurm's MessageTimeout, so this is one small
# request every few seconds, and the controller is back within this long of their return.
RETRY_S = 5.0
# Each round reads squeue and three scontrol answers from slurmctld; Slurm's own clients are
# told to poll no faster than every few seconds, and a round of a large cluster takes about one.
MIN_INTERVAL_S = 5.0
WATCHDOG_POLL_S = 2.0    # a small file read: cheap, and a dead controller is seen within it


def describe(res: RoundResult) -> str:
    """A round in a few lines for people (``--json`` prints the whole RoundResult instead)."""
    if res.skipped:
        return res.skipped
    sig = f"{res.signals['jobs']} jobs" if res.signals.get("available") else res.signals.get("why", "")
    lines = [f"{res.jobs.get('pending', 0)} pending, {res.jobs.get('running', 0)} running; signals: {sig}; "
             f"preemption held in: {', '.join(res.held) or 'none (Slurm chooses)'}"]
    for a in res.actions:
        state = "done" if a.applied else (f"not done: {a.error}" if a.error else "planned")
        lines.append(f"  {a.kind} {a.target}: {a.old} -> {a.new} [{state}] {a.reason}")
    # a victim the pass chose is a line only where its requeue was tried: one left to Slurm (its
    # head handed back) or blocked this round did not happen, and the lines above say what did
    tried = {a.target for a in res.actions if a.kind == "requeue"}
    for d in res.decisions:
        if d["kind"] != "start" and (d["kind"] != "preempt" or str(d["job_id"]) in tried):
            lines.append(f"  {d['kind']} job {d['job_id']}: {d['reason']}")
    lines += [f"  Slurm serves job {k}: {v}" for k, v in res.handed_back.items()]
    lines += [f"  note: {n}" for n in res.notes]
    return "\n".join(lines)


def _install(stop: threading.Event) -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())


def _wait(ctl: Controller, stop: threading.Event, seconds: float) -> None:
    """Sleep ``seconds`` (or until stopped), renewing the lease at a third of its length."""
    end = time.monotonic() + seconds
    while not stop.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return
        stop.wait(min(left, ctl.opt.lease_s / 3))
        if not ctl.opt.dry_run and time.monotonic() < end and not stop.is_set():
            with ctl.store.update() as ledger:
                ctl.renew(ledger)


def serve(ctl: Controller, interval_s: float, once: bool, as_json: bool, restore_at_exit: bool,
          emit: Callable[[str], None] | None = None, stop: threading.Event | None = None) -> int:
    """Run rounds until stopped (or one with ``once``); returns the exit code."""
    emit = emit or (lambda s: print(s, flush=True))
    stop = stop or threading.Event()
    _install(stop)
    down, down_since, rc, rounds = "", 0.0, 0, 0
    while not stop.is_set():
        try:
            res = ctl.round(time.time())
        except SlurmUnreachable as e:
            if e.what != down:     # named once per outage (and again if what is out changes)
                down_since = down_since if down else time.monotonic()
                down = e.what
                log.warning("%s: no changes until it is back; retrying every %.0f s", e, RETRY_S)
            if once:
                emit(json.dumps({"skipped": str(e)}) if as_json else str(e))
                rc = 1
                break
            try:
                _wait(ctl, stop, min(interval_s, RETRY_S))
            except LedgerError as e:
                log.error("%s", e)
                return 1
            continue
        except (LedgerError, Refused) as e:
            log.error("%s", e)
            emit(json.dumps({"error": str(e)}) if as_json else f"error: {e}")
            return 2 if rounds == 0 else 1    # not this controller's ledger: nothing to restore
        rounds += 1
        if down:
            log.warning("%s reachable again after %.0f s: resuming", down, time.monotonic() - down_since)
            down = ""
        emit(json.dumps(res.to_dict()) if as_json else describe(res))
        if once:
            skipped = ("not requeued", "not changed")    # a fresh view said no: decided again next round
            failed = any(a.error and not a.error.endswith(skipped) for a in res.actions)
            rc = 1 if res.skipped or failed else 0
            break
        try:
            _wait(ctl, stop, interval_s)
        except LedgerError as e:     # the lease was taken by another controller while we waited
            log.error("%s", e)
            emit(json.dumps({"error": str(e)}) if as_json else f"error: {e}")
            return 1
    if restore_at_exit:
        rc = max(rc, _report(restore(ctl.io, ctl.store, dry_run=ctl.opt.dry_run), as_json, emit))
    elif not ctl.opt.dry_run:
        held = sorted(ctl.store.read().modes)
        if held:
            log.warning("exiting without --restore: preemption stays OFF in %s until `gpudiag scheduler "
                        "serve --backend slurm --restore-only` (or a --watchdog, once the lease lapses) "
                        "gives it back", ", ".join(held))
    try:
        ctl.release()
    except LedgerError as e:
        log.error("%s", e)
        rc = max(rc, 1)
    sys.stdout.flush()
    return rc


def _report(r, as_json: bool, emit: Callable[[str], None]) -> int:  # actions.Restored
    if as_json:
        emit(json.dumps({"restored": [{k: v for k, v in a.__dict__.items() if k != "ref"} for a in r.actions],
                         "failed": r.failed, "left": r.left, "notes": r.notes}))
    for line in r.left:
        log.warning("not restored: %s", line)
    for line in r.notes:
        log.warning("%s", line)
    if r.failed:
        log.error("could not restore (kept in the ledger, run --restore-only again): %s", "; ".join(r.failed))
        if not as_json:
            emit("could not restore: " + "; ".join(r.failed))
        return 1
    return 0


def restore_only(io: SlurmIO, store: LedgerStore, as_json: bool, dry_run: bool = False,
                 emit: Callable[[str], None] | None = None) -> int:
    """Undo everything the ledger holds; no round. 2: the ledger is not ours to undo."""
    emit = emit or (lambda s: print(s, flush=True))
    try:
        ledger = store.read()
        now = time.time()
        if ledger.lease is not None and ledger.lease.live(now) and not ledger.lease.mine():
            raise LedgerError(f"{store.path}: the controller pid {ledger.lease.pid} on {ledger.lease.host} "
                              f"holds it (lease for {ledger.lease.expires - now:.0f} s more): stop it first")
        cfg: dict[str, str] = {}
        if ledger.holds_changes or ledger.id:     # the config names the cluster and its claim
            try:
                cfg = io.config()
            except (SlurmError, BadSlurmOutput):
                if ledger.holds_changes:
                    raise
        if ledger.cluster and (ledger.nice or ledger.modes):
            ident = cluster_identity(cfg)
            if ident != ledger.cluster:
                raise LedgerError(f"{store.path} belongs to cluster {ledger.cluster}, not this one ({ident})")
    except LedgerError as e:
        emit(json.dumps({"error": str(e)}) if as_json else f"error: {e}")
        return 2
    except (SlurmError, BadSlurmOutput) as e:
        emit(json.dumps({"failed": [f"slurmctld: {e}"]}) if as_json else f"could not restore: slurmctld: {e}")
        return 1
    r = restore(io, store, dry_run=dry_run)
    if not as_json:
        done = sum(a.applied for a in r.actions)
        left = f"; {len(r.left)} left to whoever changed them" if r.left else ""
        emit(f"restored {done} change(s){left}")
    rc = _report(r, as_json, emit)
    path = claim.claim_path(cfg)
    if path is not None and not dry_run:     # everything back: the cluster's claim is free again
        try:
            after = store.read()
            claim.release(path, after.id, after.holds_changes, time.time())
        except LedgerError as e:
            log.warning("%s", e)
    return rc


def watchdog(io: SlurmIO, store: LedgerStore, poll_s: float = WATCHDOG_POLL_S,
             stop: threading.Event | None = None) -> int:
    """Give preemption back whenever the ledger's lease lapses with partitions held; until stopped."""
    stop = stop or threading.Event()
    _install(stop)
    log.info("watchdog on %s: gives preemption back to Slurm if the controller's lease lapses", store.path)
    while not stop.is_set():
        try:
            ledger = store.peek()   # not store.read(): the lock's holder may be the stopped controller
            now = time.time()
            if ledger.modes and (ledger.lease is None or not ledger.lease.live(now)):
                lease = ledger.lease
                who = "no lease" if lease is None else (
                    f"pid {lease.pid} on {lease.host} is gone" if not lease.holder_alive() else
                    f"pid {lease.pid} on {lease.host} stopped renewing it {now - lease.renewed:.0f} s ago")
                log.warning("controller lease lapsed (%s): giving preemption back in %s", who,
                            ", ".join(sorted(ledger.modes)))
                r = restore(io, store, modes_only=True)
                for line in r.left:
                    log.warning("not restored: %s", line)
                for line in r.notes:
                    log.warning("%s", line)
                if r.failed:
                    log.error("could not give preemption back (retrying): %s", "; ".join(r.failed))
                else:
                    log.warning("preemption given back to Slurm in %s", ", ".join(a.target for a in r.actions)
                                or "no partition (already back)")
        except LedgerError as e:
            log.error("%s", e)
            return 2
        # wake when the lease lapses, not a poll later: preemption is back within the lease time
        lapse = ledger.lease.expires - time.time() + 0.2 if ledger.modes and ledger.lease else poll_s
        stop.wait(max(0.2, min(poll_s, lapse)))
    return 0
