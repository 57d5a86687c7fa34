"""One controller round beside slurmctld: read, decide with the policy core, change little.

``Controller.round``'s steps: read Slurm (four commands at once), reconcile the ledger with it,
read the signals and model the cluster (no evidence: change nothing), choose the partitions to
hold, decide (``policy.schedule``), serve the waiting jobs, turn it all into ``Action``s, write
them write-ahead (``writes``, each re-checked by ``fresh``; ``dry_run`` writes nothing).
docs/slurm.md, "What one round does", says what each step does and why.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpudiag.scheduler.model import Policy, Signal
from gpudiag.scheduler.policy import schedule
from gpudiag.scheduler.priority import job_class, signal_usable
from gpudiag.scheduler.signals import SignalRead, SignalSource
from gpudiag.scheduler.slurm import claim
from gpudiag.scheduler.slurm.actions import PREEMPT_OFF, reconcile
from gpudiag.scheduler.slurm.adapter import Model, model_of
from gpudiag.scheduler.slurm.arrays import adopt_split_tasks
from gpudiag.scheduler.slurm.efficiency import (
    DEFAULT_MAX_CHANGES,
    DEFAULT_MIN_CHANGE_INTERVAL_S,
    MULTIFACTOR,
    lift_all,
    neutral_jobs,
    nice_actions,
    nice_scale,
)
from gpudiag.scheduler.slurm.history import history_path, load_history, save_history
from gpudiag.scheduler.slurm.ledger import Lease, Ledger, LedgerError, LedgerStore, conf_reloaded
from gpudiag.scheduler.slurm.outages import SourceOutages
from gpudiag.scheduler.slurm.qos import PARTITION_PRIO, qos_tiers
from gpudiag.scheduler.slurm.reclaim import lift_ends, lifted_jobs, quiet_partitions
from gpudiag.scheduler.slurm.round_result import RoundResult
from gpudiag.scheduler.slurm.says import Said, mode_line
from gpudiag.scheduler.slurm.serve_jobs import Serving, serve_waiting
from gpudiag.scheduler.slurm.slurmconf import cluster_identity, duration_s, memory_is_consumable
from gpudiag.scheduler.slurm.slurmio import SlurmError, SlurmIO, SlurmUnreachable
from gpudiag.scheduler.slurm.sources import slurm_signals
from gpudiag.scheduler.slurm.squeue import BadSlurmOutput, SlurmJob
from gpudiag.scheduler.slurm.takeover import (
    ModeView,
    busy_partitions,
    eligible,
    mode_actions,
    reconcile_modes,
    unsafe_holds,
)
from gpudiag.scheduler.slurm.writes import Writer, write_round

log = logging.getLogger("gpudiag.scheduler.slurm")

# The lease outlives three missed rounds and never less than 15 s: a round that runs long (a
# slow slurmctld) renews it between commands, so only a controller that died or hangs loses it.
LEASE_ROUNDS = 3
MIN_LEASE_S = 15.0


def lease_for(interval_s: float) -> float:
    return max(MIN_LEASE_S, LEASE_ROUNDS * interval_s)


@dataclass
class Options:
    dry_run: bool = False
    nice_max: int | None = None
    min_change_interval_s: float = DEFAULT_MIN_CHANGE_INTERVAL_S
    max_changes: int = DEFAULT_MAX_CHANGES
    takeover: bool = True
    lease_s: float = MIN_LEASE_S
    min_runtime_s: float | None = None          # None: the cluster's PreemptExemptTime
    quotas: dict[str, float] = field(default_factory=dict)
    need_multifactor: bool = False              # --efficiency-delay without --nice-max
    partitions: frozenset[str] | None = None    # --partitions: the only ones managed (None: all)


@dataclass
class _Round:
    """What one round read and derived, step by step (``Controller.round``)."""

    res: RoundResult
    now: float
    jobs: list[SlurmJob]
    nodes: dict
    parts: dict
    cfg: dict[str, str]
    marked: bool | None
    conf: object
    qos: object
    by_id: dict[int, SlurmJob]
    snapshot: Ledger | None = None
    reloaded: bool = False
    modes: ModeView | None = None
    requeued: dict = field(default_factory=dict)
    in_flight: set = field(default_factory=set)
    sig: SignalRead | None = None
    signals: dict = field(default_factory=dict)
    policy: Policy | None = None
    quiet: set = field(default_factory=set)
    model: Model | None = None
    no_evidence: str = ""
    takeover: bool = False
    want: set = field(default_factory=set)
    busy_why: dict = field(default_factory=dict)
    decisions: list = field(default_factory=list)
    serving: Serving | None = None
    requeues: list = field(default_factory=list)
    handed_back: dict = field(default_factory=dict)
    give_back: set = field(default_factory=set)
    why_back: dict = field(default_factory=dict)


class Refused(ValueError):
    """An option this cluster's Slurm cannot honour (the CLI exits 2 with this line)."""


class Controller:
    def __init__(self, io: SlurmIO, source: SignalSource | None, policy: Policy | None = None,
                 options: Options | None = None, ledger_path: Path | None = None) -> None:
        self.io, self.source = io, source
        self.policy = policy or Policy()
        self.opt = options or Options()
        self.ledger_path = ledger_path
        self.store = LedgerStore(ledger_path, readonly=self.opt.dry_run)
        self.hist_path = history_path(ledger_path) if ledger_path else None
        self.history, warn = load_history(self.hist_path, self.policy.history_half_life_s, _now())
        if warn:
            log.warning("%s", warn)
        self.said = Said()                          # what the log was told, each thing once
        self._parts_read: dict = {}
        self.tenancy = claim.Tenancy(str(ledger_path or "(in memory)"), self.opt.lease_s)
        self._mark_failed = ""                      # why RELOAD_MARK could not be made (said once)
        self._outages = SourceOutages()
        self._sig_down_since: float | None = None   # the signal source has been unavailable since

    # --- the ledger --------------------------------------------------------------------------------
    def renew(self, ledger: Ledger, now: float | None = None) -> None:
        """Take or renew the lease; a live lease of another process is refused."""
        t = _now() if now is None else now
        held = ledger.lease
        if held is not None and held.live(t) and not held.mine():
            raise LedgerError(f"{self.ledger_path}: another controller (pid {held.pid} on {held.host}) holds "
                              f"its lease for {held.expires - t:.0f} s more; stop it first")
        if held is not None and not held.mine() and ledger.holds_preemption:
            log.warning("the previous controller's lease (pid %d on %s) lapsed: this one takes its ledger "
                        "over", held.pid, held.host)
        ledger.lease = Lease(os.getpid(), socket.gethostname(), t, t + self.opt.lease_s)
        if not self.opt.dry_run:
            self.tenancy.renew(ledger, t)

    def release(self) -> None:
        """The loop ends: the cluster's claim is given up (``claim.Tenancy.release``)."""
        if not self.opt.dry_run:
            self.tenancy.release(self.store.read(), _now())

    def _bind(self, ledger: Ledger, cfg: dict[str, str]) -> None:
        ident = cluster_identity(cfg)
        if ledger.cluster is None or not (ledger.nice or ledger.modes or ledger.requeued):
            ledger.cluster = ident
        elif ledger.cluster != ident:
            raise LedgerError(f"{self.ledger_path} belongs to cluster {ledger.cluster} and this is {ident}: "
                              "run --restore-only against that cluster, or give this one its own --state")
        self.tenancy.bind(ledger, cfg)

    # --- reading -----------------------------------------------------------------------------------
    def _read_signals(self, now: float) -> SignalRead:
        if self.source is None:
            return SignalRead(available=False, why="no signal source (--prometheus or --agents)")
        return self.source.read(now)

    def round(self, now: float) -> RoundResult:
        """One round; raises SlurmUnreachable (the loop backs off) and LedgerError (the ledger is
        not ours to use); skips the round on malformed output. The steps, in order: read Slurm,
        reconcile the ledger with it, read the signals and model the cluster, choose the
        partitions to hold, decide (the policy core's pass), serve the waiting jobs, turn all of
        it into actions, write them."""
        res = RoundResult(at=now)
        r = self._read(res, now)
        if r is None:
            return res
        self._reconcile(r)
        self._model(r)
        self._holds(r)
        if r.model.cluster.nodes:
            r.decisions = schedule(r.model.cluster, r.model.pending, r.model.running, r.signals,
                                   self.history.book, now, r.policy, self.opt.quotas or None)
            res.decisions = [{"kind": d.kind, "job_id": d.job_id, "reason": d.reason} for d in r.decisions]
        self._serve(r)
        self._actions(r)
        self._write(r)
        return res

    def _read(self, res: RoundResult, now: float) -> _Round | None:
        """Slurm's four answers at once, and the options this Slurm cannot honour refused."""
        try:
            with ThreadPoolExecutor(4) as pool:   # four answers from slurmctld at once, not in a row
                reads = [pool.submit(f) for f in (self.io.jobs, self.io.nodes, self.io.partitions,
                                                  self.io.config)]
                jobs, nodes, parts, cfg = (r.result() for r in reads)
            marked = self.io.marked        # RELOAD_MARK in the same answer as the partitions
            self._parts_read = parts
            conf = self.io.slurm_conf(cfg)
            qos = qos_tiers(cfg, self.io.qos, self.io.json_ok is True)
        except SlurmUnreachable:
            raise
        except (BadSlurmOutput, SlurmError) as e:
            res.skipped = f"round skipped, nothing changed: {e}"
            log.error("%s", res.skipped)
            return None
        if self.opt.need_multifactor and cfg.get("PriorityType") != MULTIFACTOR:
            raise Refused(f"--efficiency-delay: this Slurm uses {cfg.get('PriorityType', '?')}, whose Nice "
                          "counts submissions, not seconds; give --nice-max N (the least efficient job's "
                          "Nice) instead")
        managed = self.opt.partitions
        if managed is not None and managed - set(parts):
            raise Refused(f"--partitions: this Slurm has no {', '.join(sorted(managed - set(parts)))} "
                          f"(it has {', '.join(sorted(parts))})")
        return _Round(res, now, jobs, nodes, parts, cfg, marked, conf, qos, {j.id: j for j in jobs})

    def _reconcile(self, r: _Round) -> None:
        """The ledger as decided on (written back, with the lease, before any change), reconciled
        with what Slurm shows: jobs gone, split array tasks, partitions' modes after a reload."""
        r.snapshot = snapshot = self.store.read()
        self._bind(snapshot, r.cfg)
        if not self.opt.dry_run:        # one controller per cluster: before any value is read as an original
            self.tenancy.renew(snapshot, r.now)
        r.reloaded = conf_reloaded(snapshot, r.cfg.get("BOOT_TIME"), r.marked)
        reconcile(snapshot, r.by_id, r.res.notes)
        adopt_split_tasks(snapshot, r.jobs)
        for n in r.res.notes:
            log.info("%s", n)
        r.modes = reconcile_modes(snapshot, r.parts, r.reloaded, r.conf)
        r.res.notes += r.modes.notes
        for n in r.modes.notes:
            log.warning("%s", n)
        r.requeued = {jid: q.at for jid, q in snapshot.requeued.items()
                      if q.done and jid in r.by_id and r.by_id[jid].holds}
        r.in_flight = {snapshot.requeued[jid].for_job for jid in r.requeued}

    def _model(self, r: _Round) -> None:
        """Signals (each job's own user's), the policy as this cluster runs it, the model of its
        jobs and nodes, what the key history learns, and whether there is evidence to act on."""
        res, now = r.res, r.now
        r.sig = sig = self._read_signals(now)
        self._outages.update(sig.down)
        r.signals = slurm_signals(sig, r.jobs) if sig.available else {}
        res.signals = {"available": sig.available, "why": sig.why, "jobs": len(r.signals)}
        res.jobs = {"pending": sum(j.state == "PENDING" for j in r.jobs),
                    "running": sum(j.holds for j in r.jobs)}
        kill_wait = duration_s(r.cfg.get("KillWait", "30 sec"))
        min_runtime = self.opt.min_runtime_s if self.opt.min_runtime_s is not None else \
            duration_s(r.cfg.get("PreemptExemptTime", "0"))
        r.policy = replace(self.policy, min_runtime_s=min_runtime)
        managed = self.opt.partitions
        quiet = quiet_partitions(r.parts, r.modes, r.nodes, r.cfg.get("PreemptType", "")) \
            if self.opt.takeover and self.io.json_ok is True and self.opt.quotas else set()
        r.quiet = quiet & managed if managed is not None else quiet
        r.model = model_of(r.jobs, r.nodes, r.parts, r.modes.held | r.quiet, kill_wait, now, r.requeued)
        self._observe(r.model, r.by_id, r.signals, now, r.policy)
        r.no_evidence = self._evidence(sig, r.signals, r.model, r.policy)
        res.notes += [r.no_evidence] if r.no_evidence else []

    def _holds(self, r: _Round) -> None:
        """The partitions gpudiag would hold (``takeover``), less those Slurm is busy preempting in
        and those whose hold would let Slurm preempt another partition's jobs instead."""
        res, parts, nodes, modes = r.res, r.parts, r.nodes, r.modes
        r.takeover = self.opt.takeover and not r.no_evidence and self.io.json_ok is True
        if self.opt.takeover and self.io.json_ok is False:
            res.notes.append("this squeue has no --json (no requeue flag, no preempt_time): Slurm chooses "
                             "preemption victims; gpudiag only changes Nice")
        want = eligible(parts, modes, nodes, r.cfg.get("PreemptType", "")) if r.takeover else set()
        want &= self.opt.partitions if self.opt.partitions is not None else want
        # the layout's answer, said once: from every partition gpudiag may hold, not from this
        # round's (a partition Slurm is preempting in sits a round out, and said it again)
        unsafe = unsafe_holds(parts, modes.original, nodes, want)
        if r.takeover:
            self.said.layout(res, unsafe)
        if not r.no_evidence:
            self.said.steering(mode_line(r.takeover, want - set(unsafe), r.qos, unsafe))
        r.busy_why = busy_partitions(r.jobs, want)
        want -= set(r.busy_why)
        res.notes += [f"partition {p}: {w}" for p, w in r.busy_why.items()]
        r.busy_why.update(self._safe(parts, modes, nodes, want))
        r.want = want
        if self.opt.dry_run:   # decide as a real run would once it holds what it would take
            for x in r.model.running:
                j = r.by_id[x.job.id]
                x.job.preemptible = j.partition in want | r.quiet and j.requeue

    def _serve(self, r: _Round) -> None:
        """Victims requeued for the waiting jobs gpudiag serves; the others handed to Slurm."""
        res, modes = r.res, r.modes
        r.serving, r.requeues, r.handed_back, r.give_back = None, [], {}, set(modes.held)
        r.why_back = dict.fromkeys(modes.held, r.no_evidence or "takeover off (--no-takeover)")
        if r.takeover:
            r.serving = Serving(r.jobs, r.by_id, r.model, modes, r.parts, r.nodes, r.decisions, r.want,
                                lambda j: self._has_evidence(j, r.signals, r.policy, r.now), r.requeued,
                                r.in_flight, dict(r.snapshot.handed_back), memory_is_consumable(r.cfg),
                                r.policy.min_runtime_s, r.now, r.quiet, self.opt.quotas)
            blocked = self._victims_blocked(r.jobs, modes, r.want)
            r.requeues, r.handed_back, r.give_back = serve_waiting(r.serving, allow_victims=not blocked)
            res.notes += [blocked] if blocked else []
            r.why_back = {p: "a waiting job is Slurm's to serve (see handed_back)" for p in r.give_back}
        r.why_back.update(r.busy_why)
        r.why_back.update(self._safe(r.parts, modes, r.nodes, r.want - r.give_back))
        res.handed_back = r.handed_back
        self.said.reclaims(res, r.serving, r.requeues)
        for jid in set(r.handed_back) - set(r.snapshot.handed_back):
            log.info("job %d: left to Slurm's preemption: %s", jid, r.handed_back[jid])

    def _actions(self, r: _Round) -> None:
        """Partition modes, requeues, Nice lifts ended, efficiency Nice, and every Nice lifted when
        the signals have been out longer than a signal lives."""
        res, policy, snapshot, now = r.res, r.policy, r.snapshot, r.now
        res.actions += mode_actions(r.parts, r.modes, r.want - r.give_back - set(r.why_back), r.why_back)
        res.actions += r.requeues
        res.actions += lift_ends(r.by_id, snapshot.nice)
        if not r.no_evidence and policy.efficiency and (r.qos is None or r.qos.nice_ok):
            scale = self.opt.nice_max if self.opt.nice_max is not None else nice_scale(r.cfg, policy)
            lifted = lifted_jobs(snapshot.nice) | {int(a.target) for a in r.requeues if a.kind == "lift"}
            top_qos = r.qos.top if r.qos is not None else frozenset()
            res.actions += nice_actions(r.jobs, r.parts, snapshot.nice, set(snapshot.theirs) | lifted,
                                        r.signals, self.history.book, now, policy, scale,
                                        self.opt.min_change_interval_s, self.opt.max_changes,
                                        neutral_jobs(r.jobs, r.parts, self.opt.partitions, top_qos))
        self._sig_down_since = None if r.sig.available else self._sig_down_since or now
        out_s = now - (self._sig_down_since or now)
        if out_s > policy.max_signal_age_s:
            res.actions += lift_all(r.jobs, snapshot.nice, f"signals unavailable for {out_s:.0f} s, longer "
                                    f"than the {policy.max_signal_age_s:.0f} s staleness limit")

    def _write(self, r: _Round) -> None:
        """The reload mark, then the actions (``writes``), then what the round leaves held."""
        res, cfg, now = r.res, r.cfg, r.now
        marked = self._mark(cfg, r.marked)

        def prepare(ledger: Ledger) -> None:
            self._bind(ledger, cfg)
            self.renew(ledger, now)
            reconcile(ledger, r.by_id, [])
            adopt_split_tasks(ledger, r.jobs)
            reconcile_modes(ledger, r.parts, r.reloaded, r.conf)
            ledger.boot, ledger.marked = cfg.get("BOOT_TIME"), bool(marked)
            ledger.handed_back = dict(r.handed_back)

        self._apply(res, now, r.serving, r.by_id, prepare)
        changed = {a.target: a.new for a in res.actions if a.kind == "preempt_mode" and a.applied}
        res.held = sorted(p for p in r.modes.held | set(changed)
                          if changed.get(p, PREEMPT_OFF) == PREEMPT_OFF)
        if not self.opt.dry_run:
            save_history(self.hist_path, self.history, now)

    def _observe(self, model: Model, by_id: dict[int, SlurmJob], signals: dict[int, Signal], now: float,
                 policy: Policy) -> None:
        """Key history: each job run's first usable signal teaches its key (once per run)."""
        for r in model.running:
            s = signals.get(r.job.id)
            j = by_id[r.job.id]
            if s is not None and signal_usable(s, policy):
                s = s.scheduled(policy.min_signal_confidence)
                self.history.observe(f"{j.id}@{j.submit:.0f}#{j.restarts}", r.job.key, job_class(r.job.gpus),
                                     s.mfu, s.label, now)

    def _has_evidence(self, j: SlurmJob, signals: dict[int, Signal], policy: Policy, now: float) -> bool:
        if signal_usable(signals.get(j.id), policy):
            return True
        h = self.history.book.lookup(f"{j.user}/{j.name}", now)
        return h is not None and h.weight >= policy.min_history_weight

    def _evidence(self, sig: SignalRead, signals: dict[int, Signal], model: Model, policy: Policy) -> str:
        """"" when gpudiag may act on signals; else why not (logged once when it changes)."""
        if not sig.available:   # each source that is out is named once (SourceOutages)
            why = f"signals unavailable ({'none answered: ' + ', '.join(sig.down) if sig.down else sig.why})"
        elif not self.history.book.keys and not any(signal_usable(signals.get(r.job.id), policy)
                                                    for r in model.running):
            why = "no usable MFU signal (no running GPU job reports one, and no key history yet)"
        else:
            why = ""
        why = f"{why}: Slurm chooses preemption victims and no Nice is changed" if why else ""
        self.said.evidence(why)
        return why

    @staticmethod
    def _safe(parts: dict, modes: ModeView, nodes: dict, hold: set[str]) -> dict[str, str]:
        """Drops from ``hold`` (in place) the partitions whose hold would let Slurm preempt another
        partition's jobs in their place (``takeover.unsafe_holds``); returns them -> why."""
        why = unsafe_holds(parts, modes.original, nodes, hold)
        hold -= set(why)
        return why

    def _mark(self, cfg: dict[str, str], marked: bool | None) -> bool:
        """RELOAD_MARK made where gpudiag may hold partitions and it is missing: True when it is
        there now (what tells the next round a reload from an ``scontrol update``)."""
        if marked or self.opt.dry_run or not self.opt.takeover or cfg.get("PreemptType") != PARTITION_PRIO:
            return bool(marked)
        try:
            self.io.create_mark()
        except SlurmUnreachable:
            raise
        except SlurmError as e:
            if str(e) != self._mark_failed:
                log.warning("cannot make the reload mark (%s): a held partition back at its slurm.conf mode "
                            "counts as a reload, whether slurm.conf was reloaded or not", e)
                self._mark_failed = str(e)
            return False
        return True

    @staticmethod
    def _victims_blocked(jobs: list[SlurmJob], modes: ModeView, want: set[str]) -> str:
        if modes.reset:
            return f"partitions {', '.join(modes.reset)} were reset: no victims this round"
        if want - modes.held:
            return f"taking {', '.join(sorted(want - modes.held))} over: victims from the next round"
        busy = [j.id for j in jobs if j.holds and j.preempt_time > 0]
        if busy:
            return f"Slurm is preempting job {busy[0]}: no victims chosen this round"
        return ""

    # --- writing -----------------------------------------------------------------------------------
    def _apply(self, res: RoundResult, now: float, serving: Serving | None, by_id: dict[int, SlurmJob],
               prepare: Callable[[Ledger], None]) -> None:
        if self.opt.dry_run:
            for a in res.actions:
                log.info("would %s %s: %s -> %s (%s)%s", a.kind, a.target, a.old, a.new, a.reason,
                         f" [skipped: {a.error}]" if a.error else "")
            return
        write_round(res, Writer(self.io, self.store, self.renew, self.opt.lease_s / 3), now, by_id, serving,
                    self._parts_read, prepare)


def _now() -> float:
    return time.time()
